"""The committed completions/ and man/ match what scripts/gen_cli_docs.py generates from the Typer app."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gen_cli_docs.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_cli_docs_are_fresh() -> None:
    gen = _load_script()
    problems = gen.check()
    if problems:
        pytest.fail(gen.check_message(problems), pytrace=False)


def test_generated_files_cover_every_command() -> None:
    gen = _load_script()
    files = gen.render()
    assert {"completions/dyn.bash", "completions/_dyn", "completions/dyn.fish", "man/dyn.1"} <= files.keys()
    for shell in ("dyn.bash", "_dyn", "dyn.fish"):
        assert "_DYN_COMPLETE=complete_" in files[f"completions/{shell}"]
    assert files["completions/_dyn"].startswith("#compdef dyn\n")
    assert all(text.endswith("\n") for text in files.values())
