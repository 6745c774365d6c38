"""The OpenAPI 3.1 document served at ``GET /openapi.json``, generated from the protocol types
(``msgspec.json.schema_components``) so it cannot drift from what the server decodes."""

from __future__ import annotations

from typing import Any

import msgspec

import dyn.core
from dyn.core.protocol.errors import ErrorResponse
from dyn.core.protocol.openai import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelList,
)

_REF = "#/components/schemas/{name}"


def _json(ref: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": ref}}}


def _errors() -> dict[str, Any]:
    ref = {"$ref": _REF.format(name="ErrorResponse")}
    return {str(code): {"description": text, **_json(ref)} for code, text in (
        (400, "Invalid request"), (401, "Missing or wrong API key"),
        (404, "Unknown model or worker"), (503, "No worker available; retry after Retry-After"))}


def _generate(summary: str, request: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    stream = {"text/event-stream": {"schema": {
        "type": "string", "description": "SSE 'data:' events of chunk objects, then 'data: [DONE]'"}}}
    return {"post": {
        "summary": summary,
        "parameters": [
            {"name": "x-request-id", "in": "header", "required": False, "schema": {"type": "string"},
             "description": "Request id, echoed on the response"},
            {"name": "x-worker-instance-id", "in": "header", "required": False,
             "schema": {"type": "integer"}, "description": "Route to this worker instance"},
        ],
        "requestBody": {"required": True, **_json(request)},
        "responses": {"200": {"description": "Completion (JSON), or SSE when stream=true",
                              "content": {**_json(response)["content"], **stream}},
                      **_errors()},
    }}


def openapi_document() -> dict[str, Any]:
    (chat_req, chat_resp, cmpl_req, cmpl_resp, models, error), components = \
        msgspec.json.schema_components(
            [ChatCompletionRequest, ChatCompletionResponse, CompletionRequest, CompletionResponse,
             ModelList, ErrorResponse], ref_template=_REF)
    plain = {"200": {"description": "OK"}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "dyn frontend", "version": dyn.core.__version__,
                 "description": "OpenAI-compatible API with vLLM's extra parameters and nvext."},
        "paths": {
            "/v1/chat/completions": _generate("Chat completion", chat_req, chat_resp),
            "/v1/completions": _generate("Text completion", cmpl_req, cmpl_resp),
            "/v1/models": {"get": {"summary": "Served models",
                                   "responses": {"200": {"description": "Models", **_json(models)}}}},
            "/health": {"get": {"summary": "200 with live worker instances, 503 with none",
                                "responses": plain}},
            "/live": {"get": {"summary": "The process is up", "responses": plain}},
            "/metrics": {"get": {"summary": "Prometheus text format", "responses": plain}},
        },
        "components": {"schemas": {**components, "ErrorResponse": components.get("ErrorResponse", error)}},
    }
