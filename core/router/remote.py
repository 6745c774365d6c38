"""``RemoteRouter``: a frontend's router that asks a ``dyn router`` service instead of routing.

``dyn frontend --router-mode kv --router-address ADDR`` builds one; ``ADDR`` is the service's
``tcp://host:port`` or ``auto``: the first live ``dyn router`` of the frontend's model found in
the ``{namespace}.routers`` discovery namespace (another one is taken when it leaves, or when it
stops answering and another is registered: the next live one).

A ``dyn router`` that dies or freezes is noticed like a worker (``RpcClient``: ZMTP heartbeats
and a socket monitor): a dead one within milliseconds, a frozen one within
``HEARTBEAT_TIMEOUT_MS`` (1 s). Queries waiting for it fail at once, and until it answers again
(ZeroMQ reconnects by itself) requests are routed by ``fallback``, the frontend's own policy over
its own pool: ``build_router`` gives it a least-loaded router (with the disaggregated stages, and
named workers honoured as always), so they keep flowing without KV overlap rather than fail.
This is the choice over failing fast: the frontend knows its workers and their streams, which is
all a load-only choice needs, and a router outage then costs cache hits, not requests. The
change is logged once when the router is lost and once when it is back, and ``degraded()`` says
so meanwhile. Without a ``fallback`` (tests, a caller that prefers it), such requests fail at
once with ``NoWorkersError`` (a 503) saying why, and ``unroutable()`` says so. Routes the router
booked before it was lost finish as they run; their reports to it are dropped (a router that
lost a client's connection frees that client's bookings itself).

Contract:

- ``route_all`` sends one ``RouteQuery`` for the whole group (the first request's fields, the
  others as ``siblings``, each distinct prompt once) on a DEALER and waits for one ``RouteAnswer``
  per member, or the ``RouteRefused`` with the same ``query_id``; ``route`` is a group of one. The
  members must share every routing field but ``request_id`` and ``token_ids`` (``ValueError``
  otherwise: the frontend's groups always do). A refusal raises the matching ``RoutingError``
  (``all_busy`` -> ``AllWorkersBusyError``, ``queue_full`` -> ``QueueFullError``); no answer
  within ``timeout_s`` (the service's queue may hold a request a while) raises ``NoWorkersError``.
  The answers name worker instances; if the frontend's own pool does not know one yet, the call
  waits up to ``worker_wait_s`` for discovery to catch up, then gives up with ``NoWorkersError``
  (and frees the group's bookings). A ``dyn router`` older than groups answers only the first
  member (``member`` -1): the others are then routed one query each, as it always did.
- The returned route reports the stream to the service with ``RouteProgress``: ``started`` once
  (when the router understands it), ``first_token`` once, ``progress`` only when the output
  crosses a KV block boundary (the block size comes with the answer), ``finished`` exactly once.
  Reports never block the event loop and never raise into the frontend: a full socket drops
  them (counted in ``dropped`` and logged); the service frees a booking not started within its
  unstarted-booking expiry, and one whose end it never hears after its stale-request timeout.
- Answers for unknown queries, and the service's probes (``query_id`` 0), are ignored. A query
  abandoned before its answer came (the caller was cancelled: the client went away; or the
  timeout passed) is withdrawn at once with ``finished`` for its members, so the service takes it
  out of its queue; a booking answered meanwhile is freed when its answer comes.
- ``run`` owns the socket and its receive loop (and runs ``fallback``); routing raises
  ``NoWorkersError`` until it runs.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from contextlib import aclosing
from typing import Any

import anyio
import zmq

from dyn.core.discovery.store import WorkerAdded, WorkerRemoved
from dyn.core.messages import RouteAnswer, RouteProgress, RouteQuery, RouteRefused, WorkerRecord
from dyn.core.router.kv import AllWorkersBusyError, RouteDecision
from dyn.core.router.policy import (
    NotDisaggregatedError,
    NoWorkersError,
    QueueFullError,
    Route,
    Router,
    RouteRequest,
    RoutingError,
    TargetRequiredError,
    WorkerNotFoundError,
)
from dyn.core.router.pool import Worker, WorkerPool
from dyn.core.router.registry import routers_store, serves_queries
from dyn.core.transport.codec import decode_router_message
from dyn.core.transport.rpc import SEND_HWM, RpcClient, RpcDropped, RpcUnavailable

log = logging.getLogger("dyn.router.remote")

AUTO = "auto"
DEFAULT_TIMEOUT_S = 30.0
WORKER_WAIT_S = 2.0
FAILOVER_S = 1.0
"""With ``auto``, how long a router just tried gets before the next one is tried."""
_ABANDONED_KEPT = 10_000

REFUSALS: dict[str, type[RoutingError]] = {
    "no_workers": NoWorkersError,
    "worker_not_found": WorkerNotFoundError,
    "all_busy": AllWorkersBusyError,
    "queue_full": QueueFullError,
    "target_required": TargetRequiredError,
    "not_disaggregated": NotDisaggregatedError,
}


class _Query:
    """A group's query in flight: one answer slot per member."""

    __slots__ = ("request_ids", "answers", "missing", "refused", "done")

    def __init__(self, request_ids: list[str]) -> None:
        self.request_ids = request_ids
        self.answers: list[RouteAnswer | None] = [None] * len(request_ids)
        self.missing = len(request_ids)
        self.refused: RouteRefused | None = None
        self.done = False

    def take(self, reply: RouteAnswer | RouteRefused) -> bool:
        """Record ``reply``; True once the query is answered: every member answered, a refusal,
        or an answer without a member index (an older router answers the first member only)."""
        if isinstance(reply, RouteRefused):
            self.refused = reply
            self.done = True
            return True
        member = max(reply.member, 0)
        if member < len(self.answers) and self.answers[member] is None:
            self.answers[member] = reply
            self.missing -= 1
        self.done = self.missing == 0 or reply.member < 0
        return self.done


