"""Offline replay (``dyn.core.bench.replay``): the real router over simulated mocker workers
(``dyn.plugins.mocker.simulator``) in virtual time."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyn.core.bench import trace
from dyn.core.bench.metrics import summarize
from dyn.core.bench.replay import ReplaySettings, replay, trace_shape
from dyn.core.bench.trace import TokenSynth, TraceRow, draws, seed_words, seeded_draws
from dyn.core.errors import ConfigError
from dyn.core.router.config import KvRouterConfig
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.simulator import MockerSimulator


def offline(mocker: MockerConfig | None = None, **fields) -> ReplaySettings:
    """Replay settings over simulated mocker workers configured by ``mocker``."""
    return ReplaySettings(simulator=MockerSimulator(mocker), **fields)


def row(ts_ms=0.0, isl=1000, osl=5, ids=(1, 2), session=None, delay_ms=None):
    return TraceRow(
        input_length=isl,
        output_length=osl,
        hash_ids=tuple(ids),
        timestamp_ms=ts_ms,
        session_id=session,
        delay_ms=delay_ms,
    )


def later(session, delay_ms, isl=1000, osl=5, ids=(1, 2)):
    return TraceRow(
        input_length=isl, output_length=osl, hash_ids=tuple(ids), session_id=session, delay_ms=delay_ms
    )


def by_conversation(records):
    return {(r.conversation, r.turn): r for r in records}


def prefill_ms(n):  # Dynamo's polynomial, written out for the hand check
    return 4.209989e-07 * n * n + 1.518344e-02 * n + 16.50142 if n else 0.0


def decode_ms(u):
    return max(-25.74 * u * u + 54.01 * u + 5.74, 1.0)


# --------------------------------------------------------------------------- tokens


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(0, 300),
    low=st.integers(0, 20),
    span=st.sampled_from([1, 2, 3, 100, 4096, 32000, 1 << 20, 1 << 33]),
    seed=st.integers(0, 3),
)
def test_bulk_draws_are_randrange_draws(count, low, span, seed):
    rng = random.Random(seed)
    expected = [rng.randrange(low, low + span) for _ in range(count)]
    assert draws(random.Random(seed), count, low, low + span).tolist() == expected


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(max_size=40),
    count=st.integers(0, 1300),  # past one twist of the generator's 624 words
    low=st.integers(0, 20),
    span=st.sampled_from([1, 2, 3, 100, 4096, 32000, 151936, 1 << 20, (1 << 32) - 21]),
)
def test_seeded_draws_are_a_seeded_generators_randrange_draws(text, count, low, span):
    rng = random.Random(text)
    expected = [rng.randrange(low, low + span) for _ in range(count)]
    ints = list(range(low + span)) if span < 1 << 21 else None
    if ints is not None:
        got = seeded_draws(text, count, low, low + span, ints)
        assert got == expected and all(a is ints[a] for a in got)  # the shared int objects
        with pytest.MonkeyPatch.context() as patch:  # an install without a C compiler
            patch.setattr(trace, "_mt", None)
            assert seeded_draws(text, count, low, low + span, ints) == expected
    if trace._mt is not None:  # the C path itself, also with new ints and a 32-bit range
        assert trace._mt.draws(seed_words(text), count, low, low + span, None) == expected


@pytest.mark.skipif(trace._mt is None, reason="the C extension was not built")
@pytest.mark.parametrize(
    ("key", "low", "high", "ints"),
    [
        (b"", 0, 10, None),
        (b"abc", 0, 10, None),
        (b"abcd", 5, 5, None),
        (b"abcd", -1, 10, None),
        (b"abcd", 0, 1 << 33, None),
        (b"abcd", 0, 10, [1, 2]),
        (b"abcd", 0, 10, (1,) * 10),
    ],
)
def test_the_c_draws_decline_what_they_do_not_take(key, low, high, ints):
    assert trace._mt.draws(key, 3, low, high, ints) is None


def test_the_block_cache_is_bounded_and_blocks_are_stable():
    synth = TokenSynth(4, 100, seed=1, cache_blocks=2)
    first = synth.block(1).tolist()
    synth.block(2), synth.block(3)
    assert len(synth._cache) == 2 and synth.block(1).tolist() == first


@pytest.mark.parametrize("vocab", [1000, 1 << 21])  # shared int lists, and numpy arrays
def test_a_planned_block_is_drawn_once_and_dropped_after_its_last_use(vocab, monkeypatch):
    rows = [
        TraceRow(input_length=10, output_length=1, hash_ids=(1, 2, 3)),
        TraceRow(input_length=12, output_length=1, hash_ids=(1, 2, 5)),
        TraceRow(input_length=4, output_length=1, hash_ids=(1, 9)),  # 9 is past its prompt
    ]
    expected = [TokenSynth(4, vocab, seed=2).prompt(row, salt=i) for i, row in enumerate(rows)]
    synth = TokenSynth(4, vocab, seed=2, cache_blocks=1)  # the plan, not the cap, decides
    synth.plan(rows)
    texts: list[str] = []  # each block's seed text as its tokens are drawn
    if vocab <= 1 << 20:
        real = trace.seeded_draws
        monkeypatch.setattr(trace, "seeded_draws", lambda text, *a: texts.append(text) or real(text, *a))
    else:
        seeded = SimpleNamespace(Random=lambda text: texts.append(text) or random.Random(text))
        monkeypatch.setattr(trace, "random", seeded)

    def kept() -> set[int]:
        return set(synth._lists) | set(synth._cache)

    assert synth.prompt(rows[0], salt=0) == expected[0] and kept() == {1, 2}  # 3: its only use
    assert synth.prompt(rows[1], salt=1) == expected[1] and kept() == {1}
    assert synth.prompt(rows[2], salt=2) == expected[2] and kept() == set()
    assert sorted(int(t.split(":")[1]) for t in texts if ":tail:" not in t) == [1, 2, 3, 5]
    # a prompt outside the plan is made the same, and keeps nothing
    assert synth.prompt(rows[0], salt=0) == expected[0] and kept() == set()


# --------------------------------------------------------------------------- timing


def test_one_request_matches_the_timing_formulas():
    mocker = MockerConfig()
    result = replay([row(ts_ms=2000.0, isl=1000, osl=5)], offline(mocker=mocker))
    [rec] = result.records
    blocks = -(-1000 // mocker.block_size)  # 16: the 4 output tokens fit in the last block
    gap = decode_ms(blocks / mocker.num_gpu_blocks) / 1000
    assert rec.error is None and rec.worker == "0"
    assert rec.start_s == pytest.approx(2.0)
    assert rec.ttft_s == pytest.approx(prefill_ms(1000) / 1000)
    assert rec.itl_s == pytest.approx([gap] * 4)
    assert rec.end_s == pytest.approx(2.0 + prefill_ms(1000) / 1000 + 4 * gap)
    assert (rec.prompt_tokens, rec.cached_tokens, rec.output_tokens, rec.queue_s) == (1000, 0, 5, 0.0)
    assert result.passes == 5 and result.sim_s == pytest.approx(rec.e2e_s)


def test_speedup_ratio_of_the_engine_scales_pass_times():
    result = replay([row(isl=1000, osl=1)], offline(mocker=MockerConfig(speedup_ratio=4.0)))
    assert result.records[0].ttft_s == pytest.approx(prefill_ms(1000) / 4 / 1000)


# --------------------------------------------------------------------------- routing


def shared_prefix_trace():
    # the second request arrives after the first finished and repeats its two blocks
    return [row(0.0, isl=1024, osl=3, ids=(7, 8)), row(5000.0, isl=1024, osl=3, ids=(7, 8))]


def test_kv_mode_follows_the_cache_and_round_robin_does_not():
    for seed in range(6):  # the first pick is a tie between idle workers; the second never is
        kv = by_conversation(replay(shared_prefix_trace(), offline(num_workers=2, seed=seed)).records)
        assert kv["r1", 0].worker == kv["r0", 0].worker
        assert kv["r1", 0].cached_tokens == 1024 - 64  # all but the last block: one token is computed
        assert kv["r1", 0].ttft_s < kv["r0", 0].ttft_s

    rr = by_conversation(
        replay(shared_prefix_trace(), offline(num_workers=2, router_mode="round-robin")).records
    )
    assert rr["r1", 0].worker != rr["r0", 0].worker
    assert rr["r1", 0].cached_tokens == 0


def test_duplicate_prefills_are_counted():
    rr = replay(shared_prefix_trace(), offline(num_workers=2, router_mode="round-robin"))
    kv = replay(shared_prefix_trace(), offline(num_workers=2))
    assert rr.duplicate_prefill_blocks == 1024 // 64 and kv.duplicate_prefill_blocks == 0
    assert rr.stored_blocks == 2 * kv.stored_blocks


def noisy_trace(n=40, seed=3):
    rng = random.Random(seed)
    return [
        row(
            ts_ms=rng.uniform(0, 2000),
            isl=rng.randrange(100, 3000),
            osl=rng.randrange(1, 30),
            ids=[rng.randrange(6)] + [1000 + i * 10 + k for k in range(5)],
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(
    "mode,router", [("kv", KvRouterConfig(temperature=0.7)), ("random", KvRouterConfig())]
)
def test_same_seed_same_records(mode, router):
    trace = noisy_trace()

    def run(seed):
        return replay(trace, offline(num_workers=3, router_mode=mode, router=router, seed=seed)).records

    first = run(1)
    assert len(first) == 40 and all(r.error is None for r in first)
    assert first == run(1)
    assert [r.worker for r in first] != [r.worker for r in run(2)]


# --------------------------------------------------------------------------- time and sessions


def test_sessions_wait_for_the_previous_turn_plus_the_delay():
    trace = [
        row(0.0, session="a", ids=(1, 2)),
        row(100.0, ids=(9,), isl=300),
        later("a", 1500.0, isl=1500, ids=(1, 2, 3)),
        later("a", 0.0, isl=1600, ids=(1, 2, 3, 4)),
    ]
    for speedup in (1.0, 2.0):
        recs = by_conversation(replay(trace, offline(num_workers=2, speedup=speedup)).records)
        assert recs["r1", 0].start_s == pytest.approx(0.1 / speedup)
        assert recs["sa", 1].start_s == pytest.approx(recs["sa", 0].end_s + 1.5 / speedup)
        assert recs["sa", 2].start_s == pytest.approx(recs["sa", 1].end_s)
        assert recs["sa", 1].cached_tokens == 960  # the 15 full blocks turn 0 left cached
        assert recs["sa", 2].worker == recs["sa", 0].worker  # kv follows the conversation's cache


def test_an_hour_of_trace_is_virtual_time():
    trace = [row(ts_ms=i * 60_000.0, isl=2000, osl=20, ids=(i,)) for i in range(61)]
    result = replay(trace, offline(num_workers=2))
    assert len(result.records) == 61 and all(r.error is None for r in result.records)
    assert result.sim_s == pytest.approx(3600 + result.records[-1].e2e_s)
    assert result.passes == 61 * 20  # one prefill pass and 19 decode passes each, nothing idle
    summary = summarize(result.records)
    assert summary.duration_s == pytest.approx(result.sim_s)


# --------------------------------------------------------------------------- queue and failures


def test_requests_wait_in_the_router_queue_and_all_complete():
    trace = [row(0.0, isl=1000, osl=4, ids=(i * 10, i * 10 + 1)) for i in range(6)]
    config = KvRouterConfig(queue_threshold=0.01)  # busy as soon as 82 prompt tokens are pending
    result = replay(trace, offline(num_workers=1, router=config))
    recs = sorted(result.records, key=lambda r: r.ttft_s)
    assert len(recs) == 6 and all(r.error is None for r in recs)
    assert result.router_queued == 5 and result.router_queue_s > 0
    # each waits for the previous one's first token: one prefill at a time
    assert [r.queue_s > 0 for r in recs] == [False] + [True] * 5
    assert all(b.ttft_s > a.ttft_s for a, b in zip(recs, recs[1:]))

    free = replay(trace, offline(num_workers=1))
    assert free.router_queued == 0 and max(r.ttft_s for r in free.records) < recs[-1].ttft_s


def test_busy_workers_reject_and_oversized_prompts_fail_alone():
    config = KvRouterConfig(active_prefill_tokens_threshold=1)
    trace = [
        row(0.0, isl=1000, ids=(1, 2)),
        row(0.0, isl=1000, ids=(3, 4)),
        row(0.0, isl=5000, ids=(5,)),
        row(9000.0, isl=300, ids=(6,)),
    ]
    mocker = MockerConfig(num_gpu_blocks=40)  # 2560 tokens of KV: the 5000-token prompt cannot fit
    recs = by_conversation(replay(trace, offline(num_workers=1, router=config, mocker=mocker)).records)
    assert recs["r0", 0].error is None and recs["r3", 0].error is None
    assert recs["r1", 0].error == "http_503"
    assert recs["r2", 0].error in ("http_503", "bad_request")
    oversized = replay(
        [row(0.0, isl=5000, ids=(5,)), row(1.0, isl=300, ids=(6,))], offline(mocker=mocker)
    ).records
    assert [r.error for r in oversized] == ["bad_request", None]
    assert "KV capacity" in oversized[0].detail


def test_settings_are_checked():
    for bad, words in (
        (offline(router_mode="direct"), "round-robin"),
        (offline(num_workers=0), "--num-workers"),
        (offline(speedup=0), "--speedup"),
        (offline(router=KvRouterConfig(use_remote_indexer=True)), "--use-remote-indexer"),
        (offline(mocker=MockerConfig(block_size=0)), "--block-size"),
    ):
        with pytest.raises(ConfigError, match=words):
            replay([row()], bad)


def test_trace_shape():
    trace = [
        row(0.0, isl=1024, osl=2, ids=(1, 2)),
        row(4000.0, isl=1024, osl=4, ids=(1, 2)),
        row(1000.0, session="s", isl=512, ids=(3,)),
        later("s", 5.0, isl=1024, ids=(3, 4)),
    ]
    shape = trace_shape(trace, block_size=512, speedup=2.0)
    assert shape["requests"] == 4 and shape["sessions"] == 1 and shape["span_s"] == 2.0
    assert shape["theoretical_hit_rate"] == pytest.approx(3 / 7)
    assert shape["mean_osl_tokens"] == pytest.approx((2 + 4 + 5 + 5) / 4)


def test_the_router_reads_virtual_time():
    # approximate mode: predictions expire ttl_secs after they were recorded, in virtual time
    config = KvRouterConfig(use_kv_events=False, ttl_secs=100.0)
    trace = [
        row(0.0, isl=1024, osl=1, ids=(1, 2)),
        row(50_000.0, isl=1024, osl=1, ids=(1, 2)),
        row(500_000.0, isl=1024, osl=1, ids=(1, 2)),
    ]
    moved = 0
    for seed in range(8):
        recs = replay(trace, offline(num_workers=2, router=config, seed=seed)).records
        assert recs[1].worker == recs[0].worker and recs[1].cached_tokens > 0  # still predicted
        moved += recs[2].worker != recs[0].worker  # expired: a tie between two idle workers
    assert moved > 0
