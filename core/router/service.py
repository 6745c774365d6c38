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
serves and stops cleanly on SIGINT/SIGTERM.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import zmq
from prometheus_client import CollectorRegistry

from dyn.core.discovery.services import new_instance_id
from dyn.core.discovery.store import DEFAULT_TTL_S, DiscoveryStore
from dyn.core.errors import ConfigError
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
from dyn.core.service import bind_zmq, model_and_store, run_service
from dyn.core.transport.codec import ProtocolError, decode_router_message, encode
from dyn.core.transport.sockets import async_context, configure

log = logging.getLogger("dyn.router.service")

READY_PREFIX = "dyn router ready: zmq="
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
    metrics_server = None
    if settings.system_port is not None:
        metrics_server = _serve_metrics(service, settings.host, settings.system_port)
    try:
        await _serve(service, settings)
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()


def _serve_metrics(service: RouterService, host: str, port: int):
    """Prometheus text of the router's metrics at ``http://HOST:PORT/metrics`` (a thread)."""
    from prometheus_client import start_http_server

    try:
        server, _ = start_http_server(port, addr=host, registry=service.registry)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; choose another "
                          "--system-port (0 picks a free one)") from None
    print(f"dyn router metrics: http://{host}:{server.server_port}/metrics", flush=True)
    return server


async def _serve(service: RouterService, settings: RouterSettings) -> None:
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            await tg.start(service.run)
            print(READY_PREFIX + service.endpoint, flush=True)
            log.info("routing model %r for namespace %r (%d worker(s) so far)",
                     service.model_name, settings.namespace, len(service.pool))
            async for signum in signals:
                log.info("received %s; stopping", signal.Signals(signum).name)
                break
            tg.cancel_scope.cancel()


def run_router_service(settings: RouterSettings) -> None:
    """Run ``dyn router`` until SIGINT/SIGTERM; ``ConfigError`` for anything to fix first."""
    run_service(serve_router, settings)