class RemoteRoute(Route):
    """A booking held by the ``dyn router``; the hooks report the stream to it."""

    __slots__ = (
        "router",
        "request_id",
        "decision",
        "block_size",
        "output_tokens",
        "_first",
        "_started",
        "closed",
        "queue_depth",
        "prefill",
    )

    def __init__(
        self,
        worker: Worker,
        router: RemoteRouter,
        request_id: str,
        answer: RouteAnswer,
        isl_tokens: int,
        prefill: Worker | None = None,
    ) -> None:
        """``prefill``: a disaggregated request's prefill worker; its booking is the dyn
        router's, freed there when this route reports its first token."""
        super().__init__(worker, answer.dp_rank)
        self.prefill = Route(prefill, answer.prefill_dp_rank) if prefill is not None else None
        self.router = router
        self.request_id = request_id
        self.decision = RouteDecision(
            (answer.instance_id, answer.dp_rank),
            answer.overlap_blocks,
            answer.cached_tokens,
            isl_tokens,
            answer.host_blocks,
            answer.disk_blocks,
        )
        self.block_size = max(answer.block_size, 1)
        self.queue_depth = answer.queue_depth
        self.output_tokens = 0
        self._first = False
        self._started = answer.member < 0  # a router older than "started" refuses the report
        self.closed = False

    def started(self) -> None:
        if not self._started and not self.closed:
            self._started = True
            self.router._report(RouteProgress(self.request_id, "started"))

    def first_token(self) -> None:
        if not self._first and not self.closed:
            self._first = True
            self.router._report(RouteProgress(self.request_id, "first_token"))

    def progress(self, output_tokens: int) -> None:
        if self.closed or output_tokens <= self.output_tokens:
            return
        crossed = output_tokens // self.block_size > self.output_tokens // self.block_size
        self.output_tokens = output_tokens
        if crossed:
            self.router._report(RouteProgress(self.request_id, "progress", output_tokens))

    def finished(self) -> None:
        if not self.closed:
            self.closed = True
            self.router._report(RouteProgress(self.request_id, "finished", self.output_tokens))


