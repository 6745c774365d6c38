"""The results file (schema, round trip, refusals), the summary tables, compare and the plot."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from dyn.core.bench.compare import compare_rows, compare_table
from dyn.core.bench.metrics import RequestRecord, summarize
from dyn.core.bench.plot import plot_result, throughput_series
from dyn.core.bench.report import SCHEMA, BenchResult, ResultError, print_summary, read_result, write_result


def result(ttft: float, cached: int, workers=("w1", "w2")) -> BenchResult:
    records = [
        RequestRecord(
            conversation=f"c{i}",
            group=f"g{i // 2}",
            start_s=i * 0.5,
            end_s=i * 0.5 + 1.0,
            ttft_s=ttft,
            output_tokens=10,
            itl_s=[0.05] * 9,
            prompt_tokens=100,
            cached_tokens=cached,
            worker=workers[i % len(workers)],
        )
        for i in range(4)
    ]
    return BenchResult(
        kind="live",
        workload={"workload": "prefix"},
        config={"concurrency": 2},
        summary=summarize(records, grouped=True),
        requests=records,
    )


def test_results_round_trip_with_the_documented_schema(tmp_path):
    path = tmp_path / "r.json"
    original = result(0.2, 50)
    write_result(path, original)
    raw = json.loads(path.read_text())
    assert raw["schema"] == SCHEMA and raw["kind"] == "live"
    assert set(raw) == {"schema", "kind", "workload", "config", "summary", "requests"}
    assert {
        "ttft_s",
        "itl_s",
        "tpot_s",
        "e2e_s",
        "queue_s",
        "request_throughput",
        "output_throughput",
        "cached_token_ratio",
        "workers",
        "duplicate_prefills",
        "errors",
    } <= set(raw["summary"])
    assert set(raw["summary"]["ttft_s"]) == {"count", "mean", "min", "p50", "p90", "p95", "p99", "max"}
    assert raw["requests"][0]["worker"] == "w1"
    assert read_result(path) == original


def test_unreadable_results_are_refused_with_a_sentence(tmp_path):
    with pytest.raises(ResultError, match="cannot read"):
        read_result(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{nope")
    with pytest.raises(ResultError, match="not JSON"):
        read_result(tmp_path / "x.json")
    (tmp_path / "y.json").write_text('{"schema": "other"}')
    with pytest.raises(ResultError, match="not a dyn bench result"):
        read_result(tmp_path / "y.json")
    (tmp_path / "z.json").write_text(json.dumps({"schema": SCHEMA, "kind": "live"}))
    with pytest.raises(ResultError, match="not a valid dyn bench result"):
        read_result(tmp_path / "z.json")


def test_compare_computes_deltas_and_direction():
    a, b = result(0.2, 25), result(0.1, 50, workers=("w1",))
    rows = {r["metric"]: r for r in compare_rows(a, b)}
    ttft = rows["ttft_p50_ms"]
    assert ttft["a"] == pytest.approx(200) and ttft["b"] == pytest.approx(100)
    assert ttft["delta"] == pytest.approx(-100) and ttft["relative"] == pytest.approx(-0.5) and ttft["better"]
    cached = rows["cached_token_ratio"]
    assert cached["delta"] == pytest.approx(0.25) and cached["better"]
    dup = rows["duplicate_prefills"]
    assert (dup["a"], dup["b"], dup["better"]) == (2.0, 0.0, True)
    assert rows["history_cached_ratio"]["delta"] is None  # single-request conversations: no history
    assert rows["request_throughput"]["delta"] == 0 and rows["request_throughput"]["better"] is None
    assert rows["queue_p50_ms"]["a"] is None and rows["queue_p50_ms"]["delta"] is None
    console = Console(record=True, width=120)
    console.print(compare_table(compare_rows(a, b), "a.json", "b.json"))
    text = console.export_text()
    assert "ttft_p50_ms" in text and "-50.0%" in text and "+25.0 pt" in text


def test_summary_tables_show_totals_latency_and_classes():
    r = result(0.2, 50)
    r.requests[0].cls = "lead/high"
    r.summary = summarize(r.requests, grouped=True)
    console = Console(record=True, width=120)
    print_summary(r, console)
    text = console.export_text()
    for needle in ("cached-token ratio", "50.0%", "duplicate prefills", "TTFT lead/high", "TPOT", "w1: 2"):
        assert needle in text


def test_plot_writes_a_png_and_bins_throughput(tmp_path):
    r = result(0.2, 50)
    times, rates = throughput_series(r, 1.0)
    # 10 tokens per request, one per chunk from start + 0.2 s every 0.05 s: 0.2-0.65, 0.7-1.15,
    # 1.2-1.65, 1.7-2.15 s; counted where they arrived, not at each request's end
    assert times == [0.0, 1.0, 2.0] and sum(rates) == 40.0 and rates[2] < rates[1]
    path = tmp_path / "out.png"
    plot_result(r, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_throughput_bins_tokens_by_arrival_so_a_long_reply_is_no_spike():
    """One request streaming 100 tokens over 10 s (a chunk of 10 each second) is 10 tokens/s in
    every bin, where binning at its end showed 100 tokens/s in the last one."""
    r = result(0.2, 50)
    r.requests = [
        RequestRecord(
            conversation="long",
            group="g",
            start_s=0.0,
            end_s=10.0,
            ttft_s=0.5,
            output_tokens=100,
            itl_s=[1.0] * 9,
        ),
        RequestRecord(conversation="silent", group="g", start_s=0.0, end_s=3.5, ttft_s=None, output_tokens=4),
    ]
    times, rates = throughput_series(r, 1.0)
    assert times == [float(i) for i in range(10)]
    assert rates == [10.0, 10.0, 10.0, 14.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0]


def test_tool_counts_in_the_table_and_results_written_before_them_still_read(tmp_path):
    r = result(0.2, 50)
    console = Console(record=True, width=120)
    print_summary(r, console)
    assert "tool calls" not in console.export_text()  # a run without tools shows what it always did
    r.requests[1].tool_round, r.requests[1].tool_calls = 1, 2
    r.requests[2].tool_calls = r.requests[2].invalid_tool_calls = 1
    r.summary = summarize(r.requests, grouped=True)
    console = Console(record=True, width=120)
    print_summary(r, console)
    text = console.export_text()
    assert "tool calls (invalid)" in text and "3 (1)" in text and "tool rounds" in text
    path = tmp_path / "r.json"
    write_result(path, r)
    raw = json.loads(path.read_text())
    assert (
        raw["summary"]["tool_calls"],
        raw["summary"]["tool_rounds"],
        raw["summary"]["invalid_tool_calls"],
    ) == (3, 1, 1)
    for key in ("tool_calls", "tool_rounds", "invalid_tool_calls"):
        del raw["summary"][key]
    for request in raw["requests"]:
        for key in ("tool_round", "tool_calls", "invalid_tool_calls"):
            del request[key]
    path.write_text(json.dumps(raw))
    old = read_result(path)
    assert old.summary.tool_calls == 0 and old.requests[1].tool_round == 0
