"""``dyn frontend --num-http-workers N``: N frontend processes serving HTTP on one port.

One Python frontend does its HTTP, tokenizing and streaming on one core; past a hundred or so
streams it is CPU-bound (issue 21). With N workers the kernel spreads connections over N
processes that each listen on the port with ``SO_REUSEPORT``, each a whole frontend (its own
models, pools, routers and KV indexes, fed by the same workers' KV events).

- One routing view: with ``--router-mode kv`` the HTTP workers' routers sync their bookings as
  router replicas do (``--router-replica-sync``, turned on here), so each one's load model counts
  the requests the others routed, and KV routing quality does not drop with N. With
  ``--router-address`` they all ask the one ``dyn router`` instead.
- This process supervises: it checks the settings (a bad flag fails here, once), reserves the
  port (a bound socket that does not listen, so port 0 resolves to one free port for all), starts
  the workers (``multiprocessing``'s spawn: a fresh interpreter each, never a fork of a process
  with ZMQ threads), prints ``dyn frontend listening on URL`` once all of them serve, restarts
  one that dies (after a back-off that doubles, 1 s up to 30 s, while it keeps dying within a
  minute of its start), and on SIGINT or SIGTERM stops them all (each drains as a single
  frontend does) before it returns. A worker dies with this process (``die_with_parent``).
- A worker killed outright (SIGKILL, the OOM killer) takes the connections the kernel had queued
  for it but it had not accepted yet: they are reset, unless the host's
  ``net.ipv4.tcp_migrate_req`` is 1 (Linux 5.14+), which moves them to the other workers'
  sockets. The supervisor says so at start when it is 0 (``_migration_hint``).
- One agent trace: with ``--agent-trace-file`` this process writes the file, and each worker
  sends its requests' entries down a pipe of its own (``agent_trace.PipeSink``, read by a
  ``TraceReceiver`` thread here), so the trace is dated on one clock and a session's
  ``delay_ms`` counts its turns whichever worker served them.
- Per process, not shared: ``/metrics`` (a scrape reaches one worker: scrape each, or read the
  router's and workers' metrics), the ``/kv/`` views, sessions bound through ``nvext`` (a
  session's turns may reach different workers; their routers share bookings, not session
  bindings).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import signal
import time
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dyn.core.errors import ConfigError

if TYPE_CHECKING:
    from dyn.core.frontend.agent_trace import TraceReceiver

log = logging.getLogger("dyn.frontend")

START_TIMEOUT_S = 120.0
"""Longest the HTTP workers may take to serve, all together, before the frontend gives up."""
_POLL_S = 0.2
_BACKOFF_S = (1.0, 30.0)
_QUICK_DEATH_S = 60.0


def run_http_workers(settings: Any) -> None:
    """Serve ``settings`` (a ``FrontendSettings`` with ``num_http_workers`` > 1) from that many
    processes until SIGINT or SIGTERM; ``ConfigError`` for what can be checked before they start,
    or when they do not all start."""
    from dyn.core.frontend.agent_trace import TraceReceiver
    from dyn.core.frontend.server import READY_PREFIX, build_app, trace_file
    from dyn.core.logs import current_setup, status
    from dyn.core.service import bind_http
    from dyn.core.transport.sockets import plane_keys

    build_app(settings)  # every check a single frontend makes, here, once
    receiver = TraceReceiver(trace_file(settings)) if settings.agent_trace_file is not None else None
    reserved = bind_http(settings.http_host, settings.http_port, reuse_port=True, listen=False)
    host, port = reserved.getsockname()[:2]
    keys = plane_keys()
    child = dataclasses.replace(
        settings,
        http_port=port,
        num_http_workers=1,
        reuse_port=True,
        router_config=_shared_routing(settings),
    )
    supervisor = _Supervisor(
        child,
        settings.num_http_workers,
        current_setup(),
        str(keys.directory) if keys is not None else None,
        receiver,
    )
    stop = _Stop()
    try:
        url = supervisor.start()
        status(READY_PREFIX + url, url=url)
        log.info("%d HTTP worker processes serve %s", settings.num_http_workers, url)
        hint = _migration_hint()
        if hint is not None:
            log.info(hint)
        supervisor.supervise(stop)
    finally:
        supervisor.stop()
        if receiver is not None:
            receiver.close()
        reserved.close()
        stop.restore()


MIGRATE_REQ = Path("/proc/sys/net/ipv4/tcp_migrate_req")


def _migration_hint(setting: Path = MIGRATE_REQ) -> str | None:
    """What to set so that a killed worker's queued connections move to the others; None when it
    is set, or the kernel has no such setting."""
    try:
        value = setting.read_text().strip()
    except OSError:
        return None
    if value != "0":
        return None
    return (
        "net.ipv4.tcp_migrate_req is 0: connections queued for an HTTP worker that is killed are "
        "reset; `sysctl -w net.ipv4.tcp_migrate_req=1` moves them to the other workers"
    )


def _shared_routing(settings: Any) -> Any:
    """The router config the HTTP workers run: kv routers sync their bookings (one view)."""
    config = settings.router_config
    if settings.router_mode == "kv" and settings.router_address is None and not config.replica_sync:
        return dataclasses.replace(config, replica_sync=True)
    return config


def _serve(
    settings: Any, index: int, ready: Any, logging_setup: tuple[str, str], keys: str | None, parent: int
) -> None:
    """One HTTP worker process (the spawn target): as ``dyn frontend``, telling ``ready`` when it
    serves."""
    from dyn.core.frontend.server import run_frontend
    from dyn.core.logs import configure_logging
    from dyn.core.parent import die_with_parent
    from dyn.core.transport.sockets import use_advertise_host, use_plane_keys

    die_with_parent(parent)
    configure_logging(*logging_setup, process=f"frontend-{index}")
    use_plane_keys(keys)
    use_advertise_host(settings.advertise_host)
    settings.on_ready = lambda _url: ready.set()
    run_frontend(settings)


class _Stop:
    """SIGINT/SIGTERM handlers that set a flag, and the previous handlers to restore."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.requested = True

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


