"""The worker's ``--system-port``: its HTTP status API, as Dynamo's system status server
(``DYN_SYSTEM_PORT``) gives each worker.

- ``GET /metrics``: the engine's own metrics in the Prometheus text format, for an engine that
  offers them (``dyn.core.engine.PrometheusMetrics``: SGLang's, with ``--enable-metrics``); an
  empty page for one that keeps none. dyn's own worker figures travel to the frontends in load
  messages and are served on their ``/metrics``.
- ``GET /live`` and ``GET /health``: 200 while the worker serves (it registers in discovery only
  once its engine has started).

Anything else is a 404, a wrong method a 405, with ``{"error": "<sentence>"}``.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from dyn.core.asgi import http_request
from dyn.core.engine import PrometheusMetrics
from dyn.core.kv.views import error_body, respond

JSON = b"application/json"


class WorkerSystemApp:
    """The ASGI app of one worker's ``--system-port`` (read on the worker's event loop)."""

    def __init__(self, engine: Any, instance_id: int) -> None:
        self.engine = engine
        self.instance_id = instance_id

    def metrics(self) -> bytes:
        return self.engine.prometheus_text() if isinstance(self.engine, PrometheusMetrics) else b""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not await http_request(scope, receive, send):
            return
        path, method = scope["path"], scope["method"]
        if path not in ("/metrics", "/live", "/health"):
            message = f"no route for {method} {path}; a dyn worker serves GET /metrics, /health and /live"
            await respond(send, 404, error_body(message), JSON)
        elif method not in ("GET", "HEAD"):
            await respond(send, 405, error_body(f"{path} accepts GET only"), JSON)
        elif path == "/metrics":
            await respond(send, 200, self.metrics(), CONTENT_TYPE_LATEST.encode())
        else:
            body = (
                b'{"status":"live"}'
                if path == "/live"
                else b'{"status":"ready","instance_id":%d}' % self.instance_id
            )
            await respond(send, 200, body, JSON)
