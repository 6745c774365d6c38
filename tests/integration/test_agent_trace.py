"""``--agent-trace-file``: a real ``dyn serve`` (KV router, 2 mocker workers) records a multi-turn
agent run of ``dyn bench``, every line a Mooncake trace row with the serving facts beside it;
``dyn bench replay --offline`` replays the file with the hit rate the live run had (within 2
points), and a request's ``nvext.agent_context`` lands in its line."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.integration.conftest import serve_ready_url

pytestmark = pytest.mark.integration


def dyn(*args: str, timeout: float = 120) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dyn.cli", *args], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_recorded_agent_run_replays_offline_with_its_hit_rate(dyn_process, tmp_path):
    trace = tmp_path / "trace.jsonl"
    proc = dyn_process(
        "serve", "--http-port", "0", "--workers", "2", "--router-mode", "kv", "--block-size", "16",
        "--speedup-ratio", "100", "--agent-trace-file", str(trace),
    )  # fmt: skip
    url = serve_ready_url(proc)
    context = {"workflow_type_id": "coding_agent", "workflow_id": "run-1", "program_id": "run-1:planner"}
    with httpx.Client(timeout=60) as http:
        r = http.post(
            url + "/chat/completions",
            json={
                "messages": [{"role": "user", "content": "plan"}],
                "max_tokens": 2,
                "nvext": {"agent_context": context},
            },
            headers={"x-request-id": "planner-1"},
        )
        assert r.status_code == 200, r.text
        bad = http.post(
            url + "/chat/completions",
            json={
                "messages": [{"role": "user", "content": "x"}],
                "nvext": {"agent_context": {"workflow_id": "w"}},
            },
        )
        assert bad.status_code == 400 and "agent_context" in bad.json()["error"]["param"]
    live = tmp_path / "live.json"
    dyn(
        "bench", "--url", url, "--multi-turn", "--agents", "4", "--lead-turns", "4", "--subagents", "2",
        "--subagent-turns", "3", "--system-tokens", "512", "--turn-tokens", "64", "--max-tokens", "16",
        "--tool-pause", "0", "--block-size", "16", "--concurrency", "1", "--no-progress", "-o", str(live),
    )  # fmt: skip
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    first, run = rows[0], rows[1:]
    assert first["request_id"] == "planner-1" and first["agent_context"] == context
    assert first["session_id"] == "run-1:planner" and first["timestamp"] == 0
    assert len(run) == 4 * (4 + 2 * 3) and {r["status"] for r in run} == {"success"}
    for row in run:
        assert row["block_size"] == 16 and len(row["hash_ids"]) == row["input_length"] // 16
        assert row["output_length"] == 16 and row["worker_id"]["decode_worker_id"] > 0
        assert row["ttft_ms"] > 0 and 0 <= row["kv_hit_rate"] <= 1
    subagent_turns = [r for r in run if r.get("session_id", "").endswith("agent0-sub0")]
    assert len(subagent_turns) == 3
    assert "delay_ms" not in subagent_turns[0] and all(r["delay_ms"] >= 0 for r in subagent_turns[1:])
    live_rate = sum(r["cached_tokens"] for r in run) / sum(r["input_length"] for r in run)
    assert live_rate > 0.5

    run_only = tmp_path / "run.jsonl"
    run_only.write_text("".join(json.dumps(r) + "\n" for r in run))
    replayed = tmp_path / "replay.json"
    dyn(
        "bench", "replay", "--offline", str(run_only), "--num-workers", "2", "--router-mode", "kv",
        "--block-size", "16", "--speedup-ratio", "100", "-o", str(replayed),
    )  # fmt: skip
    summary = json.loads(replayed.read_text())["summary"]
    assert summary["requests"] == len(run)
    assert abs(summary["cached_token_ratio"] - live_rate) <= 0.02, (summary["cached_token_ratio"], live_rate)
