"""Summary arithmetic against hand-computed cases."""

from __future__ import annotations

import pytest

from dyn.core.bench.metrics import RequestRecord, distribution, percentile, summarize


def rec(
    conv,
    group,
    start,
    end,
    ttft=None,
    out=0,
    itl=(),
    prompt=None,
    cached=None,
    worker=None,
    error=None,
    queue=None,
    cls=None,
):
    return RequestRecord(
        conversation=conv,
        group=group,
        start_s=start,
        end_s=end,
        ttft_s=ttft,
        output_tokens=out,
        itl_s=list(itl),
        prompt_tokens=prompt,
        cached_tokens=cached,
        worker=worker,
        error=error,
        queue_s=queue,
        cls=cls,
    )


def test_percentiles_interpolate_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile([5.0], 99) == 5.0
    d = distribution([4.0, 1.0, 3.0, 2.0])
    assert (d.count, d.mean, d.min, d.p50, d.max) == (4, 2.5, 1.0, 2.5, 4.0)
    assert distribution([]).count == 0 and distribution([]).p50 is None


def test_summary_of_a_small_run():
    records = [
        rec(
            "a",
            "g1",
            0.0,
            1.0,
            ttft=0.2,
            out=5,
            itl=[0.2, 0.2],
            prompt=100,
            cached=50,
            worker="w1",
            queue=0.01,
            cls="lead/high",
        ),
        rec(
            "b",
            "g1",
            0.5,
            2.0,
            ttft=0.4,
            out=11,
            itl=[0.1],
            prompt=100,
            cached=0,
            worker="w2",
            cls="lead/high",
        ),
        rec("c", "g2", 1.0, 3.0, ttft=0.6, out=4, prompt=200, cached=100, worker="w1"),
        rec("d", "g2", 1.0, 1.5, error="http_503"),
        rec("e", "g3", 2.0, 2.5, ttft=0.1, out=1, worker="w2"),  # no usage: left out of the ratio
    ]
    s = summarize(records, grouped=True)
    assert (s.requests, s.succeeded, s.failed) == (5, 4, 1)
    assert s.duration_s == 3.0
    assert s.request_throughput == pytest.approx(4 / 3)
    assert s.output_throughput == pytest.approx(21 / 3)
    assert (s.prompt_tokens, s.cached_tokens) == (400, 150)
    assert s.cached_token_ratio == pytest.approx(150 / 400)
    assert s.ttft_s.p50 == pytest.approx(0.3) and s.ttft_s.max == 0.6
    assert s.itl_s.count == 3 and s.itl_s.mean == pytest.approx(0.5 / 3)
    assert s.e2e_s.mean == pytest.approx((1.0 + 1.5 + 2.0 + 0.5) / 4)
    # TPOT: a (1.0-0.2)/4, b (1.5-0.4)/10, c (2.0-0.6)/3; e has one token
    assert s.tpot_s.count == 3 and s.tpot_s.max == pytest.approx(1.4 / 3)
    assert s.queue_s.count == 1 and s.queue_s.p50 == 0.01
    assert s.workers.requests == {"w1": 2, "w2": 2} and s.workers.max_share == 0.5
    # g1 on w1 and w2 (1 extra), g2 on w1 only (the failure has no worker), g3 on w2
    assert s.duplicate_prefills == 1
    assert s.errors == {"http_503": 1}
    assert list(s.ttft_by_class) == ["lead/high"] and s.ttft_by_class["lead/high"].count == 2


def test_empty_and_ungrouped_runs():
    s = summarize([])
    assert s.requests == 0 and s.request_throughput == 0.0 and s.cached_token_ratio is None
    assert s.duplicate_prefills is None and s.workers.requests == {}
    s = summarize([rec("a", "g", 0.0, 1.0, ttft=0.1, out=2)], grouped=True)
    assert s.duplicate_prefills is None  # no worker ids: unknown, not zero


def test_tool_calls_rounds_and_invalid_arguments_are_counted():
    records = [
        rec("a", "g", 0.0, 1.0, ttft=0.1, out=4, cls="lead/normal"),
        rec("a", "g", 1.0, 2.0, ttft=0.05, out=4, cls="lead/normal/tool-round"),
        rec("a", "g", 2.0, 3.0, ttft=0.05, out=4, cls="lead/normal/tool-round"),
        rec("b", "g", 0.0, 1.0, error="tool_arguments", cls="lead/normal"),
    ]
    records[0].tool_calls = 2
    records[1].tool_round, records[1].tool_calls = 1, 1
    records[2].tool_round = 2
    records[3].tool_calls = records[3].invalid_tool_calls = 1
    s = summarize(records)
    assert (s.tool_calls, s.tool_rounds, s.invalid_tool_calls) == (4, 2, 1)
    assert s.errors == {"tool_arguments": 1}
    assert s.ttft_by_class["lead/normal/tool-round"].count == 2
    plain = summarize([rec("a", "g", 0.0, 1.0, ttft=0.1, out=1)])
    assert (plain.tool_calls, plain.tool_rounds, plain.invalid_tool_calls) == (0, 0, 0)


def test_history_cached_ratio_counts_what_each_turn_got_of_the_previous_conversation():
    def turn(conv, t, prompt, cached, worker, error=None):
        r = rec(conv, conv, float(t), t + 0.5, ttft=0.1, out=20, prompt=prompt, cached=cached, worker=worker)
        r.turn, r.error = t, error
        return r

    records = [
        turn("a", 2, 200, 96, "w2"),  # moved: got 96 of the 160 full-block tokens of turn 1
        turn("a", 0, 100, 0, "w1"),
        turn("a", 1, 150, 112, "w1"),  # 100 + 20 -> 112 tokens in full blocks, all cached
        turn("b", 0, 300, 0, "w1"),  # a conversation of one request has no history
        turn("c", 0, 64, 0, "w1", error="timeout"),
        turn("c", 1, 100, 64, "w1"),  # its predecessor failed: no pair
    ]
    s = summarize(records, block_size=16)
    assert s.history_cached_ratio == pytest.approx((112 + 96) / (112 + 160))
    assert s.history_moves == 1
    assert summarize(records).history_cached_ratio is None  # no block size, no ratio
    single = summarize([turn("x", 0, 100, 0, "w1")], block_size=16)
    assert (single.history_cached_ratio, single.history_moves) == (None, None)
    unknown = [turn("y", 0, 100, 0, None), turn("y", 1, 150, 112, None)]
    assert summarize(unknown, block_size=16).history_moves is None
