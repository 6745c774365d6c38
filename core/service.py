"""What every long-running dyn process shares: its event loop, binding its listening sockets
with an error that names the flag to change, and an HTTP server on that loop."""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import zmq

from dyn.core.errors import ConfigError
from dyn.core.memory import settle_heap
from dyn.core.transport.sockets import bind

if TYPE_CHECKING:
    from dyn.core.config import DiscoveryConfig


def run_service(main: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """Run ``main(*args)`` in an asyncio event loop (uvloop when installed) until it returns,
    with the garbage collector tuned for serving (``dyn.core.memory.settle_heap``)."""
    settle_heap()
    try:
        import uvloop  # noqa: F401

        options = {"use_uvloop": True}
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        options = {}
    anyio.run(main, *args, backend="asyncio", backend_options=options)
    sys.stdout.flush()


def bind_http(
    host: str, port: int, flag: str = "--http-port", *, reuse_port: bool = False, listen: bool = True
) -> socket.socket:
    """A listening TCP socket (port 0 picks a free one); ``ConfigError`` naming ``flag`` if it
    cannot bind. ``reuse_port``: other sockets with it may bind the same port, and the kernel
    spreads connections over those that listen (``SO_REUSEPORT``); ``listen`` False only reserves
    the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror}; choose another {flag} (0 picks a free one)"
        ) from None
    if listen:
        sock.listen(2048)
    sock.setblocking(False)
    return sock


def bind_zmq(sock: zmq.Socket, host: str, port: int, flag: str) -> str:
    """Bind ``sock`` on ``host:port`` (0: a free port) and return its endpoint; ``ConfigError``
    naming ``flag`` (and closing the socket) if it cannot bind."""
    try:
        return bind(sock, host, port)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror}; choose another "
            f"{flag} (0 picks a free one) or --host"
        ) from None


def model_and_store(
    model_path: str | None, model_name: str | None, discovery: DiscoveryConfig
) -> tuple[str, Any]:
    """The served model's name and the workers' discovery store (``discovery.open()``) of a
    service that follows them (router, indexer); ``ConfigError`` says what to fix."""
    from dyn.core.model.info import ModelError, load_model_info

    try:
        name = load_model_info(model_path, model_name).name
    except ModelError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return name, discovery.open()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


STOP_GRACE_S = 5.0


class LoopHttpServer:
    """uvicorn serving the ASGI ``app`` on an already bound ``sock``, inside the caller's event
    loop (so the app reads single-writer state safely); the caller handles SIGINT/SIGTERM.
    ``served`` is set once serving has ended."""

    def __init__(self, app: Any, sock: socket.socket, host: str) -> None:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield  # the service handles SIGINT/SIGTERM itself

        self.sock = sock
        self.host = host
        self.server = Server(
            uvicorn.Config(
                app,
                loop="none",
                http="httptools",
                lifespan="off",
                log_config=None,
                access_log=False,
                timeout_keep_alive=30,
            )
        )
        self.served = anyio.Event()

    @property
    def url(self) -> str:
        port = self.sock.getsockname()[1]
        return f"http://{self.host if ':' not in self.host else f'[{self.host}]'}:{port}"

    async def start(self, tg: Any) -> bool:
        """Serve in task group ``tg``; return once connections are accepted (True) or serving
        ended before that (False)."""
        tg.start_soon(self._serve)
        while not self.server.started and not self.served.is_set():  # noqa: ASYNC110 (uvicorn's flag)
            await anyio.sleep(0.01)
        return bool(self.server.started)

    async def stop(self) -> None:
        """Let open requests finish (at most ``STOP_GRACE_S``)."""
        self.server.should_exit = True
        with anyio.move_on_after(STOP_GRACE_S):
            await self.served.wait()

    async def _serve(self) -> None:
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            self.served.set()
