"""``dyn router``: one KV router for one model, shared by several frontends over ZMQ.

``RouterService`` follows the model's workers (``WorkerPool``), routes with a ``KvRouter`` (built
by ``build_router(mode "kv")``, so every ``--router-*`` flag means what it means in a frontend)
and answers on a ROUTER socket (the router plane of ``dyn.core.messages``):

- ``RouteQuery`` -> ``KvRouter.route`` in a task of its own (it may wait in the router queue)
  -> ``RouteAnswer`` (with the router's block size) or ``RouteRefused`` (``no_workers``,
  ``worker_not_found``, ``all_busy``, ``target_required``, ``bad_request`` or ``error``, and a
  sentence). The booking is kept under (client, request id).
- ``RouteProgress`` -> the booking's ``first_token`` / ``progress`` / ``finished`` hook;
  ``finished`` forgets it. Progress for an unknown booking is ignored.
- Malformed frames get ``RouteRefused(query_id=-1, "bad_request", ...)``; nothing a client sends
  stops the service.

A booking whose client never reports its end is freed by the router's stale-request expiry
(``KvRouterConfig.stale_request_secs``); the service then forgets it too.

The service registers in the ``{namespace}.routers`` discovery namespace (so frontends with
``--router-address auto`` find it) and deregisters on shutdown; with ``--router-replica-sync``
that record is the ``ReplicaSync``'s, which also carries the query endpoint.
``run_router_service`` is the process: it prints ``dyn router ready: zmq=ENDPOINT`` once it
serves and stops cleanly on SIGINT/SIGTERM. With ``system_port`` it also serves ``RouterHttpApp``
(Prometheus ``/metrics`` and the index views under ``/kv/``) with uvicorn on the same event loop,
so HTTP reads of the index never race its single writer, and prints
``dyn router metrics: http://HOST:PORT/metrics`` before the ready line.
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
import zmq
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from dyn.core.asgi import lifespan
from dyn.core.discovery.services import new_instance_id
from dyn.core.discovery.store import DEFAULT_TTL_S, DiscoveryStore
from dyn.core.errors import ConfigError
from dyn.core.indexer.http import error_body
from dyn.core.messages import RouteAnswer, RouteProgress, RouteQuery, RouteRefused
from dyn.core.router.build import build_router
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.kv import AllWorkersBusyError, KvRoute, KvRouter
from dyn.core.router.policy import (
    NoWorkersError,
    RouteRequest,
    RoutingError,
    TargetRequiredError,
    WorkerNotFoundError,
)
from dyn.core.router.pool import WorkerPool
from dyn.core.router.registry import router_record, routers_store
from dyn.core.service import LoopHttpServer, bind_http, bind_zmq, model_and_store, run_service
from dyn.core.transport.codec import ProtocolError, decode_router_message, encode
from dyn.core.transport.sockets import async_context, configure

log = logging.getLogger("dyn.router.service")

READY_PREFIX = "dyn router ready: zmq="
METRICS_PREFIX = "dyn router metrics: "
SWEEP_S = 30.0

REFUSAL_CODES: tuple[tuple[type[RoutingError], str], ...] = (
    (AllWorkersBusyError, "all_busy"),
    (NoWorkersError, "no_workers"),
    (WorkerNotFoundError, "worker_not_found"),
    (TargetRequiredError, "target_required"),
)


def refusal_code(exc: RoutingError) -> str:
    for cls, code in REFUSAL_CODES:
        if isinstance(exc, cls):
            return code
    return "error"


class RouterService:
    """Routes ``model_name``'s requests for the frontends that ask (see the module docstring).

    Construction binds the query socket on ``host`` (``port`` 0: a free one; ``endpoint`` says
    which) and raises ``ConfigError`` when it cannot.
    """

    def __init__(self, store: DiscoveryStore, model_name: str, config: KvRouterConfig, *,
                 host: str = "127.0.0.1", port: int = 0,
                 registry: CollectorRegistry | None = None,
                 lease_ttl_s: float = DEFAULT_TTL_S) -> None:
        self.store = store
        self.model_name = model_name
        self.config = config
        self.lease_ttl_s = lease_ttl_s
        self.registry = registry if registry is not None else CollectorRegistry()
        self._socket = configure(async_context().socket(zmq.ROUTER))
        self.endpoint = bind_zmq(self._socket, host, port, "--port")
        self.pool = WorkerPool(store, model_name)
        try:
            router = build_router("kv", self.pool, config, self.registry,
                                  namespace=store.namespace, host=host,
                                  serve_endpoint=self.endpoint)
        except ValueError as exc:
            self._socket.close(linger=0)
            raise ConfigError(str(exc)) from None
        assert isinstance(router, KvRouter)
        self.router: KvRouter = router
        self.routes: dict[tuple[bytes, str], KvRoute] = {}
        """Live bookings by (client identity, request id)."""
        self._booked_at: dict[tuple[bytes, str], float] = {}
        self._pending: set[tuple[bytes, str]] = set()

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
                    record = router_record(routers_store(self.store), self.model_name,
                                           new_instance_id(), request=self.endpoint)
                    async with routers_store(self.store).lease(record, self.lease_ttl_s):
                        tg.start_soon(self._serve, tg)
                        task_status.started(self.endpoint)
                        await anyio.sleep_forever()
        finally:
            self._socket.close(linger=0)

    # ----------------------------------------------------------------- serving

    async def _serve(self, tg: anyio.abc.TaskGroup) -> None:
        while True:
            frames = await self._socket.recv_multipart(copy=True)
            identity, body = frames[0], frames[1:]
            try:
                message = decode_router_message(body)
            except ProtocolError as exc:
                log.warning("refused a malformed message: %s", exc)
                self._send(identity, RouteRefused(-1, "bad_request", str(exc)))
                continue
            if isinstance(message, RouteQuery):
                key = (identity, message.request_id)
                if key in self.routes or key in self._pending:
                    self._send(identity, RouteRefused(
                        message.query_id, "bad_request",
                        f"request id {message.request_id!r} is already booked by this client"))
                    continue
                self._pending.add(key)
                tg.start_soon(self._answer, identity, message)
            elif isinstance(message, RouteProgress):
                self._progress(identity, message)
            else:
                self._send(identity, RouteRefused(
                    -1, "bad_request", f"a dyn router takes RouteQuery and RouteProgress, not "
                    f"{type(message).__name__}"))

    async def _answer(self, identity: bytes, query: RouteQuery) -> None:
        key = (identity, query.request_id)
        request = RouteRequest(
            request_id=f"{identity.hex()}/{query.request_id}", token_ids=query.token_ids,
            instance_id=query.instance_id, dp_rank=query.dp_rank, priority=query.priority,
            lora_name=query.lora_name, latency_sensitivity=query.latency_sensitivity,
            expected_output_tokens=query.expected_output_tokens)
        try:
            route = await self.router.route(request)
        except RoutingError as exc:
            self._send(identity, RouteRefused(query.query_id, refusal_code(exc), str(exc)))
            return
        except Exception as exc:  # a router bug must not take the service down
            log.exception("routing request %s failed", query.request_id)
            self._send(identity, RouteRefused(query.query_id, "error",
                                              f"the router failed: {type(exc).__name__}: {exc}"))
            return
        finally:
            self._pending.discard(key)
        assert isinstance(route, KvRoute)
        self.routes[key] = route
        self._booked_at[key] = time.monotonic()
        decision = route.decision
        self._send(identity, RouteAnswer(query.query_id, decision.worker[0], decision.worker[1],
                                         decision.overlap_blocks, decision.cached_tokens,
                                         self.router.block_size or 0, route.queue_depth))

    def _progress(self, identity: bytes, progress: RouteProgress) -> None:
        key = (identity, progress.request_id)
        route = self.routes.get(key)
        if route is None:
            log.debug("progress for unknown booking %s", progress.request_id)
            return
        if progress.event == "first_token":
            route.first_token()
        elif progress.event == "progress":
            route.progress(progress.output_tokens)
        elif progress.event == "finished":
            if progress.output_tokens:
                route.progress(progress.output_tokens)
            del self.routes[key]
            self._booked_at.pop(key, None)
            route.finished()
        else:
            self._send(identity, RouteRefused(-1, "bad_request",
                                              f"unknown progress event {progress.event!r}: use "
                                              "first_token, progress or finished"))

    def _send(self, identity: bytes, message: Any) -> None:
        """Send without waiting (the send high-water mark is unbounded); a ROUTER drops
        messages to a client that went away."""
        sent = self._socket.send_multipart([identity, *encode(message)])
        if sent.done():
            if sent.exception() is not None:
                log.warning("could not answer a client: %s", sent.exception())
        else:
            sent.add_done_callback(_log_send_error)

    async def _sweep(self) -> None:
        """Forget bookings older than the router's stale-request timeout (their client never
        reported the end; the router has freed or will free them)."""
        max_age = self.config.stale_request_secs
        while True:
            await anyio.sleep(min(SWEEP_S, max_age))
            now = time.monotonic()
            stale = [k for k, t in self._booked_at.items() if now - t > max_age]
            for key in stale:
                del self._booked_at[key]
                route = self.routes.pop(key, None)
                if route is not None:
                    route.finished()
            if stale:
                log.warning("forgot %d booking(s) whose client never reported their end",
                            len(stale))


def _log_send_error(sent) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        log.warning("could not answer a client: %s", sent.exception())


# --------------------------------------------------------------------------- the process


@dataclass(slots=True)
class RouterSettings:
    host: str = "127.0.0.1"
    port: int = 0
    namespace: str = "default"
    discovery_backend: str = "file"
    discovery_dir: str | None = None
    model_path: str | None = None
    model_name: str | None = None
    router_config: KvRouterConfig = field(default_factory=KvRouterConfig)
    system_port: int | None = None


def build_service(settings: RouterSettings) -> RouterService:
    """The service ``settings`` describe; ``ConfigError`` says what to fix."""
    model_name, store = model_and_store(settings.model_path, settings.model_name,
                                        settings.discovery_backend, settings.namespace,
                                        settings.discovery_dir)
    try:
        routers_store(store)  # the backend must support router discovery
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return RouterService(store, model_name, settings.router_config, host=settings.host,
                         port=settings.port)


async def serve_router(settings: RouterSettings) -> None:
    """Serve until SIGINT/SIGTERM."""
    service = build_service(settings)
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
    - ``/kv/...``: ``dyn indexer``'s read views (``dyn.core.indexer.http``) over the router's own
      index, as a frontend in kv mode serves them. A router without one (``--use-remote-indexer``,
      an overlap credit of 0) answers 404 with a sentence naming what to inspect instead.

    Anything else is a 404, a wrong method a 405; errors are ``{"error": "<sentence>"}``.
    """

    def __init__(self, service: RouterService) -> None:
        from dyn.core.indexer.http import IndexerHttpApp, IndexerMetrics, router_index_view

        self.service = service
        view = router_index_view(service.router, service.pool, service.model_name)
        self.kv_views = (IndexerHttpApp(view, IndexerMetrics(service.registry, view), prefix="/kv")
                         if view is not None else None)

    def no_index(self) -> str:
        """Why this router has no ``/kv/`` views, and what to inspect instead."""
        config = self.service.config
        if config.use_remote_indexer:
            remote = self.service.router.remote_indexer
            where = (f"the dyn indexer at {remote.address}" if remote is not None
                     else "a dyn indexer found in discovery")
            return (f"this router keeps no KV index: it asks {where} (--use-remote-indexer); "
                    "inspect that indexer instead (dyn inspect-kv --namespace "
                    f"{self.service.store.namespace}, or --url with its http= address)")
        return ("this router keeps no KV index: prefix overlap is off "
                "(--router-kv-overlap-score-credit 0 or --load-aware)")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path.startswith("/kv/"):
            if self.kv_views is not None:
                await self.kv_views(scope, receive, send)
                return
            status, body, content_type = 404, error_body(self.no_index()), b"application/json"
        elif path == "/metrics":
            if method in ("GET", "HEAD"):
                status, body = 200, generate_latest(self.service.registry)
                content_type = CONTENT_TYPE_LATEST.encode()
            else:
                status, body, content_type = 405, error_body("/metrics accepts GET only"), b"application/json"
        else:
            status, body, content_type = 404, error_body(
                f"no route for {method} {path}; a dyn router serves GET /metrics and the KV index "
                "views under /kv/ (/kv/workers, /kv/query, /kv/dump, ...)"), b"application/json"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


async def _serve(service: RouterService, settings: RouterSettings,
                 sock: socket.socket | None = None) -> None:
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            await tg.start(service.run)
            system = LoopHttpServer(RouterHttpApp(service), sock, settings.host) if sock is not None else None
            if system is not None:
                await system.start(tg)
                print(f"{METRICS_PREFIX}{system.url}/metrics", flush=True)
            print(READY_PREFIX + service.endpoint, flush=True)
            log.info("routing model %r for namespace %r (%d worker(s) so far)",
                     service.model_name, settings.namespace, len(service.pool))
            async for signum in signals:
                log.info("received %s; stopping", signal.Signals(signum).name)
                break
            if system is not None:
                await system.stop()
            tg.cancel_scope.cancel()


def run_router_service(settings: RouterSettings) -> None:
    """Run ``dyn router`` until SIGINT/SIGTERM; ``ConfigError`` for anything to fix first."""
    run_service(serve_router, settings)
