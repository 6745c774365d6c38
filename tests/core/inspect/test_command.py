"""``dyn inspect-kv`` end to end over an in-process index (JSON, tables, --watch), and the one
sentence and exit status it gives for what a user can get wrong."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from dyn.cli.app import app
from dyn.core.inspect import command
from dyn.core.inspect.command import InspectSettings, run_inspect
from dyn.core.inspect.target import open_target
from tests.core.inspect.index_state import BS, ENTRIES, MODEL, NODES, A, asgi_client, kv_app

runner = CliRunner()


@pytest.fixture
def served(monkeypatch):
    """``run_inspect`` reads the known index state served under /kv/ at any URL."""
    monkeypatch.setattr(
        command, "open_target", lambda url, **_: open_target(url, client=asgi_client(kv_app(prefix="/kv")))
    )


def test_json_is_one_object_with_the_known_numbers(served, capsys, tmp_path):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    run_inspect(InspectSettings(url="http://fe:1", json=True))
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    data = json.loads(out[0])
    assert (data["target"], data["model"], data["block_size"]) == ("http://fe:1/kv", MODEL, BS)
    assert data["cached_blocks"] == ENTRIES and data["tree"]["nodes"] == NODES
    assert [w["blocks"] for w in data["workers"]] == [6, 2, 4, 3, 0]
    assert data["hit_rate"] is None and data["overlap"] is None


def test_tables_show_workers_depths_and_the_overlap(served, capsys):
    run_inspect(InspectSettings(url="http://fe:1", prompt="hello"))
    out = capsys.readouterr()
    assert "Cached blocks per worker" in out.out and "Blocks by chain depth" in out.out
    assert str(A[0]) in out.out and "6.0%" in out.out  # A: 6 of 100 blocks
    assert "Cached prefix of the request" in out.out
    assert "n/a (the target has no KV router)" in out.out
    assert "tokenized with 'dyn-tiny'" in out.err  # the index serves another model


def test_watch_refreshes_until_the_duration_ends(served, capsys):
    run_inspect(InspectSettings(url="http://fe:1", json=True, watch=True, interval_s=0.05, duration_s=0.1))
    frames = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(frames) >= 2 and all(f["tree"] is None for f in frames)
    run_inspect(InspectSettings(url="http://fe:1", watch=True, interval_s=0.05, duration_s=0.05))
    assert "Cached blocks per worker" in capsys.readouterr().out


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--url", f"http://127.0.0.1:{_closed_port()}"], 1, "cannot reach"),
        (["--url", "localhost"], 1, "not an HTTP URL"),
        (["--prompt", "a", "--messages", "b"], 2, "not both"),
        (["--messages", "/nonexistent/chat.json"], 2, "cannot read --messages"),
    ],
)
def test_mistakes_are_one_sentence_and_a_status(args, status, message):
    result = runner.invoke(app, ["inspect-kv", *args])
    assert result.exit_code == status, result.output
    assert result.output.startswith("error: ") and message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_bad_interval_is_a_usage_error():
    assert runner.invoke(app, ["inspect-kv", "--interval", "0"]).exit_code == 2


def test_nothing_in_discovery_says_what_to_pass(tmp_path):
    result = runner.invoke(app, ["inspect-kv", "--discovery-dir", str(tmp_path), "--namespace", "empty"])
    assert result.exit_code == 1
    assert "no live dyn indexer of any model in namespace 'empty'" in result.output
    assert "--url" in result.output
