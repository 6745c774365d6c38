"""Offline trace replay: the real router driving simulated engine workers in virtual time.

``replay(rows, settings)`` plays a trace (``dyn.core.bench.trace``) through ``num_workers``
engines of ``settings.simulator`` (a ``dyn.core.simulator.Simulator``: the mocker's is
``dyn.plugins.mocker.simulator.MockerSimulator``) and the router of ``router_mode`` (any mode of
``dyn.core.router.modes`` that is ``offline``; ``kv`` is tuned by the given ``KvRouterConfig``),
with no sockets and no sleeping, and returns one ``RequestRecord`` per request plus what
the simulation cost. This module drives; the simulator only says what each pass did.

Design: a discrete-event simulation on one heap of ``(time, seq, action)`` (the trace's own
arrivals wait in a sorted list beside it, merged in the same order); virtual time jumps from event
to event and is the only clock anyone reads (the router's, its queue's, the simulated engines').

- **Arrival**: a trace row becomes a prompt (``TokenSynth``'s tokens, as ``dyn bench --trace`` sends them; salt =
  row index) at ``timestamp / speedup``; a later turn of a session arrives ``delay / speedup``
  after its previous turn finished (or failed). The request is routed at once.
- **Routing**: ``router.route()`` is a coroutine; the simulation drives it by hand
  (``coro.send``) instead of through an event loop. It completes synchronously unless the
  request waits in the router queue, where it is parked on the asyncio future it awaits; a hook
  that drains the queue (``first_token`` / ``finished``) resolves that future and the simulation
  resumes the coroutine right after the hook, at the same virtual instant. So time advances
  only when every routing coroutine is blocked, with no scheduler in between. (An event loop is
  running, because anyio objects need one, but nothing is ever scheduled on it.)
- **Dispatch**: the routed request joins its worker's engine; an idle worker starts a pass
  now. A pass of ``d`` simulated ms ends ``d`` later (the simulator's speedup, such as the
  mocker's ``speedup_ratio``, is already in ``d``); at its end, as a live engine publishes them,
  its KV events reach the router's indexer (through ``BatchConverter`` and ``TieredIndexers``,
  the live router's conversion path, with no delay), then its tokens reach the route hooks
  (``first_token``, ``progress``, ``finished``: the frontend's order), then the worker's next
  pass starts at once if it has work.
- **Quiet passes**: where the simulator offers them (``SkipsQuietPasses``), the passes that only
  give each running request a token are dated on the clock, each ending at the same instant
  and in the same heap order as a stepped pass would, but the engine is not stepped and the
  tokens are not delivered pass by pass: both catch up (``skip_quiet``, then the records' ITLs and
  one ``progress`` call per request) before the worker's next stepped pass. No decision reads
  what lags meanwhile: the router's only use of output progress, the KV router's output-block
  booking, books on the token that fills a block, and filling a block ends a quiet run; a queue
  drains only in hooks that resume its parked requests themselves. The records are the same bit
  for bit (``tests/core/bench/test_replay_pinned.py``).

The router is built from its mode with the simulation's clock, a seeded RNG and the direct
ingestion below, not through ``build_router`` (which adds only what live routers need).
``KvRouter.run`` is not started: its ingestion is replaced by the direct
application above, and hooks drain the queue as they do live. Its periodic queue recheck matters
only with a prefill load that decays over time (``--router-prefill-load-model aic``): the replay
then rechecks the queue every ``AIC_QUEUE_RECHECK_S`` of virtual time while requests wait in it
and other events are due, after waiting for the AIC prefill table before the first arrival (a
table that cannot be built is a ``ConfigError``). The simulator's own tables (the mocker's
``--timing-model aic``) are waited for the same way (``Simulator.prepare``). Should
the heap empty while requests are unfinished, they are recorded as ``stalled``.
``duplicate_prefill_blocks`` counts blocks stored on a worker's device while another worker held
them there (disaggregated: another worker of the same role, since a decode worker stores the
blocks it receives from a prefill worker by design). Lower tiers' events count in neither it nor
``stored_blocks``; a block onboarded from a host tier is a device store and counts in both.

Record fields: ``start_s`` arrival, ``ttft_s`` / ``itl_s`` / ``end_s`` from pass ends,
``queue_s`` from arrival to the start of the first pass that scheduled the request (router-queue
wait *plus* engine waiting), ``cached_tokens`` the engine's prefix-cache hit at admission,
``worker`` the instance id (0..N-1). ``conversation`` and ``group`` are ``s<session>`` or
``r<row index>`` and ``turn`` counts within the conversation, as ``dyn bench --trace`` names them.
Failures: a routing error (busy thresholds) is ``http_503``, a prompt the engine refuses (longer
than the KV cache, empty) ``bad_request``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import heapq
import random
import time
from collections import deque
from collections.abc import Callable, Coroutine, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from dyn.core.bench.metrics import RequestRecord, summarize
from dyn.core.bench.report import BenchResult
from dyn.core.bench.trace import MOONCAKE_BLOCK_SIZE, TokenSynth, TraceRow, theoretical_hit_rate
from dyn.core.errors import ConfigError
from dyn.core.kv.convert import BatchConverter, KvEventMetrics, TieredIndexers
from dyn.core.kv.events import (
    DEFAULT_MEDIUM,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvEventBatch,
    StorageTier,
    tier_of,
)
from dyn.core.kv.membership import Member, Membership
from dyn.core.messages import WorkerEndpoints, WorkerRecord
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.disagg import DisaggRouter
from dyn.core.router.kv import AIC_QUEUE_RECHECK_S, KvRouter
from dyn.core.router.metrics import RouterMetrics
from dyn.core.router.modes import RouterContext, mode_names, router_mode
from dyn.core.router.policy import Route, Router, RouteRequest, RoutingError
from dyn.core.router.pool import Worker
from dyn.core.simulator import SimEngine, SimPass, Simulator

UNLIMITED_CONTEXT = 1 << 40
MODEL_NAME = "replay"
GC_THRESHOLD = 200_000


@dataclass(frozen=True, kw_only=True)
class ReplaySettings:
    """What to simulate. ``simulator``: the engine of every worker; ``trace_block_size``: tokens
    per trace hash id; ``context_length`` None: only the KV cache limits a sequence; ``limit``:
    replay the first rows only."""

    simulator: Simulator
    num_workers: int = 1
    num_prefill_workers: int = 0
    num_decode_workers: int = 0
    """Disaggregated serving when both are set (``num_workers`` is then not used): prefill and
    decode workers routed in two stages (``dyn.core.router.disagg``)."""
    router_mode: str = "kv"
    router: KvRouterConfig = field(default_factory=KvRouterConfig)
    speedup: float = 1.0
    trace_block_size: int = MOONCAKE_BLOCK_SIZE
    vocab_size: int = 4096
    context_length: int | None = None
    seed: int = 0
    limit: int | None = None

    @property
    def roles(self) -> list[str]:
        """Each simulated worker's ``disaggregation_mode``, by instance id."""
        if self.num_prefill_workers:
            return ["prefill"] * self.num_prefill_workers + ["decode"] * self.num_decode_workers
        return ["agg"] * self.num_workers

    def validate(self) -> ReplaySettings:
        """Return self, or raise ``ConfigError`` with a sentence saying what to fix."""
        if self.num_workers < 1:
            raise ConfigError("--num-workers must be at least 1")
        if (self.num_prefill_workers > 0) != (self.num_decode_workers > 0):
            raise ConfigError(
                "a disaggregated replay needs both --num-prefill-workers and --num-decode-workers "
                "(at least 1 each)"
            )
        try:
            offline = router_mode(self.router_mode).offline
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not offline:
            raise ConfigError(
                f"offline replay routes with --router-mode "
                f"{', '.join(mode_names(offline=True))}, not {self.router_mode!r}"
            )
        if self.router.uses_aic and self.router_mode != "kv":
            raise ConfigError(
                f"--router-prefill-load-model {self.router.prefill_load_model} models the KV "
                f"router's prompt load: it needs --router-mode kv, not {self.router_mode}"
            )
        if not self.speedup > 0:
            raise ConfigError("--speedup must be positive")
        if self.trace_block_size < 1:
            raise ConfigError("--trace-block-size must be at least 1")
        if self.limit is not None and self.limit < 1:
            raise ConfigError("--num-requests must be at least 1")
        if self.context_length is not None and self.context_length < 2:
            raise ConfigError("the context length must be at least 2")
        try:
            self.simulator.validate()
            TokenSynth(self.trace_block_size, self.vocab_size)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.router_mode == "kv":
            self.router.validate()
            if self.router.use_remote_indexer:
                raise ConfigError(
                    "--use-remote-indexer asks a live dyn indexer; offline replay "
                    "indexes KV events in-process: drop the flag"
                )
            if self.router.replica_sync:
                raise ConfigError(
                    "--router-replica-sync needs live router replicas; offline "
                    "replay runs one router: drop the flag"
                )
        return self