class _Supervisor:
    def __init__(
        self,
        settings: Any,
        count: int,
        logging_setup: tuple[str, str],
        keys: str | None,
        trace: TraceReceiver | None = None,
    ) -> None:
        import os

        self.settings = settings
        self.trace = trace
        self.count = count
        self.logging_setup = logging_setup
        self.keys = keys
        self.parent = os.getpid()
        self.context = multiprocessing.get_context("spawn")
        self.procs: list[BaseProcess | None] = [None] * count
        self.readies: list[Any] = [None] * count
        """Each worker's ready event, held while it lives (a collected one fails its unpickling)."""
        self.started_at = [0.0] * count
        self.backoff = [_BACKOFF_S[0]] * count
        self.restart_at: list[float | None] = [None] * count
        self.url = ""

    def _spawn(self, index: int) -> Any:
        ready = self.context.Event()
        pipe = self.trace.pipe() if self.trace is not None else None
        proc = self.context.Process(
            target=_serve,
            args=(
                dataclasses.replace(self.settings, agent_trace_pipe=pipe),
                index,
                ready,
                self.logging_setup,
                self.keys,
                self.parent,
            ),
            name=f"dyn-frontend-{index}",
            daemon=True,
        )
        proc.start()
        if pipe is not None:
            pipe.close()  # the worker holds its own copy: its exit is then the pipe's end
        self.procs[index], self.readies[index] = proc, ready
        self.started_at[index] = time.monotonic()
        return ready

    def start(self) -> str:
        """Start every worker; the URL once all serve. ``ConfigError`` if one exits first or
        they take longer than ``START_TIMEOUT_S``."""
        readies = [self._spawn(i) for i in range(self.count)]
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(r.is_set() for r in readies):
            for i, proc in enumerate(self.procs):
                if proc is not None and not proc.is_alive():
                    raise ConfigError(f"HTTP worker {i} exited (status {proc.exitcode}) before it served")
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"the {self.count} HTTP workers did not all serve within {START_TIMEOUT_S:g} s"
                )
            time.sleep(_POLL_S)
        scheme = "https" if self.settings.tls is not None else "http"
        host = self.settings.http_host
        self.url = f"{scheme}://{host if ':' not in host else f'[{host}]'}:{self.settings.http_port}"
        return self.url

    def supervise(self, stop: _Stop) -> None:
        """Restart workers that die until a stop is requested."""
        while not stop.requested:
            now = time.monotonic()
            for i, proc in enumerate(self.procs):
                if proc is not None and not proc.is_alive():
                    quick = now - self.started_at[i] < _QUICK_DEATH_S
                    self.backoff[i] = min(self.backoff[i] * 2, _BACKOFF_S[1]) if quick else _BACKOFF_S[0]
                    self.restart_at[i] = now + self.backoff[i]
                    self.procs[i] = None
                    log.warning(
                        "HTTP worker %d exited (status %s); restarting it in %.0f s",
                        i,
                        proc.exitcode,
                        self.backoff[i],
                    )
                elif proc is None and (self.restart_at[i] or 0) <= now:
                    self.restart_at[i] = None
                    self._spawn(i)
            time.sleep(_POLL_S)

    def stop(self) -> None:
        """SIGTERM every worker, wait for their drain, then kill what is left."""
        live = [p for p in self.procs if p is not None and p.is_alive()]
        for proc in live:
            proc.terminate()
        deadline = time.monotonic() + self.settings.graceful_shutdown_s + 5
        for proc in live:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5)
