"""The routing interface: ``Router``, ``RouteRequest``, ``Route`` and the routing errors.

The frontend asks a ``Router`` for a ``Route`` per engine request, or for the routes of all the
engine requests of one client request at once (``route_all``: the ``n`` choices and batched prompts
are admitted as one unit), and reports each request's progress on its route (``started``,
``first_token``, ``progress``, ``finished``), so a router that books load (the KV router) can keep
its accounting. A request that names a worker (``RouteRequest.instance_id``:
``nvext.backend_instance_id`` or ``x-worker-instance-id``) goes to that worker in every mode;
``direct`` mode requires one. The routers themselves: ``dyn.core.router.modes``.

Failures are ``RoutingError`` subclasses; the HTTP layer maps them to statuses
(``NoWorkersError`` -> 503 with Retry-After).
"""

from __future__ import annotations

import abc
from typing import Any, Literal

import anyio
import msgspec

from dyn.core.kv.hashing import MediaSpan
from dyn.core.router.pool import Worker, WorkerPool


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


class NotDisaggregatedError(RoutingError):
    """The request named a prefill worker, but its model is served aggregated."""


class TargetRequiredError(RoutingError):
    """``direct`` mode got a request that names no worker."""


class RouteOverrides(msgspec.Struct, frozen=True, kw_only=True):
    """Per-request changes to a KV router's cost model (Dynamo's ``RouterConfigOverride``);
    ``None`` keeps the router's setting. A disaggregated request's decode hop uses
    ``DECODE_HOP``: the prompt was prefilled elsewhere, so the decode worker's cache earns no
    credit, its blocks are not assumed shared, and it is charged no prefill tokens."""

    overlap_score_credit: float | None = None
    assume_kv_reuse: bool | None = None
    track_prefill_tokens: bool | None = None


DECODE_HOP = RouteOverrides(overlap_score_credit=0.0, assume_kv_reuse=False, track_prefill_tokens=False)


class RouteSession(msgspec.Struct, frozen=True):
    """A request's streaming-session intent as the router acts on it (from the frontend's
    ``nvext.session_control`` or a client's session header): ``action`` open | bind | close, or
    None on the turns in between; ``timeout`` the idle timeout in seconds (open and bind)."""

    session_id: str
    action: Literal["open", "bind", "close"] | None = None
    timeout: int = 300


class RouteRequest(msgspec.Struct, kw_only=True):
    """What a router sees of one engine request. ``priority`` and ``latency_sensitivity`` are
    the agent hints (larger means sooner in the router queue); ``expected_output_tokens`` is
    ``agent_hints.osl``. ``session`` and ``pin_ttl_s`` (``nvext.session_control``, the
    ``cache_control`` TTL) are served by ``dyn.core.router.agent.AgentRouter``; ``affinity``
    (``soft`` | ``hard``) marks a session named by the client's session id (a header, not
    ``session_control``): bound to its first worker on first sight, kept there after.
    ``prefill_instance_id`` names the prefill worker of a disaggregated request
    (``nvext.prefill_worker_id``, ``x-prefill-instance-id``; ``instance_id`` then names its decode
    worker); ``overrides`` change a KV router's cost model for this request."""

    request_id: str
    token_ids: list[int]
    instance_id: int | None = None
    dp_rank: int | None = None
    prefill_instance_id: int | None = None
    overrides: RouteOverrides | None = None
    priority: int | None = None
    lora_name: str | None = None
    latency_sensitivity: float | None = None
    expected_output_tokens: int | None = None
    session: RouteSession | None = None
    affinity: Literal["soft", "hard"] | None = None
    pin_ttl_s: float | None = None
    media: list[MediaSpan] = []
    """The prompt's images (audio, video): their placeholder tokens' blocks hash with their keys
    (``dyn.core.kv.hashing``), so a KV router credits a repeated image where it is cached."""
    trajectory: str | None = None
    """The agent (or subagent) this request belongs to (``agent_context.program_id``, else its
    session id): ``AgentRouter`` remembers where its requests went."""
    parent: str | None = None
    """The agent that spawned this one (``agent_context.parent_program_id``, a parent-session
    header): with parent affinity, its first request prefers the parent's worker."""


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
    closed: bool = False
    """Whether ``finished`` freed the booking (for the routers that book)."""
    prefill: Route | None = None
    """A disaggregated request's prefill stage (``dyn.core.router.disagg``): the route of the
    prefill worker that computes the prompt's KV for ``worker``; None: ``worker`` does both."""
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

    async def reroute_prefill(self) -> Route | None:
        """After the prefill worker failed: another prefill route, or None (the decode worker
        prefills locally). Only a disaggregated route has a prefill stage to move."""
        return None


class Router(abc.ABC):
    """Routes the engine requests over ``pool``: ``route`` is the contract every router meets.

    A policy that picks one worker per request from the live workers and their load subclasses
    ``dyn.core.router.simple.SimpleRouter`` and writes only ``choose``; a router with its own
    admission (the KV router's queue, a remote ``dyn router``, the agent wrapper) implements
    ``route`` itself. ``dyn.core.router.modes`` names every router a ``--router-mode`` builds.
    """

    mode: str

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Background work the router needs while it serves (none for the simple policies)."""
        task_status.started()

    @abc.abstractmethod
    async def route(self, request: RouteRequest) -> Route:
        """The route for ``request``; may wait (a queueing router); raises ``RoutingError``. A
        request that names a worker (``instance_id``) goes to that worker or fails with
        ``WorkerNotFoundError`` (see ``named_worker``)."""

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

    def unroutable(self) -> str | None:
        """Why no request could be routed now (e.g. the ``dyn router`` it asks is unreachable
        and it has no policy of its own), or None. A wrapper answers for what it wraps."""
        return None

    def degraded(self) -> str | None:
        """Why routing is worse than configured now (e.g. by load alone while the ``dyn
        router`` or ``dyn indexer`` it asks is unreachable), or None. A wrapper answers for
        what it wraps."""
        return None


def named_worker(pool: WorkerPool, instance_id: int) -> Worker:
    """The live worker ``instance_id`` of ``pool``; ``WorkerNotFoundError`` lists the live ones."""
    worker = pool.get(instance_id)
    if worker is None:
        live = ", ".join(str(w.instance_id) for w in pool.workers()) or "none"
        raise WorkerNotFoundError(f"worker instance {instance_id} is not live (live instances: {live})")
    return worker


def no_workers(pool: WorkerPool) -> NoWorkersError:
    """The error for a request that finds no live worker in ``pool``."""
    return NoWorkersError(
        f"no worker is serving model {pool.model_name!r} yet; "
        "start one with 'dyn worker mocker' or retry later"
    )
