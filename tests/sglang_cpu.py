"""The venv ``scripts/provision_sglang_cpu.sh`` makes, as the live-SGLang tests use it: its Python,
the tiny random model it holds, and the environment SGLang's CPU engine runs in here."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.vllm_cpu import MODEL, engine_serve

VENV = os.environ.get("DYN_SGLANG_VENV")
"""Set by the README's test command; the live-SGLang tests skip without it."""
WHY_SKIPPED = (
    "set DYN_SGLANG_VENV=$(scripts/provision_sglang_cpu.sh) to run dyn's SGLang worker on SGLang's CPU engine"
)
NEEDS_SGLANG = pytest.mark.skipif(not VENV, reason=WHY_SKIPPED)
"""Marks a test that runs dyn's SGLang worker: skipped without the provisioned venv."""
ENGINE_FLAGS = ("--device", "cpu", "--sleep-on-idle")
"""Every live SGLang worker here runs SGLang's CPU engine, and its scheduler sleeps while idle:
by default it polls in a loop that keeps a core busy per worker (on this 2-core machine, all of
it, starving the other processes)."""


def python_and_model() -> tuple[Path, Path]:
    """``(the venv's python, the model directory)``; fails if the venv was not provisioned."""
    venv = Path(VENV or "")
    python, path = venv / "bin" / "python", venv / "models" / MODEL
    assert python.exists() and (path / "config.json").exists(), (
        f"{venv} is not a venv made by scripts/provision_sglang_cpu.sh"
    )
    return python, path


def sglang_env() -> dict[str, str]:
    """This environment plus no hub downloads, unbuffered output, one OpenMP thread per engine."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


@contextmanager
def sglang_serve(root: Path, *flags: str, workers: int = 1) -> Iterator[tuple[str, Path]]:
    """``dyn serve --engine sglang --device cpu`` on the provisioned venv with ``flags``; yields
    ``(base URL, log path)`` once ready and stops the stack after (``tests.vllm_cpu.engine_serve``)."""
    python, model = python_and_model()
    with engine_serve(
        "sglang", python, model, sglang_env(), root, *ENGINE_FLAGS, *flags, workers=workers
    ) as served:
        yield served
