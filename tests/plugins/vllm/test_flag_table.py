"""docs/vllm-serve-flags.md is current for the installed vLLM: every ``vllm serve`` flag has a fate
in dyn, and the committed table is what ``scripts/gen_vllm_flag_table.py`` writes today."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.vllm_cpu import NEEDS_VLLM, python_and_model, vllm_env

ROOT = Path(__file__).resolve().parents[3]


@NEEDS_VLLM
def test_the_vllm_serve_flag_table_is_current():
    python, _ = python_and_model()
    result = subprocess.run(
        [str(python), str(ROOT / "scripts" / "gen_vllm_flag_table.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        env=vllm_env(),
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
