"""The Messages API's part of the OpenAPI document (``dyn.core.frontend.openapi``): its two paths
and their schemas, generated from ``protocol`` so they cannot drift from what is decoded.

Component names start with ``Anthropic`` (``AnthropicMessagesRequest``, ``AnthropicErrorResponse``),
so they never collide with the OpenAI API's (``ErrorResponse``, ``Usage``, ``Message``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from dyn.core.frontend.apis.anthropic.protocol import (
    CountTokensRequest,
    CountTokensResponse,
    ErrorResponse,
    Message,
    MessagesRequest,
)
from dyn.core.frontend.apis.openapi_parts import error_responses, json_content, streamed_post

PREFIX = "Anthropic"
_REF = "#/components/schemas/" + PREFIX + "{name}"


def openapi_paths(model: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) of ``/v1/messages`` and ``/v1/messages/count_tokens``; with
    ``model``, the requests' ``model`` is that name."""
    schemas, components = msgspec.json.schema_components(
        [MessagesRequest, Message, CountTokensRequest, CountTokensResponse, ErrorResponse], ref_template=_REF
    )
    messages_req, message, count_req, count_resp, error = schemas
    if model is not None:
        for name in ("MessagesRequest", "CountTokensRequest"):
            components[name]["properties"]["model"] = {"type": "string", "enum": [model]}
    errors = error_responses(
        error,
        (
            (400, "Invalid request (invalid_request_error)"),
            (401, "Missing or wrong API key (authentication_error)"),
            (404, "Unknown model (not_found_error)"),
            (413, "The body is too large (request_too_large)"),
            (415, "The body is not application/json"),
            (503, "No worker available, or the frontend is at --max-inflight (overloaded_error)"),
        ),
    )
    paths = {
        "/v1/messages": streamed_post(
            "Anthropic Messages API: a message, or its SSE events when stream=true",
            messages_req,
            message,
            "The message (JSON), or SSE when stream=true",
            "Named SSE events: message_start, ping, content_block_start/delta/stop, "
            "message_delta, message_stop (or error)",
            errors,
        ),
        "/v1/messages/count_tokens": {
            "post": {
                "summary": "The prompt tokens a Messages request with this body sends",
                "requestBody": {"required": True, **json_content(count_req)},
                "responses": {"200": {"description": "OK", **json_content(count_resp)}, **errors},
            }
        },
    }
    return paths, {PREFIX + name: schema for name, schema in components.items()}
