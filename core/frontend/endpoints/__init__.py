"""The frontend's endpoint table: every path ``FrontendApp`` serves, one module per endpoint.

An ``Endpoint`` has its ``path``, the ``methods`` it answers (any other is a 405), and
``serve(app, call)``, which answers one HTTP request. ``ENDPOINTS`` maps each path to its
endpoint; the app looks every request up there after CORS and the API key. Three kinds cover what
the frontend serves today: ``ReadEndpoint`` (GET/HEAD, a body computed from the app's state),
``GenerateEndpoint`` (``generate.py``: a JSON request decoded into its protocol type, routed,
answered as SSE or one JSON body) and ``JsonEndpoint`` (``json_post.py``: a JSON request answered
with one JSON body, nothing generated: ``/tokenize``, ``/detokenize``).

To add an endpoint: a module here declaring it, its line in ``ENDPOINTS``, its request and
response types in ``dyn.core.protocol``, and its path in ``dyn.core.frontend.openapi`` (a test
checks the document and the table agree).
"""

from __future__ import annotations

from dyn.core.frontend.endpoints import (
    chat,
    completions,
    detokenize,
    embeddings,
    health,
    metrics,
    models,
    openapi,
    tokenize,
)
from dyn.core.frontend.endpoints.base import Call, Endpoint, ReadEndpoint

ENDPOINTS: dict[str, Endpoint] = {
    e.path: e
    for e in (
        chat.ENDPOINT,
        completions.ENDPOINT,
        models.ENDPOINT,
        tokenize.ENDPOINT,
        detokenize.ENDPOINT,
        embeddings.ENDPOINT,
        health.HEALTH,
        health.LIVE,
        metrics.ENDPOINT,
        openapi.ENDPOINT,
    )
}

__all__ = ["ENDPOINTS", "Call", "Endpoint", "ReadEndpoint"]
