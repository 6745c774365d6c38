"""``GET /openapi.json``: the OpenAPI document of the served model (``dyn.core.frontend.openapi``),
built once per model and limits."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import orjson

from dyn.core.frontend.endpoints.base import ReadEndpoint, Reply
from dyn.core.frontend.openapi import openapi_document

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp


@functools.lru_cache(maxsize=8)
def _document(model_name: str, context_length: int, vocab_size: int, max_logprobs: int) -> bytes:
    return orjson.dumps(
        openapi_document(
            model_name, context_length=context_length, vocab_size=vocab_size, max_logprobs=max_logprobs
        )
    )


def _openapi(app: FrontendApp) -> Reply:
    service = app.service
    info = service.preprocessor.info
    body = _document(service.model_name, info.context_length, info.vocab_size, service.outputs.max_logprobs)
    root_path = getattr(app, "root_path", "")
    if root_path:
        body = _served_under(body, root_path)
    return 200, body, b"application/json"


@functools.lru_cache(maxsize=8)
def _served_under(body: bytes, root_path: str) -> bytes:
    """The document with ``servers`` naming the ``--root-path`` prefix (as FastAPI writes it),
    so a client reading it behind the proxy calls the prefixed paths."""
    return orjson.dumps({**orjson.loads(body), "servers": [{"url": root_path}]})


ENDPOINT = ReadEndpoint("/openapi.json", _openapi)