@dataclass(kw_only=True)
class ReplayResult:
    """What a replay produced. ``sim_s``: virtual seconds from the first arrival to the last
    event; ``wall_s``: real seconds the simulation took. ``duplicate_prefill_blocks``: KV blocks
    a worker stored (prefilled) while another worker held the same prefix block in its cache;
    ``stored_blocks``: all blocks stored. ``router_queued``: requests that waited in the router
    queue, for ``router_queue_s`` seconds in all."""

    records: list[RequestRecord] = field(repr=False)
    sim_s: float
    wall_s: float
    passes: int
    stored_blocks: int
    duplicate_prefill_blocks: int
    router_queued: int
    router_queue_s: float

    @property
    def speed(self) -> float:
        """Simulated seconds per real second."""
        return self.sim_s / self.wall_s if self.wall_s > 0 else float("inf")

    def stats(self) -> dict[str, Any]:
        return {
            "sim_s": self.sim_s,
            "wall_s": self.wall_s,
            "speed": self.speed,
            "passes": self.passes,
            "stored_blocks": self.stored_blocks,
            "duplicate_prefill_blocks": self.duplicate_prefill_blocks,
            "router_queued": self.router_queued,
            "router_queue_s": self.router_queue_s,
        }


def replay(rows: Sequence[TraceRow], settings: ReplaySettings) -> ReplayResult:
    """Replay ``rows`` (in file order) under ``settings``; ``ConfigError`` for bad settings.
    Runs an event loop of its own, so call it from synchronous code."""
    settings.validate()
    if settings.router_mode == "kv" and settings.router.uses_aic:
        _wait_for_prefill_table(settings.router)
    settings.simulator.prepare()
    if settings.limit is not None:
        rows = rows[: settings.limit]

    done: list[ReplayResult] = []

    async def main() -> None:  # returns nothing: asyncio.run may repr the task and its result
        done.append(_Simulation(rows, settings).run())

    threshold = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, *threshold[1:])  # millions of short-lived objects: collect rarely
    try:
        asyncio.run(main())
    finally:
        gc.set_threshold(*threshold)
    return done[0]


