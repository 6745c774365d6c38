"""The routing interface and the simple policies: round-robin, random, direct.

The frontend asks a ``Router`` for a ``Route`` per engine request, or for the routes of all the
engine requests of one client request at once (``route_all``: the ``n`` choices and batched prompts
are admitted as one unit), and reports each request's progress on its route (``started``,
``first_token``, ``progress``, ``finished``), so a router that books load (the KV router) can keep
its accounting; the simple policies book nothing. A request that names a worker
(``RouteRequest.instance_id``: ``nvext.backend_instance_id`` or ``x-worker-instance-id``) goes to
that worker in every mode; ``direct`` mode requires one.

Failures are ``RoutingError`` subclasses; the HTTP layer maps them to statuses
(``NoWorkersError`` -> 503 with Retry-After).
"""

from __future__ import annotations

import abc
import random
from collections.abc import Sequence
from typing import Any

import anyio

import msgspec

from dyn.core.protocol.openai import SessionControl
from dyn.core.router.pool import Worker, WorkerPool

ROUTER_MODES = ("round-robin", "random", "direct", "kv")


class RoutingError(Exception):
    """A request could not be routed; the message says why and what to do."""


class NoWorkersError(RoutingError):
    """No live worker can take the request now; retrying later may succeed."""


class AllWorkersBusyError(RoutingError):
    """Every eligible worker is over a busy threshold; retrying later may succeed."""


class QueueFullError(AllWorkersBusyError):
    """Every eligible worker is busy and the router queue holds as many requests as it may
    (``--router-queue-limit``); retrying later may succeed."""


class WorkerNotFoundError(RoutingError):
    """The request named a worker instance that is not live."""


class TargetRequiredError(RoutingError):
    """``direct`` mode got a request that names no worker."""


class RouteRequest(msgspec.Struct, kw_only=True):
    """What a router sees of one engine request. ``priority`` and ``latency_sensitivity`` are
    the agent hints (larger means sooner in the router queue); ``expected_output_tokens`` is
    ``agent_hints.osl``. ``session`` and ``pin_ttl_s`` (``nvext.session_control``, the
    ``cache_control`` TTL) are served by ``dyn.core.router.agent.AgentRouter``."""

    request_id: str
    token_ids: list[int]
    instance_id: int | None = None
    dp_rank: int | None = None
    priority: int | None = None
    lora_name: str | None = None
    latency_sensitivity: float | None = None
    expected_output_tokens: int | None = None
    session: SessionControl | None = None
    pin_ttl_s: float | None = None


class Route:
    """A routing decision: the worker (and rank) that serves one engine request.

    The frontend calls ``started`` right after it sends the request to its worker, ``first_token``
    when the first output token arrives, ``progress`` with the running count of output tokens as
    they arrive, and ``finished`` exactly once when the request ends for any reason; the base class
    books nothing. A KV router frees a booking that was not started (nor reached its first token)
    within ``KvRouterConfig.unstarted_booking_secs``: a route that is never sent costs seconds.

    What a router knew when it routed, for the response's ``nvext.timing`` (``None``: unknown):
    ``cached_tokens`` / ``isl_tokens`` (the predicted KV hit) and ``queue_depth`` (requests waiting
    in the router queue). ``session_id`` names the engine session the request runs in.
    """

    __slots__ = ("worker", "dp_rank")
    decision: Any = None
    """A KV router's ``RouteDecision`` (overlap, cached and prompt tokens)."""
    queue_depth: int | None = None
    session_id: str | None = None

    @property
    def cached_tokens(self) -> int | None:
        return None if self.decision is None else self.decision.cached_tokens

    @property
    def isl_tokens(self) -> int | None:
        return None if self.decision is None else self.decision.isl_tokens

    def __init__(self, worker: Worker, dp_rank: int | None = None) -> None:
        self.worker = worker
        self.dp_rank = dp_rank

    def started(self) -> None:
        pass

    def first_token(self) -> None:
        pass

    def progress(self, output_tokens: int) -> None:
        pass

    def finished(self) -> None:
        pass


class Router(abc.ABC):
    """Chooses a worker from ``pool`` for each request."""

    mode: str

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Background work the router needs while it serves (none for the simple policies)."""
        task_status.started()

    async def route(self, request: RouteRequest) -> Route:
        """The route for ``request``; may wait (a queueing router); raises ``RoutingError``."""
        if request.instance_id is not None:
            worker = self.pool.get(request.instance_id)
            if worker is None:
                live = ", ".join(str(w.instance_id) for w in self.pool.workers()) or "none"
                raise WorkerNotFoundError(
                    f"worker instance {request.instance_id} is not live (live instances: {live})")
            return Route(worker, request.dp_rank)
        workers = self.pool.workers()
        if not workers:
            raise NoWorkersError(f"no worker is serving model {self.pool.model_name!r} yet; "
                                 "start one with 'dyn worker mocker' or retry later")
        return Route(self.select(request, workers), request.dp_rank)

    async def route_all(self, requests: list[RouteRequest]) -> list[Route]:
        """The routes of ``requests``, in order: the engine requests of one client request (its
        ``n`` choices, its batched prompts), admitted as one unit. Either every request is routed
        or none is: on a failure (or cancellation) the routes already made are finished and the
        error is raised. This base routes each in turn, which suits routers that never wait; a
        queueing router overrides it so that the group never waits behind its own members."""
        routes: list[Route] = []
        try:
            for request in requests:
                routes.append(await self.route(request))
        except BaseException:
            for route in routes:
                route.finished()
            raise
        return routes

    @abc.abstractmethod
    def select(self, request: RouteRequest, workers: Sequence[Worker]) -> Worker:
        """Pick one of ``workers`` (never empty) for a request that names no worker."""


class RoundRobinRouter(Router):
    mode = "round-robin"

    def __init__(self, pool: WorkerPool) -> None:
        super().__init__(pool)
        self._next = 0

    def select(self, request: RouteRequest, workers: Sequence[Worker]) -> Worker:
        worker = workers[self._next % len(workers)]
        self._next += 1
        return worker


class RandomRouter(Router):
    mode = "random"

    def __init__(self, pool: WorkerPool, rng: random.Random | None = None) -> None:
        super().__init__(pool)
        self._rng = rng or random.Random()

    def select(self, request: RouteRequest, workers: Sequence[Worker]) -> Worker:
        return workers[self._rng.randrange(len(workers))]


class DirectRouter(Router):
    """Only requests that name their worker; anything else is ``TargetRequiredError``."""

    mode = "direct"

    async def route(self, request: RouteRequest) -> Route:
        if request.instance_id is None:
            raise TargetRequiredError(
                "router mode 'direct' needs a target worker: set nvext.backend_instance_id or the "
                "x-worker-instance-id header")
        return await super().route(request)

    def select(self, request: RouteRequest, workers: Sequence[Worker]) -> Worker:
        raise AssertionError("unreachable: direct routes only requests that name their worker")


def make_router(mode: str, pool: WorkerPool) -> Router:
    """The simple router for ``mode`` (round-robin, random or direct; ``kv`` is built by
    ``dyn.core.router.build``); ``ValueError`` names the valid modes."""
    routers = {cls.mode: cls for cls in (RoundRobinRouter, RandomRouter, DirectRouter)}
    if mode not in routers:
        raise ValueError(f"unknown router mode {mode!r}: choose one of {', '.join(ROUTER_MODES)}")
    return routers[mode](pool)
