"""``scripts/provision_vllm_cpu.sh`` and ``scripts/provision_sglang_cpu.sh``, each run twice at
once: one builds the cached venv, the other waits on the cache's lock and reuses it; neither
deletes the other's venv (issue 18, item 12).

The engine's install steps are replaced through ``DYN_PROVISION_BUILD`` by a build that takes a while
and leaves a stand-in venv (a ``python`` that imports anything and a ``pip`` that does nothing),
so the test downloads nothing; everything else (the cache check, the lock, the stamps) is the
script's own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
TIMEOUT_S = 120

FAKE_BUILD = """#!/bin/sh
# the stand-in for venv + pip install of the engine: slow enough for a second run to arrive meanwhile
echo "$$" >> "$BUILD_LOG"
mkdir -p "$1/bin"
sleep 2
printf '#!/bin/sh\\ncase "$1" in *make_tiny_llama.py) mkdir -p "$2";; esac\\nexit 0\\n' > "$1/bin/python"
printf '#!/bin/sh\\nexit 0\\n' > "$1/bin/pip"
chmod +x "$1/bin/python" "$1/bin/pip"
"""


@pytest.mark.skipif(shutil.which("flock") is None, reason="flock (util-linux) is not installed")
@pytest.mark.parametrize(
    ("engine", "venv_variable"), [("vllm", "DYN_VLLM_VENV"), ("sglang", "DYN_SGLANG_VENV")]
)
def test_two_runs_at_once_build_once_and_share_the_venv(tmp_path, engine, venv_variable):
    build = tmp_path / "fake_build.sh"
    build.write_text(FAKE_BUILD)
    build.chmod(0o755)
    log = tmp_path / "builds.log"
    venv = tmp_path / "cache" / "dyn" / f"{engine}-cpu-test"
    env = {
        **os.environ,
        venv_variable: str(venv),
        "DYN_PROVISION_BUILD": str(build),
        "BUILD_LOG": str(log),
    }
    runs = [
        subprocess.Popen(
            ["bash", str(SCRIPTS / f"provision_{engine}_cpu.sh")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=TIMEOUT_S) for run in runs]
    for run, (out, err) in zip(runs, outputs):
        assert run.returncode == 0, out + err
        assert out.strip() == str(venv)
    assert len(log.read_text().split()) == 1, "both runs built the venv"
    errors = "".join(err for _, err in outputs)
    assert "waiting for it to finish" in errors and f"cached venv {venv}" in errors
    assert (venv / "bin" / "python").is_file() and (venv / f".dyn-{engine}-cpu").is_file()
    assert (venv / "models" / ".dyn-tiny-llama").is_file()
    if engine == "vllm":  # the vision-language, classification and audio models of the real-vLLM tests
        assert (venv / "models" / ".dyn-tiny-llava").is_file()
        assert (venv / "models" / ".dyn-tiny-classifier").is_file()
        assert (venv / "models" / ".dyn-tiny-qwen2-audio").is_file()
        assert (venv / "models" / ".dyn-tiny-qwen2-vl").is_file()
        assert (venv / ".dyn-vllm-cpu-extras").read_text().split() == ["soundfile"]
    assert (venv.parent / f"{engine}-cpu-test.lock").exists()
