"""The frontend's endpoint table: every path ``FrontendApp`` serves, one module per endpoint.

An ``Endpoint`` has its ``path``, the ``methods`` it answers (any other is a 405), and
``serve(app, call)``, which answers one HTTP request. ``ENDPOINTS`` maps each path to its
endpoint; the app looks every request up there after CORS and the API key. Three kinds cover what
the frontend serves today: ``ReadEndpoint`` (GET/HEAD, a body computed from the app's state),
``GenerateEndpoint`` (``generate.py``: a JSON request decoded into its protocol type, routed,
answered as SSE or one JSON body) and ``JsonEndpoint`` (``json_post.py``: a JSON request answered
with one JSON body, nothing generated: ``/tokenize``, ``/detokenize``).

A prefix endpoint (``prefix``, its ``path`` ending in ``/``) also serves the paths under it
(``/v1/responses/{id}``, ``/v1/responses/{id}/input_items``); ``find`` looks a path up. An endpoint answers errors in its API's
shape (``Endpoint.error_body``). The generating APIs live in ``dyn.core.frontend.apis``, one
folder each.

To add an endpoint: a module here (or an API folder) declaring it, its line in ``ENDPOINTS``, its request and
response types in ``dyn.core.protocol``, and its path in ``dyn.core.frontend.openapi`` (a test
checks the document and the table agree).
"""

from __future__ import annotations

from dyn.core.frontend.apis.anthropic import endpoints as anthropic
from dyn.core.frontend.apis.chat_completions import endpoints as chat_completions
from dyn.core.frontend.apis.files import endpoints as files
from dyn.core.frontend.apis.responses import endpoints as responses
from dyn.core.frontend.endpoints import (
    detokenize,
    embeddings,
    health,
    metrics,
    models,
    openapi,
    scoring,
    tokenize,
    tokenizer_info,
)
from dyn.core.frontend.endpoints.base import Call, Endpoint, ReadEndpoint

ENDPOINTS: dict[str, Endpoint] = {
    e.path: e
    for e in (
        chat_completions.CHAT,
        chat_completions.COMPLETIONS,
        responses.CREATE,
        responses.STORED,
        anthropic.MESSAGES,
        anthropic.COUNT_TOKENS,
        files.FILES,
        files.FILE,
        models.ENDPOINT,
        tokenize.ENDPOINT,
        detokenize.ENDPOINT,
        tokenizer_info.ENDPOINT,
        embeddings.ENDPOINT,
        embeddings.POOLING,
        embeddings.CLASSIFY,
        scoring.SCORE,
        scoring.SCORE_V1,
        scoring.RERANK,
        scoring.RERANK_V1,
        scoring.RERANK_V2,
        health.HEALTH,
        health.LIVE,
        metrics.ENDPOINT,
        openapi.ENDPOINT,
    )
}


def find(path: str) -> Endpoint | None:
    """The endpoint serving ``path``: its own, else the prefix endpoint it is under."""
    endpoint = ENDPOINTS.get(path)
    if endpoint is not None:
        return endpoint
    parts = path.split("/")
    for depth in range(len(parts) - 1, 1, -1):  # the nearest prefix endpoint above it
        parent = ENDPOINTS.get("/".join(parts[:depth]) + "/")
        if parent is not None and parent.prefix:
            return parent
    return None


__all__ = ["ENDPOINTS", "Call", "Endpoint", "ReadEndpoint", "find"]
