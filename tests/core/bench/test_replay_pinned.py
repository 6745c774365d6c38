"""Offline replay results pinned bit for bit: the speed work on the replay path (issue 21 item 6:
the driver ``dyn.core.bench.replay``, the mocker's scheduler and KV cache, the KV-event conversion)
must not change a single record.

Each scenario replays a small seeded trace of the shape ``tests/perf/replay_vs_anchor.py`` writes
(Mooncake FAST'25 trace rows: ``timestamp``, ``input_length``, ``output_length``, 512-token
``hash_ids``; the multi-turn ``session_id`` + ``delay`` extension) and compares the SHA-256 of every
record (msgspec JSON: floats as their shortest round-trip repr, so equal text means equal bits) and
the simulation's counters with the values recorded before that work started. The scenarios cover
what the fast paths must get right: prefix hits and evictions (a small KV cache), preemption,
chunked prefill, the router queue, sessions, round-robin, and disaggregated prefill/decode.

When a change *meant* to alter results lands (a router or timing-model fix), print the new
values with ``python tests/core/bench/test_replay_pinned.py`` and say why in the commit.
"""

from __future__ import annotations

import hashlib
import random

import msgspec
import numpy as np
import pytest

from dyn.core.bench.replay import ReplayResult, ReplaySettings, replay
from dyn.core.bench.trace import TokenSynth, TraceRow, draws
from dyn.core.router.config import KvRouterConfig
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.simulator import MockerSimulator

TRACE_BLOCK = 512


