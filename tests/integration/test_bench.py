"""``dyn bench`` against a real stack (frontend with the KV router + 2 mocker workers), each workload."""

from __future__ import annotations

import json
import subprocess
import sys

import orjson
import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kv_stack(stack_factory):
    return stack_factory("bench").up("--router-mode", "kv")


def bench(stack, tmp_path, *args, expect=0):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dyn.cli",
            "bench",
            "--url",
            stack.url,
            "--block-size",
            "16",
            "--no-progress",
            "--output",
            str(out),
            "--timeout",
            "60",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=stack.env,
    )
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout


def test_parallel_sampling_bursts_report_workers_cache_and_duplicates(kv_stack, tmp_path):
    result, stdout = bench(
        kv_stack,
        tmp_path,
        "--parallel-sampling",
        "--problems",
        "3",
        "--samples",
        "4",
        "--system-tokens",
        "64",
        "--problem-tokens",
        "32",
        "--max-tokens",
        "8",
        "--concurrency",
        "1",
    )
    s = result["summary"]
    assert (s["requests"], s["succeeded"]) == (12, 12) and s["errors"] == {}
    assert s["output_tokens"] == 12 * 8
    assert s["ttft_s"]["count"] == 12 and s["e2e_s"]["p50"] > 0 and s["queue_s"]["count"] == 12
    assert 0 < s["cached_token_ratio"] < 1  # later siblings and problems reuse the system prompt
    assert sum(s["workers"]["requests"].values()) == 12
    assert s["duplicate_prefills"] is not None and 0 <= s["duplicate_prefills"] <= 3
    assert result["workload"]["theoretical_hit_rate"] > 0.5
    assert "cached-token ratio" in stdout and "TTFT" in stdout


def test_multi_turn_agents_with_sessions_priorities_and_speculative_prefill(kv_stack, tmp_path):
    result, _ = bench(
        kv_stack,
        tmp_path,
        "--multi-turn",
        "--agents",
        "2",
        "--lead-turns",
        "3",
        "--subagents",
        "1",
        "--subagent-turns",
        "2",
        "--system-tokens",
        "64",
        "--turn-tokens",
        "16",
        "--max-tokens",
        "4",
        "--tool-pause",
        "0.05",
        "--speculative-prefill",
        "--priority-mix",
        "0.5",
        "--concurrency",
        "2",
    )
    s = result["summary"]
    assert s["succeeded"] == 2 * (3 + 2) and s["failed"] == 0
    assert s["cached_token_ratio"] > 0.3  # growing histories hit the cache turn after turn
    # each turn finds most of the conversation before it cached (KV routing, sessions)
    assert s["history_cached_ratio"] > 0.5 and isinstance(s["history_moves"], int)
    assert {c.split("/")[0] for c in s["ttft_by_class"]} == {"lead", "subagent"}
    turns = sorted((r["conversation"], r["turn"]) for r in result["requests"])
    assert ("agent0-sub0", 1) in turns and ("agent1-lead", 2) in turns


def test_prefix_groups_open_loop(kv_stack, tmp_path):
    result, _ = bench(
        kv_stack,
        tmp_path,
        "--prefix",
        "--groups",
        "3",
        "--per-group",
        "3",
        "--isl",
        "96",
        "--prefix-ratio",
        "0.5",
        "--max-tokens",
        "4",
        "--request-rate",
        "50",
    )
    s = result["summary"]
    assert s["succeeded"] == 9 and result["config"]["request_rate"] == 50
    assert s["cached_tokens"] > 0


