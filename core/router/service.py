"""``dyn router``: one KV router for one model, shared by several frontends over ZMQ.

``RouterService`` follows the model's workers (``WorkerPool``), routes with a ``KvRouter`` (built
by ``build_router(mode "kv")``, so every ``--router-*`` flag means what it means in a frontend;
over prefill and decode workers, in two stages: ``dyn.core.router.disagg``) and answers on a
ROUTER socket (the router plane of ``dyn.core.messages``):

- ``RouteQuery`` -> ``route_all`` over the query's group (its own request and its
  ``siblings``, admitted as one unit) in a task of its own (it may wait in the router queue)
  -> one ``RouteAnswer`` per member (with the router's block size and the member's index) or one
  ``RouteRefused`` for the whole group (``no_workers``, ``worker_not_found``, ``all_busy``,
  ``queue_full``, ``target_required``, ``bad_request``, ``cancelled`` or ``error``, and a
  sentence). Each booking is kept under (client, request id).
- ``RouteProgress`` -> the booking's ``started`` / ``first_token`` / ``progress`` / ``finished``
  hook; ``finished`` forgets it, and withdraws a query still waiting (its task is cancelled, so it
  leaves the router queue, and the client gets ``cancelled``). Progress for an unknown booking
  is ignored.
- Malformed frames get ``RouteRefused(query_id=-1, "bad_request", ...)``; nothing a client sends
  stops the service.

A client that disconnects (its frontend crashed or stopped) is noticed within a second: the
socket refuses to send to a peer that left (``ROUTER_MANDATORY``), and every second each client
holding a booking or a waiting query is sent a ``probe`` that clients ignore. Its waiting queries
are withdrawn and its bookings freed. A query answered for a client that left is freed at once.
A booking whose client stays but never reports its start is freed by the router's unstarted
expiry (``unstarted_booking_secs``; not for clients that do not set ``reports_start``), one that
never reports its end by the stale-request expiry (``stale_request_secs``); the service forgets
both within a second.

The service registers in the ``{namespace}.routers`` discovery namespace (so frontends with
``--router-address auto`` find it) and deregisters on shutdown; with ``--router-replica-sync``
that record is the ``ReplicaSync``'s, which also carries the query endpoint.
``run_router_service`` is the process: it prints ``dyn router ready: zmq=ENDPOINT`` once it
serves and stops cleanly on SIGINT/SIGTERM. With ``system_port`` it also serves ``RouterHttpApp``
(Prometheus ``/metrics`` and the index views under ``/kv/``) with uvicorn on the same event loop,
so HTTP reads of the index never race its single writer, and prints
``dyn router metrics: http://HOST:PORT/metrics`` before the ready line. The query socket binds
through ``dyn.core.transport.sockets.bind``: under ``--plane-keys`` only holders of the keys get
in, and without them it may listen on loopback only, where every local user can query it: with
``--api-key`` (which guards HTTP) the process warns so at start.
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from dyn.core.api_key import CHALLENGE, REFUSAL, ApiKey, authorization, needs_key
from dyn.core.asgi import http_request
from dyn.core.config import DiscoveryConfig
from dyn.core.discovery.services import new_instance_id
from dyn.core.discovery.store import DEFAULT_TTL_S, DiscoveryStore
from dyn.core.errors import ConfigError
from dyn.core.health import unroutable, verdict
from dyn.core.kv.hashing import MediaSpan
from dyn.core.kv.views import error_body, respond
from dyn.core.logs import status
from dyn.core.messages import RouteAnswer, RouteProgress, RouteQuery, RouteRefused
from dyn.core.router.build import build_router
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.disagg import DisaggRouter
from dyn.core.router.kv import AllWorkersBusyError
from dyn.core.router.policy import (
    NotDisaggregatedError,
    NoWorkersError,
    QueueFullError,
    Route,
    RouteOverrides,
    RouteRequest,
    RoutingError,
    TargetRequiredError,
    WorkerNotFoundError,
)
from dyn.core.router.pool import WorkerPool
from dyn.core.router.registry import router_record, routers_store
from dyn.core.service import LoopHttpServer, bind_http, bind_zmq, model_and_store, run_service
from dyn.core.transport.codec import decode_router_message
from dyn.core.transport.rpc import RpcServer
from dyn.core.transport.sockets import warn_open_plane

log = logging.getLogger("dyn.router.service")

READY_PREFIX = "dyn router ready: zmq="
METRICS_PREFIX = "dyn router metrics: "
SWEEP_S = 1.0

REFUSAL_CODES: tuple[tuple[type[RoutingError], str], ...] = (
    (QueueFullError, "queue_full"),
    (AllWorkersBusyError, "all_busy"),
    (NoWorkersError, "no_workers"),
    (WorkerNotFoundError, "worker_not_found"),
    (TargetRequiredError, "target_required"),
    (NotDisaggregatedError, "not_disaggregated"),
)


def refusal_code(exc: RoutingError) -> str:
    for cls, code in REFUSAL_CODES:
        if isinstance(exc, cls):
            return code
    return "error"


class RouterService:
    """Routes ``model_name``'s requests for the frontends that ask (see the module docstring).

    Construction binds the query socket on ``host`` (``port`` 0: a free one; ``endpoint`` is
    where frontends connect: the advertised address, ``dyn.core.transport.sockets.bind``) and
    raises ``ConfigError`` when it cannot.
    """

    def __init__(
        self,
        store: DiscoveryStore,
        model_name: str,
        config: KvRouterConfig,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        registry: CollectorRegistry | None = None,
        lease_ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        self.store = store
        self.model_name = model_name
        self.config = config
        self.lease_ttl_s = lease_ttl_s
        self.registry = registry if registry is not None else CollectorRegistry()
        # mandatory: a send to a client that left fails, which is how a departure is noticed
        self._rpc = RpcServer(decode_router_message, mandatory=True, logger=log)
        self._socket = self._rpc.socket
        self.endpoint = bind_zmq(self._socket, host, port, "--port")
        self.pool = WorkerPool(store, model_name)
        try:
            router = build_router(
                "kv",
                self.pool,
                config,
                self.registry,
                namespace=store.namespace,
                host=host,
                serve_endpoint=self.endpoint,
            )
        except ValueError as exc:
            self._socket.close(linger=0)
            raise ConfigError(str(exc)) from None
        assert isinstance(router, DisaggRouter)
        self.router = router
        self.routes: dict[tuple[bytes, str], Route] = {}
        """Live bookings by (client identity, request id)."""
        self._booked_at: dict[tuple[bytes, str], float] = {}
        self._waiting: dict[tuple[bytes, str], anyio.CancelScope] = {}
        """Queries not answered yet: each member's key -> its group's task scope."""

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started(endpoint)`` once queries are answered
        and the service is registered. Deregisters and closes the socket on the way out."""
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(self.pool.run)
                await tg.start(self.router.run)
                tg.start_soon(self._sweep)
                if self.config.replica_sync:  # ReplicaSync's record carries our endpoint
                    tg.start_soon(self._serve, tg)
                    task_status.started(self.endpoint)
                else:
                    record = router_record(
                        routers_store(self.store), self.model_name, new_instance_id(), request=self.endpoint
                    )
                    async with routers_store(self.store).lease(record, self.lease_ttl_s):
                        tg.start_soon(self._serve, tg)
                        task_status.started(self.endpoint)
                        await anyio.sleep_forever()
        finally:
            self._socket.close(linger=0)

    # ----------------------------------------------------------------- serving

    async def _serve(self, tg: anyio.abc.TaskGroup) -> None:
        rpc = self._rpc
        rpc.handle(RouteQuery, lambda identity, query: self._on_query(tg, identity, query))
        rpc.handle(RouteProgress, self._progress)
        rpc.fallback = self._refuse_unexpected
        rpc.on_malformed = lambda identity, body, exc: self._send(
            identity, RouteRefused(-1, "bad_request", str(exc))
        )
        await rpc.serve()

    def _on_query(self, tg: anyio.abc.TaskGroup, identity: bytes, query: RouteQuery) -> None:
        problem = self._check_query(identity, query)
        if problem is not None:
            self._send(identity, RouteRefused(query.query_id, "bad_request", problem))
            return
        scope = anyio.CancelScope()
        for rid in (query.request_id, *query.siblings):
            self._waiting[(identity, rid)] = scope
        tg.start_soon(self._answer, identity, query, scope)

    def _refuse_unexpected(self, identity: bytes, message: Any) -> None:
        self._send(
            identity,
            RouteRefused(
                -1,
                "bad_request",
                f"a dyn router takes RouteQuery and RouteProgress, not {type(message).__name__}",
            ),
        )

    def _check_query(self, identity: bytes, query: RouteQuery) -> str | None:
        """Why ``query`` cannot be taken, or None."""
        ids = (query.request_id, *query.siblings)
        if len(set(ids)) != len(ids):
            return "the request ids of a query's group must differ"
        for rid in ids:
            if (identity, rid) in self.routes or (identity, rid) in self._waiting:
                return f"request id {rid!r} is already booked by this client"
        if query.sibling_prompts:
            if len(query.sibling_prompts) != len(query.siblings):
                return (
                    f"sibling_prompts has {len(query.sibling_prompts)} entries for "
                    f"{len(query.siblings)} siblings"
                )
            if any(not 0 <= i <= len(query.prompts) for i in query.sibling_prompts):
                return f"a sibling prompt index is outside 0..{len(query.prompts)}"
        credit = query.overlap_score_credit
        if credit is not None and not 0.0 <= credit <= 1.0:
            return f"overlap_score_credit must be from 0.0 to 1.0, got {credit!r}"
        if query.prompt_media:
            if len(query.prompt_media) != len(query.prompts) + 1:
                return (
                    f"prompt_media has {len(query.prompt_media)} entries for {len(query.prompts) + 1} prompts"
                )
            tokens = [query.token_ids, *query.prompts]
            for spans, prompt in zip(query.prompt_media, tokens, strict=True):
                if len(spans) > len(prompt) or any(
                    not (0 <= offset and 0 < length and offset + length <= len(prompt) and 0 <= key < 2**64)
                    for offset, length, key in spans
                ):
                    return "a prompt_media span lies outside its prompt (or its key is not a u64)"
        return None

    def _group(self, identity: bytes, query: RouteQuery) -> list[RouteRequest]:
        prompts = [query.token_ids, *query.prompts]
        media = [[MediaSpan(*span) for span in spans] for spans in query.prompt_media]
        which = query.sibling_prompts or [0] * len(query.siblings)
        members = [(query.request_id, 0)]
        members += list(zip(query.siblings, which, strict=True))
        prefix = identity.hex()
        credit = query.overlap_score_credit
        overrides = None if credit is None else RouteOverrides(overlap_score_credit=credit)
        return [
            RouteRequest(
                request_id=f"{prefix}/{rid}",
                token_ids=prompts[i],
                media=media[i] if i < len(media) else [],
                instance_id=query.instance_id,
                dp_rank=query.dp_rank,
                priority=query.priority,
                lora_name=query.lora_name,
                latency_sensitivity=query.latency_sensitivity,
                expected_output_tokens=query.expected_output_tokens,
                prefill_instance_id=query.prefill_instance_id,
                overrides=overrides,
            )
            for rid, i in members
        ]

    async def _answer(self, identity: bytes, query: RouteQuery, scope: anyio.CancelScope) -> None:
        rids = (query.request_id, *query.siblings)
        routes = None
        try:
            with scope:
                routes = await self.router.route_all(self._group(identity, query))
        except RoutingError as exc:
            self._send(identity, RouteRefused(query.query_id, refusal_code(exc), str(exc)))
            return
        except Exception as exc:  # a router bug must not take the service down
            log.exception("routing request %s failed", query.request_id)
            self._send(
                identity,
                RouteRefused(query.query_id, "error", f"the router failed: {type(exc).__name__}: {exc}"),
            )
            return
        finally:
            for rid in rids:
                self._waiting.pop((identity, rid), None)
        if routes is None:  # withdrawn: the client gave up, or left
            self._send(identity, RouteRefused(query.query_id, "cancelled", "the client withdrew the query"))
            return
        now = time.monotonic()
        block_size = self.router.block_size or 0
        answers = []
        for member, (rid, route) in enumerate(zip(rids, routes, strict=True)):
            key = (identity, rid)
            self.routes[key] = route
            self._booked_at[key] = now
            if not query.reports_start:
                route.started()  # an older client: the answer is the only start we will hear of
            d = route.decision
            prefill = route.prefill
            answers.append(
                RouteAnswer(
                    query.query_id,
                    route.worker.instance_id,
                    route.dp_rank or 0,
                    d.overlap_blocks if d is not None else 0,
                    d.cached_tokens if d is not None else 0,
                    block_size,
                    route.queue_depth or 0,
                    member,
                    prefill.worker.instance_id if prefill is not None else -1,
                    prefill.dp_rank or 0 if prefill is not None else 0,
                    getattr(d, "host_blocks", 0),
                    getattr(d, "disk_blocks", 0),
                )
            )
        for answer in answers:
            if not self._send(identity, answer):
                log.info("client %s left before its answer; freed %d booking(s)", identity.hex(), len(rids))
                for rid in rids:
                    self._forget((identity, rid))
                return

    def _forget(self, key: tuple[bytes, str]) -> None:
        """Free and forget a booking, or withdraw a waiting query's group."""
        self._booked_at.pop(key, None)
        route = self.routes.pop(key, None)
        if route is not None:
            route.finished()
            return
        scope = self._waiting.get(key)
        if scope is not None:
            scope.cancel()

    def _progress(self, identity: bytes, progress: RouteProgress) -> None:
        key = (identity, progress.request_id)
        route = self.routes.get(key)
        if route is None:
            if progress.event == "finished" and key in self._waiting:
                self._forget(key)
            else:
                log.debug("progress for unknown booking %s", progress.request_id)
            return
        if progress.event == "started":
            route.started()
        elif progress.event == "first_token":
            route.first_token()
        elif progress.event == "progress":
            route.progress(progress.output_tokens)
        elif progress.event == "finished":
            if progress.output_tokens:
                route.progress(progress.output_tokens)
            self._forget(key)
        else:
            self._send(
                identity,
                RouteRefused(
                    -1,
                    "bad_request",
                    f"unknown progress event {progress.event!r}: use "
                    "started, first_token, progress or finished",
                ),
            )

    def _send(self, identity: bytes, message: Any) -> bool:
        """Send without waiting (the send high-water mark is unbounded); False when the client
        is gone (``ROUTER_MANDATORY``) or the send failed."""
        return self._rpc.send(identity, message)

    async def _sweep(self) -> None:
        """Every second: forget bookings the router freed (unstarted or stale), free those older
        than the stale-request timeout, and drop the clients that left."""
        max_age = self.config.stale_request_secs
        while True:
            await anyio.sleep(SWEEP_S)
            self.sweep(time.monotonic(), max_age)

    def sweep(self, now: float, max_age: float) -> None:
        """One pass of ``_sweep``."""
        stale = [
            k
            for k, route in self.routes.items()
            if route.closed or now - self._booked_at.get(k, now) > max_age
        ]
        unreported = 0
        for key in stale:
            unreported += not self.routes[key].closed
            self._forget(key)
        if unreported:
            log.warning("forgot %d booking(s) whose client never reported their end", unreported)
        clients = {k[0] for k in self.routes} | {k[0] for k in self._waiting}
        for identity in clients:
            if not self._send(identity, RouteRefused(0, "probe", "")):
                self._client_left(identity)

    def _client_left(self, identity: bytes) -> None:
        keys = [k for k in (*self.routes, *self._waiting) if k[0] == identity]
        for key in keys:
            self._forget(key)
        log.info("client %s left; freed its %d booking(s) and waiting request(s)", identity.hex(), len(keys))


