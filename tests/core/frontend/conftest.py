"""In-process frontends over fake workers: ``build_app`` with the settings a test asks for, its
worker pool fed by a ``FakeFleet`` (``tests/core/frontend/fake_workers.py``) through the in-memory
discovery backend (one ``MemoryHub`` per frontend: no files to watch), and an
``httpx.AsyncClient`` that calls the ASGI app directly (``httpx.ASGITransport``: no socket).

``frontend`` is a running frontend with two fake workers and default settings;
``make_frontend(workers=..., script=..., **FrontendSettings fields)`` starts others (an async
context manager). ASGITransport hands the app the whole request body, then reports the client
gone once the response is complete; a test that needs the client to leave mid-stream drives
the app through ``asgi_call`` instead.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest

from dyn.core.config import DiscoveryConfig
from dyn.core.discovery import MemoryHub
from dyn.core.frontend.app import FrontendApp
from dyn.core.frontend.server import FrontendSettings, build_app
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import load_model_info
from dyn.core.router.pool import WorkerPool
from tests.core.frontend.fake_workers import FakeFleet, Script

BASE_URL = "http://dyn.test"
_namespaces = itertools.count()


@dataclass
class Frontend:
    """A running in-process frontend: ``client`` talks to ``app``; ``fleet`` is its workers."""

    app: FrontendApp
    pool: WorkerPool
    fleet: FakeFleet
    client: httpx.AsyncClient
    settings: FrontendSettings

    def metric(self, name: str, labels: str = "") -> float:
        """The value of the first sample of ``name`` whose labels contain ``labels`` (0 if none)."""
        for line in self.app.service.metrics.render().decode().splitlines():
            sample, _, value = line.rpartition(" ")
            if sample.split("{", 1)[0] == name and labels in sample:
                return float(value)
        return 0.0


@asynccontextmanager
async def running_frontend(
    tmp_path,
    *,
    workers: int = 2,
    script: Script | None = None,
    features: dict[int, list[str]] | None = None,
    records: dict[int, dict[str, Any]] | None = None,
    **settings: Any,
) -> AsyncIterator[Frontend]:
    """Build the app as ``dyn frontend`` does, over ``workers`` fake workers, and run its
    models until the block ends. ``features``: what the worker of each instance id advertises
    (default nothing); ``records``: other record fields of an instance (``model_name``...)."""
    namespace = f"fake{next(_namespaces)}"
    hub = MemoryHub()
    config = FrontendSettings(
        discovery=DiscoveryConfig(namespace=namespace, backend="memory", dir=hub.name), **settings
    )
    app, pool = build_app(config)
    fleet = FakeFleet(workers, script)
    for instance_id, advertised in (features or {}).items():
        fleet[instance_id].features = list(advertised)
    pool.client_factory = fleet.client
    await fleet.register(pool.store, app.service.model_name, records)
    async with anyio.create_task_group() as tg:
        await tg.start(app.models.run)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, timeout=30) as client:
            yield Frontend(app, pool, fleet, client, config)
        tg.cancel_scope.cancel()


CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three colours."},
]
"""A short conversation for endpoints that take ``messages``."""


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """The default model's tokenizer (dyn-tiny), as the frontend loads it."""
    return Tokenizer.from_model(load_model_info(None, None))


@pytest.fixture
def make_frontend(tmp_path) -> Callable[..., Any]:
    """``async with make_frontend(workers=2, script=None, features=None, **settings) as fe``."""
    return lambda **kwargs: running_frontend(tmp_path, **kwargs)


@pytest.fixture
async def frontend(tmp_path) -> AsyncIterator[Frontend]:
    """Default settings (round-robin, dyn-tiny) over two fake workers."""
    async with running_frontend(tmp_path) as fe:
        yield fe


async def asgi_call(
    app: FrontendApp,
    method: str,
    path: str,
    body: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
    *,
    leave_after: Callable[[list[dict]], bool] | None = None,
    leave: anyio.Event | None = None,
) -> list[dict]:
    """Call ``app`` directly and return the ASGI messages it sent. The client disconnects once
    ``leave`` is set, or once ``leave_after(sent)`` is true (checked after every message the app
    sends); otherwise it stays until the response is complete."""
    sent: list[dict] = []
    gone = leave or anyio.Event()
    path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "client": ("127.0.0.1", 50000),
        "server": ("dyn.test", 80),
        "headers": [
            (b"host", b"dyn.test"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *(headers or []),
        ],
    }
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if gone.is_set():
            raise OSError("the client is gone")  # as uvicorn's send fails on a closed connection
        sent.append(message)
        ended = message["type"] == "http.response.body" and not message.get("more_body", False)
        if ended or (leave_after is not None and leave_after(sent)):
            gone.set()

    await app(scope, receive, send)
    return sent
