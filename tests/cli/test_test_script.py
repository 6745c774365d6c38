"""``scripts/test.sh``, the README's test command, run in a copy of the repository's layout whose
provisioning scripts and ``python`` are stand-ins: its exit status is the first failing step's,
and 0 when every step passes (the engine venvs' provisioning finished long before the end, as it
does when they are cached).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test.sh"
TIMEOUT_S = 60


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def layout(tmp_path):
    """A repository root holding scripts/test.sh, stand-in provisioning scripts and a bin/ whose
    ``python`` logs its arguments and exits with ``$FAIL_ON`` matched against them."""
    scripts = tmp_path / "repo" / "scripts"
    scripts.mkdir(parents=True)
    shutil.copy(SCRIPT, scripts / "test.sh")
    for engine in ("vllm", "sglang"):
        _executable(
            scripts / f"provision_{engine}_cpu.sh",
            f'#!/bin/sh\n[ "$FAIL_PROVISION" = {engine} ] && exit 3\necho /venvs/{engine}\n',
        )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(
        bin_dir / "python",
        '#!/bin/sh\necho "$DYN_VLLM_VENV|$DYN_SGLANG_VENV|$*" >> "$CALLS"\n'
        'case "$*" in *"$FAIL_ON"*) [ -n "$FAIL_ON" ] && exit 1;; esac\nexit 0\n',
    )
    return tmp_path


def _run(layout: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    calls = layout / "calls.log"
    run = subprocess.run(
        ["bash", str(layout / "repo" / "scripts" / "test.sh"), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={
            **os.environ,
            "PATH": f"{layout / 'bin'}:{os.environ['PATH']}",
            "CALLS": str(calls),
            **env,
        },
    )
    return run, calls.read_text().splitlines() if calls.exists() else []


def test_every_step_passing_exits_0_and_runs_the_suite_then_each_engines_own_paths(layout):
    run, calls = _run(layout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert calls[0] == "||-m pytest -n 2"
    assert calls[1].startswith(
        "/venvs/vllm|/venvs/sglang|-m pytest -n 2 --dist loadfile -m not all_engines "
        "tests/integration/test_vllm_serve.py tests/integration/test_sglang_serve.py "
    )
    assert len(calls) == 2
    assert not any("multimodal" in call or "disagg" in call for call in calls)


def test_all_engines_adds_the_priority_runs_alone_and_vllms_model_variants(layout):
    run, calls = _run(layout, "--all-engines")
    assert run.returncode == 0, run.stdout + run.stderr
    assert calls[2] == "/venvs/vllm||-m pytest -m all_engines tests/integration/test_vllm_serve.py"
    assert calls[3] == "|/venvs/sglang|-m pytest -m all_engines tests/integration/test_sglang_serve.py"
    assert calls[4].startswith("/venvs/vllm||-m pytest -n 2 --dist loadfile tests/integration/")
    for variant in (
        "test_vllm_multimodal.py",
        "test_vllm_disagg.py",
        "test_real_vllm_audio.py",
        "test_vllm_lora.py",
    ):
        assert variant in calls[4]


def test_an_unknown_argument_is_refused_before_anything_runs(layout):
    run, calls = _run(layout, "--all")
    assert run.returncode == 2
    assert "usage: scripts/test.sh [--all-engines]" in run.stderr
    assert calls == []


def test_a_failing_suite_fails_before_the_engine_tests(layout):
    run, calls = _run(layout, FAIL_ON="-n 2")
    assert run.returncode == 1
    assert len(calls) == 1


def test_a_failing_engine_step_fails_the_run(layout):
    run, _ = _run(layout, FAIL_ON="test_sglang_serve")
    assert run.returncode == 1


def test_failed_provisioning_fails_the_run_and_says_so(layout):
    run, calls = _run(layout, FAIL_PROVISION="sglang")
    assert run.returncode == 1
    assert "provisioning the engine venvs failed" in run.stderr
    assert len(calls) == 1