# --------------------------------------------------------------------------- the process


@dataclass(slots=True)
class RouterSettings:
    host: str = "127.0.0.1"
    port: int = 0
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    model_path: str | None = None
    model_name: str | None = None
    router_config: KvRouterConfig = field(default_factory=KvRouterConfig)
    system_port: int | None = None
    api_key: str | None = None
    """Required as 'Authorization: Bearer KEY' on the HTTP routes but /live and /health."""


def build_service(settings: RouterSettings) -> RouterService:
    """The service ``settings`` describe; ``ConfigError`` says what to fix."""
    model_name, store = model_and_store(settings.model_path, settings.model_name, settings.discovery)
    try:
        routers_store(store)  # the backend must support router discovery
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return RouterService(store, model_name, settings.router_config, host=settings.host, port=settings.port)


async def serve_router(settings: RouterSettings) -> None:
    """Serve until SIGINT/SIGTERM."""
    service = build_service(settings)
    warn_open_plane(log, settings.api_key, service.endpoint)
    sock = None
    if settings.system_port is not None:
        try:
            sock = bind_http(settings.host, settings.system_port, "--system-port")
        except ConfigError:
            service._socket.close(linger=0)
            raise
    try:
        await _serve(service, settings, sock)
    finally:
        if sock is not None:
            sock.close()


