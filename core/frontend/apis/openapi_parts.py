"""The pieces of an API folder's OpenAPI paths (``anthropic.openapi``, ``responses.openapi``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def json_content(schema: dict[str, Any]) -> dict[str, Any]:
    """A request body's or response's ``content``: ``schema`` as ``application/json``."""
    return {"content": {"application/json": {"schema": schema}}}


def error_responses(error: dict[str, Any], texts: Iterable[tuple[int, str]]) -> dict[str, Any]:
    """Responses by status code: each ``(code, description)`` of ``texts``, its body ``error``
    (the API's error body schema)."""
    return {str(code): {"description": text, **json_content(error)} for code, text in texts}


def streamed_post(
    summary: str,
    request: dict[str, Any],
    response: dict[str, Any],
    answer: str,
    events: str,
    errors: dict[str, Any],
) -> dict[str, Any]:
    """A POST operation that takes ``request`` and answers ``response`` (JSON; ``answer``
    describes it) or, when stream=true, SSE whose ``events`` the description names; ``errors``
    are its other responses (``error_responses``)."""
    stream = {"text/event-stream": {"schema": {"type": "string", "description": events}}}
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, **json_content(request)},
            "responses": {
                "200": {"description": answer, "content": {**json_content(response)["content"], **stream}},
                **errors,
            },
        }
    }