def test_trace_replay_with_sessions_and_compare(kv_stack, tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 3]},
        {"timestamp": 100, "session_id": "s", "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 4]},
        {"session_id": "s", "delay": 200, "input_length": 60, "output_length": 4, "hash_ids": [1, 2, 4, 5]},
        {"timestamp": 300, "input_length": 33, "output_length": 2, "hash_ids": [1, 2, 3]},
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    result, _ = bench(kv_stack, tmp_path, "--trace", str(trace), "--trace-block-size", "16", "--speedup", "2")
    s = result["summary"]
    assert s["succeeded"] == 4 and s["prompt_tokens"] == 40 + 40 + 60 + 33
    assert s["cached_tokens"] >= 32  # the shared hash ids are shared token blocks
    turns = {(r["conversation"], r["turn"]): r for r in result["requests"]}
    assert turns[("ss", 1)]["start_s"] >= turns[("ss", 0)]["end_s"] + 0.1  # delay 200 ms / speedup 2
    first = tmp_path / "first.json"
    (tmp_path / "result.json").rename(first)
    bench(kv_stack, tmp_path, "--trace", str(trace), "--trace-block-size", "16", "--speedup", "4")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dyn.cli",
            "bench",
            "compare",
            str(first),
            str(tmp_path / "result.json"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["metric"]: r for r in json.loads(proc.stdout)}
    assert rows["failed"]["a"] == rows["failed"]["b"] == 0 and rows["ttft_p50_ms"]["a"] > 0


def test_errors_are_counted_by_kind(kv_stack, tmp_path):
    result, stdout = bench(
        kv_stack,
        tmp_path,
        "--prefix",
        "--groups",
        "1",
        "--per-group",
        "2",
        "--isl",
        "16",
        "--max-tokens",
        "2",
        "--model",
        "no-such-model",
        expect=1,
    )
    assert result["summary"]["errors"] == {"http_404": 2}
    assert result["requests"][0]["detail"]


@pytest.fixture(scope="module")
def tool_stack(stack_factory):
    """Mocker workers that answer 70% of the requests offering tools with a schema-valid call, in the
    hermes format dyn-tiny's workers advertise (README "Agents"); the frontend parses the calls."""
    return stack_factory("benchtools").up(
        "--router-mode", "kv", worker_args=("--block-size", "16", "--tool-call-rate", "0.7")
    )


def test_multi_turn_with_tools_answers_real_tool_calls(tool_stack, tmp_path):
    result, stdout = bench(
        tool_stack,
        tmp_path,
        "--multi-turn",
        "--tools",
        "2",
        "--agents",
        "2",
        "--lead-turns",
        "2",
        "--subagents",
        "1",
        "--subagent-turns",
        "2",
        "--system-tokens",
        "64",
        "--turn-tokens",
        "16",
        "--max-tokens",
        "96",
        "--tool-pause",
        "0.01",
        "--tool-result-tokens",
        "16",
        "--concurrency",
        "2",
    )
    s = result["summary"]
    assert s["failed"] == 0 and s["errors"] == {}
    assert result["workload"]["tools"] == 2
    requests = result["requests"]
    scripted = [r for r in requests if r["tool_round"] == 0]
    rounds = [r for r in requests if r["tool_round"] > 0]
    assert len(scripted) == 2 * (2 + 2)  # every scripted turn was sent, whatever the rounds did
    # 8 scripted requests each call with probability 0.7: none at all is a 0.3^8 (7e-5) event
    assert rounds and s["tool_rounds"] == len(rounds) and all(r["tool_round"] <= 4 for r in rounds)
    assert s["tool_calls"] >= len(rounds) and s["invalid_tool_calls"] == 0  # every call's arguments parsed
    assert all(r["cls"].endswith("/tool-round") for r in rounds)
    assert any(c.endswith("/tool-round") for c in s["ttft_by_class"])
    by_position = {(r["conversation"], r["turn"], r["tool_round"]): r for r in requests}
    for r in rounds:
        before = by_position[(r["conversation"], r["turn"], r["tool_round"] - 1)]
        assert before["tool_calls"] >= 1 and r["start_s"] >= before["end_s"]
        assert r["prompt_tokens"] > before["prompt_tokens"] + 16  # the history plus the call and its result
    # a round's prompt extends the one before it, so the KV router finds most of it cached
    assert sum(r["cached_tokens"] for r in rounds) > 0.5 * sum(r["prompt_tokens"] for r in rounds)
    assert "tool rounds" in stdout and "tool-round" in stdout
