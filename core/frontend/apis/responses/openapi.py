"""The Responses API's part of the OpenAPI document (``dyn.core.frontend.openapi``): its paths and
their schemas, generated from ``protocol`` so they cannot drift from what is decoded.

Component names start with ``Responses`` so they never collide with the chat API's.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dyn.core.frontend.apis.openapi_parts import error_responses, json_content, streamed_post
from dyn.core.frontend.apis.responses.adapter import (
    MAX_INPUT_ITEMS,
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
    MAX_SHORT_CHARS,
)
from dyn.core.frontend.apis.responses.input_items import MAX_LIMIT
from dyn.core.frontend.apis.responses.protocol import DeletedResponse, ResponseObject, ResponsesRequest
from dyn.core.protocol.errors import ErrorResponse

PREFIX = "Responses"
_REF = "#/components/schemas/" + PREFIX + "{name}"


def openapi_paths(model: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) of ``/v1/responses``, ``/v1/responses/{response_id}``, its
    ``cancel`` and its ``input_items``; with ``model``, the request's ``model`` is that name."""
    schemas, components = msgspec.json.schema_components(
        [ResponsesRequest, ResponseObject, DeletedResponse, ErrorResponse], ref_template=_REF
    )
    request, response, deleted, error = schemas
    properties = components["ResponsesRequest"]["properties"]
    if model is not None:
        properties["model"] = {"type": "string", "enum": [model]}
    properties.update(_value_rules())
    errors = error_responses(
        error,
        (
            (400, "Invalid request"),
            (401, "Missing or wrong API key"),
            (404, "Unknown model, or previous_response_id not stored"),
            (413, "The body is too large"),
            (415, "The body is not application/json"),
            (503, "No worker available, or the frontend is at --max-inflight"),
        ),
    )
    stored = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
    not_found = {"404": errors["404"], "401": errors["401"]}
    paths = {
        "/v1/responses": streamed_post(
            "OpenAI Responses API: a response, or its SSE events when stream=true",
            request,
            response,
            "The response (JSON), or SSE when stream=true",
            "Named SSE events with sequence_number: response.created, "
            "response.in_progress, response.output_item.added/done, response.content_part.added/done, "
            "response.output_text.delta/done, response.reasoning_text.delta/done, "
            "response.function_call_arguments.delta/done, response.completed (or .incomplete, .failed)",
            errors,
        ),
        "/v1/responses/{response_id}": {
            "get": {
                "summary": "A stored response (store: true, bounded by --responses-store-*); with "
                "stream=true, the events of one created with background and stream, after starting_after",
                "parameters": [stored, *_RESUME_PARAMETERS],
                "responses": {
                    "200": {
                        "description": "The response (JSON), or its SSE events when stream=true",
                        "content": {
                            **json_content(response)["content"],
                            "text/event-stream": {"schema": {"type": "string"}},
                        },
                    },
                    "400": errors["400"],
                    **not_found,
                },
            },
            "delete": {
                "summary": "Forget a stored response",
                "parameters": [stored],
                "responses": {"200": {"description": "OK", **json_content(deleted)}, **not_found},
            },
        },
        "/v1/responses/{response_id}/cancel": {
            "post": {
                "summary": "Stop a background response that has not ended; the response, now cancelled",
                "parameters": [stored],
                "responses": {
                    "200": {"description": "OK", **json_content(response)},
                    "400": errors["400"],
                    **not_found,
                },
            },
        },
        "/v1/responses/{response_id}/input_items": {
            "get": {
                "summary": "A stored response's own input items, a page at a time",
                "parameters": [stored, *_PAGE_PARAMETERS],
                "responses": {
                    "200": {"description": "OK", **json_content(_ITEM_LIST)},
                    "400": errors["400"],
                    **not_found,
                },
            },
        },
    }
    return paths, {PREFIX + name: schema for name, schema in components.items()}


_RESUME_PARAMETERS = [
    {"name": "stream", "in": "query", "schema": {"type": "boolean"}},
    {"name": "starting_after", "in": "query", "schema": {"type": "integer", "minimum": 0}},
]
_PAGE_PARAMETERS = [
    {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}},
    {"name": "after", "in": "query", "schema": {"type": "string"}},
    {"name": "include", "in": "query", "schema": {"type": "array", "items": {"type": "string"}}},
]
_ITEM_LIST = {
    "type": "object",
    "required": ["object", "data", "first_id", "last_id", "has_more"],
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array", "items": {"type": "object", "required": ["id", "type"]}},
        "first_id": {"type": ["string", "null"]},
        "last_id": {"type": ["string", "null"]},
        "has_more": {"type": "boolean"},
    },
}


def _value_rules() -> dict[str, Any]:
    """The rules the adapter applies after decoding, so that a client (or a fuzzer) that follows
    the document sends requests the server accepts; item and tool shapes beyond a message and a
    function are left to the prose (docs/api-responses.md)."""
    short = {"type": ["string", "null"], "maxLength": MAX_SHORT_CHARS}
    message = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "type": {"const": "message"},
            "role": {"enum": ["user", "assistant", "system", "developer"]},
            "content": {"type": "string"},
        },
    }
    function = {
        "type": "object",
        "required": ["type", "name"],
        "properties": {
            "type": {"const": "function"},
            "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
            "description": {"type": "string"},
            "parameters": {"type": "object", "properties": {"type": {"const": "object"}}},
        },
    }
    return {
        "input": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": message, "minItems": 1, "maxItems": MAX_INPUT_ITEMS},
                {"type": "null"},
            ]
        },
        "tools": {"type": ["array", "null"], "items": function, "maxItems": 64},
        "tool_choice": {"enum": ["auto", "none", None], "description": "Also required or a named function."},
        "text": {
            "type": ["object", "null"],
            "properties": {
                "format": {
                    "anyOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "required": ["type"],
                            "properties": {"type": {"enum": ["text", "json_object"]}},
                            "description": "Also json_schema with name and schema.",
                        },
                    ]
                },
                "verbosity": {"enum": ["low", "medium", "high", None]},
            },
        },
        "reasoning": {
            "type": ["object", "null"],
            "properties": {
                "effort": {"enum": ["minimal", "low", "medium", "high", None]},
                "summary": {"enum": ["auto", "concise", "detailed", None]},
            },
        },
        "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
        "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
        "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
        "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
        "metadata": {
            "type": ["object", "null"],
            "maxProperties": MAX_METADATA_PAIRS,
            "propertyNames": {"maxLength": MAX_METADATA_KEY_CHARS},
            "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE_CHARS},
        },
        "prompt_cache_key": short,
        "safety_identifier": short,
        "truncation": {"enum": ["auto", "disabled", None]},
        "service_tier": {"enum": ["auto", "default", "flex", "priority", None]},
        "previous_response_id": {"type": "null", "description": "A stored response's id (not fuzzable)."},
        "background": {
            "type": ["boolean", "null"],
            "description": "Answer at once (status queued) and generate after; needs store, not stream.",
        },
        "conversation": {"type": "null", "description": "Conversations are not supported."},
        "nvext": {"type": "null", "description": "As in a chat completion (see its schema)."},
        "request_id": {"type": ["string", "null"], "pattern": "^[!-~]{1,256}$"},
    }