class RemoteRouter(Router):
    """Routes through the ``dyn router`` at ``address`` (see the module docstring)."""

    mode = "kv"

    def __init__(
        self,
        pool: WorkerPool,
        address: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        worker_wait_s: float = WORKER_WAIT_S,
        fallback: Router | None = None,
    ) -> None:
        """``fallback``: routes while no ``dyn router`` answers (see the module docstring)."""
        super().__init__(pool)
        if address != AUTO and not address.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(
                f"--router-address {address!r} is not a ZMQ address: give the "
                "tcp://HOST:PORT that 'dyn router' printed, or auto"
            )
        self.address = address
        self._routers = routers_store(pool.store) if address == AUTO else None
        self.timeout_s = timeout_s
        self.worker_wait_s = worker_wait_s
        self.endpoint: str | None = None
        """The service this router talks to now (``address``, or the one ``auto`` found)."""
        self._rpc = RpcClient(
            decode_router_message,
            (RouteAnswer, RouteRefused),
            peer="the dyn router",
            hwm=SEND_HWM,
            logger=log,
        )
        self._rpc.on_unmatched = self._on_late
        self._rpc.on_reachable = self._on_reachable
        self.fallback = fallback
        self._running = False
        self._abandoned: OrderedDict[int, list[str]] = OrderedDict()
        self._lost: str | None = None
        """The router whose loss was logged (its return is logged once)."""
        self._searched_since = time.monotonic()
        """Since when ``auto`` has found no live router."""
        self._unreachable = anyio.Event()

    @property
    def dropped(self) -> int:
        """Reports dropped because the socket was full."""
        return self._rpc.dropped

    # ----------------------------------------------------------------- socket

    @property
    def reachable(self) -> bool:
        """Whether requests go to a ``dyn router`` now (it runs, has a router, which answers)."""
        return self._running and self.endpoint is not None and self._rpc.reachable

    def _outage(self) -> str:
        """Why no ``dyn router`` takes queries now (it runs, and is not ``reachable``)."""
        if self.endpoint is None:
            return (
                f"no dyn router for model {self.pool.model_name!r} has been live for "
                f"{time.monotonic() - self._searched_since:.1f} s"
            )
        return f"the dyn router at {self.endpoint} is {self._rpc.outage()}"

    def unroutable(self) -> str | None:
        if self.fallback is not None or not self._running or self.reachable:
            return None
        return f"{self._outage()}; no request can be routed"

    def degraded(self) -> str | None:
        if self.fallback is None or not self._running or self.reachable:
            return None
        return f"{self._outage()}; routing by least load"

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Own the DEALER and receive answers until cancelled; with ``auto``, follow the
        routers' namespace to pick (and replace) the service."""
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(self._rpc.run)
                if self.fallback is not None:
                    await tg.start(self.fallback.run)
                if self.address == AUTO:
                    await tg.start(self._follow_routers)
                else:
                    self._use(self.address)
                self._running = True
                task_status.started()
        finally:
            self._running = False

    def _use(self, endpoint: str | None) -> None:
        if endpoint == self.endpoint:
            return
        old, self.endpoint = self.endpoint, endpoint
        self._lost = None
        if old is not None:
            self._rpc.disconnect(old)
            self._rpc.fail_all(RpcUnavailable(f"dyn router at {old} left; retry"))
        if endpoint is None:
            self._searched_since = time.monotonic()
            return
        try:
            self._rpc.connect(endpoint)
        except zmq.ZMQError as exc:
            self.endpoint = None
            log.error("cannot connect to dyn router at %s: %s", endpoint, exc)
            return
        log.info("routing through the dyn router at %s", endpoint)

    def _on_reachable(self, reachable: bool, reason: str) -> None:
        """Log the loss of the router in use and its return, once each."""
        endpoint = self.endpoint
        if endpoint is None:
            return  # none is live: ``_follow_routers`` says so
        if not reachable:
            self._lost = endpoint
            self._unreachable.set()
            log.warning(
                "the dyn router at %s is unreachable (%s); %s",
                endpoint,
                reason,
                "routing by least load until it answers"
                if self.fallback is not None
                else "requests fail until it answers",
            )
        elif self._lost == endpoint:
            self._lost = None
            log.info("the dyn router at %s answers again; routing through it", endpoint)

    async def _follow_routers(self, *, task_status: Any) -> None:
        store = self._routers
        assert store is not None
        live: dict[int, WorkerRecord] = {}

        def choose() -> None:
            """Keep the router in use while it is live and answers; else take the next live one."""
            endpoints = [live[i].endpoints.request for i in sorted(live)]
            current = self.endpoint
            if current in endpoints:
                if self._rpc.reachable or len(endpoints) == 1:
                    return
                at = endpoints.index(current)
                endpoints = endpoints[at + 1 :] + endpoints[:at]
            self._use(endpoints[0] if endpoints else None)
            if not endpoints and current is not None:
                log.warning(
                    "no dyn router for model %r is live in namespace %r; %s",
                    self.pool.model_name,
                    store.namespace,
                    "routing by least load until one is" if self.fallback is not None else "requests fail",
                )

        async def fail_over() -> None:
            while True:
                await self._unreachable.wait()
                self._unreachable = anyio.Event()
                choose()
                await anyio.sleep(FAILOVER_S)

        for record in await store.list():
            if serves_queries(record, self.pool.model_name):
                live[record.instance_id] = record
        choose()
        if self.endpoint is None:
            log.warning(
                "no dyn router for model %r is live in namespace %r yet; %s",
                self.pool.model_name,
                store.namespace,
                "routing by least load until one is" if self.fallback is not None else "requests fail",
            )
        async with anyio.create_task_group() as tg:
            tg.start_soon(fail_over)
            task_status.started()
            async with aclosing(store.watch()) as events:
                async for event in events:
                    if isinstance(event, WorkerAdded):
                        if serves_queries(event.record, self.pool.model_name):
                            live[event.record.instance_id] = event.record
                        else:
                            live.pop(event.record.instance_id, None)
                    elif isinstance(event, WorkerRemoved):
                        live.pop(event.instance_id, None)
                    choose()

    def _on_late(self, reply: RouteAnswer | RouteRefused) -> None:
        """A reply for no pending query: free the booking of an abandoned query's answer;
        ignore probes and the rest, but log a refusal of a message the router could not read."""
        request_ids = self._abandoned.get(reply.query_id)
        if request_ids is not None:
            member = max(reply.member, 0) if type(reply) is RouteAnswer else len(request_ids)
            if member < len(request_ids):
                self._report(RouteProgress(request_ids[member], "finished"))
            else:
                del self._abandoned[reply.query_id]
        elif type(reply) is RouteRefused and reply.query_id < 0:
            log.warning("the dyn router refused a message: %s", reply.message)

    def _report(self, progress: RouteProgress) -> None:
        self._rpc.send(progress)

    # ----------------------------------------------------------------- routing

    async def route(self, request: RouteRequest) -> Route:
        return (await self.route_all([request]))[0]

    async def route_all(self, requests: list[RouteRequest]) -> list[Route]:
        if not requests:
            return []
        if not self._running:
            raise NoWorkersError(f"the dyn router at {self.address} is not connected yet, or retry later")
        if not self.reachable:
            return await self._without_router(requests)
        message = _group_query(self._rpc.new_id(), requests)
        query_id = message.query_id
        query = _Query([r.request_id for r in requests])
        try:
            await self._rpc.call(message, self.timeout_s, collect=query.take)
        except RpcDropped:
            raise NoWorkersError(
                f"dyn router at {self.endpoint} is not taking queries (its socket is full); retry later"
            ) from None
        except RpcUnavailable as exc:  # lost while the query waited
            self._forget(query_id, query)
            if self.fallback is not None:
                return await self.fallback.route_all(requests)
            raise NoWorkersError(f"{exc}; retry later") from None
        except TimeoutError:
            self._forget(query_id, query)
            raise NoWorkersError(
                f"dyn router at {self.endpoint} is not answering (no answer in "
                f"{self.timeout_s:g} s); check that 'dyn router' runs, or retry later"
            ) from None
        except BaseException:  # cancelled (the client left): withdraw it, free what was booked
            self._forget(query_id, query)
            raise
        if query.refused is not None:
            raise REFUSALS.get(query.refused.code, RoutingError)(query.refused.message)
        routes: list[Route] = []
        try:
            for request, answer in zip(requests, query.answers, strict=True):
                if answer is None:  # an older dyn router answered the first member only
                    routes.append(await self.route(request))
                    continue
                worker = await self._worker(answer.instance_id)
                prefill = (
                    await self._worker(answer.prefill_instance_id)
                    if answer.prefill_instance_id >= 0
                    else None
                )
                routes.append(
                    RemoteRoute(worker, self, request.request_id, answer, len(request.token_ids), prefill)
                )
        except BaseException:
            for route in routes:
                route.finished()
            for request, answer in zip(requests[len(routes) :], query.answers[len(routes) :]):
                if answer is not None:
                    self._report(RouteProgress(request.request_id, "finished"))
            raise
        return routes

    async def _without_router(self, requests: list[RouteRequest]) -> list[Route]:
        """Route by ``fallback`` while no ``dyn router`` answers, else refuse at once."""
        if self.fallback is None:
            hint = "start one with 'dyn router'" if self.endpoint is None else "check that 'dyn router' runs"
            raise NoWorkersError(f"{self._outage()}; {hint}, or retry later")
        return await self.fallback.route_all(requests)

    def _forget(self, query_id: int, query: _Query) -> None:
        """Give up on a query: withdraw it (the service takes it out of its queue, or frees
        what it booked), and free the bookings whose answers come later."""
        for request_id in query.request_ids:
            self._report(RouteProgress(request_id, "finished"))
        if query.done:
            return
        self._abandoned[query_id] = query.request_ids
        while len(self._abandoned) > _ABANDONED_KEPT:
            self._abandoned.popitem(last=False)

    async def _worker(self, instance_id: int) -> Worker:
        worker = self.pool.get(instance_id)
        if worker is not None:
            return worker
        with anyio.move_on_after(self.worker_wait_s):
            while worker is None:
                await anyio.sleep(0.02)
                worker = self.pool.get(instance_id)
            return worker
        raise NoWorkersError(
            f"the dyn router chose worker {instance_id}, which this frontend "
            "has not discovered; check that both use the same namespace and "
            "discovery directory"
        )


