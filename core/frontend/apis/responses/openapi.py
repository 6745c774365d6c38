"""The Responses API's part of the OpenAPI document (``dyn.core.frontend.openapi``): its paths and
their schemas, generated from ``protocol`` so they cannot drift from what is decoded.

Component names start with ``Responses`` so they never collide with the chat API's.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dyn.core.frontend.apis.responses.protocol import DeletedResponse, ResponseObject, ResponsesRequest
from dyn.core.protocol.errors import ErrorResponse

PREFIX = "Responses"
_REF = "#/components/schemas/" + PREFIX + "{name}"


def openapi_paths(model: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) of ``/v1/responses`` and ``/v1/responses/{response_id}``; with
    ``model``, the request's ``model`` is that name."""
    schemas, components = msgspec.json.schema_components(
        [ResponsesRequest, ResponseObject, DeletedResponse, ErrorResponse], ref_template=_REF
    )
    request, response, deleted, error = schemas
    if model is not None:
        components["ResponsesRequest"]["properties"]["model"] = {"type": "string", "enum": [model]}
    errors = {
        str(code): {"description": text, "content": {"application/json": {"schema": error}}}
        for code, text in (
            (400, "Invalid request"),
            (401, "Missing or wrong API key"),
            (404, "Unknown model, or previous_response_id not stored"),
            (413, "The body is too large"),
            (415, "The body is not application/json"),
            (503, "No worker available, or the frontend is at --max-inflight"),
        )
    }
    stream = {
        "text/event-stream": {
            "schema": {
                "type": "string",
                "description": "Named SSE events with sequence_number: response.created, "
                "response.in_progress, response.output_item.added/done, response.content_part.added/done, "
                "response.output_text.delta/done, response.reasoning_text.delta/done, "
                "response.function_call_arguments.delta/done, response.completed (or .incomplete, .failed)",
            }
        }
    }
    stored = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
    not_found = {"404": errors["404"], "401": errors["401"]}
    paths = {
        "/v1/responses": {
            "post": {
                "summary": "OpenAI Responses API: a response, or its SSE events when stream=true",
                "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
                "responses": {
                    "200": {
                        "description": "The response (JSON), or SSE when stream=true",
                        "content": {"application/json": {"schema": response}, **stream},
                    },
                    **errors,
                },
            }
        },
        "/v1/responses/{response_id}": {
            "get": {
                "summary": "A stored response (store: true, bounded by --responses-store-*)",
                "parameters": [stored],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": {"schema": response}}},
                    **not_found,
                },
            },
            "delete": {
                "summary": "Forget a stored response",
                "parameters": [stored],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": {"schema": deleted}}},
                    **not_found,
                },
            },
        },
    }
    return paths, {PREFIX + name: schema for name, schema in components.items()}
