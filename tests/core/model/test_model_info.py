"""dyn.core.model: the embedded dyn-tiny model and load_model_info on custom directories."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from dyn.core.model import TINY_MODEL_DIR, TINY_MODEL_NAME, ModelError, ModelInfo, load_model_info
from dyn.core.model.info import DEFAULT_CONTEXT_LENGTH

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "make_tiny_model.py"
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _tiny_eot_id() -> int:
    tok = json.loads((TINY_MODEL_DIR / "tokenizer.json").read_text())
    return next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|eot_id|>")


def test_embedded_model() -> None:
    info = load_model_info(None, None)
    assert isinstance(info, ModelInfo)
    assert info.name == TINY_MODEL_NAME == "dyn-tiny"
    assert info.path == TINY_MODEL_DIR.resolve()
    assert 4000 <= info.vocab_size <= 4096
    assert info.eos_token_ids == (_tiny_eot_id(),)
    assert info.bos_token_id is not None and info.bos_token_id in info.special_token_ids
    assert info.context_length == 131072  # coding agents' prompts (10k-20k tokens) fit
    assert len(info.special_token_ids) == 5


def test_embedded_model_renamed() -> None:
    assert load_model_info(None, "served-name").name == "served-name"


def test_no_transformers_import() -> None:
    code = "import sys, dyn.core.model as m; m.load_model_info(None, None); assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def _write_model(
    d: Path,
    *,
    config: dict | None = None,
    gen: dict | None = None,
    tok_config: dict | None = None,
    vocab_size: int = 10,
) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    vocab = {f"t{i}": i for i in range(vocab_size)}
    added = [
        {"id": vocab_size, "content": "<s>", "special": True},
        {"id": vocab_size + 1, "content": "</s>", "special": True},
        {"id": vocab_size + 2, "content": "<end>", "special": True},
        {"id": vocab_size + 3, "content": "plain", "special": False},
    ]
    (d / "tokenizer.json").write_text(
        json.dumps(
            {"version": "1.0", "added_tokens": added, "model": {"type": "BPE", "vocab": vocab, "merges": []}}
        )
    )
    tc = {
        "bos_token": "<s>",
        "eos_token": {"content": "</s>", "__type": "AddedToken"},
        "chat_template": TEMPLATE,
        "model_max_length": 1000000000000000019884624838656,
    }
    (d / "tokenizer_config.json").write_text(json.dumps(tc if tok_config is None else tok_config))
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    if gen is not None:
        (d / "generation_config.json").write_text(json.dumps(gen))
    return d


def test_custom_dir_tokenizer_only(tmp_path: Path) -> None:
    d = _write_model(tmp_path / "my-model")
    info = load_model_info(d, None)
    assert info.name == "my-model"
    assert info.path == d.resolve()
    assert info.vocab_size == 14
    assert info.bos_token_id == 10
    assert info.eos_token_ids == (11,)
    assert info.special_token_ids == (10, 11, 12)
    assert info.context_length == DEFAULT_CONTEXT_LENGTH == 8192  # it states none: the default


def test_custom_dir_full(tmp_path: Path) -> None:
    d = _write_model(
        tmp_path / "m",
        config={"vocab_size": 32, "max_position_embeddings": 4096, "eos_token_id": [11, 12]},
        gen={"eos_token_id": [12, 13], "bos_token_id": 10},
    )
    info = load_model_info(str(d), "alias")
    assert info.name == "alias"
    assert info.vocab_size == 32
    assert info.eos_token_ids == (11, 12, 13)
    assert info.context_length == 4096


def test_context_length_from_tokenizer_config_when_smaller(tmp_path: Path) -> None:
    tc = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE, "model_max_length": 2048}
    d = _write_model(tmp_path / "m", config={"max_position_embeddings": 4096}, tok_config=tc)
    assert load_model_info(d, None).context_length == 2048


def test_chat_template_file(tmp_path: Path) -> None:
    d = _write_model(tmp_path / "m", tok_config={"bos_token": "<s>", "eos_token": "</s>"})
    (d / "chat_template.jinja").write_text(TEMPLATE)
    assert load_model_info(d, None).eos_token_ids == (11,)


def test_error_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(
        ModelError, match=r"--model-path .*nope: no such directory; pass a local Hugging Face"
    ):
        load_model_info(tmp_path / "nope", None)


def test_error_not_a_dir(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ModelError, match="not a directory"):
        load_model_info(f, None)


def test_error_missing_tokenizer_json(tmp_path: Path) -> None:
    d = _write_model(tmp_path / "m")
    (d / "tokenizer.json").unlink()
    with pytest.raises(
        ModelError, match=r": no tokenizer.json found; pass a local Hugging Face model directory"
    ):
        load_model_info(d, None)


def test_error_missing_tokenizer_config(tmp_path: Path) -> None:
    d = _write_model(tmp_path / "m")
    (d / "tokenizer_config.json").unlink()
    with pytest.raises(ModelError, match="no tokenizer_config.json found"):
        load_model_info(d, None)


@pytest.mark.parametrize(
    "name", ["tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"]
)
def test_error_invalid_json(tmp_path: Path, name: str) -> None:
    d = _write_model(tmp_path / "m", config={}, gen={})
    (d / name).write_text("{not json")
    with pytest.raises(ModelError, match=rf"{name} is not valid JSON .*; fix or replace the file"):
        load_model_info(d, None)


def test_error_wrong_shape_tokenizer_json(tmp_path: Path) -> None:
    d = _write_model(tmp_path / "m")
    (d / "tokenizer.json").write_text(json.dumps({"added_tokens": "oops"}))
    with pytest.raises(ModelError, match="tokenizer.json is not a Hugging Face tokenizers file"):
        load_model_info(d, None)


def test_error_no_chat_template(tmp_path: Path) -> None:
    d = _write_model(tmp_path / "m", tok_config={"bos_token": "<s>", "eos_token": "</s>"})
    with pytest.raises(ModelError, match="no chat template found"):
        load_model_info(d, None)


def test_model_error_is_value_error() -> None:
    assert issubclass(ModelError, ValueError)


def test_transformers_loads_tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR))
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "def f(x): return x"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\ndef f(x): return x<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = tok.encode(text, add_special_tokens=False)
    info = load_model_info(None, None)
    assert ids[0] == info.bos_token_id
    assert ids.count(info.eos_token_ids[0]) == 2
    assert max(ids) < info.vocab_size
    assert tok.decode(ids) == text


def test_regenerate_is_byte_identical(tmp_path: Path) -> None:
    meta = json.loads((TINY_MODEL_DIR / "dyn_tiny.json").read_text())
    import tokenizers

    here = platform.python_version()
    if here.rsplit(".", 1)[0] != meta["python_version"].rsplit(".", 1)[0]:
        pytest.skip(f"dyn-tiny was generated with Python {meta['python_version']}, this is {here}")
    if tokenizers.__version__ != meta["tokenizers_version"]:
        pytest.skip(
            f"dyn-tiny was generated with tokenizers {meta['tokenizers_version']}, "
            f"this is {tokenizers.__version__}"
        )
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import make_tiny_model
    finally:
        sys.path.remove(str(SCRIPT.parent))
    if make_tiny_model.corpus_sha256(make_tiny_model.corpus_files()) != meta["corpus_sha256"]:
        pytest.skip(
            f"this Python {here}'s standard library (the training corpus) differs from the one "
            f"dyn-tiny was trained on (Python {meta['python_version']})"
        )
    out = tmp_path / "dyn-tiny"
    subprocess.run([sys.executable, str(SCRIPT), str(out)], check=True, capture_output=True)
    shipped = sorted(p.name for p in TINY_MODEL_DIR.glob("*.json"))
    assert sorted(p.name for p in out.iterdir()) == shipped
    for name in shipped:
        assert (out / name).read_bytes() == (TINY_MODEL_DIR / name).read_bytes(), (
            f"{name} differs; regenerate with: python scripts/make_tiny_model.py core/model/dyn-tiny"
        )


def test_tokenizer_files_from_a_separate_directory(tmp_path: Path) -> None:
    """vLLM's ``--tokenizer``: tokenizer.json, tokenizer_config.json and the chat template come
    from the tokenizer's directory, config.json from the model's."""
    tok = _write_model(tmp_path / "tok")
    model = tmp_path / "weights"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 2048, "vocab_size": 20}))
    with pytest.raises(ModelError, match="no tokenizer.json"):
        load_model_info(model, None)
    info = load_model_info(model, None, tok)
    assert info.path == model.resolve() and info.tokenizer_path == tok.resolve()
    assert info.tokenizer_dir == tok.resolve() and info.name == "weights"
    assert info.context_length == 2048 and info.vocab_size == 20
    assert info.bos_token_id == 10 and info.special_token_ids == (10, 11, 12)
    assert load_model_info(tok, None, tok).tokenizer_path is None  # the same directory: no separate one
    with pytest.raises(ModelError, match="--tokenizer .*not a directory"):
        load_model_info(model, None, tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="--tokenizer .*no tokenizer.json"):
        load_model_info(model, None, tmp_path / "empty")
