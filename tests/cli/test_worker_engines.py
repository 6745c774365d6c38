"""``dyn worker vllm|sglang`` without the engine installed: flags are checked first, then a clear
error, never a traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from dyn.core.model import TINY_MODEL_DIR


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def dyn(engine: str, *args: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dyn.cli", "worker", engine, *args, "--discovery-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("engine", "passed_through", "message"),
    [
        ("vllm", ["--swap-space", "4", "--trust-remote-code"], "vLLM is not installed"),
        ("sglang", ["--attention-backend", "triton", "--enable-metrics"], "SGLang is not installed"),
    ],
)
def test_without_the_engine_it_says_how_to_install_and_exits_1(tmp_path, engine, passed_through, message):
    if installed(engine):
        pytest.skip(f"{engine} is installed here")
    # undeclared engine flags are accepted and passed through; the engine itself is what is missing
    result = dyn(engine, "--model-path", str(TINY_MODEL_DIR), *passed_through, tmp_path=tmp_path)
    assert result.returncode == 1, result.stderr
    assert message in result.stderr and f"dyn[{engine}]" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("engine", "args", "needle"),
    [
        ("vllm", ["--block-size", "0"], "--block-size must be at least 1"),
        ("vllm", ["--scheduling-policy", "lifo"], "fcfs or priority"),
        ("vllm", ["--kv-events-config", "{oops"], "JSON object"),
        ("sglang", ["--radix-eviction-policy", "mru"], "lru or priority"),
        ("sglang", ["--page-size", "0"], "--page-size"),
    ],
)
def test_bad_engine_flags_exit_2_naming_the_flag(tmp_path, engine, args, needle):
    result = dyn(engine, "--model-path", str(tmp_path), *args, tmp_path=tmp_path)
    assert result.returncode == 2 and needle in result.stderr, result.stderr


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_model_is_required(tmp_path, engine):
    result = dyn(engine, tmp_path=tmp_path)
    assert result.returncode == 2 and "--model-path" in result.stderr