def _wait_for_prefill_table(config: KvRouterConfig) -> None:
    """Wait for the AIC prefill table the KV router will share, so that no part of the trace is
    routed without it; ``ConfigError`` when it cannot be built."""
    from dyn.core.router.prefill_model import AicSetup, shared_durations

    durations = shared_durations(AicSetup.from_config(config))
    if durations.wait() is None:
        raise ConfigError(durations.error or "the AIC prefill table could not be built")


def bench_result(
    trace: str, rows: Sequence[TraceRow], settings: ReplaySettings, result: ReplayResult
) -> BenchResult:
    """The ``--output`` of an offline replay: kind ``offline``, the trace's shape, the settings
    (``simulation``: ``result.stats()``) and every request."""
    config = {
        "trace": trace,
        "num_workers": len(settings.roles),
        "num_prefill_workers": settings.num_prefill_workers,
        "num_decode_workers": settings.num_decode_workers,
        "router_mode": settings.router_mode,
        "router": dataclasses.asdict(settings.router) if settings.router_mode == "kv" else None,
        settings.simulator.name: settings.simulator.describe(),
        "speedup": settings.speedup,
        "trace_block_size": settings.trace_block_size,
        "vocab_size": settings.vocab_size,
        "num_requests": settings.limit,
        "seed": settings.seed,
        "simulation": result.stats(),
    }
    shape = trace_shape(rows, block_size=settings.trace_block_size, speedup=settings.speedup)
    return BenchResult(
        kind="offline",
        workload=shape,
        config=config,
        summary=summarize(result.records),
        requests=result.records,
    )


def simulation_line(result: ReplayResult) -> str:
    """One sentence on the simulation itself: speed, passes, duplicated prefill, router queue."""
    return (
        f"simulated {result.sim_s:.1f} s in {result.wall_s:.2f} s ({result.speed:.0f}x), "
        f"{result.passes} passes; blocks prefilled {result.stored_blocks}, of which "
        f"{result.duplicate_prefill_blocks} were cached on another worker; "
        f"{result.router_queued} requests waited in the router queue"
    )


def trace_shape(rows: Sequence[TraceRow], *, block_size: int, speedup: float = 1.0) -> dict[str, Any]:
    """The trace's shape for a result's ``workload``: counts, ISL/OSL, span (after ``speedup``)
    and the theoretical hit rate of its hash ids taken in file order."""
    isl = [r.input_length for r in rows]
    osl = [r.output_length for r in rows]
    stamps = [r.timestamp_ms for r in rows if r.timestamp_ms is not None]
    return {
        "workload": "trace",
        "requests": len(rows),
        "sessions": len({r.session_id for r in rows if r.session_id is not None}),
        "block_size": block_size,
        "mean_isl_tokens": sum(isl) / len(isl) if isl else 0.0,
        "max_isl_tokens": max(isl, default=0),
        "mean_osl_tokens": sum(osl) / len(osl) if osl else 0.0,
        "span_s": (max(stamps) - min(stamps)) / 1000.0 / speedup if stamps else None,
        "theoretical_hit_rate": theoretical_hit_rate(r.hash_ids for r in rows),
    }


