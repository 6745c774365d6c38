"""``KvRouter``: the KV-cache-aware router (reference section 3), composed of small parts.

For each engine request (or each group of them: ``route_all`` admits the ``n`` choices and
batched prompts of one client request as one unit) it

1. hashes the prompt into full blocks (``dyn.core.kv.hashing``) and chains sequence hashes;
2. asks the overlap source how many leading blocks each (worker, dp_rank) holds: the exact
   indexer fed by KV events, the TTL-approximate one fed by its own decisions
   (``--no-router-kv-events``), or a remote ``dyn indexer``; max-merged with the short-TTL side
   indexer of predicted routes (``--router-predicted-ttl-secs``). With KV events (here or in the
   remote indexer), it also asks how many further blocks continue each rank's device match in its
   host and then disk tiers (``dyn.core.kv.tiers``; the side index's blocks anchor no such
   walk), credited at ``--router-host-cache-hit-weight`` and ``--router-disk-cache-hit-weight``
   in the cost and the expected cached tokens. A remote indexer is asked only
   while it is reachable (its client follows the connection: a dead or frozen indexer costs no
   request the query timeout) and, after a query failed while it was reachable, not for
   ``REMOTE_RETRY_S`` (unless it is lost and back meanwhile: a new connection); meanwhile, or
   while none is found yet, routing is on load alone and ``degraded()`` says why;
3. drops workers whose every rank is over a busy threshold (all busy: ``AllWorkersBusyError``, a 503);
4. if the queue is on and every eligible rank has more than ``threshold * max_num_batched_tokens``
   active prefill tokens, waits in the router queue (fcfs / lcfs / wspt keys, priority jumps); a
   group waits as one entry keyed by its first request, and is refused at once
   (``QueueFullError``) when the queue already holds ``max_queued_requests`` engine requests;
5. scores every rank with the cost model (or the ``policy`` it was given, ``dyn.core.router.scoring``:
   a scorer over each rank's ``RankView`` and a picker), picks one (argmin or softmax at a
   temperature), books
   the request on it (``ActiveLoad``) and records the decision where an approximate index wants it.
   At temperature 0 over a fleet of ``BULK_SCORING_MIN`` ranks or more, with no busy threshold,
   no pinned worker and no decaying prefill, every rank is scored at once over arrays: its
   device overlap, its booked load (``ActiveLoad``'s arrays) and its active prefix depth (from
   ``ActiveLoad``'s holder masks), in the same float operations as the cost model; only the
   ranks with a predicted prefix or a lower-tier hit are scored one by one. The pick draws as
   scoring each would (``argmin_position``): the same costs, the same pick, the same random
   draws, at a cost that barely grows with the fleet.
   A group's members are all scored and booked in the same step, each seeing its siblings'
   bookings, and never wait behind each other: the frontend starts none of them until all are
   routed, so a member waiting for its siblings' prefill would wait forever. If one member cannot
   be booked, the others are freed and the error raised. With ``--router-prefill-load-model
   aic`` the booking carries the prefill duration AIConfigurator predicts for the request's
   ``isl - cached`` new tokens after its ``cached`` ones (``dyn.core.router.prefill_model``; none
   until its table is ready), over which the rank's oldest active prefill decays; the queue is
   then rechecked every ``AIC_QUEUE_RECHECK_S``, as prompt load falls between events.

The returned ``KvRoute`` keeps the booking in step with the stream: ``started`` says the request
was sent to its worker, ``first_token`` marks the prefill done, ``progress`` grows output blocks,
``finished`` frees the request; each of them may let queued requests through. A booking neither
started nor past its first token after ``unstarted_booking_secs`` is freed (its frontend crashed
or gave up between routing and sending; checked every second); stale bookings (a request never
finished) expire after ``stale_request_secs``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np

from dyn.core.kv.approx import TtlIndexer, max_merge
from dyn.core.kv.hashing import block_hashes, media_block_keys, sequence_hashes
from dyn.core.kv.indexer import OverlapScores, RadixIndexer, WorkerKey, radix_indexer
from dyn.core.kv.tiers import LowerTierIndexes, TieredScores, TierHits
from dyn.core.messages import ActiveSequenceEvent
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.cost import (
    argmin_position,
    effective_cached_tokens,
    effective_overlap_blocks,
    select_worker,
    worker_logit,
)
from dyn.core.router.load import ActiveLoad, tracking_hashes
from dyn.core.router.metrics import RouterMetrics, WorkerLoad
from dyn.core.router.policy import (
    AllWorkersBusyError,
    NoWorkersError,
    QueueFullError,
    Route,
    Router,
    RouteRequest,
    RoutingError,
    WorkerNotFoundError,
    named_worker,
    no_workers,
)
from dyn.core.router.pool import Worker, WorkerPool
from dyn.core.router.prefill_model import AicSetup, PrefillDurations, shared_durations
from dyn.core.router.queue import RouterQueue, all_busy, priority_jump
from dyn.core.router.scoring import Policy, RankView

log = logging.getLogger("dyn.router")

STALE_CHECK_S = 30.0
QUEUE_RECHECK_S = 1.0
AIC_QUEUE_RECHECK_S = 0.1
"""The queue recheck with a decaying prefill load (Dynamo's 100 ms)."""
REMOTE_RETRY_S = 5.0
BULK_SCORING_MIN = 32
"""Ranks from which the untouched ones are scored at once over arrays (docs/benchmarks.md,
"Routing cost at fleet size": from 8 to 32 ranks both ways take the same time, at 128 arrays win)."""


class RouteDecision:
    """What the router decided for one request (also sent over the wire by ``dyn router``).

    ``overlap_blocks``: the prompt's leading blocks in the worker's device cache; ``host_blocks``
    and ``disk_blocks``: the blocks after them found in its host, then disk (or external) tier;
    ``cached_tokens``: the prompt tokens those are worth (lower tiers at their weights), at most
    ``isl_tokens``, the prompt's length."""

    __slots__ = ("worker", "overlap_blocks", "cached_tokens", "isl_tokens", "host_blocks", "disk_blocks")

    def __init__(
        self,
        worker: WorkerKey,
        overlap_blocks: int,
        cached_tokens: int,
        isl_tokens: int,
        host_blocks: int = 0,
        disk_blocks: int = 0,
    ):
        self.worker = worker
        self.overlap_blocks = overlap_blocks
        self.cached_tokens = cached_tokens
        self.isl_tokens = isl_tokens
        self.host_blocks = host_blocks
        self.disk_blocks = disk_blocks


class _PieceScores(Mapping[WorkerKey, int]):
    """The primary index's overlap scores as it answered them (``RadixIndexer.match_pieces``),
    made a mapping only when read as one: scoring the fleet over arrays reads ``depths`` instead
    and never builds a dict of every holder."""

    __slots__ = ("_indexer", "_pieces", "_scores")

    def __init__(self, indexer: RadixIndexer, pieces: list[tuple[int, int]]) -> None:
        self._indexer = indexer
        self._pieces = pieces
        self._scores: OverlapScores | None = None

    @property
    def scores(self) -> OverlapScores:
        if self._scores is None:
            self._scores = self._indexer.pieces_scores(self._pieces)
        return self._scores

    def depths(self, size: int) -> np.ndarray:
        """The matched depth per worker id of the index, in an array of ``size`` (see
        ``RadixIndexer.pieces_depths``)."""
        return self._indexer.pieces_depths(self._pieces, size)

    def __getitem__(self, key: WorkerKey) -> int:
        return self.scores[key]

    def get(self, key: WorkerKey, default: Any = None) -> Any:
        return self.scores.get(key, default)

    def __iter__(self) -> Iterator[WorkerKey]:
        return iter(self.scores)

    def __len__(self) -> int:
        return len(self.scores)

    def __bool__(self) -> bool:
        return bool(self._pieces)  # a piece names at least one holder (no holes: no empty node)


_Overlaps = tuple[Mapping[WorkerKey, int], OverlapScores, TieredScores]
"""(scores, predicted, tiers) as ``_Prompt`` keeps them."""
_NO_HITS = TierHits(0, 0)


class _Prompt:
    """A prompt's block hashes and overlap scores, shared by the group members that send it:
    ``scores`` the device match per rank, ``predicted`` the part of it only the side index
    knows, ``tiers`` the host and disk blocks continuing it."""

    __slots__ = ("local", "seq", "scores", "predicted", "tiers", "scored_at")

    def __init__(self, local: list[int], seq: list[int], overlaps: _Overlaps, now: float) -> None:
        self.local = local
        self.seq = seq
        self.scores, self.predicted, self.tiers = overlaps
        self.scored_at = now


@dataclass(slots=True)
class _Scoring:
    """What ``_admit`` scores one request's candidates with: its prompt, the hashes its booking
    tracks, its length in tokens, the overlap credit and prefill tracking in force for it (its
    overrides applied), and the time."""

    prompt: _Prompt
    track: list[int]
    isl: int
    credit: float
    track_prefill: bool
    now: float


class _Group:
    """The requests of one ``route_all`` between hashing and admission (maybe in the queue)."""

    __slots__ = ("members", "queue_depth", "routes", "error", "done")

    def __init__(self, members: list[tuple[RouteRequest, _Prompt]], queue_depth: int) -> None:
        self.members = members
        self.queue_depth = queue_depth
        self.routes: list[KvRoute] = []
        self.error: RoutingError | None = None
        self.done: anyio.Event | None = None

    @property
    def first(self) -> RouteRequest:
        return self.members[0][0]

    def wake(self) -> None:
        """Wake the request that waits in the queue for this group's admission (or error)."""
        if self.done is not None:
            self.done.set()


class KvRoute(Route):
    """A booked route; its hooks keep the router's load model in step with the stream."""

    __slots__ = (
        "router",
        "request_id",
        "key",
        "decision",
        "routed_at",
        "booked_at",
        "first_at",
        "output_tokens",
        "closed",
        "queue_depth",
    )

    def __init__(
        self,
        worker: Worker,
        router: KvRouter,
        request_id: str,
        decision: RouteDecision,
        routed_at: float,
        queue_depth: int = 0,
        booked_at: float = 0.0,
    ) -> None:
        super().__init__(worker, decision.worker[1])
        self.queue_depth = queue_depth
        self.router = router
        self.request_id = request_id
        self.key = decision.worker
        self.decision = decision
        self.routed_at = routed_at
        self.booked_at = booked_at
        """When it was booked, on the router's clock (the unstarted-booking expiry's start)."""
        self.first_at: float | None = None
        self.output_tokens = 0
        self.closed = False

    def started(self) -> None:
        if not self.closed:
            self.router._started(self)

    def first_token(self) -> None:
        if self.first_at is None and not self.closed:
            self.first_at = first_at = time.perf_counter()
            self.router._started(self)
            self.router._prefill_done(self, first_at)

    def progress(self, output_tokens: int) -> None:
        if output_tokens > self.output_tokens and not self.closed:
            self.output_tokens = output_tokens
            self.router._output_progress(self)

    def finished(self) -> None:
        if not self.closed:
            self.closed = True
            self.router._free(self)


class KvRouter(Router):
    """The KV-aware router over ``pool`` (see the module docstring)."""

    mode = "kv"

    def __init__(
        self,
        pool: WorkerPool,
        config: KvRouterConfig,
        metrics: RouterMetrics,
        *,
        ingest: Callable[[RadixIndexer], Any] | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        block_size: int | None = None,
        prefill_durations: PrefillDurations | None = None,
        policy: Policy | None = None,
    ) -> None:
        super().__init__(pool)
        self.config = config.validate()
        self.policy = policy
        """Chooses among the candidate ranks (``dyn.core.router.scoring``); None: the cost model,
        inlined."""
        if prefill_durations is None and config.uses_aic:
            prefill_durations = shared_durations(AicSetup.from_config(config))
        self.prefill_durations = prefill_durations
        """Predicted prefill durations (``--router-prefill-load-model aic``; None: ``none``)."""
        self.metrics = metrics
        self.worker_type = "prefill" if getattr(pool, "role", None) == "prefill" else "decode"
        """The ``worker_type`` label of its workers' series: a prefill pool's, else decode."""
        self._shown_queue = (0, 0)
        """The queue's requests and prompt tokens as the metrics show them now."""
        self._rng = rng or random.Random()
        self._clock = clock
        self.block_size = block_size
        self.load = ActiveLoad(rng=self._rng, clock=clock)
        metrics.watch_load(self._worker_loads)
        # overlap sources: exactly one primary (or none when the credit is 0), maybe a side index
        self.indexer: RadixIndexer | None = None
        self.lower: LowerTierIndexes | None = None
        """The host, disk and external tiers' indexes, beside an event-fed ``indexer``."""
        self.approx: TtlIndexer | None = None
        if config.uses_indexer and not config.use_remote_indexer:
            if config.use_kv_events:
                self.indexer = radix_indexer()
                self.lower = LowerTierIndexes()
            else:
                self.approx = TtlIndexer(config.ttl_secs, clock=clock)
        self.side = (
            TtlIndexer(config.predicted_ttl_secs, clock=clock)
            if config.predicted_ttl_secs is not None
            else None
        )
        self.remote_indexer: Any = None
        """A ``RemoteIndexer`` to ask for overlaps (set by the companion that found it)."""
        self.remote_indexer_missing: str | None = None
        """Why a remote indexer this router should ask is not there yet (set by that companion)."""
        self._remote_retry_at = 0.0
        self._remote_failure = ""
        self._warned_block_size = False
        self.ingestor: Any = None
        """Feeds ``indexer`` from the workers' KV events (built by ``ingest(indexer)``); an
        ingestor with ``add_lower_tiers`` (``KvEventIngestor``, the replay's) is handed ``lower``'s
        indexes to feed too, one without it (a test's) leaves them to its caller."""
        if self.indexer is not None:
            if ingest is None:
                raise ValueError("a KV router that follows KV events needs an event ingestor")
            self.ingestor = ingest(self.indexer)
            add_lower_tiers = getattr(self.ingestor, "add_lower_tiers", None)
            if add_lower_tiers is not None and self.lower is not None:
                add_lower_tiers(self.lower.writers())
            self.ingestor.follow(pool)
        self.queue = RouterQueue(config.queue_policy, clock)
        self._draining = False
        self._unstarted: dict[str, KvRoute] = {}  # booking order, so the oldest come first
        self.unstarted_expired = 0
        """Bookings freed because their request was not started in time."""
        self._ranks: dict[int, list[WorkerKey]] = {}
        self._fleet: list[WorkerKey] = []
        """Every live rank in routing order (see ``_all_ranks``)."""
        self._fleet_of: list[Worker] | None = None
        self._fleet_pos: dict[WorkerKey, int] = {}
        self._fleet_slots = np.zeros(0, np.intp)
        self._wid_of_pos = np.zeros(0, np.intp)
        """Per fleet position, the rank's worker id in the index (an unknown rank: one past the
        last), for reading ``_PieceScores`` in fleet order; current for ``_wid_of_pos_at``."""
        self._wid_of_pos_at: tuple[int, list[WorkerKey]] | None = None
        self._wake = anyio.Event()
        self.on_booking: Callable[[ActiveSequenceEvent], None] | None = None
        """Replica sync hears every booking change here (set by ``ReplicaSync``)."""
        self.router_id = ""
        self.companions: list[Callable[..., Coroutine[Any, Any, None]]] = []
        """Tasks ``run`` starts beside the router (replica sync, for instance); each takes
        ``task_status`` like ``anyio.TaskGroup.start`` expects."""
        pool.add_listener(self._on_worker)

    # ----------------------------------------------------------------- membership

    def _on_worker(self, worker: Worker, added: bool) -> None:
        self._fleet_of = None
        record = worker.record
        if added:
            if self.block_size is None:
                self.block_size = record.block_size
                log.info("KV block size %d (from worker %d)", self.block_size, record.instance_id)
            elif record.block_size != self.block_size:
                log.warning(
                    "worker %d uses KV block size %d but the router hashes blocks of %d; "
                    "its cache cannot be matched",
                    record.instance_id,
                    record.block_size,
                    self.block_size,
                )
            keys = [(record.instance_id, r) for r in range(max(record.dp_size, 1))]
            self._ranks[record.instance_id] = keys
            for key in keys:
                self.load.add_worker(key)
            self._wake.set()
        else:
            keys = self._ranks.pop(record.instance_id, [])
            self.load.remove_worker(record.instance_id)
            for index in (self.approx, self.side, self.lower):  # the ingestor drops the primary's
                if index is not None:
                    index.remove_worker(record.instance_id)
            for key in keys:
                self.metrics.forget_worker(key, self.worker_type)

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Background work until cancelled: KV-event ingestion, queue rechecks and the expiry of
        unstarted bookings every second, stale booking expiry every 30 s."""
        async with anyio.create_task_group() as tg:
            if self.ingestor is not None:
                await tg.start(self.ingestor.run)
            for companion in self.companions:
                await tg.start(companion)
            task_status.started()
            last_stale = self._clock()
            while True:
                with anyio.move_on_after(self._recheck_s):
                    await self._wake.wait()
                self._wake = anyio.Event()
                now = self._clock()
                self._expire_unstarted(now)
                if now - last_stale >= STALE_CHECK_S:
                    last_stale = now
                    for request_id in self.load.expire_stale(now, self.config.stale_request_secs):
                        log.warning(
                            "request %s held its booking for over %.0f s; freed",
                            request_id,
                            self.config.stale_request_secs,
                        )
                self._drain()

    @property
    def _recheck_s(self) -> float:
        if self.prefill_durations is not None and self.config.queue_threshold is not None:
            return AIC_QUEUE_RECHECK_S
        return QUEUE_RECHECK_S

    # ----------------------------------------------------------------- routing

    async def route(self, request: RouteRequest) -> Route:
        return (await self.route_all([request]))[0]

    async def route_all(self, requests: list[RouteRequest]) -> list[Route]:
        """Route ``requests`` as one unit (see the module docstring): one queue entry, all
        booked in one step, all or none."""
        if not requests:
            return []
        t0 = time.perf_counter()
        for target in {r.instance_id for r in requests if r.instance_id is not None}:
            named_worker(self.pool, target)
        block_size = self.block_size
        if not self.pool.workers() or block_size is None:
            raise no_workers(self.pool)
        prompts: dict[tuple[int, str | None], _Prompt] = {}
        members: list[tuple[RouteRequest, _Prompt]] = []
        for request in requests:
            # the n choices of a prompt share its token list: hash and score it once
            key = (id(request.token_ids), request.lora_name)
            prompt = prompts.get(key)
            if prompt is None:
                prompt = prompts[key] = await self._prompt(request, block_size)
            members.append((request, prompt))
        t3 = time.perf_counter()
        group = _Group(members, self.queue.pending_requests)
        targets = self._targets(group)
        first = targets[(group.first.instance_id, group.first.dp_rank)]
        if self.config.queue_threshold is not None and self._prefill_busy(first):
            routes = await self._wait_in_queue(group)
        else:
            routes = self._admit_group(group, targets)
        t4 = time.perf_counter()
        self.metrics.scheduling_ms.observe((t4 - t3) * 1e3)
        self.metrics.total_ms.observe((t4 - t0) * 1e3)
        return list(routes)

    async def best_cached(self, request: RouteRequest) -> tuple[WorkerKey | None, int]:
        """The live rank holding most of ``request``'s prompt and how many of its blocks, per
        this router's index (``(None, 0)``: none holds any); books nothing (conditional
        disaggregation's preview of the decode pool)."""
        if self.block_size is None or not request.token_ids:
            return None, 0
        scores = (await self._prompt(request, self.block_size)).scores
        live = {k: n for k, n in scores.items() if k[0] in self._ranks}
        if not live:
            return None, 0
        key = max(live, key=live.__getitem__)
        return key, live[key]

    def saturated(self, fraction: float) -> bool:
        """Whether every live rank's active prefill tokens exceed ``fraction`` of its worker's
        max_num_batched_tokens (the router queue's busy line at that threshold)."""
        keys = [k for ks in self._ranks.values() for k in ks]
        return bool(keys) and all(
            self.load.active_tokens(k, self._clock())
            > fraction * (w.record.max_num_batched_tokens if (w := self.pool.get(k[0])) else 0)
            for k in keys
        )

    def decode_busy(self, key: WorkerKey, fraction: float) -> bool:
        """Whether rank ``key``'s active decode blocks exceed ``fraction`` of its KV blocks."""
        worker = self.pool.get(key[0])
        return (
            worker is None or self.load.active_decode_blocks(key) > fraction * worker.record.total_kv_blocks
        )

    async def _prompt(self, request: RouteRequest, block_size: int) -> _Prompt:
        t0 = time.perf_counter()
        extra = None
        if request.media:
            extra = media_block_keys(request.media, block_size, len(request.token_ids) // block_size)
        local = block_hashes(request.token_ids, block_size, request.lora_name, extra)
        t1 = time.perf_counter()
        seq = sequence_hashes(local)
        t2 = time.perf_counter()
        overlaps = await self._overlaps(local, seq)
        t3 = time.perf_counter()
        m = self.metrics
        m.block_hashing_ms.observe((t1 - t0) * 1e3)
        m.seq_hashing_ms.observe((t2 - t1) * 1e3)
        m.find_matches_ms.observe((t3 - t2) * 1e3)
        return _Prompt(local, seq, overlaps, self._clock())

    def _targets(self, group: _Group) -> dict[tuple[int | None, int | None], list[WorkerKey]]:
        """The eligible ranks of each (instance_id, dp_rank) target the group's members name,
        decided once for the whole group, before any of it is booked; raises ``RoutingError``."""
        targets: dict[tuple[int | None, int | None], list[WorkerKey]] = {}
        for request, _ in group.members:
            target = (request.instance_id, request.dp_rank)
            if target not in targets:
                targets[target] = self._eligible(request)
        return targets

    async def _overlaps(self, local: list[int], seq: list[int]) -> _Overlaps:
        """``(scores, predicted, tiers)``: matched device blocks per rank, of those the blocks only
        the side index of predicted routes knows (a sibling's prefill still in flight there), and
        the lower-tier blocks continuing each rank's match in the primary index."""
        if not local:
            return {}, {}, {}
        tiers: TieredScores = {}
        if self.indexer is not None:
            pieces = self.indexer.match_pieces(seq) if self._bulk_overlaps() else None
            if pieces is not None:  # no side index, no lower tier: nothing to merge in
                return _PieceScores(self.indexer, pieces), {}, {}
            scores = self.indexer.find_matches(local, seq)
            tiers = self._tier_hits(local, seq, scores)
        elif self.approx is not None:
            scores = self.approx.find_matches(local, seq)
        elif self.remote_indexer is not None and self._remote_ready(self.remote_indexer):
            scores, tiers = await self._remote_overlaps(local, seq)
        else:
            scores = {}
        return (*self._with_side(scores, local, seq), tiers)

    def _bulk_overlaps(self) -> bool:
        """Whether to keep the index's answer as pieces (``_PieceScores``): a fleet that size is
        scored over arrays, and no side index or lower tier reads the answer as a mapping."""
        assert self.indexer is not None
        return (
            len(self.indexer.worker_ids()) >= BULK_SCORING_MIN
            and self.side is None
            and (self.lower is None or self.lower.empty())
        )

    def _tier_hits(self, local: list[int], seq: list[int], scores: OverlapScores) -> TieredScores:
        """The lower-tier continuations of the primary index's ``scores`` (none without tiers)."""
        lower = self.lower
        if lower is None or self.indexer is None or lower.empty():
            return {}
        return lower.hits(self.indexer, local, seq, scores)

    def _remote_ready(self, indexer: Any) -> bool:
        """Whether to ask the remote indexer now: it answers heartbeats and no failed query holds
        it off. One lost meanwhile is asked as soon as it answers again (a new connection)."""
        if not indexer.reachable:
            self._remote_retry_at = 0.0
            return False
        return self._clock() >= self._remote_retry_at

    async def _remote_overlaps(self, local: list[int], seq: list[int]) -> tuple[OverlapScores, TieredScores]:
        """The remote indexer's answer: device scores and lower-tier hits; a failure (or a block
        size that is not ours) degrades to load-only routing. An indexer that was lost is asked
        again once its client sees it answer; one that failed a query while it answered
        heartbeats is left alone for a while rather than costing every request its timeout."""
        indexer = self.remote_indexer
        try:
            scores, tiers = await indexer.find_tiered_matches(local)
        except Exception as exc:
            if indexer.reachable:
                self._remote_retry_at = self._clock() + REMOTE_RETRY_S
                self._remote_failure = str(exc) or type(exc).__name__
                log.warning(
                    "remote indexer query failed (%s); routing on load alone for %.0f s", exc, REMOTE_RETRY_S
                )
            return {}, {}
        if indexer.block_size not in (None, self.block_size):
            if not self._warned_block_size:
                self._warned_block_size = True
                log.warning(
                    "the dyn indexer hashes blocks of %d tokens, this router %d; its answers are ignored",
                    indexer.block_size,
                    self.block_size,
                )
            return {}, {}
        return scores, tiers

    def degraded(self) -> str | None:
        """Why the overlaps come from no index now: the remote indexer is not found yet, is
        unreachable, failed a query, or hashes other blocks (routing is on load alone); else
        why the AIC prefill table could not be built (prompt load does not decay)."""
        indexer = self.remote_indexer
        if indexer is None:
            why = self.remote_indexer_missing
        elif not indexer.reachable:
            why = f"the dyn indexer at {indexer.address} is {indexer.outage()}"
        elif self._clock() < self._remote_retry_at:
            why = f"a query to the dyn indexer at {indexer.address} failed ({self._remote_failure})"
        elif indexer.block_size not in (None, self.block_size):
            why = (
                f"the dyn indexer at {indexer.address} hashes blocks of {indexer.block_size} "
                f"tokens, this router {self.block_size}"
            )
        else:
            why = None
        if why is not None:
            return f"{why}; routing on load alone"
        return self._prefill_model_failure()

    def _prefill_model_failure(self) -> str | None:
        error = self.prefill_durations.error if self.prefill_durations is not None else None
        return None if error is None else f"{error}; prompt load does not decay"

    def _with_side(
        self, scores: OverlapScores, local: list[int], seq: list[int]
    ) -> tuple[OverlapScores, OverlapScores]:
        if self.side is None:
            return scores, {}
        side = self.side.find_matches(local, seq)
        predicted = {k: n - scores.get(k, 0) for k, n in side.items() if n > scores.get(k, 0)}
        return max_merge(scores, side), predicted

    def _eligible(self, request: RouteRequest) -> list[WorkerKey]:
        """The (worker, rank) pairs this request may go to, busy workers removed; raises when
        nothing is left."""
        if request.instance_id is not None:
            keys = self._ranks.get(request.instance_id, [])
            if request.dp_rank is not None:
                keys = [k for k in keys if k[1] == request.dp_rank]
                if not keys:
                    raise WorkerNotFoundError(
                        f"worker instance {request.instance_id} has no dp rank {request.dp_rank}"
                    )
            if not keys:
                raise WorkerNotFoundError(f"worker instance {request.instance_id} is not live")
            return keys
        keys = self._all_ranks()
        if not keys:
            raise no_workers(self.pool)
        if not self._thresholds_set():
            return keys
        busy = {k for k in keys if self._rank_busy(k)}
        overloaded = {i for i, ks in self._ranks.items() if all(k in busy for k in ks)}
        eligible = [k for k in keys if k[0] not in overloaded]
        if not eligible:
            self.metrics.rejected.labels(self.worker_type, "all_workers_busy").inc()
            raise AllWorkersBusyError("every worker is over its busy threshold; retry later")
        return eligible

    def _all_ranks(self) -> list[WorkerKey]:
        """Every rank of the pool's live workers, in its order: one list, rebuilt only when the
        membership changed (do not mutate), with each rank's position and load-array slot."""
        workers = self.pool.workers()
        if workers is not self._fleet_of:
            self._fleet = [k for w in workers for k in self._ranks.get(w.instance_id, ())]
            self._fleet_pos = {k: i for i, k in enumerate(self._fleet)}
            self._fleet_slots = self.load.slots(self._fleet)
            self._fleet_of = workers
        return self._fleet

    def _thresholds_set(self) -> bool:
        c = self.config
        return (
            c.active_decode_blocks_threshold is not None
            or c.active_prefill_tokens_threshold is not None
            or c.active_prefill_tokens_threshold_frac is not None
        )

    def _rank_busy(self, key: WorkerKey) -> bool:
        c = self.config
        worker = self.pool.get(key[0])
        if worker is None:
            return True
        record = worker.record
        prefill = self.load.active_tokens(key, self._clock())
        if (
            c.active_decode_blocks_threshold is not None
            and self.load.active_decode_blocks(key)
            > c.active_decode_blocks_threshold * record.total_kv_blocks
        ):
            return True
        if c.active_prefill_tokens_threshold is not None and prefill > c.active_prefill_tokens_threshold:
            return True
        frac = c.active_prefill_tokens_threshold_frac
        return frac is not None and prefill > frac * record.max_num_batched_tokens

    def _prefill_busy(self, keys: list[WorkerKey]) -> bool:
        threshold = self.config.queue_threshold
        if threshold is None:
            return False
        now = self._clock()
        get = self.pool.get
        active_tokens = self.load.active_tokens
        # lazily: all_busy stops at the first rank with room, which is the first one in a fleet
        # that is not saturated, instead of reading every rank's load per request
        caps = (w.record.max_num_batched_tokens if (w := get(key[0])) else 0 for key in keys)
        return all_busy((active_tokens(key, now) for key in keys), threshold, caps)

    # ----------------------------------------------------------------- the queue

    async def _wait_in_queue(self, group: _Group) -> list[KvRoute]:
        limit = self.config.max_queued_requests
        waiting = self.queue.pending_requests
        if limit is not None and waiting >= limit:
            self.metrics.rejected.labels(self.worker_type, "queue_full").inc()
            raise QueueFullError(
                f"every worker is busy and {waiting} requests already wait in the router queue "
                f"(--router-queue-limit {limit}); retry later"
            )
        req, prompt = group.members[0]
        best_cached = max(prompt.scores.values(), default=0) * (self.block_size or 0)
        group.done = anyio.Event()
        entry = self.queue.push(
            group,
            priority_jump=priority_jump(req.priority, req.latency_sensitivity),
            isl_tokens=len(req.token_ids),
            max_cached_tokens=best_cached,
            requests=len(group.members),
            tokens=sum(len(r.token_ids) for r, _ in group.members),
        )
        self._queue_gauges()
        try:
            await group.done.wait()
        except BaseException:
            self.queue.remove(entry)
            self._queue_gauges()
            for route in group.routes:  # admitted while this waiter was being cancelled
                route.finished()
            raise
        if group.error is not None:
            raise group.error
        return group.routes

    def recheck_queue(self) -> None:
        """Admit what the router queue can admit now: ``run``'s periodic recheck, for a driver
        of virtual time (the offline replay), where prompt load decays between events."""
        self._drain()

    def _drain(self) -> None:
        """Admit queued groups from the head while the head is not blocked. A drain that a
        booking change causes while one runs is folded into it (the running loop re-reads the
        load before each admission)."""
        if self._draining:
            return
        self._draining = True
        try:
            self._drain_queue()
        finally:
            self._draining = False
        self._queue_gauges()

    def _drain_queue(self) -> None:
        refresh = self.config.overlap_refresh_after_secs
        while len(self.queue):
            group: _Group = self.queue.peek()
            try:
                targets = self._targets(group)
            except RoutingError as exc:
                self.queue.pop()
                group.error = exc
                group.wake()
                continue
            if self._prefill_busy(targets[(group.first.instance_id, group.first.dp_rank)]):
                break
            self.queue.pop()
            now = self._clock()
            index: RadixIndexer | TtlIndexer | None = (
                self.indexer if self.indexer is not None else self.approx
            )
            if refresh is not None and index is not None:
                for prompt in {id(p): p for _, p in group.members}.values():
                    if now - prompt.scored_at >= refresh:
                        scores = index.find_matches(prompt.local, prompt.seq)
                        prompt.tiers = self._tier_hits(prompt.local, prompt.seq, scores)
                        prompt.scores, prompt.predicted = self._with_side(scores, prompt.local, prompt.seq)
                        prompt.scored_at = now
            try:
                group.routes = self._admit_group(group, targets)
            except RoutingError as exc:
                group.error = exc
            except Exception as exc:  # a bug must fail this request, not hang it or the drain
                log.exception("admitting queued request %s failed", group.first.request_id)
                group.error = RoutingError(f"the router failed to admit the request: {exc}")
            group.wake()

    def _queue_gauges(self) -> None:
        # moved by this queue's change, as the routers of other models share the gauges
        pending, isl = self.queue.pending_requests, self.queue.pending_isl_tokens
        self.metrics.queue_pending.inc(pending - self._shown_queue[0])
        self.metrics.queue_isl.inc(isl - self._shown_queue[1])
        self._shown_queue = (pending, isl)

    # ----------------------------------------------------------------- admission and booking

    def _admit_group(
        self, group: _Group, targets: dict[tuple[int | None, int | None], list[WorkerKey]]
    ) -> list[KvRoute]:
        """Book every member now, each seeing the bookings of those before it; if one fails,
        free the others and raise."""
        routes: list[KvRoute] = []
        try:
            for request, prompt in group.members:
                routes.append(
                    self._admit(
                        request, prompt, targets[(request.instance_id, request.dp_rank)], group.queue_depth
                    )
                )
        except BaseException:
            for route in routes:
                route.finished()
            raise
        return routes

    def _admit(
        self, req: RouteRequest, prompt: _Prompt, candidates: list[WorkerKey], queue_depth: int = 0
    ) -> KvRoute:
        c = self.config
        credit, assume_reuse, track_prefill = (
            c.overlap_score_credit,
            c.assume_kv_reuse,
            c.track_prefill_tokens,
        )
        o = req.overrides
        if o is not None:
            credit = credit if o.overlap_score_credit is None else o.overlap_score_credit
            assume_reuse = assume_reuse if o.assume_kv_reuse is None else o.assume_kv_reuse
            track_prefill = track_prefill if o.track_prefill_tokens is None else o.track_prefill_tokens
        isl = len(req.token_ids)
        now = self._clock()
        scores, tiers = prompt.scores, prompt.tiers
        track = tracking_hashes(prompt.seq, assume_reuse, self._rng) if c.track_active_blocks else []
        logits: dict[WorkerKey, float] | None = None
        picked: tuple[WorkerKey, int] | None = None
        overlap: int | None = None
        scoring = _Scoring(prompt, track, isl, credit, track_prefill, now)
        if self.policy is not None:
            picked = self._pick_by_policy(self.policy, candidates, scoring)
        elif (
            candidates is self._fleet
            and len(candidates) >= BULK_SCORING_MIN
            and c.temperature <= 0
            and not self.load.decaying
            and not log.isEnabledFor(logging.DEBUG)
        ):
            in_bulk = self._pick_in_bulk(scoring)
            if in_bulk is not None:
                picked, overlap = in_bulk[:2], in_bulk[2]
        if picked is not None:
            key, cached_key = picked
        else:
            logits, cached = self._logits(candidates, scoring)
            key = candidates[0] if len(candidates) == 1 else select_worker(logits, c.temperature, self._rng)
            cached_key = cached[key]
        worker = self.pool.get(key[0])
        if worker is None:  # the pool changed under a queued request
            raise NoWorkersError("the chosen worker left; retry")
        if overlap is None:
            overlap = scores.get(key, 0)
        self.load.add_request(
            req.request_id,
            key,
            track,
            isl,
            cached_key,
            req.expected_output_tokens,
            track_prefill,
            now,
            expected_prefill_secs=self._expected_prefill_secs(isl, cached_key),
        )
        if self.approx is not None:
            self.approx.record(key, prompt.local, prompt.seq)
        if self.side is not None:
            self.side.record(key, prompt.local, prompt.seq)
        decision = RouteDecision(key, overlap, cached_key, isl, *tiers.get(key, _NO_HITS))
        if self.on_booking is not None:
            self.on_booking(
                ActiveSequenceEvent(
                    self.router_id,
                    req.request_id,
                    key[0],
                    key[1],
                    "add",
                    tracked_hashes=track,
                    local_hashes=prompt.local,
                    seq_hashes=prompt.seq,
                    isl_tokens=isl,
                    cached_tokens=cached_key,
                    expected_output_tokens=req.expected_output_tokens,
                )
            )
        m = self.metrics
        m.requests.inc()
        m.isl.observe(isl)
        m.kv_hit_rate.observe(cached_key / isl if isl else 0.0)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request %s -> worker %d rank %d (overlap %d blocks, host %d, disk %d, logits %s)",
                req.request_id,
                key[0],
                key[1],
                overlap,
                decision.host_blocks,
                decision.disk_blocks,
                {f"{k[0]}:{k[1]}": round(v, 2) for k, v in (logits or {}).items()},
            )
        route = KvRoute(worker, self, req.request_id, decision, time.perf_counter(), queue_depth, now)
        if c.unstarted_booking_secs is not None:
            self._unstarted[req.request_id] = route
        return route

    def _logits(
        self, keys: list[WorkerKey] | set[WorkerKey], scoring: _Scoring
    ) -> tuple[dict[WorkerKey, float], dict[WorkerKey, int]]:
        """The cost of each of ``keys`` (in their order) and the prompt tokens each holds."""
        c = self.config
        bs = self.block_size or 1
        scores, tiers = scoring.prompt.scores, scoring.prompt.tiers
        isl, credit, track_prefill = scoring.isl, scoring.credit, scoring.track_prefill
        cached, decode, prefill = self._loads(keys, scoring)
        logits = {
            k: worker_logit(
                potential_prefill_tokens=prefill.get(k),
                cached_tokens=cached[k],
                isl_tokens=isl,
                device_overlap_blocks=scores.get(k, 0),
                host_overlap_blocks=tiers.get(k, _NO_HITS).host,
                disk_overlap_blocks=tiers.get(k, _NO_HITS).disk,
                potential_decode_blocks=decode.get(k, 0),
                block_size=bs,
                overlap_score_credit=credit,
                prefill_load_scale=c.prefill_load_scale,
                track_prefill_tokens=track_prefill,
                host_cache_hit_weight=c.host_cache_hit_weight,
                disk_cache_hit_weight=c.disk_cache_hit_weight,
                shared_cache_multiplier=c.effective_shared_cache_multiplier,
            )
            for k in keys
        }
        return logits, cached

    def _loads(
        self, keys: list[WorkerKey] | set[WorkerKey], scoring: _Scoring
    ) -> tuple[dict[WorkerKey, int], dict[WorkerKey, int], dict[WorkerKey, int]]:
        """``(cached tokens, potential decode blocks, potential prefill tokens)`` per rank of
        ``keys``: what the cost is computed from."""
        c = self.config
        bs = self.block_size or 1
        prompt, isl, now = scoring.prompt, scoring.isl, scoring.now
        scores, tiers = prompt.scores, prompt.tiers
        host_w, disk_w = c.host_cache_hit_weight, c.disk_cache_hit_weight
        if tiers:
            cached = {
                k: effective_cached_tokens(
                    effective_overlap_blocks(scores.get(k, 0), *tiers.get(k, _NO_HITS), host_w, disk_w),
                    bs,
                    isl,
                )
                for k in keys
            }
        else:
            cached = {k: min(scores.get(k, 0) * bs, isl) for k in keys}
        decode, prefill = self.load.potential_loads(
            keys, scoring.track, isl, cached, scoring.track_prefill, now
        )
        for k, blocks in prompt.predicted.items():
            # Those blocks are being prefilled there for a sibling: that work is already in the
            # worker's active prefill tokens and this request will reuse it, so it is not charged
            # twice (without this, a burst of siblings spreads before the first one's prefill ends).
            if k in prefill:
                shared = min(blocks * bs, self.load.active_tokens(k, now))
                prefill[k] = max(prefill[k] - shared, 0)
        return cached, decode, prefill

    def _pick_by_policy(
        self, policy: Policy, keys: list[WorkerKey], scoring: _Scoring
    ) -> tuple[WorkerKey, int]:
        """``(rank, its cached tokens)`` as ``policy`` scores and picks over ``keys``' views."""
        cached, decode, prefill = self._loads(keys, scoring)
        scores, tiers, bs = scoring.prompt.scores, scoring.prompt.tiers, self.block_size or 1
        isl, credit, track_prefill = scoring.isl, scoring.credit, scoring.track_prefill
        ranked: dict[WorkerKey, float] = {}
        for k in keys:
            worker = self.pool.get(k[0])
            if worker is None:
                continue
            hits = tiers.get(k, _NO_HITS)
            view = RankView(
                k, worker, isl, bs, scores.get(k, 0), hits.host, hits.disk, cached[k],
                prefill.get(k, 0), decode.get(k, 0), self.load.num_requests(k), credit, track_prefill,
            )  # fmt: skip
            ranked[k] = policy.score(view)
        if not ranked:
            raise NoWorkersError("the candidate workers left; retry")
        key = next(iter(ranked)) if len(ranked) == 1 else policy.pick(ranked, self._rng)
        return key, cached[key]

    def _pick_in_bulk(self, scoring: _Scoring) -> tuple[WorkerKey, int, int] | None:
        """``(rank, its cached tokens, its matched blocks)``: what scoring every rank of the
        fleet at temperature 0 picks, computed over arrays. A rank with no predicted prefix and
        no lower-tier hit costs ``scale * max((prefill_sum + isl) / block_size - credit *
        overlap, 0) + active_blocks + blocks - active_prefix_depth`` (``worker_logit`` in the
        same float operations); the others are scored one by one. None when those are more
        than half the fleet: scoring each rank is then cheaper than scoring twice."""
        prompt, track, isl, credit = scoring.prompt, scoring.track, scoring.isl, scoring.credit
        pos = self._fleet_pos
        special = {k for k in (*prompt.tiers, *prompt.predicted) if k in pos}
        if 2 * len(special) > len(pos):
            return None
        load, slots = self.load, self._fleet_slots
        if not load.holders_indexed:
            load.index_holders()
        decode = load.block_counts[slots] + len(track)
        if track:
            depths = load.prefix_depths(track)
            assert depths is not None  # indexed above
            decode -= depths[slots]
        overlap = self._fleet_overlaps(prompt.scores)
        scale, bs = self.config.prefill_load_scale, self.block_size or 1
        if scoring.track_prefill:
            raw = (load.prefill_sums[slots] + isl) / bs
            values = scale * np.maximum(raw - credit * overlap, 0.0) + decode
        else:
            values = scale * np.maximum(0.0 - credit * overlap, 0.0) + decode
        cached: dict[WorkerKey, int] = {}
        if special:
            logits, cached = self._logits(special, scoring)
            for k, logit in logits.items():
                values[pos[k]] = logit
        position = argmin_position(values, self._rng)
        key, matched = self._fleet[position], int(overlap[position])
        return key, cached[key] if key in cached else min(matched * bs, isl), matched

    def _fleet_overlaps(self, scores: Mapping[WorkerKey, int]) -> np.ndarray:
        """The matched blocks of each fleet rank, in ``_fleet`` order."""
        pos = self._fleet_pos
        if isinstance(scores, _PieceScores):
            indexer = self.indexer
            assert indexer is not None
            at = self._wid_of_pos_at
            if at is None or at[0] != indexer.generation or at[1] is not self._fleet:
                wid, none = indexer.worker_ids(), indexer.id_count  # none: the extra zero at the end
                self._wid_of_pos = np.fromiter((wid.get(k, none) for k in self._fleet), np.intp, len(pos))
                self._wid_of_pos_at = (indexer.generation, self._fleet)
            return scores.depths(indexer.id_count + 1)[self._wid_of_pos]
        overlap = np.zeros(len(pos), np.int64)
        if scores:
            held = [k for k in scores if k in pos]
            overlap[np.fromiter(map(pos.__getitem__, held), np.intp, len(held))] = np.fromiter(
                map(scores.__getitem__, held), np.int64, len(held)
            )
        return overlap

    def _expected_prefill_secs(self, isl: int, cached: int) -> float | None:
        """The predicted prefill duration of the ``isl - cached`` new tokens after the ``cached``
        ones (Dynamo's prefill load hint); None without a prefill model or its table."""
        durations = self.prefill_durations
        if durations is None:
            return None
        prefix = min(max(cached, 0), isl)
        return durations.expected_secs(isl - prefix, prefix)

    def _worker_loads(self) -> list[WorkerLoad]:
        """Every rank's booked load now, for the metrics' per-worker gauges."""
        load, now, worker_type = self.load, self._clock(), self.worker_type
        return [
            (key, worker_type, load.active_decode_blocks(key), load.active_tokens(key, now))
            for keys in self._ranks.values()
            for key in keys
        ]

    def _sync(self, route: KvRoute, event: str) -> None:
        if self.on_booking is not None:
            self.on_booking(
                ActiveSequenceEvent(
                    self.router_id,
                    route.request_id,
                    route.key[0],
                    route.key[1],
                    event,
                    output_tokens=route.output_tokens,
                )
            )

    def apply_remote(self, event: ActiveSequenceEvent) -> None:
        """Apply a peer router's booking change (``--router-replica-sync``): its requests load
        this router's view of the workers, and its decisions feed approximate indexes."""
        key = (event.instance_id, event.dp_rank)
        if event.instance_id not in self._ranks:
            return
        rid = f"{event.router_id}/{event.request_id}"
        if event.event == "add":
            self.load.add_request(
                rid,
                key,
                event.tracked_hashes,
                event.isl_tokens,
                event.cached_tokens,
                event.expected_output_tokens,
                self.config.track_prefill_tokens,
                self._clock(),
                expected_prefill_secs=self._expected_prefill_secs(event.isl_tokens, event.cached_tokens),
            )
            if event.local_hashes:
                for index in (self.approx, self.side):
                    if index is not None:
                        index.record(key, event.local_hashes, event.seq_hashes)
        elif event.event == "prefill_done":
            self.load.mark_prefill_completed(rid)
        elif event.event == "output":
            if self.config.track_output_blocks:
                self.load.add_output_tokens(rid, event.output_tokens, self.block_size or 1)
        elif event.event == "free":
            self.load.free(rid)
        else:
            log.warning("ignoring replica event %r from router %s", event.event, event.router_id)
            return
        if event.event in ("prefill_done", "free") and len(self.queue):
            self._drain()

    def forget_peer(self, router_id: str) -> None:
        """A peer router left: free the bookings it shared (its requests are no longer reported)."""
        gone = self.load.free_prefixed(f"{router_id}/")
        if gone:
            log.info("freed %d booking(s) of departed router %s", len(gone), router_id)
            if len(self.queue):
                self._drain()

    def _started(self, route: KvRoute) -> None:
        if self._unstarted.get(route.request_id) is route:
            del self._unstarted[route.request_id]

    def _expire_unstarted(self, now: float) -> None:
        """Free the bookings whose request was neither started nor past its first token
        ``unstarted_booking_secs`` after booking."""
        max_age = self.config.unstarted_booking_secs
        if max_age is None or not self._unstarted:
            return
        expired = []
        for route in self._unstarted.values():
            if now - route.booked_at <= max_age:
                break
            expired.append(route)
        if not expired:
            return
        for route in expired:
            route.finished()
        self.unstarted_expired += len(expired)
        log.warning(
            "freed %d booking(s) whose request was not sent to its worker within %g s "
            "(%s...): its frontend crashed or gave up after routing",
            len(expired),
            max_age,
            expired[0].request_id,
        )

    def _prefill_done(self, route: KvRoute, first_at: float) -> None:
        self._sync(route, "prefill_done")
        self.load.mark_prefill_completed(route.request_id)
        self.metrics.first_token(
            route.key, first_at - route.routed_at, route.decision.isl_tokens, self.worker_type
        )
        if len(self.queue):
            self._drain()

    def _output_progress(self, route: KvRoute) -> None:
        if self.config.track_output_blocks:
            self.load.add_output_tokens(route.request_id, route.output_tokens, self.block_size or 1)
            self._sync(route, "output")

    def _free(self, route: KvRoute) -> None:
        self._started(route)
        self._sync(route, "free")
        self.load.free(route.request_id)
        itl = None
        if route.first_at is not None and route.output_tokens > 1:
            itl = (time.perf_counter() - route.first_at) / (route.output_tokens - 1)
        self.metrics.finished(route.key, route.output_tokens, itl, self.worker_type)
        if len(self.queue):
            self._drain()
