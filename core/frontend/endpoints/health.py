"""``GET /health`` (200 with the live worker instances of every served model, 503 with none; ``model``
is the frontend's own, ``models`` every name ``/v1/models`` lists) and ``GET /live`` (200 while the
process serves). Both stay open with ``--api-key`` (``dyn.core.api_key``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from dyn.core.frontend.endpoints.base import ReadEndpoint, Reply

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp


def _health(app: FrontendApp) -> Reply:
    service = app.service
    # a worker serving several models or adapters is in each of their pools
    instances = sorted({w.instance_id for model in app.models.models() for w in model.pool.workers()})
    body = orjson.dumps(
        {
            "status": "healthy" if instances else "unhealthy",
            "instances": instances,
            "model": service.model_name,
            "models": app.models.names(),
            "router_mode": service.router.mode,
        }
    )
    return (200 if instances else 503), body, b"application/json"


def _live(app: FrontendApp) -> Reply:
    return 200, b'{"status":"live"}', b"application/json"


HEALTH = ReadEndpoint("/health", _health)
LIVE = ReadEndpoint("/live", _live)
