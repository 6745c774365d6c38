"""The Files API's wire types, OpenAI's and Anthropic's, as they are encoded (and as the OpenAPI
document describes them)."""

from __future__ import annotations

from typing import Literal

import msgspec


class OpenAIFile(msgspec.Struct):
    """OpenAI's ``FileObject``."""

    id: str
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    object: Literal["file"] = "file"
    status: Literal["processed"] = "processed"
    status_details: None = None


class OpenAIFileList(msgspec.Struct):
    data: list[OpenAIFile]
    first_id: str | None
    last_id: str | None
    has_more: bool
    object: Literal["list"] = "list"


class OpenAIFileDeleted(msgspec.Struct):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class AnthropicFile(msgspec.Struct):
    """Anthropic's ``FileMetadata``: ``created_at`` is RFC 3339; an upload can be downloaded
    again here (Anthropic lets only files its tools made be downloaded)."""

    id: str
    filename: str
    mime_type: str
    size_bytes: int
    created_at: str
    type: Literal["file"] = "file"
    downloadable: bool = True


class AnthropicFileList(msgspec.Struct):
    data: list[AnthropicFile]
    first_id: str | None
    last_id: str | None
    has_more: bool


class AnthropicFileDeleted(msgspec.Struct):
    id: str
    type: Literal["file_deleted"] = "file_deleted"
