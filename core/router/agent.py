"""``AgentRouter``: sticky sessions, the session lifecycle and cache pinning around any router.

Reference 4.2-4.4 (Dynamo's StickySessionRouter, AgentController and the cache_control pin).
The frontend routes every engine request through it; requests without ``session`` or
``pin_ttl_s`` pass straight to the inner router.

``nvext.session_control`` (``RouteRequest.session``):

- **Stickiness.** A request whose session is bound, and that names no worker or dp rank itself,
  is pinned to the bound (worker, rank): it still passes the inner router's queue and booking,
  only the choice is made. If the bound worker is gone, the binding is dropped with a warning and
  the request is routed normally. A turn without ``action`` refreshes the binding's TTL.
- **open**: after routing, before generating, the worker is asked to open a streaming session
  with ``timeout + 30`` seconds (so the router's expiry closes it first); the request then runs in
  it and the session is bound ``engine_backed``. A failed open fails the request
  (``SessionOpenError``). A worker without streaming sessions gets a router-only binding and a
  warning (once per worker).
- **bind**: a router-only binding, no call to the worker.
- **close**: the binding is removed at once; after the stream ends the worker holding the
  session is asked to close it, if the binding was engine-backed or there was none (the worker
  may still hold one). A rebinding (``bind``, or ``open`` elsewhere) closes the engine session
  it replaces.
- **Expiry.** A reaper checks every ``REAP_INTERVAL_S``; an expired engine-backed session is
  closed on its worker.

**Session affinity by id** (``RouteRequest.affinity``, the frontend's ``--router-session-affinity``
for the session id a client sends in a header): a turn without ``action`` whose session has no
binding is routed normally and bound router-only to the worker chosen (TTL ``session.timeout``).
``hard`` keeps every later turn on that worker. ``soft`` keeps it there unless the worker is
overloaded: more than ``SOFT_SLACK`` requests in flight above the least loaded live worker and
more than twice its count; then the turn is routed normally and the session bound anew where it
went (as Dynamo's soft affinity treats the bound worker as a preference).

**Parent affinity** (``--router-parent-affinity``, on by default): a subagent's first request
shares its parent's context, cached where the parent ran. ``AgentRouter`` remembers the worker of
each agent's last request (``RouteRequest.trajectory``, at most ``MAX_PLACEMENTS``, least recently
used first out); an agent's first request (no binding, no placement of its own, no worker named)
that names its ``parent`` goes to the parent's last worker unless that worker is gone or
overloaded (as ``soft`` affinity judges it), and its session, if any, binds there as usual. Later
turns follow their own binding, or are routed anew. Dynamo (``--router-parent-affinity``, opt-in) needs the parent's
session binding; here any request with an agent identity leaves its placement behind.

``RouteRequest.pin_ttl_s`` (``nvext.cache_control`` with ``--enable-cache-control``): after the
stream ends, the worker that served it is asked to pin the prompt's cached prefix for that long.

``route_all`` (the ``n`` choices of one request) passes the group to the inner router's
``route_all``, so it is admitted as one unit, and adds each member's pin. A session needs a single
choice: a group of several requests of which one carries ``session`` is a caller's bug
(``ValueError``; the frontend refuses such requests with a 400 first).

Worker calls after a stream run in the background (``BackgroundTasks``); their failures are
logged, never reported to a client that already has its answer.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from dyn.core.background import BackgroundTasks
from dyn.core.engine import FEATURE_PIN_PREFIX, FEATURE_STREAMING_SESSIONS
from dyn.core.messages import PinPrefixRequest, SessionControlRequest
from dyn.core.router.policy import Route, Router, RouteRequest, RoutingError, WorkerNotFoundError
from dyn.core.router.pool import Worker
from dyn.core.router.sessions import SessionAffinity
from dyn.core.transport.request_plane import RemoteError, WorkerUnavailable

log = logging.getLogger("dyn.router")

ENGINE_TIMEOUT_MARGIN_S = 30
SOFT_SLACK = 8
MAX_PLACEMENTS = 65536
"""Agents whose last worker ``AgentRouter`` remembers for their subagents."""
REAP_INTERVAL_S = 1.0
CALL_TIMEOUT_S = 10.0
_call_ids = itertools.count()


class SessionOpenError(RoutingError):
    """The worker could not open the streaming session the request asked for."""


class AgentRoute(Route):
    """The inner router's route plus what must follow the stream (close, pin)."""

    __slots__ = ("inner", "session_id", "_after", "_closed")

    def __init__(self, inner: Route, session_id: str | None, after: list[Callable[[], object]]) -> None:
        super().__init__(inner.worker, inner.dp_rank)
        self.inner = inner
        self.session_id = session_id
        self._after = after
        self._closed = False

    @property
    def decision(self) -> Any:
        return self.inner.decision

    @property
    def queue_depth(self) -> int | None:  # type: ignore[override]
        return self.inner.queue_depth

    @property
    def prefill(self) -> Route | None:  # type: ignore[override]
        return self.inner.prefill

    async def reroute_prefill(self) -> Route | None:
        return await self.inner.reroute_prefill()

    def started(self) -> None:
        self.inner.started()

    def first_token(self) -> None:
        self.inner.first_token()

    def progress(self, output_tokens: int) -> None:
        self.inner.progress(output_tokens)

    def finished(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.inner.finished()
        for job in self._after:
            job()


class AgentRouter(Router):
    """Sessions and pinning around ``inner`` (see the module docstring)."""

    def __init__(
        self,
        inner: Router,
        *,
        enable_cache_control: bool = False,
        parent_affinity: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(inner.pool)
        self.inner = inner
        self.mode = inner.mode
        self.enable_cache_control = enable_cache_control
        self.parent_affinity = parent_affinity
        self.sessions = SessionAffinity(clock)
        self.background = BackgroundTasks()
        self._warned: set[int] = set()
        self._placed: OrderedDict[str, tuple[int, int | None]] = OrderedDict()
        """Each agent's last (worker, dp rank), for its subagents (``RouteRequest.trajectory``)."""

    def __getattr__(self, name: str) -> Any:
        # the inner router's own views (its index, block size) stay reachable through the wrapper
        return getattr(self.inner, name)

    def unroutable(self) -> str | None:
        return self.inner.unroutable()

    def degraded(self) -> str | None:
        return self.inner.degraded()

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(self.inner.run)
            await tg.start(self.background.run)
            task_status.started()
            while True:
                await anyio.sleep(REAP_INTERVAL_S)
                self._reap()

    # ----------------------------------------------------------------- routing

    async def route(self, request: RouteRequest) -> Route:
        session = request.session
        pin = request.pin_ttl_s if self.enable_cache_control else None
        if session is None and pin is None:
            if request.trajectory is None and request.parent is None:
                return await self.inner.route(request)
            return self._placed_by(await self._route_near_parent(request), request)
        after: list[Callable[[], object]] = []
        if session is None:
            route = await self._route_near_parent(request)
            engine_session = None
        else:
            route, engine_session = await self._route_session(request, after)
        self._placed_by(route, request)
        if pin is not None:
            after.append(lambda: self._spawn_pin(route.worker, request.token_ids, pin))
        return AgentRoute(route, engine_session, after)

    async def _route_near_parent(self, request: RouteRequest) -> Route:
        """``request`` routed on its parent's last worker when parent affinity says so (see the
        module docstring), else as the inner router chooses."""
        near = self._near_parent(request)
        if near is not None:
            try:
                return await self.inner.route(near)
            except WorkerNotFoundError:
                pass  # gone between the look-up and the booking: routed anew
        return await self.inner.route(request)

    def _near_parent(self, request: RouteRequest) -> RouteRequest | None:
        """``request`` pinned to its parent's last worker, or None when it should not be."""
        if not self.parent_affinity or request.parent is None or request.instance_id is not None:
            return None
        if request.trajectory is not None and request.trajectory in self._placed:
            return None  # not the agent's first request: it has a place of its own
        placed = self._placed.get(request.parent)
        if placed is None or self.pool.get(placed[0]) is None or self._overloaded(placed[0]):
            return None
        log.debug("request %s: placed on worker %d, where its parent ran", request.request_id, placed[0])
        return msgspec.structs.replace(request, instance_id=placed[0], dp_rank=placed[1])

    def _placed_by(self, route: Route, request: RouteRequest) -> Route:
        """Remember where ``request``'s agent ran (``RouteRequest.trajectory``); returns ``route``."""
        agent = request.trajectory
        if agent is not None:
            self._placed[agent] = (route.worker.instance_id, route.dp_rank)
            self._placed.move_to_end(agent)
            if len(self._placed) > MAX_PLACEMENTS:
                self._placed.popitem(last=False)
        return route

    async def route_all(self, requests: list[RouteRequest]) -> list[Route]:
        if len(requests) == 1:
            return [await self.route(requests[0])]
        if any(r.session is not None for r in requests):
            raise ValueError(
                "nvext.session_control needs a single choice: route_all got "
                f"{len(requests)} requests, one with a session"
            )
        routes = await self.inner.route_all(requests)
        if not self.enable_cache_control:
            return routes
        wrapped: list[Route] = []
        for request, route in zip(requests, routes, strict=True):
            if request.pin_ttl_s is None:
                wrapped.append(route)
                continue
            pin = functools.partial(self._spawn_pin, route.worker, request.token_ids, request.pin_ttl_s)
            wrapped.append(AgentRoute(route, None, [pin]))
        return wrapped

    async def _route_session(
        self, request: RouteRequest, after: list[Callable[[], object]]
    ) -> tuple[Route, str | None]:
        session = request.session
        assert session is not None
        sid = session.session_id
        bound = None
        if request.instance_id is None and request.dp_rank is None:
            bound = self.sessions.peek(sid)
            if bound is not None and self.pool.get(bound.instance_id) is None:
                log.warning(
                    "session %s was bound to worker %d, which is gone; routing it anew",
                    sid,
                    bound.instance_id,
                )
                self.sessions.unbind(sid)
                bound = None
        unbound = bound is None  # its first request (or its worker is gone): the parent may place it
        if bound is not None and request.affinity == "soft" and not bound.engine_backed:
            if self._overloaded(bound.instance_id):
                log.debug(
                    "session %s: worker %d is overloaded; routing the turn anew", sid, bound.instance_id
                )
                bound = None
        route = None
        if bound is not None:
            pinned = msgspec.structs.replace(request, instance_id=bound.instance_id, dp_rank=bound.dp_rank)
            try:
                route = await self.inner.route(pinned)
            except WorkerNotFoundError:
                log.warning(
                    "session %s: bound worker %d cannot take it; routing it anew", sid, bound.instance_id
                )
                self.sessions.unbind(sid)
                bound = None
        if route is None:
            route = await (self._route_near_parent(request) if unbound else self.inner.route(request))
        worker = route.worker
        action = session.action
        if action is None:
            if bound is not None:
                self.sessions.resolve(sid)
                return route, sid if bound.engine_backed else None
            if request.affinity is not None:
                self.sessions.bind(
                    sid, worker.instance_id, route.dp_rank, session.timeout, engine_backed=False
                )
            return route, None
        if action == "bind":
            old = self.sessions.peek(sid)
            self.sessions.bind(sid, worker.instance_id, route.dp_rank, session.timeout, engine_backed=False)
            self._close_replaced(sid, old, None)
            return route, None
        if action == "open":
            old = self.sessions.peek(sid)
            opened = await self._open(route, sid, session.timeout)
            self.sessions.bind(sid, worker.instance_id, route.dp_rank, session.timeout, engine_backed=opened)
            self._close_replaced(sid, old, worker.instance_id if opened else None)
            return route, sid if opened else None
        # close: unbind now; the worker holding the session closes it once this stream is over
        old = self.sessions.unbind(sid)
        holder = worker if old is None else self.pool.get(old.instance_id)
        if (
            (old is None or old.engine_backed)
            and holder is not None
            and self._supports(holder, FEATURE_STREAMING_SESSIONS, warn=False)
        ):
            after.append(
                lambda: self.background.spawn(f"close_session {sid}", self._close_session, holder, sid)
            )
        in_session = old is not None and old.engine_backed and old.instance_id == worker.instance_id
        return route, sid if in_session else None

    def _overloaded(self, instance_id: int) -> bool:
        """``soft`` affinity gives way: the worker has ``SOFT_SLACK`` more requests in flight (from
        this process) than the least loaded live worker, and more than twice as many."""
        workers = self.pool.workers()
        mine = next((w.client.in_flight for w in workers if w.instance_id == instance_id), None)
        if mine is None or len(workers) < 2:
            return False
        least = min(w.client.in_flight for w in workers)
        return mine > least + SOFT_SLACK and mine > 2 * least

    def _close_replaced(self, sid: str, old: Any, kept_on: int | None) -> None:
        """A rebinding replaced ``old``: close its engine session unless it lives on where the
        session is engine-backed now (``kept_on``)."""
        if old is None or not old.engine_backed or old.instance_id == kept_on:
            return
        holder = self.pool.get(old.instance_id)
        if holder is not None:
            self.background.spawn(f"close_session {sid}", self._close_session, holder, sid)

    async def _open(self, route: Route, sid: str, timeout: int) -> bool:
        """Open ``sid`` on the route's worker; False when it has no streaming sessions."""
        worker = route.worker
        if not self._supports(worker, FEATURE_STREAMING_SESSIONS):
            return False
        call = SessionControlRequest(
            f"session-{next(_call_ids)}", "open", sid, float(timeout + ENGINE_TIMEOUT_MARGIN_S)
        )
        try:
            await worker.client.call(call, CALL_TIMEOUT_S)
        except (RemoteError, WorkerUnavailable, TimeoutError) as exc:
            route.finished()
            raise SessionOpenError(
                f"worker {worker.instance_id} could not open session {sid!r}: {exc}"
            ) from None
        except BaseException:
            route.finished()
            raise
        return True

    def _supports(self, worker: Worker, feature: str, warn: bool = True) -> bool:
        if feature in worker.record.features:
            return True
        if warn and worker.instance_id not in self._warned:
            self._warned.add(worker.instance_id)
            log.warning(
                "worker %d (%s) does not offer %s; %s",
                worker.instance_id,
                worker.record.engine,
                feature,
                "sessions stay router-only (SGLang needs --enable-streaming-session)"
                if feature == FEATURE_STREAMING_SESSIONS
                else "cache_control is ignored",
            )
        return False

    # ----------------------------------------------------------------- after the stream

    def _spawn_pin(self, worker: Worker, token_ids: list[int], ttl_s: float) -> None:
        if self._supports(worker, FEATURE_PIN_PREFIX):
            self.background.spawn(
                f"pin_prefix on worker {worker.instance_id}", self._pin, worker, token_ids, ttl_s
            )

    async def _pin(self, worker: Worker, token_ids: list[int], ttl_s: float) -> None:
        reply = await worker.client.call(
            PinPrefixRequest(f"pin-{next(_call_ids)}", token_ids, ttl_s), CALL_TIMEOUT_S
        )
        log.debug("worker %d pinned %d blocks for %.0f s", worker.instance_id, reply.value, ttl_s)

    async def _close_session(self, worker: Worker, sid: str) -> None:
        await worker.client.call(
            SessionControlRequest(f"session-{next(_call_ids)}", "close", sid), CALL_TIMEOUT_S
        )
        log.debug("closed session %s on worker %d", sid, worker.instance_id)

    def _reap(self) -> None:
        for sid, binding in self.sessions.expire():
            if not binding.engine_backed:
                continue
            worker = self.pool.get(binding.instance_id)
            if worker is not None:
                log.info(
                    "session %s idle for %.0f s; closing it on worker %d",
                    sid,
                    binding.ttl_s,
                    binding.instance_id,
                )
                self.background.spawn(f"close_session {sid}", self._close_session, worker, sid)