def _routing_fields(request: RouteRequest) -> tuple[object, ...]:
    """What a ``RouteQuery`` sends once for its whole group."""
    return (
        request.instance_id,
        request.dp_rank,
        request.priority,
        request.lora_name,
        request.latency_sensitivity,
        request.expected_output_tokens,
        request.prefill_instance_id,
        request.overrides,
    )


def _group_query(query_id: int, requests: list[RouteRequest]) -> RouteQuery:
    """One query for ``requests`` (see the module docstring): each distinct prompt sent once."""
    first = requests[0]
    shared = _routing_fields(first)
    prompts: list[list[int]] = []
    media: list[list[tuple[int, int, int]]] = [list(first.media)]
    index = {id(first.token_ids): 0}
    which: list[int] = []
    for request in requests[1:]:
        if _routing_fields(request) != shared:
            raise ValueError(
                "the requests of one route_all group must share their routing "
                "fields (all but request_id and token_ids)"
            )
        i = index.get(id(request.token_ids))
        if i is None:
            prompts.append(request.token_ids)
            media.append(list(request.media))
            i = index[id(request.token_ids)] = len(prompts)
        which.append(i)
    return RouteQuery(
        query_id,
        first.request_id,
        first.token_ids,
        first.instance_id,
        first.dp_rank,
        first.priority,
        first.lora_name,
        first.latency_sensitivity,
        first.expected_output_tokens,
        siblings=[r.request_id for r in requests[1:]],
        sibling_prompts=which if any(which) else [],
        prompts=prompts,
        reports_start=True,
        prefill_instance_id=first.prefill_instance_id,
        prompt_media=media if any(media) else [],
        overlap_score_credit=first.overrides.overlap_score_credit if first.overrides is not None else None,
    )
