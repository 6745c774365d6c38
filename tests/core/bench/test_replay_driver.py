"""The offline replay drives any ``dyn.core.simulator.Simulator``: here a hand-written one whose
passes take a fixed time, so every record can be worked out by hand (no mocker involved)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest import approx

from dyn.core.bench.replay import ReplaySettings, bench_result, replay
from dyn.core.bench.trace import TraceRow
from dyn.core.kv.events import BlockStored, KvEvent

PASS_MS = 10.0
BLOCK = 4


@dataclass
class Finish:
    request_id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass
class Pass:
    duration_ms: float = 0.0
    tokens: list[tuple[str, int]] = field(default_factory=list)
    finished: list[Finish] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    events: list[KvEvent] = field(default_factory=list)
    batch_size: int = 0


class FixedEngine:
    """Every pass takes ``PASS_MS`` and gives each running request one token; a request's first
    pass also stores its prompt's full blocks. Prompts over ``limit`` tokens are refused."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running: dict[str, list[int]] = {}  # request id -> [prompt, wanted, made]
        self.fresh: list[tuple[str, list[int]]] = []

    def add(self, request_id: str, token_ids: list[int], max_tokens: int, seed: int) -> None:
        if len(token_ids) > self.limit:
            raise ValueError(f"a prompt of {len(token_ids)} tokens is over {self.limit}")
        self.running[request_id] = [len(token_ids), max_tokens, 0]
        self.fresh.append((request_id, token_ids))

    def step(self) -> Pass:
        result = Pass(
            duration_ms=PASS_MS, batch_size=len(self.running), started=[rid for rid, _ in self.fresh]
        )
        for _, tokens in self.fresh:
            full = len(tokens) // BLOCK * BLOCK
            hashes = [hash(tuple(tokens[:end])) & (2**63 - 1) for end in range(BLOCK, full + 1, BLOCK)]
            result.events.append(
                BlockStored(
                    block_hashes=hashes, parent_block_hash=None, token_ids=tokens[:full], block_size=BLOCK
                )
            )
        self.fresh = []
        for rid, state in list(self.running.items()):
            state[2] += 1
            result.tokens.append((rid, 7))
            if state[2] == state[1]:
                del self.running[rid]
                result.finished.append(Finish(rid, state[0], state[2]))
        return result

    def abort(self, request_id: str) -> bool:
        return self.running.pop(request_id, None) is not None

    @property
    def has_work(self) -> bool:
        return bool(self.running)


class FixedSimulator:
    name = "fixed"
    block_size = BLOCK
    total_kv_blocks = 1000
    max_num_batched_tokens = 8192

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self.built = 0

    def validate(self) -> FixedSimulator:
        return self

    def describe(self) -> dict[str, int]:
        return {"pass_ms": int(PASS_MS), "limit": self.limit}

    def prepare(self) -> None:  # a fixed pass time needs nothing made ready
        pass

    def engine(self, clock, *, vocab_size: int, context_length: int) -> FixedEngine:
        self.built += 1
        return FixedEngine(self.limit)


def row(ts_ms: float, isl: int, osl: int, ids: tuple[int, ...] = (1,)) -> TraceRow:
    return TraceRow(input_length=isl, output_length=osl, hash_ids=ids, timestamp_ms=ts_ms)


def test_records_follow_the_simulators_passes():
    sim = FixedSimulator(limit=100)
    rows = [row(0.0, 16, 3), row(5.0, 16, 2), row(20.0, 500, 4)]
    settings = ReplaySettings(simulator=sim, num_workers=2, router_mode="round-robin", trace_block_size=16)
    result = replay(rows, settings)
    assert sim.built == 2
    first, second, refused = sorted(result.records, key=lambda r: r.start_s)
    # worker 0: passes end at 10, 20, 30 ms; worker 1 starts at 5 ms: 15, 25 ms
    assert (first.worker, first.output_tokens, first.queue_s) == ("0", 3, 0.0)
    assert (first.ttft_s, first.end_s, *first.itl_s) == approx((0.010, 0.030, 0.010, 0.010))
    assert (second.worker, second.output_tokens, second.prompt_tokens) == ("1", 2, 16)
    assert (second.start_s, second.ttft_s, second.end_s) == approx((0.005, 0.010, 0.025))
    assert refused.error == "bad_request" and "over 100" in refused.detail and refused.worker == "0"
    # both prompts are trace block 1 (16 tokens): round-robin prefills its 4 blocks on each worker
    assert result.passes == 5 and result.stored_blocks == 8 and result.duplicate_prefill_blocks == 4


def test_the_kv_router_sees_the_simulators_kv_events():
    sim = FixedSimulator()
    # one prompt three times, each after the previous one's blocks were stored: they follow them
    rows = [row(0.0, 32, 1, (1, 2)), row(100.0, 32, 1, (1, 2)), row(200.0, 32, 1, (1, 2))]
    result = replay(rows, ReplaySettings(simulator=sim, num_workers=4, trace_block_size=16))
    assert len({r.worker for r in result.records}) == 1
    assert all(r.error is None for r in result.records)


def test_saved_results_name_the_simulator():
    sim = FixedSimulator()
    rows = [row(0.0, 16, 2)]
    settings = ReplaySettings(simulator=sim, router_mode="random", trace_block_size=16)
    saved = bench_result("t.jsonl", rows, settings, replay(rows, settings))
    assert saved.kind == "offline" and saved.config["fixed"] == {"pass_ms": 10, "limit": 10_000}
    assert saved.config["router"] is None and saved.summary.requests == 1