# --------------------------------------------------------------------------- the system port


class RouterHttpApp:
    """The ``--system-port`` HTTP API of a ``dyn router`` (ASGI), read on the router's loop:

    - ``GET /metrics``: the router's registry in the Prometheus text format.
    - ``GET /health`` (``probe``: 503 with the reason when it can route nothing, the worker ids
      only with the API key) and ``GET /live`` (200 while it serves), open without the key, for
      probes.
    - ``/kv/...``: ``dyn indexer``'s read views (``dyn.core.kv.views``) over the router's own
      index, as a frontend in kv mode serves them. A router without one (``--use-remote-indexer``,
      an overlap credit of 0) answers 404 with a sentence naming what to inspect instead.

    Anything else is a 404, a wrong method a 405; errors are ``{"error": "<sentence>"}``. With
    ``api_key`` every route needs it (``dyn.core.api_key``): a 401 otherwise.
    """

    def __init__(self, service: RouterService, api_key: str | None = None) -> None:
        from dyn.core.kv.views import IndexerHttpApp, IndexerMetrics, router_index_view

        self.service = service
        view = router_index_view(service.router, service.pool, service.model_name)
        self.kv_views = (
            IndexerHttpApp(view, IndexerMetrics(service.registry, view), prefix="/kv")
            if view is not None
            else None
        )
        self.api_key = ApiKey(api_key) if api_key else None

    def probe(self, path: str, privileged: bool) -> tuple[int, bytes]:
        """``/live``: 200 while the process serves; ``/health``: the frontend's shape
        (``dyn.core.health``): 503 with the reason when it could route no request (no live
        worker, or what its router says), degraded while it routes worse than configured (its
        ``dyn indexer`` away), the count of live workers, and their instance ids when
        ``privileged`` (no API key is set, or the caller sent it)."""
        if path == "/live":
            return 200, b'{"status":"live"}'
        service = self.service
        instances = [w.instance_id for w in service.pool.workers()]
        reason = unroutable(service.router, service.model_name)
        degraded = service.router.degraded()
        status, body = verdict(
            {service.model_name: reason} if reason else {}, [degraded] if degraded else [], 1
        )
        body |= {"model": service.model_name, "workers": len(instances)}
        if privileged:
            body["instances"] = instances
        return status, orjson.dumps(body)

    def no_index(self) -> str:
        """Why this router has no ``/kv/`` views, and what to inspect instead."""
        config = self.service.config
        if config.use_remote_indexer:
            remote = self.service.router.remote_indexer
            where = (
                f"the dyn indexer at {remote.address}"
                if remote is not None
                else "a dyn indexer found in discovery"
            )
            return (
                f"this router keeps no KV index: it asks {where} (--use-remote-indexer); "
                "inspect that indexer instead (dyn inspect-kv --namespace "
                f"{self.service.store.namespace}, or --url with its http= address)"
            )
        return (
            "this router keeps no KV index: prefix overlap is off "
            "(--router-kv-overlap-score-credit 0 or --load-aware)"
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not await http_request(scope, receive, send):
            return
        path, method = scope["path"], scope["method"]
        if needs_key(self.api_key, path) and not self.api_key.allows(authorization(scope["headers"])):
            await respond(send, 401, error_body(REFUSAL), b"application/json", [CHALLENGE])
            return
        if path.startswith("/kv/"):
            if self.kv_views is not None:
                await self.kv_views(scope, receive, send)
                return
            status, body, content_type = 404, error_body(self.no_index()), b"application/json"
        elif path in ("/health", "/live"):
            key = self.api_key
            status, body = self.probe(path, key is None or key.allows(authorization(scope["headers"])))
            content_type = b"application/json"
        elif path == "/metrics":
            if method in ("GET", "HEAD"):
                status, body = 200, generate_latest(self.service.registry)
                content_type = CONTENT_TYPE_LATEST.encode()
            else:
                status, body, content_type = 405, error_body("/metrics accepts GET only"), b"application/json"
        else:
            status, body, content_type = (
                404,
                error_body(
                    f"no route for {method} {path}; a dyn router serves GET /metrics, /health, /live and the KV index "
                    "views under /kv/ (/kv/workers, /kv/query, /kv/dump, ...)"
                ),
                b"application/json",
            )
        await respond(send, status, body, content_type)


async def _serve(service: RouterService, settings: RouterSettings, sock: socket.socket | None = None) -> None:
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            await tg.start(service.run)
            system = (
                LoopHttpServer(RouterHttpApp(service, settings.api_key), sock, settings.host)
                if sock is not None
                else None
            )
            if system is not None:
                await system.start(tg)
                status(f"{METRICS_PREFIX}{system.url}/metrics", url=f"{system.url}/metrics")
            status(READY_PREFIX + service.endpoint, zmq=service.endpoint)
            log.info(
                "routing model %r for namespace %r (%d worker(s) so far)",
                service.model_name,
                settings.discovery.namespace,
                len(service.pool),
            )
            async for signum in signals:
                log.info("received %s; stopping", signal.Signals(signum).name)
                break
            if system is not None:
                await system.stop()
            tg.cancel_scope.cancel()


def run_router_service(settings: RouterSettings) -> None:
    """Run ``dyn router`` until SIGINT/SIGTERM; ``ConfigError`` for anything to fix first."""
    run_service(serve_router, settings)
