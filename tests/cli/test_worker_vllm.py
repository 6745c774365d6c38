"""``dyn worker vllm`` without vLLM: flags are checked first, then a clear error, never a traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                                reason="vLLM is installed here; tests/integration/test_vllm_serve.py covers it")


def dyn(*args: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dyn.cli", "worker", "vllm", *args,
                           "--discovery-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)


def test_without_vllm_it_says_how_to_install_and_exits_1(tmp_path):
    # an undeclared vLLM flag is accepted and passed through; vLLM itself is what is missing
    result = dyn("--model-path", str(tmp_path), "--swap-space", "4", "--trust-remote-code",
                 tmp_path=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "vLLM is not installed" in result.stderr and "dyn[vllm]" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--block-size", "0"], "--block-size must be at least 1"),
    (["--scheduling-policy", "lifo"], "fcfs or priority"),
    (["--kv-events-config", "{oops"], "JSON object"),
])
def test_bad_engine_flags_exit_2_naming_the_flag(tmp_path, args, needle):
    result = dyn("--model-path", str(tmp_path), *args, tmp_path=tmp_path)
    assert result.returncode == 2 and needle in result.stderr, result.stderr


def test_the_model_is_required(tmp_path):
    result = dyn(tmp_path=tmp_path)
    assert result.returncode == 2 and "--model-path" in result.stderr
