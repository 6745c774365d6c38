"""The agent trace in-process (``--agent-trace-file``, ``dyn.core.frontend.agent_trace``): a line
per finished request with the prompt's chained block hashes, sessions timed by ``delay_ms``,
rotation at ``--agent-trace-max-bytes`` keeping ``--agent-trace-backups`` files, bad settings
refused, a trace that cannot be written stopping tracing, not serving, and the pipes that carry
the entries of HTTP worker processes to the one writer (bounded, never blocking)."""

from __future__ import annotations

import json
import multiprocessing

import pytest

from dyn.core.errors import ConfigError
from dyn.core.frontend.agent_trace import MAX_UNSENT, PipeSink, TraceFile, TraceReceiver
from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.core.messages import AgentTraceEntry
from tests.core.frontend.conftest import CHAT

pytestmark = pytest.mark.anyio


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_each_request_is_a_mooncake_row_with_its_serving_facts(make_frontend, tmp_path):
    trace = tmp_path / "t" / "trace.jsonl"
    async with make_frontend(workers=1, agent_trace_file=str(trace)) as fe:
        headers = {"x-dynamo-session-id": "s1"}
        for _ in range(2):
            r = await fe.client.post(
                "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3}, headers=headers
            )
            assert r.status_code == 200, r.text
        r = await fe.client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})
        assert r.status_code == 200
        asked = [req.token_ids for req in fe.fleet[1].requests]
    first, second, plain = lines(trace)
    assert first["block_size"] == 16  # the fake workers' (tests/core/frontend/fake_workers.py)
    assert first["hash_ids"] == sequence_hashes(block_hashes(asked[0], 16))
    assert (first["input_length"], first["output_length"]) == (len(asked[0]), 3)
    assert first["session_id"] == second["session_id"] == "s1" and "delay_ms" not in first
    assert second["delay_ms"] >= 0 and second["timestamp"] >= first["timestamp"] == 0
    assert "session_id" not in plain and plain["endpoint"] == "completions"
    assert {r["status"] for r in (first, second, plain)} == {"success"}


async def test_the_file_rotates_at_its_size_keeping_its_backups(make_frontend, tmp_path):
    trace = tmp_path / "traces" / "trace.jsonl"
    async with make_frontend(
        workers=1, agent_trace_file=str(trace), agent_trace_max_bytes=4096, agent_trace_backups=2
    ) as fe:
        for _ in range(40):
            r = await fe.client.post("/v1/completions", json={"prompt": "x " * 200, "max_tokens": 1})
            assert r.status_code == 200
    files = sorted(p.name for p in trace.parent.iterdir())
    assert files == ["trace.jsonl", "trace.jsonl.1", "trace.jsonl.2"]
    assert all((trace.parent / name).stat().st_size <= 4096 for name in files)
    assert all(lines(trace.parent / name) for name in files)  # whole lines only


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        TraceFile(tmp_path)
    with pytest.raises(ConfigError, match="at least 4096"):
        TraceFile(tmp_path / "t", max_bytes=10)
    with pytest.raises(ConfigError, match="0 or more"):
        TraceFile(tmp_path / "t", backups=-1)


async def test_a_trace_that_cannot_be_written_stops_tracing_not_serving(make_frontend, tmp_path, caplog):
    trace = tmp_path / "trace.jsonl"
    async with make_frontend(workers=1, agent_trace_file=str(trace)) as fe:
        writer = fe.app.service.agent_trace.sink

        class FullDisk:
            def write(self, data):
                raise OSError(28, "No space left on device")

            def close(self):
                pass

        writer._file = FullDisk()
        for _ in range(2):
            r = await fe.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
            assert r.status_code == 200
        assert writer._file is None
    assert sum("tracing stops" in m for m in caplog.messages) == 1


def entry(request_id: str, received: float, ended: float, session: str | None = None) -> AgentTraceEntry:
    head = {"input_length": 3, "output_length": 1, "hash_ids": [1], "block_size": 16}
    return AgentTraceEntry(head, {"request_id": request_id}, received, ended, session)


def test_entries_sent_down_pipes_are_written_as_one_process_writes_them(tmp_path):
    """Under --num-http-workers each process's entries reach the one writer through a pipe of its
    own; the lines are those a single process's TraceFile writes for the same entries."""
    entries = [entry("a", 10.0, 10.5, "s"), entry("b", 10.2, 10.3), entry("c", 11.0, 11.2, "s")]
    direct = TraceFile(tmp_path / "direct.jsonl")
    direct.write(entries[:2])
    direct.write(entries[2:])
    direct.close()
    receiver = TraceReceiver(TraceFile(tmp_path / "piped.jsonl"))
    first, second = PipeSink(receiver.pipe()), PipeSink(receiver.pipe())
    first.write(entries[:2])
    first.close()  # sends what waits, then closes its end: the receiver sees it end
    second.write(entries[2:])
    second.close()
    receiver.close()
    assert lines(tmp_path / "piped.jsonl") == lines(tmp_path / "direct.jsonl")
    third = lines(tmp_path / "direct.jsonl")[2]
    assert third["timestamp"] == 1000.0 and third["delay_ms"] == 500.0  # 11.0 - 10.0; 11.0 - 10.5


def test_a_worker_process_never_waits_for_a_writer_that_is_behind():
    reading, sending = multiprocessing.Pipe(duplex=False)  # no one reads it
    sink = PipeSink(sending)
    for i in range(MAX_UNSENT + 3000):
        sink.write([entry(f"r{i}", 0.0, 0.0)])
    assert sink.dropped >= 2000  # past what the pipe and MAX_UNSENT hold, dropped and counted
    reading.close()  # the sending thread's write fails now, and it ends
    sink.close()


def test_a_message_that_does_not_decode_is_skipped(tmp_path, caplog):
    receiver = TraceReceiver(TraceFile(tmp_path / "t.jsonl"))
    sending = receiver.pipe()
    sending.send_bytes(b"\xc1 not msgpack")
    sink = PipeSink(sending)
    sink.write([entry("after", 1.0, 1.0)])
    sink.close()
    receiver.close()
    assert [row["request_id"] for row in lines(tmp_path / "t.jsonl")] == ["after"]
    assert any("does not decode" in m for m in caplog.messages)
