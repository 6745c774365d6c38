"""``GET /health``: whether a request could be served now, and if not why (a readiness probe);
``GET /live``: 200 while the process serves (a liveness probe). Both answer without the API key
(``dyn.core.api_key``), for orchestrators.

``/health`` looks at every served model (its own, those workers registered, LoRA adapters):

- a model is **unroutable** when no request for it could succeed now: no live worker serves it,
  or its router says why not (``Router.unroutable``: a disaggregated model whose prefill pool is
  empty with no local fallback, a ``dyn router`` that cannot be reached with no policy to fall
  back on);
- it is **degraded** when requests succeed but are routed worse than configured
  (``Router.degraded``: by load alone while the ``dyn router`` or ``dyn indexer`` is away).

The answer (``dyn.core.health.verdict``) is 503, ``status`` "unhealthy" with a ``reason``, when
every served model is unroutable; else 200 with ``status`` "degraded" (``degraded``: one line per
cause, and ``unroutable``: the models that cannot be served, by name) or "healthy". ``workers`` counts the
live worker instances; ``instances`` lists their ids only when no API key is set or the caller
sent it (a public probe must not enumerate the fleet).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from dyn.core.api_key import authorization
from dyn.core.asgi import respond
from dyn.core.frontend.endpoints.base import Call, Endpoint, ReadEndpoint, Reply
from dyn.core.health import unroutable, verdict

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp


def health(app: FrontendApp, privileged: bool) -> Reply:
    """The ``/health`` answer; ``privileged``: the caller may see worker instance ids."""
    service = app.service
    models = app.models.models()
    # a worker serving several models or adapters is in each of their pools
    instances = sorted({w.instance_id for model in models for w in model.pool.workers()})
    down = {
        model.name: reason
        for model in models
        if (reason := unroutable(model.service.router, model.name)) is not None
    }
    degraded = [reason for model in models if (reason := model.service.router.degraded()) is not None]
    status, body = verdict(down, degraded, len(models))
    body |= {
        "model": service.model_name,
        "models": app.models.names(),
        "router_mode": service.router.mode,
        "workers": len(instances),
    }
    if privileged:
        body["instances"] = instances
    return status, orjson.dumps(body), b"application/json"


class HealthEndpoint(Endpoint):
    """``GET /health`` (and HEAD): ``health`` for the caller."""

    path = "/health"
    methods = ("GET", "HEAD")

    async def serve(self, app: FrontendApp, call: Call) -> None:
        key = app.api_key
        privileged = key is None or key.allows(authorization(call.headers))
        status, body, content_type = health(app, privileged)
        await respond(call.send, status, body, call.extra + [(b"content-type", content_type)])


def _live(app: FrontendApp) -> Reply:
    return 200, b'{"status":"live"}', b"application/json"


HEALTH = HealthEndpoint()
LIVE = ReadEndpoint("/live", _live)
