"""``GET /metrics``: the frontend's (and its router's) Prometheus metrics in the text format.
Behind ``--api-key`` unless ``--public-metrics``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dyn.core.frontend.endpoints.base import ReadEndpoint, Reply
from dyn.core.frontend.metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp

_CONTENT_TYPE = CONTENT_TYPE.encode()


def _metrics(app: FrontendApp) -> Reply:
    return 200, app.service.metrics.render(), _CONTENT_TYPE


ENDPOINT = ReadEndpoint("/metrics", _metrics)
