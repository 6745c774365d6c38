"""dyn.core.frontend.tokenizer: same ids as transformers, special tokens and chat templates from the
model directory, clear errors for broken directories."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import TINY_MODEL_DIR, ModelError, load_model_info

TEXTS = [
    "",
    "Hello, world!",
    "def f(x):\n    return x + 1\n",
    "  leading and trailing spaces  ",
    "naïve café — ünïcödé",
    "数据结构与算法, 日本語のテキスト",
    "emoji 🎉🚀 and a family 👩‍👩‍👧 and flags 🇫🇷",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "text<|eot_id|>glued<|end_of_text|>",
    "\t\n\r\x00 control \u200b zero width",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_model(load_model_info())


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(TINY_MODEL_DIR)


@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_encode_matches_transformers(tok: Tokenizer, hf, add_special_tokens: bool) -> None:
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=add_special_tokens) == hf.encode(
            text, add_special_tokens=add_special_tokens
        ), text


@pytest.mark.parametrize("skip", [False, True])
def test_decode_matches_transformers(tok: Tokenizer, hf, skip: bool) -> None:
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert tok.decode(tok.encode(TEXTS[6], False)) == TEXTS[6]
    assert tok.decode(tok.encode(TEXTS[7], False)) == "user\n\nhi"
    assert tok.decode(tok.encode(TEXTS[7], False), False) == TEXTS[7]


def test_special_tokens_of_the_embedded_model(tok: Tokenizer, hf) -> None:
    info = load_model_info()
    assert tok.bos_token == "<|begin_of_text|>" == hf.bos_token
    assert tok.eos_token == "<|eot_id|>" == hf.eos_token
    assert tok.special_tokens_map == hf.special_tokens_map
    assert tok.special_token_ids == frozenset(info.special_token_ids)
    assert tok.token_to_id("<|eot_id|>") in info.eos_token_ids
    assert tok.id_to_token(tok.token_to_id("<|eot_id|>")) == "<|eot_id|>"
    assert tok.id_to_token(tok.encode(" the", False)[0]) == "Ġthe"
    assert tok.id_to_token(10**6) is None
    assert tok.vocab_size == info.vocab_size == 4096
    assert tok.chat_template == hf.chat_template
    assert tok.path == info.path


def _model_dir(tmp_path: Path, tok_config: dict | None, files: dict[str, str] | None = None) -> Path:
    d = tmp_path / "m"
    d.mkdir(parents=True)
    shutil.copy(TINY_MODEL_DIR / "tokenizer.json", d / "tokenizer.json")
    if tok_config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(tok_config))
    for name, text in (files or {}).items():
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return d


def test_response_template_as_the_config_holds_it(tmp_path: Path) -> None:
    """tokenizer_config.json's response_template, kept unchecked (the hf parsers check it): a
    malformed one still loads the model."""
    template = {"start_anchor": "<|im_start|>assistant\n", "fields": {"content": {}}}
    assert (
        Tokenizer.from_dir(_model_dir(tmp_path / "a", {"response_template": template})).response_template
        == template
    )
    assert Tokenizer.from_dir(_model_dir(tmp_path / "b", {"response_template": [1]})).response_template == [1]
    assert Tokenizer.from_dir(_model_dir(tmp_path / "c", {})).response_template is None
    assert Tokenizer.from_dir(_model_dir(tmp_path / "d", None)).response_template is None


def test_special_tokens_as_dicts_and_from_special_tokens_map(tmp_path: Path) -> None:
    d = _model_dir(
        tmp_path,
        {"bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>"}, "eos_token": None},
        {
            "special_tokens_map.json": json.dumps(
                {"eos_token": {"content": "<|end_of_text|>"}, "bos_token": "ignored, the config has one"}
            )
        },
    )
    tok = Tokenizer.from_dir(d)
    assert tok.bos_token == "<|begin_of_text|>"
    assert tok.eos_token == "<|end_of_text|>"
    assert tok.chat_template is None


def test_chat_template_forms(tmp_path: Path) -> None:
    named = [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]
    tok = Tokenizer.from_dir(_model_dir(tmp_path / "a", {"chat_template": named}))
    assert tok.chat_template == "D" and tok.chat_templates == {"default": "D", "tool_use": "T"}

    # chat_template.jinja replaces the config's template, as in transformers
    tok = Tokenizer.from_dir(
        _model_dir(
            tmp_path / "b",
            {"chat_template": "old"},
            {"chat_template.jinja": "new {{ x }}", "additional_chat_templates/rag.jinja": "R"},
        )
    )
    assert tok.chat_templates == {"default": "new {{ x }}", "rag": "R"}

    tok = Tokenizer.from_dir(
        _model_dir(tmp_path / "c", {}, {"chat_template.json": json.dumps({"chat_template": "J"})})
    )
    assert tok.chat_template == "J"


def test_no_tokenizer_config_is_fine(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(_model_dir(tmp_path, None))
    assert tok.bos_token is None and tok.chat_template is None
    assert tok.encode("hi", False) == Tokenizer.from_dir(TINY_MODEL_DIR).encode("hi", False)


def test_broken_directories_raise_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not a directory"):
        Tokenizer.from_dir(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path / "empty")
    d = _model_dir(tmp_path, {})
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "nonsense"}}')
    with pytest.raises(ModelError, match="tokenizer.json could not be loaded"):
        Tokenizer.from_dir(d)
    (d / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelError, match="tokenizer.json"):
        Tokenizer.from_dir(d)
    shutil.copy(TINY_MODEL_DIR / "tokenizer.json", d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(ModelError, match="tokenizer_config.json is not valid JSON"):
        Tokenizer.from_dir(d)


def test_frontend_modules_do_not_import_transformers() -> None:
    code = (
        "import sys\n"
        "from dyn.core.frontend import tokenizer, chat_template, detokenizer\n"
        "from dyn.core.model.info import TINY_MODEL_DIR\n"
        "t = tokenizer.Tokenizer.from_dir(TINY_MODEL_DIR)\n"
        "chat_template.compile_template(t.chat_template).render([{'role': 'user', 'content': 'x'}])\n"
        "d = detokenizer.IncrementalDetokenizer(t); d.push(t.encode('hi', False)); d.finish()\n"
        "assert 'transformers' not in sys.modules and 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "config, bos_processor",
    [
        ({}, True),  # tokenizer.json's post-processor adds BOS
        ({"add_bos_token": False}, True),  # transformers 5 ignores the config's add_bos_token/add_eos_token
        ({"add_bos_token": True, "add_eos_token": True}, False),
    ],
)
def test_add_special_tokens_follows_transformers(tmp_path: Path, config: dict, bos_processor: bool) -> None:
    transformers = pytest.importorskip("transformers")
    d = _model_dir(tmp_path, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", **config})
    if bos_processor:
        spec = json.loads((d / "tokenizer.json").read_text())
        spec["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {
                "<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [0], "tokens": ["<|begin_of_text|>"]}
            },
        }
        (d / "tokenizer.json").write_text(json.dumps(spec))
    ours, hf = Tokenizer.from_dir(d), transformers.AutoTokenizer.from_pretrained(d)
    for text in TEXTS[:4]:
        for add in (True, False):
            assert ours.encode(text, add) == hf.encode(text, add_special_tokens=add), (text, add)
    assert (ours.encode("hi", True)[0] == 0) == bos_processor
    assert ours.encode("hi", False)[0] != 0


def test_a_pair_is_encoded_as_transformers_encodes_text_with_text_pair():
    """A BERT-style post-processor (``[CLS] A [SEP] B [SEP]``): the cross-encoder's input."""
    import tokenizers
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    vocab = {
        w: i
        for i, w in enumerate(["[UNK]", "[CLS]", "[SEP]", "where", "is", "paris", "in", "france", "?", "."])
    }
    backend = tokenizers.Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    backend.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
    )
    ours = Tokenizer(backend).encode_pair("where is paris ?", "paris is in france .")
    theirs = PreTrainedTokenizerFast(tokenizer_object=backend)(
        text="where is paris ?", text_pair="paris is in france ."
    )
    assert ours == theirs["input_ids"] == [1, 3, 4, 5, 8, 2, 5, 4, 6, 7, 9, 2]
