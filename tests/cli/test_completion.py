"""The generated completion scripts complete real command lines in real shells (issue 18, item 8).

Each test starts the shell as a user's would load the script (``source completions/...``), sets
the words typed so far the way the shell does at TAB, calls the script's completion function and
reads what it offers: bash's ``COMPREPLY``, zsh's ``_arguments`` spec, fish's ``complete -C``.
The function calls back into the installed ``dyn`` (the console script beside this Python), as
it does for a user. Shells that are not installed are skipped, saying which.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPLETIONS = ROOT / "completions"
TIMEOUT_S = 60
MODES = {"kv", "round-robin", "random", "power-of-two", "least-loaded", "device-aware-weighted", "direct"}


def _env(tmp_path: Path) -> dict[str, str]:
    """No rc file of the user's, and ``dyn`` resolved to this environment's console script."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "dyn").exists(), "the dyn console script is not installed beside this Python"
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "LANG": "C.UTF-8",
    }


def _run(argv: list[str], tmp_path: Path) -> str:
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=_env(tmp_path), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not supported" not in proc.stderr, proc.stderr
    return proc.stdout


def _shell(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed, so its completion script cannot be run")
    return path


def bash_complete(line: str, tmp_path: Path) -> list[str]:
    """What bash offers at the end of ``line``, as ``complete -F`` would call the function."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    script = (
        f"source {shlex.quote(str(COMPLETIONS / 'dyn.bash'))}\n"
        f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\n"
        f"COMP_LINE={shlex.quote(line)}\n"
        f"COMP_POINT={len(line)}\n"
        "_dyn_completion dyn\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = _run([_shell("bash"), "--norc", "--noprofile", "-c", script], tmp_path)
    return [w for w in out.splitlines() if w]


def zsh_complete(line: str, tmp_path: Path) -> list[str]:
    """The values zsh would offer at the end of ``line``: ``compdef`` and ``_arguments`` are
    stand-ins that print what the script hands them (zsh's completion system needs a terminal)."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    script = (
        "compdef() { : }\n"
        '_arguments() { print -r -- "$@" }\n'
        "_files() { print -r -- _files }\n"
        f"source {shlex.quote(str(COMPLETIONS / '_dyn'))}\n"
        f"words=({' '.join(shlex.quote(w) for w in words)})\n"
        f"CURRENT={len(words)}\n"
        "_dyn_completion\n"
    )
    out = _run([_shell("zsh"), "-f", "-c", script], tmp_path)
    assert out.startswith("*: :((") or out.strip() == "_files", out
    # eval joins the spec's lines with spaces: each offer is ' "value"' or ' "value":"help"'
    return re.findall(r'(?:^|\s)"((?:[^"]|"")*)"(?=:"|\s|\)\))', out.strip().removeprefix("*: :(("))


def fish_complete(line: str, tmp_path: Path) -> list[str]:
    """What fish offers at the end of ``line`` (``complete -C``: value TAB description)."""
    script = f"source {shlex.quote(str(COMPLETIONS / 'dyn.fish'))}; complete -C {shlex.quote(line)}"
    out = _run([_shell("fish"), "--no-config", "-c", script], tmp_path)
    return [row.split("\t")[0] for row in out.splitlines() if row]


SHELLS = {"bash": bash_complete, "zsh": zsh_complete, "fish": fish_complete}


@pytest.mark.parametrize("shell", SHELLS)
def test_commands_subcommands_flags_and_values_complete(shell, tmp_path):
    complete = SHELLS[shell]
    assert complete("dyn wor", tmp_path) == ["worker"]
    assert set(complete("dyn worker ", tmp_path)) == {"mocker", "vllm", "sglang"}
    assert complete("dyn frontend --router-m", tmp_path) == ["--router-mode"]
    # exactly the modes: no line of a description wrapped at the terminal's width (``direct``'s is long)
    assert set(complete("dyn frontend --router-mode ", tmp_path)) == MODES
    assert complete("dyn frontend --router-mode ro", tmp_path) == ["round-robin"]
    assert set(complete("dyn bench ", tmp_path)) >= {"compare", "replay"}
    assert set(complete("dyn --log-format ", tmp_path)) == {"rich", "json"}
    # the flags dyn serve hands to its frontend and to its engine's worker, and their values
    assert complete("dyn serve --router-m", tmp_path) == ["--router-mode"]
    assert set(complete("dyn serve --workers 3 --router-mode ", tmp_path)) == MODES
    assert complete("dyn serve --engine sglang --enable-streaming-s", tmp_path) == [
        "--enable-streaming-session"
    ]


@pytest.mark.parametrize(("shell", "name"), [("bash", "dyn.bash"), ("zsh", "_dyn"), ("fish", "dyn.fish")])
def test_show_completion_prints_the_committed_script_of_the_shell_it_runs_in(shell, name, tmp_path):
    shown = _run([_shell(shell), "-c", "dyn --show-completion; true"], tmp_path)
    committed = (COMPLETIONS / name).read_text().splitlines()
    assert [line for line in shown.splitlines() if line.strip()] == [
        line for line in committed if line.strip() and not line.startswith("# Generated")
    ]
