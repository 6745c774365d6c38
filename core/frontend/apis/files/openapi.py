"""The Files API's part of the OpenAPI document (``dyn.core.frontend.openapi``), in OpenAI's
shapes (a request with ``anthropic-version`` gets Anthropic's, ``endpoints``); the schemas come
from ``protocol``. Component names start with ``Files``."""

from __future__ import annotations

from typing import Any

import msgspec

from dyn.core.frontend.apis.files.endpoints import PURPOSES
from dyn.core.frontend.apis.files.protocol import OpenAIFile, OpenAIFileDeleted, OpenAIFileList
from dyn.core.frontend.apis.openapi_parts import error_responses, json_content
from dyn.core.protocol.errors import ErrorResponse

PREFIX = "Files"
_REF = "#/components/schemas/" + PREFIX + "{name}"


def openapi_paths() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) of ``/v1/files``, ``/v1/files/{file_id}`` and its ``content``."""
    schemas, components = msgspec.json.schema_components(
        [OpenAIFile, OpenAIFileList, OpenAIFileDeleted, ErrorResponse], ref_template=_REF
    )
    file, listing, deleted, error = schemas
    errors = error_responses(
        error,
        (
            (400, "Invalid upload or query"),
            (401, "Missing or wrong API key"),
            (404, "No such file here (never uploaded, deleted, expired or evicted)"),
            (413, "The upload is larger than the body limit or the file store"),
            (415, "The body is not multipart/form-data"),
        ),
    )
    upload = {
        "type": "object",
        "required": ["file", "purpose"],
        "properties": {
            "file": {"type": "string", "format": "binary"},
            "purpose": {"enum": list(PURPOSES)},
        },
    }
    named = {"name": "file_id", "in": "path", "required": True, "schema": {"type": "string"}}
    not_found = {code: errors[code] for code in ("401", "404")}
    paths = {
        "/v1/files": {
            "post": {
                "summary": "Upload a file (OpenAI's Files API, or Anthropic's with anthropic-version), "
                "kept in this frontend's bounded file store for file_id references",
                "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": upload}}},
                "responses": {
                    "200": {"description": "The file", **json_content(file)},
                    **{code: errors[code] for code in ("400", "401", "413", "415")},
                },
            },
            "get": {
                "summary": "The stored files, newest first",
                "parameters": [
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 10000},
                    },
                    {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
                    {"name": "after", "in": "query", "schema": {"type": "string"}},
                    {"name": "purpose", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {"200": {"description": "OK", **json_content(listing)}, "400": errors["400"]},
            },
        },
        "/v1/files/{file_id}": {
            "get": {
                "summary": "A stored file's description",
                "parameters": [named],
                "responses": {"200": {"description": "OK", **json_content(file)}, **not_found},
            },
            "delete": {
                "summary": "Forget a stored file",
                "parameters": [named],
                "responses": {"200": {"description": "OK", **json_content(deleted)}, **not_found},
            },
        },
        "/v1/files/{file_id}/content": {
            "get": {
                "summary": "A stored file's bytes",
                "parameters": [named],
                "responses": {"200": {"description": "The file's bytes, with its media type"}, **not_found},
            },
        },
    }
    return paths, {PREFIX + name: schema for name, schema in components.items()}