def trace(
    n: int, span_s: float, *, seed: int, sessions: bool = False, tick_ms: float | None = None
) -> list[TraceRow]:
    """Conversations opening on one of 6 shared system prompts and growing turn by turn, dated to
    the microsecond or to the nearest ``tick_ms`` (a coarse tick puts many arrivals at one instant)."""
    rng = random.Random(seed)
    roots = [tuple(range(100 * g, 100 * g + rng.randint(1, 4))) for g in range(6)]
    fresh = iter(range(10_000, 10**9))
    rows: list[TraceRow] = []
    conversation = 0
    t = 0.0
    while len(rows) < n:
        t += rng.expovariate(n / 3 / span_s)
        history = list(rng.choice(roots))
        when = t
        for turn in range(rng.randint(1, 4)):
            history.extend(next(fresh) for _ in range(rng.randint(1, 3)))
            isl = len(history) * TRACE_BLOCK - rng.randrange(TRACE_BLOCK)
            osl = max(1, min(600, int(rng.lognormvariate(4.0, 0.9))))
            later = sessions and turn > 0
            rows.append(
                TraceRow(
                    input_length=isl,
                    output_length=osl,
                    hash_ids=tuple(history),
                    timestamp_ms=None if later else stamp(when * 1000.0, tick_ms),
                    session_id=f"c{conversation}" if sessions else None,
                    delay_ms=round(rng.expovariate(1 / 2000.0), 3) if later else None,
                )
            )
            when += rng.expovariate(1 / 3.0) + osl * 0.02
            history.extend(next(fresh) for _ in range(-(-osl // TRACE_BLOCK)))
        conversation += 1
    rows = rows[:n]
    if not sessions:
        rows.sort(key=lambda r: r.timestamp_ms or 0.0)
    return rows


def stamp(ms: float, tick_ms: float | None) -> float:
    return round(ms, 3) if tick_ms is None else round(ms / tick_ms) * tick_ms


def mocker(**kw) -> MockerSimulator:
    fields = {"block_size": 64, "num_gpu_blocks": 2048, "max_num_seqs": 32, "max_num_batched_tokens": 4096}
    return MockerSimulator(MockerConfig(**{**fields, **kw}))


SCENARIOS = {
    "kv": lambda: ReplaySettings(simulator=mocker(), num_workers=3, trace_block_size=TRACE_BLOCK),
    # 400 blocks of 64 tokens for 3 workers: evictions and preemptions on every worker
    "kv-small-cache": lambda: ReplaySettings(
        simulator=mocker(num_gpu_blocks=400, max_num_batched_tokens=2048),
        num_workers=3,
        trace_block_size=TRACE_BLOCK,
    ),
    "kv-router-queue": lambda: ReplaySettings(
        simulator=mocker(),
        num_workers=2,
        trace_block_size=TRACE_BLOCK,
        router=KvRouterConfig(queue_threshold=0.5),
    ),
    "round-robin": lambda: ReplaySettings(
        simulator=mocker(), num_workers=3, router_mode="round-robin", trace_block_size=TRACE_BLOCK
    ),
    "disagg": lambda: ReplaySettings(
        simulator=mocker(kv_transfer_bandwidth=64.0, kv_bytes_per_token=131072),
        num_prefill_workers=1,
        num_decode_workers=2,
        trace_block_size=TRACE_BLOCK,
    ),
    # output blocks booked as they fill, arrivals in 50 ms ticks (many at one instant), 4 workers
    # decoding at once: what the skipped quiet decode passes must get right
    "kv-output-blocks-ties": lambda: ReplaySettings(
        simulator=mocker(),
        num_workers=4,
        trace_block_size=TRACE_BLOCK,
        router=KvRouterConfig(track_output_blocks=True),
    ),
}

TRACES = {
    "kv": lambda: trace(300, 30.0, seed=1),
    "kv-small-cache": lambda: trace(200, 10.0, seed=2),
    "kv-router-queue": lambda: trace(200, 8.0, seed=3),
    "round-robin": lambda: trace(300, 30.0, seed=4, sessions=True),
    "disagg": lambda: trace(200, 20.0, seed=5),
    "kv-output-blocks-ties": lambda: trace(300, 20.0, seed=6, tick_ms=50.0),
}

# Recorded on main before the replay speed work (commit a5a4cb7).
PINNED: dict[str, tuple[str, dict[str, float]]] = {
    "disagg": (
        "3363ae6d613fcd0295cb38511148c97294fd0ce2508d41f06134bab832efa21b",
        {
            "sim_s": 46.9853399245012,
            "passes": 7417,
            "stored_blocks": 8982,
            "duplicate_prefill_blocks": 1293,
            "router_queued": 0,
            "router_queue_s": 0.0,
        },
    ),
    "kv": (
        "cd946fdf203fb9a22ec2dee5085c3491abeaaa099fad91147b7d9b0d434beb28",
        {
            "sim_s": 53.27716420460414,
            "passes": 12183,
            "stored_blocks": 8467,
            "duplicate_prefill_blocks": 2154,
            "router_queued": 0,
            "router_queue_s": 0.0,
        },
    ),
    # recorded before quiet decode passes were skipped (issue 37 item 3, commit 06906e8)
    "kv-output-blocks-ties": (
        "3b852690dbdbfff147a4c8e5d464e9d6cc2f2fcbe306b8251c76a99a98abe0f5",
        {
            "sim_s": 47.06553112577718,
            "passes": 12287,
            "stored_blocks": 8608,
            "duplicate_prefill_blocks": 2251,
            "router_queued": 0,
            "router_queue_s": 0.0,
        },
    ),
    "kv-router-queue": (
        "30a964c158e25a911ccfd5e5da8a082c8114f380b205b94b3a94fee5e28c084c",
        {
            "sim_s": 33.230135414675274,
            "passes": 4231,
            "stored_blocks": 5443,
            "duplicate_prefill_blocks": 1100,
            "router_queued": 6,
            "router_queue_s": 0.21638477531606348,
        },
    ),
    "kv-small-cache": (
        "dde738dac42c2526a6e0f31612aa29fb4f7f732ebf3a05e3f30b7bb2f4d22dcf",
        {
            "sim_s": 36.59509669554454,
            "passes": 3100,
            "stored_blocks": 6846,
            "duplicate_prefill_blocks": 645,
            "router_queued": 0,
            "router_queue_s": 0.0,
        },
    ),
    "round-robin": (
        "0033ac3a8e204bdffb445534e799620d111de2bde769e23bf19fb1f5d215458a",
        {
            "sim_s": 49.38602889154001,
            "passes": 12281,
            "stored_blocks": 9150,
            "duplicate_prefill_blocks": 2799,
            "router_queued": 0,
            "router_queue_s": 0.0,
        },
    ),
}


def fingerprint(result: ReplayResult) -> tuple[str, dict[str, float]]:
    digest = hashlib.sha256(msgspec.json.encode(result.records)).hexdigest()
    counters = {k: v for k, v in result.stats().items() if k not in ("wall_s", "speed")}
    return digest, counters


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_replay_records_are_unchanged(name):
    result = replay(TRACES[name](), SCENARIOS[name]())
    digest, counters = fingerprint(result)
    expected_digest, expected_counters = PINNED[name]
    assert counters == expected_counters
    assert digest == expected_digest


def test_the_scenarios_exercise_what_they_name():
    small = replay(TRACES["kv-small-cache"](), SCENARIOS["kv-small-cache"]())
    assert all(r.error is None for r in small.records)
    assert sum(r.cached_tokens or 0 for r in small.records) > 0
    queued = replay(TRACES["kv-router-queue"](), SCENARIOS["kv-router-queue"]())
    assert queued.router_queued > 0
    disagg = replay(TRACES["disagg"](), SCENARIOS["disagg"]())
    assert {r.worker for r in disagg.records} == {"1", "2"}


@pytest.mark.parametrize("vocab", [4096, 1 << 21])  # shared int objects, and the plain conversion
def test_prompts_are_the_concatenated_blocks(vocab):
    """``TokenSynth.prompt`` builds prompts from cached block lists: the same tokens as cutting
    the concatenated block arrays (a prompt cut inside a block, one extended past its ids)."""
    synth = TokenSynth(16, vocab, seed=3)
    rng = random.Random(0)
    for i in range(50):
        ids = tuple(rng.randrange(40) for _ in range(rng.randint(0, 6)))
        isl = rng.randint(0, 16 * (len(ids) + 2))
        row = TraceRow(input_length=isl, output_length=1, hash_ids=ids, timestamp_ms=0.0)
        parts = [synth.block(h) for h in ids[: -(-isl // 16)]] if isl else []
        have = 16 * len(parts)
        if have < isl:
            parts.append(draws(random.Random(f"3:tail:{i}"), isl - have, 16, vocab))
        expected = np.concatenate(parts)[:isl].tolist() if parts else []
        assert synth.prompt(row, salt=i) == expected


if __name__ == "__main__":
    for name in sorted(SCENARIOS):
        print(f"    {name!r}: {fingerprint(replay(TRACES[name](), SCENARIOS[name]()))!r},")