# --------------------------------------------------------------------------- the parts


_NEVER = float("inf")


def _event_order(event: tuple[float, int, Any]) -> tuple[float, int]:
    return event[0], event[1]


class _Pool:
    """The ``WorkerPool`` surface routers read, over a fixed set of simulated workers."""

    store = None
    model_name = MODEL_NAME
    client_factory = None

    def __init__(self, workers: list[Worker]) -> None:
        self._ordered = sorted(workers, key=lambda w: w.instance_id)
        self._by_id = {w.instance_id: w for w in workers}

    def get(self, instance_id: int) -> Worker | None:
        return self._by_id.get(instance_id)

    def workers(self) -> list[Worker]:
        return self._ordered

    def __len__(self) -> int:
        return len(self._ordered)

    def add_listener(self, listener: Callable[[Worker, bool], None]) -> None:
        for worker in self._ordered:
            listener(worker, True)


def _on_device(medium: str | None) -> bool:
    """Whether an event's ``medium`` is device memory (the common case needs no lookup)."""
    return medium == DEFAULT_MEDIUM or tier_of(medium) is StorageTier.DEVICE


class _DirectIngest:
    """Stands in for ``KvEventIngestor``: each worker's events go through its ``BatchConverter``
    into ``TieredIndexers`` when ``apply`` is called, instead of arriving on a socket."""

    def __init__(self, indexer: Any, metrics: KvEventMetrics) -> None:
        self.indexers = TieredIndexers(indexer, metrics)
        self.metrics = metrics
        self._converters: dict[int, BatchConverter] = {}

    def add_lower_tiers(self, lower_tiers: Mapping[StorageTier, Any]) -> None:
        """Index the simulated workers' lower-tier events too, as a live ingestor does."""
        self.indexers.add_lower_tiers(lower_tiers)

    def follow(self, membership: Membership) -> None:
        membership.add_listener(self._on_worker)

    def _on_worker(self, member: Member, joined: bool) -> None:
        record = member.record
        if joined:
            self._converters[record.instance_id] = BatchConverter(
                record.instance_id, record.block_size, self.metrics
            )

    async def run(self, *, task_status: Any) -> None:  # pragma: no cover - never started here
        raise RuntimeError("offline replay applies KV events directly")

    def apply(self, instance_id: int, events: list[KvEvent], ts: float) -> None:
        batch = KvEventBatch(ts=ts, events=events)
        self.indexers.apply(self._converters[instance_id].convert(batch))


class _SimWorker:
    __slots__ = ("instance_id", "engine", "busy", "label", "role", "quiet_left", "quiet_s", "quiet_ends")

    def __init__(self, instance_id: int, engine: SimEngine, role: str = "agg") -> None:
        self.instance_id = instance_id
        self.engine = engine
        self.busy = False
        self.label = str(instance_id)
        self.role = role
        self.quiet_left = 0
        """Quiet passes counted and not started yet (a request added ends the count)."""
        self.quiet_s = 0.0
        """How long each of those passes takes, s."""
        self.quiet_ends: list[float] = []
        """When each quiet pass since the engine was last brought up to date ended."""


class _Flight:
    """One request from arrival to its record."""

    __slots__ = (
        "rid",
        "index",
        "row",
        "conversation",
        "turn",
        "session",
        "arrival",
        "tokens",
        "coro",
        "awaiting",
        "route",
        "worker",
        "routed_at",
        "admitted",
        "first",
        "last",
        "itl",
        "output",
        "prefilling",
    )

    def __init__(
        self, index: int, row: TraceRow, conversation: str, turn: int, session: str | None, arrival: float
    ) -> None:
        self.rid = f"r{index}"
        self.index = index
        self.row = row
        self.conversation = conversation
        self.turn = turn
        self.session = session
        self.arrival = arrival
        self.tokens: list[int] | None = None
        self.coro: Coroutine[Any, Any, Route] | None = None
        self.awaiting: asyncio.Future | None = None
        self.route: Route | None = None
        self.worker: _SimWorker | None = None
        self.routed_at = arrival
        self.admitted: float | None = None
        self.first: float | None = None
        self.last = 0.0
        self.itl: list[float] = []
        self.output = 0
        self.prefilling = False
        """In its prefill stage on a prefill worker (disaggregated): its tokens there are dropped."""

    def record(self, end_s: float, **outcome: Any) -> RequestRecord:
        """This request's record, ended at ``end_s``: its conversation (also its group), turn and
        arrival, with ``outcome``'s fields (``RequestRecord``'s others)."""
        return RequestRecord(
            conversation=self.conversation,
            group=self.conversation,
            turn=self.turn,
            start_s=self.arrival,
            end_s=end_s,
            **outcome,
        )


