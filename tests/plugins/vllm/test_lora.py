"""``--lora-modules`` as vLLM 0.32 reads it (``vllm/entrypoints/launchers/cli_args.py``,
``LoRAParserAction``: ``name=path`` or a JSON object with ``name``, ``path``, ``base_model_name``),
checked before vLLM starts; and the stable ``lora_int_id`` of each adapter. No vLLM needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dyn.plugins.vllm.lora import (
    MAX_LORA_MODULES,
    LoraAdapters,
    LoraModule,
    LoraSpecError,
    UnknownLoraAdapter,
    adapter_rank,
    engine_flags,
    parse_lora_modules,
)

REPO = Path(__file__).resolve().parents[3]


def adapter_dir(root: Path, name: str, rank: int = 8) -> Path:
    """A directory that looks like a PEFT adapter (its config only; parsing reads nothing else)."""
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank}))
    return path


def test_name_equals_path_and_json_forms_give_typed_modules_in_order(tmp_path):
    sql, chat = adapter_dir(tmp_path, "sql"), adapter_dir(tmp_path, "chat")
    modules = parse_lora_modules(
        [
            f"sql-lora={sql}",
            json.dumps({"name": "chat", "path": str(chat), "base_model_name": "llama"}),
        ]
    )
    assert modules == [
        LoraModule("sql-lora", str(sql.resolve()), None),
        LoraModule("chat", str(chat.resolve()), "llama"),
    ]
    assert modules[0].parent("served") == "served"  # vLLM: the first served model name
    assert modules[1].parent("served") == "llama"


def test_a_json_list_gives_several_adapters_and_empty_specs_are_skipped(tmp_path):
    a, b = adapter_dir(tmp_path, "a"), adapter_dir(tmp_path, "b")
    spec = json.dumps([{"name": "a", "path": str(a)}, {"name": "b", "path": str(b)}])
    assert [m.name for m in parse_lora_modules(["", spec, "  "])] == ["a", "b"]


def test_the_path_is_made_absolute_and_home_relative_paths_expand(tmp_path, monkeypatch):
    adapter_dir(tmp_path, "home-adapter")
    monkeypatch.setenv("HOME", str(tmp_path))
    (module,) = parse_lora_modules(["h=~/home-adapter"])
    assert module.path == str((tmp_path / "home-adapter").resolve())
    monkeypatch.chdir(tmp_path)
    (module,) = parse_lora_modules(["rel=home-adapter"])
    assert Path(module.path).is_absolute()


def test_the_name_is_split_at_the_first_equals_sign(tmp_path):
    odd = adapter_dir(tmp_path, "x=y,z")  # vLLM reads any spec with a comma as JSON
    (module,) = parse_lora_modules([f"odd={odd}"])
    assert (module.name, module.path) == ("odd", str(odd.resolve()))


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("just-a-name", "expected NAME=PATH"),
        ("=/tmp", "is not allowed"),
        ("bad name=/tmp", "is not allowed"),
        ("-dash=/tmp", "is not allowed"),
        ("x" * 129 + "=/tmp", "is not allowed"),
        ("empty=", "has no path"),
        ("missing=/no/such/adapter", "is not a directory"),
        ('{"name": "a", "path": ', "is not valid JSON"),
        ('{"name": "a"}', "'path' is required"),
        ('{"name": 1, "path": "/tmp"}', "'name' is required"),
        ('{"name": "a", "path": "/tmp", "lora_int_id": 3}', "unknown key(s) 'lora_int_id'"),
        ('{"name": "a", "path": "/tmp", "base_model_name": ""}', "non-empty string"),
        ('["a=/tmp"]', "must be a JSON object"),
    ],
)
def test_a_bad_spec_is_refused_with_a_sentence_naming_it(spec, needle):
    with pytest.raises(LoraSpecError) as refused:
        parse_lora_modules([spec])
    assert needle in str(refused.value) and "--lora-modules" in str(refused.value)


def test_a_directory_without_adapter_config_is_not_an_adapter(tmp_path):
    (tmp_path / "weights").mkdir()
    with pytest.raises(LoraSpecError, match="has no adapter_config.json"):
        parse_lora_modules([f"w={tmp_path / 'weights'}"])


def test_names_are_unique_and_may_not_shadow_the_served_model(tmp_path):
    a = adapter_dir(tmp_path, "a")
    with pytest.raises(LoraSpecError, match="already given"):
        parse_lora_modules([f"x={a}", json.dumps({"name": "x", "path": str(a)})])
    with pytest.raises(LoraSpecError, match="served model's name"):
        parse_lora_modules([f"llama={a}"], reserved_names=["llama", "llama-alias"])


def test_hugging_face_style_names_are_allowed(tmp_path):
    a = adapter_dir(tmp_path, "a")
    (module,) = parse_lora_modules([f"org/adapter-v1.2:b@3+x_y={a}"])
    assert module.name == "org/adapter-v1.2:b@3+x_y"


def test_at_most_64_adapters(tmp_path):
    a = adapter_dir(tmp_path, "a")
    specs = [f"a{i}={a}" for i in range(MAX_LORA_MODULES)]
    assert len(parse_lora_modules(specs)) == MAX_LORA_MODULES
    with pytest.raises(LoraSpecError, match=f"more than {MAX_LORA_MODULES} adapters"):
        parse_lora_modules([*specs, f"one-more={a}"])


def test_int_ids_start_at_one_in_the_order_given_and_stay_fixed(tmp_path):
    modules = parse_lora_modules([f"{n}={adapter_dir(tmp_path, n)}" for n in ("b", "a", "c")])
    adapters = LoraAdapters(modules)
    assert [adapters.int_id(n) for n in ("b", "a", "c")] == [1, 2, 3]
    assert [adapters.int_id(n) for n in ("c", "b")] == [3, 1]  # asking again changes nothing
    assert adapters.names() == ["b", "a", "c"] and "a" in adapters and "z" not in adapters


def test_the_base_model_needs_no_request_and_an_unknown_adapter_is_refused(tmp_path):
    adapters = LoraAdapters(parse_lora_modules([f"sql={adapter_dir(tmp_path, 'sql')}"]))
    assert adapters.lora_request(None) is None and adapters.lora_request("") is None
    with pytest.raises(UnknownLoraAdapter, match=r"no LoRA adapter 'chat' \(it serves: sql\)"):
        adapters.lora_request("chat")
    with pytest.raises(UnknownLoraAdapter, match="it serves: none"):
        LoraAdapters([]).int_id("sql")


def test_engine_flags_enable_lora_only_with_adapters_and_pass_the_limits_given(tmp_path):
    modules = parse_lora_modules([f"a={adapter_dir(tmp_path, 'a', rank=8)}"])
    assert engine_flags([]) == []
    assert engine_flags(modules) == ["--enable-lora"]
    assert engine_flags(modules, max_loras=2, max_lora_rank=8, max_cpu_loras=4) == [
        "--enable-lora",
        "--max-loras",
        "2",
        "--max-lora-rank",
        "8",
        "--max-cpu-loras",
        "4",
    ]


@pytest.mark.parametrize(
    ("limits", "needle"),
    [
        ({"max_loras": 0}, "--max-loras must be at least 1"),
        ({"max_lora_rank": 12}, "--max-lora-rank must be one of 1, 8, 16"),
        ({"max_loras": 4, "max_cpu_loras": 2}, "--max-cpu-loras (2) must be at least --max-loras (4)"),
        ({"max_lora_rank": 8}, "rank 32, above --max-lora-rank 8; raise --max-lora-rank to at least 32"),
    ],
)
def test_engine_flags_refuse_limits_vllm_would_refuse(tmp_path, limits, needle):
    modules = parse_lora_modules([f"big={adapter_dir(tmp_path, 'big', rank=32)}"])
    with pytest.raises(LoraSpecError) as refused:
        engine_flags(modules, **limits)
    assert needle in str(refused.value)


def test_an_adapter_above_vllms_default_rank_16_needs_the_flag(tmp_path):
    modules = parse_lora_modules([f"r64={adapter_dir(tmp_path, 'r64', rank=64)}"])
    with pytest.raises(LoraSpecError, match="above --max-lora-rank 16"):
        engine_flags(modules)
    assert engine_flags(modules, max_lora_rank=64) == ["--enable-lora", "--max-lora-rank", "64"]


def test_limits_without_adapters_are_refused():
    with pytest.raises(LoraSpecError, match="need --lora-modules"):
        engine_flags([], max_loras=2)


def test_make_tiny_lora_writes_the_files_peft_writes_deterministically(tmp_path):
    """scripts/make_tiny_lora.py: PEFT's two files, every projection of dyn-tiny-llama's 2 layers,
    rank 8, the same bytes for the same seed and other bytes for another."""
    from safetensors.numpy import load_file

    def make(out: Path, *args: str) -> Path:
        done = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "make_tiny_lora.py"), str(out), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert done.stdout.strip() == str(out)
        return out

    first, again, other = make(tmp_path / "a"), make(tmp_path / "b"), make(tmp_path / "c", "--seed", "1")
    config = json.loads((first / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8 and config["bias"] == "none"
    assert (module := parse_lora_modules([f"tiny={first}"])[0]) and adapter_rank(module) == 8
    tensors = load_file(str(first / "adapter_model.safetensors"))
    assert len(tensors) == 2 * 7 * 2  # A and B, 7 projections, 2 layers
    q_a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    down_b = tensors["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
    assert q_a.shape == (8, 64) and down_b.shape == (64, 8) and q_a.dtype.name == "float32"
    weights = (first / "adapter_model.safetensors").read_bytes()
    assert weights == (again / "adapter_model.safetensors").read_bytes()
    assert weights != (other / "adapter_model.safetensors").read_bytes()
