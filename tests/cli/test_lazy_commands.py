"""A dyn process imports only the command it runs (``dyn.cli.lazy``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dyn.cli.lazy import LazyCommands

SHOW_IMPORTED = """
import atexit, sys
atexit.register(lambda: print("IMPORTED", *sorted(m for m in sys.modules if m.startswith("dyn.")), file=sys.stderr))
sys.argv = ["dyn", *sys.argv[1:]]
from dyn.cli.app import main
main()
"""


def _imported(*args: str) -> tuple[str, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", SHOW_IMPORTED, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stderr.splitlines() if line.startswith("IMPORTED"))
    return done.stdout, set(line.split()[1:])


def test_a_worker_imports_its_engine_alone_and_no_other_command():
    out, modules = _imported("worker", "mocker", "--help")
    assert "--speedup-ratio" in out  # the mocker's own flags were built
    assert "dyn.plugins.mocker" in modules
    for other in (
        "dyn.plugins.vllm",
        "dyn.plugins.sglang",
        "dyn.cli.bench",
        "dyn.cli.frontend",
        "dyn.cli.serve",
    ):
        assert other not in modules


def test_the_root_help_builds_every_command_in_its_order():
    out, modules = _imported("--help")
    listed = ("frontend", "serve", "router", "indexer", "inspect-kv", "keys", "worker", "bench")
    at = [out.index(f"│ {name} ") for name in listed]
    assert at == sorted(at)
    assert {"dyn.cli.bench", "dyn.cli.frontend", "dyn.cli.worker"} <= modules


def test_commands_are_built_at_their_first_lookup_and_those_that_cannot_be_leave_the_listing():
    built: list[str] = []

    def loader(name: str, ok: bool = True):
        def load():
            built.append(name)
            return f"<{name}>" if ok else None

        return load

    commands = LazyCommands({}, {"a": loader("a"), "broken": loader("broken", ok=False), "b": loader("b")})
    assert list(commands) == ["a", "broken", "b"] and "broken" in commands and built == []
    assert commands["b"] == "<b>" and built == ["b"]
    assert commands.get("broken") is None and "broken" not in commands
    with pytest.raises(KeyError):
        commands["missing"]
    assert dict(commands.items()) == {"a": "<a>", "b": "<b>"}
    commands["c"] = "<c>"
    del commands["a"]
    assert list(commands) == ["b", "c"] and len(commands) == 2