class _Simulation:
    def __init__(self, rows: Sequence[TraceRow], settings: ReplaySettings) -> None:
        self.settings = settings
        self.rows = rows
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self._after: tuple[float, int, Any] = (_NEVER, 0, None)
        """The next trace arrival's (time, seq, flight): they wait beside the heap (see ``run``),
        ordered against its entries by the same (time, seq)."""
        self._quiet = self._quiet_end
        """The heap action of a quiet pass's end (one object, recognized by identity)."""
        sim = settings.simulator
        context_length = settings.context_length or UNLIMITED_CONTEXT
        roles = settings.roles
        self.workers = [
            _SimWorker(
                i,
                sim.engine(self.clock, vocab_size=settings.vocab_size, context_length=context_length),
                role,
            )
            for i, role in enumerate(roles)
        ]
        self._by_id = {w.instance_id: w for w in self.workers}
        pool = _Pool(
            [
                Worker(
                    WorkerRecord(
                        instance_id=w.instance_id,
                        namespace=MODEL_NAME,
                        model_name=MODEL_NAME,
                        engine=sim.name,
                        endpoints=WorkerEndpoints(request=f"sim://{w.instance_id}"),
                        block_size=sim.block_size,
                        total_kv_blocks=sim.total_kv_blocks,
                        max_num_batched_tokens=sim.max_num_batched_tokens,
                        context_length=settings.context_length,
                        disaggregation_mode=role,  # type: ignore[arg-type]
                    ),
                    client=None,  # type: ignore[arg-type]  # simulated workers have no request plane
                )
                for w, role in zip(self.workers, roles, strict=True)
            ]
        )
        self._ingests: list[_DirectIngest] = []
        self.router = self._router(pool)
        self._ingest_of = {
            i: ingest
            for ingest in self._ingests
            for i in ingest._converters  # a worker's role router
        }
        self._queue = getattr(self.router, "queue", None)
        self._recheck_s = (
            AIC_QUEUE_RECHECK_S
            if isinstance(self.router, KvRouter)
            and self.router.prefill_durations is not None
            and self.router.config.queue_threshold is not None
            else None
        )
        """The virtual queue recheck of a decaying prefill load (None: hooks drain it alone)."""
        self._recheck_due = False
        self.synth = TokenSynth(settings.trace_block_size, settings.vocab_size, seed=settings.seed)
        self.synth.plan(rows)  # each block drawn once, kept until its last prompt
        self._flights: dict[Hashable, _Flight] = {}
        self._parked: dict[str, _Flight] = {}
        self._later_turns: dict[str, deque[tuple[int, TraceRow]]] = {}
        self._turns: dict[str, int] = {}
        self.records: list[RequestRecord] = []
        self.passes = 0
        self._holders: dict[Hashable, int] = {}
        self.stored_blocks = 0
        self.duplicate_blocks = 0
        self.router_queued = 0
        self.router_queue_s = 0.0

    def clock(self) -> float:
        return self.now

    def _router(self, pool: _Pool) -> Router:
        s = self.settings
        registry = CollectorRegistry()
        event_metrics = KvEventMetrics(registry)

        def ingest(indexer: Any) -> _DirectIngest:
            made = _DirectIngest(indexer, event_metrics)
            self._ingests.append(made)
            return made

        metrics = RouterMetrics(registry, MODEL_NAME)
        rng = random.Random(s.seed)
        mode = router_mode(s.router_mode)

        def build(role_pool: Any, config: KvRouterConfig) -> Router:
            context = RouterContext(
                pool=role_pool, config=config, metrics=metrics, ingest=ingest, rng=rng, clock=self.clock
            )
            return mode.build(context)

        if s.num_prefill_workers:
            return DisaggRouter(pool, build, s.router, metrics)  # type: ignore[arg-type]
        return build(pool, s.router)  # the simulation's pool: what routers read of one

    # ------------------------------------------------------------------ the event loop

    def _at(self, when: float, action: Callable[[Any], None], arg: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, action, arg))

    def run(self) -> ReplayResult:
        started = time.perf_counter()
        speedup = self.settings.speedup
        # The trace's own arrivals wait in one sorted list beside the heap instead of in it: the
        # heap then holds only the few events in flight. Each keeps the sequence number it would
        # have had in the heap, so the merged order is the heap's order.
        arrivals: list[tuple[float, int, _Flight]] = []
        for index, row in enumerate(self.rows):
            session = row.session_id
            if session is not None and row.timestamp_ms is None:
                self._later_turns.setdefault(session, deque()).append((index, row))
                continue
            key = f"r{index}" if session is None else f"s{session}"
            when = (row.timestamp_ms or 0.0) / 1000.0 / speedup
            self._seq += 1
            arrivals.append((when, self._seq, _Flight(index, row, key, self._next_turn(key), session, when)))
        arrivals.sort(key=_event_order)
        first = arrivals[0][0] if arrivals else 0.0
        heap = self._heap
        pop = heapq.heappop
        arrive = self._arrive
        count = len(arrivals)
        i = 0
        # (time, seq) decides, as in the heap: no two events share a seq, so comparing whole
        # tuples never reaches their third item
        none_left = self._after
        after = self._after = arrivals[0] if arrivals else none_left
        while True:
            while True:
                if heap and heap[0] < after:
                    when, _, action, arg = pop(heap)
                    self.now = when
                    action(arg)
                elif after is not none_left:
                    when, _, flight = after
                    i += 1
                    after = self._after = arrivals[i] if i < count else none_left
                    self.now = when
                    arrive(flight)
                else:
                    break
            stuck = list(self._flights.values())
            if not stuck:
                break
            for flight in stuck:  # nothing left to happen: these can never finish
                self._abandon(flight)
        self.records.sort(key=lambda r: (r.start_s, r.conversation, r.turn))
        return ReplayResult(
            records=self.records,
            sim_s=self.now - first,
            wall_s=time.perf_counter() - started,
            passes=self.passes,
            stored_blocks=self.stored_blocks,
            duplicate_prefill_blocks=self.duplicate_blocks,
            router_queued=self.router_queued,
            router_queue_s=self.router_queue_s,
        )

    def _next_turn(self, key: str) -> int:
        turn = self._turns.get(key, 0)
        self._turns[key] = turn + 1
        return turn

    # ------------------------------------------------------------------ requests

    def _arrive(self, flight: _Flight) -> None:
        flight.arrival = self.now
        self._flights[flight.rid] = flight
        flight.tokens = self.synth.prompt(flight.row, salt=flight.index)
        flight.coro = self.router.route(RouteRequest(request_id=flight.rid, token_ids=flight.tokens))
        self._drive(flight)

    def _drive(self, flight: _Flight) -> None:
        """Run the routing coroutine until it returns, fails or blocks on an unresolved future."""
        coro = flight.coro
        assert coro is not None
        while True:
            try:
                awaited = coro.send(None)
            except StopIteration as stop:
                flight.coro = None
                self._dispatch(flight, stop.value)
                return
            except RoutingError as exc:
                flight.coro = None
                self._fail(flight, "http_503", str(exc))
                return
            if awaited is None:  # a bare checkpoint (sleep(0)): go on
                continue
            if isinstance(awaited, asyncio.Future):
                if awaited.done():
                    continue
                if flight.rid not in self._parked:
                    self.router_queued += 1
                flight.awaiting = awaited
                self._parked[flight.rid] = flight
                self._schedule_recheck()
                return
            coro.close()
            raise RuntimeError(f"route() awaited {awaited!r}, which offline replay cannot drive")

    def _schedule_recheck(self) -> None:
        if self._recheck_s is not None and not self._recheck_due:
            self._recheck_due = True
            self._at(self.now + self._recheck_s, self._recheck, None)

    def _recheck(self, _: Any) -> None:
        """The live router's periodic queue recheck: prompt load decays between events. It
        stops with nothing else due (no engine runs then, so no load falls any further)."""
        self._recheck_due = False
        if not self._parked:
            return
        assert isinstance(self.router, KvRouter)
        self.router.recheck_queue()
        self._resume_parked()
        if self._parked and (self._heap or self._after[0] < _NEVER):
            self._schedule_recheck()

    def _resume_parked(self) -> None:
        """Resume routing coroutines whose request left the router queue (after a drain)."""
        parked = self._parked
        queue = self._queue
        while parked and queue is not None and len(queue) < len(parked):
            left = len(parked) - len(queue)
            for rid, flight in list(parked.items()):
                if flight.awaiting is not None and flight.awaiting.done():
                    del parked[rid]
                    flight.awaiting = None
                    self._drive(flight)
                    left -= 1
                    if left <= 0:
                        break
            else:
                break

    def _dispatch(self, flight: _Flight, route: Route) -> None:
        now = self.now
        flight.route = route
        if now > flight.arrival:
            self.router_queue_s += now - flight.arrival
        prefill = route.prefill
        if prefill is not None:  # disaggregated: one token on the prefill worker first
            route.started()
            prefill.started()
            flight.prefilling = True
            self._add(flight, self._by_id[prefill.worker.instance_id], flight.tokens or [], 1)
            return
        tokens = flight.tokens or []
        flight.tokens = None
        self._add(flight, self._by_id[route.worker.instance_id], tokens, max(flight.row.output_length, 1))

    def _to_decode(self, flight: _Flight) -> None:
        """The prefill stage ended: the request goes to its decode worker, which receives the KV."""
        route = flight.route
        assert route is not None and route.prefill is not None
        route.prefill.finished()
        flight.prefilling = False
        tokens = flight.tokens or []
        flight.tokens = None
        worker = self._by_id[route.worker.instance_id]
        self._add(flight, worker, tokens, max(flight.row.output_length, 1), remote=True)

    def _add(
        self, flight: _Flight, worker: _SimWorker, tokens: list[int], max_tokens: int, remote: bool = False
    ) -> None:
        flight.worker = worker
        try:
            if remote:
                worker.engine.add(flight.rid, tokens, max_tokens, flight.index, remote=True)
            else:
                worker.engine.add(flight.rid, tokens, max_tokens, flight.index)
        except ValueError as exc:
            self._fail(flight, "bad_request", str(exc))
            if flight.route is not None:
                flight.route.finished()
            self._resume_parked()
            return
        worker.quiet_left = 0
        if not worker.busy:
            worker.busy = True
            self._at(self.now, self._step, worker)

    def _fail(self, flight: _Flight, kind: str, detail: str) -> None:
        self._flights.pop(flight.rid, None)
        self._parked.pop(flight.rid, None)
        if flight.coro is not None:
            flight.coro.close()
            flight.coro = None
        self.records.append(
            flight.record(
                self.now,
                prompt_tokens=flight.row.input_length,
                worker=None if flight.worker is None else flight.worker.label,
                error=kind,
                detail=detail,
            )
        )
        self._next_of_session(flight)

    def _abandon(self, flight: _Flight) -> None:
        if flight.rid not in self._flights:
            return
        if flight.worker is not None:
            flight.worker.engine.abort(flight.rid)
        self._fail(flight, "stalled", "no simulated event could advance this request")
        if flight.route is not None:
            flight.route.finished()
            self._resume_parked()

    def _next_of_session(self, flight: _Flight) -> None:
        if flight.session is None:
            return
        later = self._later_turns.get(flight.session)
        if not later:
            return
        index, row = later.popleft()
        delay = (row.delay_ms or 0.0) / 1000.0 / self.settings.speedup
        when = self.now + delay
        self._at(
            when,
            self._arrive,
            _Flight(
                index, row, flight.conversation, self._next_turn(flight.conversation), flight.session, when
            ),
        )

    # ------------------------------------------------------------------ workers

    def _step(self, worker: _SimWorker) -> None:
        """Start the worker's next pass now. While that pass would end before any other event
        (strictly: an event already queued for the same instant goes first, as the heap would
        order it), its end is handled at once instead of through the heap, and the next pass
        starts, and so on: the same events in the same order, without the heap's round trips."""
        engine = worker.engine
        step = engine.step
        quiet_passes = getattr(engine, "quiet_passes", None)
        heap = self._heap
        heappush = heapq.heappush
        flights = self._flights
        while True:
            if worker.quiet_ends:
                self._catch_up(worker)
            if quiet_passes is not None:
                count, ms = quiet_passes()
                if count:
                    worker.quiet_left = count
                    worker.quiet_s = ms / 1000.0
                    if self._quiet_run(worker):
                        return
                    continue  # all ended before any other event: catch up, then step
            result = step()
            self.passes += 1
            now = self.now
            if result.started:
                for rid in result.started:
                    flight = flights[rid]
                    if flight.admitted is None:  # a disaggregated request starts twice: prefill, then decode
                        flight.admitted = now
            if not result.batch_size and not result.preempted:
                # nothing fits until something changes: wait for the next arrival, or a KV transfer
                worker.busy = False
                if result.events:
                    self._kv_events(worker, result.events)
                wake = getattr(engine, "wake_at", None)  # a simulator without P/D has none
                if wake is not None:
                    worker.busy = True
                    self._at(max(wake, now), self._step, worker)
                return
            end = now + result.duration_ms / 1000.0
            if (heap and heap[0][0] <= end) or self._after[0] <= end:
                self._seq += 1
                heappush(heap, (end, self._seq, self._pass_end, (worker, result)))
                return
            self.now = end
            if not self._end_pass(worker, result):
                return

    def _quiet_run(self, worker: _SimWorker) -> bool:
        """Start the worker's counted quiet passes one after another, as ``_step`` does stepped
        ones. True: one ends after another event (it waits on the heap); False: the count is
        spent (or a request was added) and the worker steps next."""
        heap = self._heap
        while worker.quiet_left:
            worker.quiet_left -= 1
            self.passes += 1
            end = self.now + worker.quiet_s
            if (heap and heap[0][0] <= end) or self._after[0] <= end:
                self._seq += 1
                heapq.heappush(heap, (end, self._seq, self._quiet, worker))
                return True
            self.now = end
            worker.quiet_ends.append(end)
        return False

    def _quiet_end(self, worker: _SimWorker) -> None:
        """A quiet pass ended now. So do those after it at the heap's top, taken here in turn
        while each comes before the next arrival (the event loop's order, without its round
        trip): with several workers decoding, their quiet passes alternate on the heap."""
        heap = self._heap
        quiet = self._quiet
        after = self._after
        arrival_at = after[0]
        push = heapq.heappush
        now = self.now
        while True:
            worker.quiet_ends.append(now)
            left = worker.quiet_left
            if left:
                # _quiet_run's first pass, here for its usual outcome: it ends after another event
                end = now + worker.quiet_s
                if (heap and heap[0][0] <= end) or arrival_at <= end:
                    worker.quiet_left = left - 1
                    self.passes += 1
                    self._seq += 1
                    push(heap, (end, self._seq, quiet, worker))
                elif not self._quiet_run(worker):
                    self._step(worker)
            else:
                self._step(worker)
            if not (heap and heap[0][2] is quiet and heap[0] < after):
                return
            now, _, _, worker = heapq.heappop(heap)
            self.now = now

    def _catch_up(self, worker: _SimWorker) -> None:
        """Bring the engine and the records past the quiet passes that ended since the last
        catch-up, as if each had been stepped and delivered at its end."""
        ends = worker.quiet_ends
        n = len(ends)
        gaps = [b - a for a, b in zip(ends, ends[1:])]
        last = ends[-1]
        flights = self._flights
        for rid in worker.engine.skip_quiet(n):  # type: ignore[attr-defined]  # counted by quiet_passes
            flight = flights[rid]
            itl = flight.itl
            itl.append(ends[0] - flight.last)
            itl.extend(gaps)
            flight.last = last
            flight.output += n
            flight.route.progress(flight.output)  # type: ignore[union-attr]
        ends.clear()

    def _pass_end(self, arg: tuple[_SimWorker, SimPass]) -> None:
        worker, result = arg
        if self._end_pass(worker, result):
            self._step(worker)

    def _end_pass(self, worker: _SimWorker, result: SimPass) -> bool:
        """A pass ended now: its KV events, tokens and finished requests reach the router.
        Returns whether the worker has work for another pass (else it goes idle)."""
        now = self.now
        if result.events:
            self._kv_events(worker, result.events)
        flights = self._flights
        for rid, _token in result.tokens:
            flight = flights[rid]
            route = flight.route
            if flight.prefilling:
                route.prefill.first_token()  # type: ignore[union-attr]
                continue
            if flight.first is None:
                flight.first = now
                route.first_token()  # type: ignore[union-attr]
            else:
                flight.itl.append(now - flight.last)
            flight.last = now
            flight.output += 1
            route.progress(flight.output)  # type: ignore[union-attr]
        if result.finished:
            self._finished(worker, result)
        if self._parked:
            self._resume_parked()
        if worker.engine.has_work:
            return True
        worker.busy = False
        return False

    def _finished(self, worker: _SimWorker, result: SimPass) -> None:
        now = self.now
        flights = self._flights
        for fin in result.finished:
            if flights[fin.request_id].prefilling:
                self._to_decode(flights[fin.request_id])
                continue
            flight = flights.pop(fin.request_id)
            flight.route.finished()  # type: ignore[union-attr]
            first = flight.first if flight.first is not None else now
            admitted = flight.admitted if flight.admitted is not None else first
            self.records.append(
                flight.record(
                    now,
                    ttft_s=first - flight.arrival,
                    itl_s=flight.itl,
                    prompt_tokens=fin.prompt_tokens,
                    cached_tokens=fin.cached_tokens,
                    output_tokens=fin.completion_tokens,
                    queue_s=admitted - flight.arrival,
                    worker=worker.label,
                )
            )
            self._next_of_session(flight)

    def _kv_events(self, worker: _SimWorker, events: list[KvEvent]) -> None:
        holders = self._holders
        role = worker.role
        for event in events:
            if isinstance(event, AllBlocksCleared) or not _on_device(event.medium):
                continue  # a lower tier's copy is neither a prefill nor a duplicate of one
            if type(event) is BlockStored:
                for h in event.block_hashes if role == "agg" else [(role, h) for h in event.block_hashes]:
                    n = holders.get(h, 0)
                    if n:
                        self.duplicate_blocks += 1
                    holders[h] = n + 1
                self.stored_blocks += len(event.block_hashes)
            elif type(event) is BlockRemoved:
                for h in event.block_hashes if role == "agg" else [(role, h) for h in event.block_hashes]:
                    n = holders[h] - 1
                    if n:
                        holders[h] = n
                    else:
                        del holders[h]
        ingest = self._ingest_of.get(worker.instance_id)
        if ingest is not None:
            ingest.apply(worker.instance_id, events, self.now)
