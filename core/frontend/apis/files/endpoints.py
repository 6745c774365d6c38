"""``POST /v1/files`` (upload) and ``GET /v1/files`` (list) (``FILES``); ``GET`` and ``DELETE
/v1/files/{id}`` and ``GET /v1/files/{id}/content`` (``FILE``): OpenAI's Files API and
Anthropic's (beta ``files-api-2025-04-14``), on one ``FileStore`` (``FrontendApp.file_store``).

A request that carries ``anthropic-version`` (Anthropic's SDKs always send it) is answered in
Anthropic's shapes (``type: "file"`` metadata, ``file_deleted``, its list paging with
``before_id``/``after_id``, its error body); any other in OpenAI's (``object: "file"``, a
``purpose`` required at upload, the list's ``after``/``order``/``purpose``). An upload is
``multipart/form-data`` with a ``file`` part, at most ``MAX_BODY_BYTES``; an upload that does not
fit the store's ``max_bytes`` is a 413. Ids of either shape are found by both.
"""

from __future__ import annotations

import abc
import mimetypes
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import msgspec

from dyn.core.asgi import JSON, BodyTooLarge, read_body, respond
from dyn.core.frontend.apis.anthropic import errors as anthropic_errors
from dyn.core.frontend.apis.files.multipart import form_parts
from dyn.core.frontend.apis.files.protocol import (
    AnthropicFile,
    AnthropicFileDeleted,
    AnthropicFileList,
    OpenAIFile,
    OpenAIFileDeleted,
    OpenAIFileList,
)
from dyn.core.frontend.apis.files.store import FileStore, StoredFile, stored_file
from dyn.core.frontend.endpoints.base import Call, Endpoint
from dyn.core.frontend.endpoints.generate import MAX_BODY_BYTES
from dyn.core.protocol.errors import ApiError, bad_request

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp

PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
"""OpenAI's upload purposes; any is kept (dyn reads a file by id whatever its purpose)."""


_DOWNLOAD = [(b"content-disposition", b"attachment"), (b"x-content-type-options", b"nosniff")]


def is_anthropic(call: Call) -> bool:
    return b"anthropic-version" in call.headers


class _FilesApi(Endpoint):
    """Answers errors in the caller's API's shape."""

    async def serve(self, app: FrontendApp, call: Call) -> None:
        try:
            status, body = await self.answer(app.file_store, call)
        except ApiError as exc:
            if not is_anthropic(call):
                raise
            await respond(call.send, exc.status, anthropic_errors.encoded(exc), call.extra + [JSON])
            return
        if isinstance(body, StoredFile):  # its bytes, never rendered as a page of this origin
            headers = [(b"content-type", body.mime_type.encode()), *_DOWNLOAD]
            await respond(call.send, status, body.data, call.extra + headers)
        else:
            await respond(call.send, status, body, call.extra + [JSON])

    @abc.abstractmethod
    async def answer(self, store: FileStore, call: Call) -> tuple[int, bytes | StoredFile]:
        """The status and the body: JSON, or a stored file's bytes (``/content``)."""


class FilesEndpoint(_FilesApi):
    path = "/v1/files"
    methods = ("POST", "GET")

    async def answer(self, store: FileStore, call: Call) -> tuple[int, bytes | StoredFile]:
        anthropic = is_anthropic(call)
        if call.scope["method"] == "GET":
            return 200, _listed(store, _query(call), anthropic)
        try:
            body = await read_body(call.receive, MAX_BODY_BYTES)
        except BodyTooLarge as exc:
            raise ApiError(413, f"{exc}: upload a smaller file") from None
        parts = form_parts(call.headers.get(b"content-type"), body)
        upload = parts.get("file")
        if upload is None:
            raise bad_request("a file upload needs a 'file' part", param="file")
        purpose = "user_data"
        if not anthropic:
            given = parts.get("purpose")
            purpose = given.data.decode("utf-8", "replace").strip() if given is not None else ""
            if purpose not in PURPOSES:
                raise bad_request(
                    f"purpose must be one of {', '.join(PURPOSES)}, got {purpose[:64]!r}", param="purpose"
                )
        filename = (upload.filename or "upload")[:1024]
        mime = (upload.content_type or "").split(";", 1)[0].strip().lower()
        if not mime or mime == "application/octet-stream":
            mime = mimetypes.guess_type(filename)[0] or "application/octet-stream"
        stored = store.add("file_" if anthropic else "file-", filename, mime, purpose, upload.data)
        if stored is None:
            raise ApiError(
                413,
                f"the file's {len(upload.data)} bytes exceed this frontend's file store ({store.max_bytes} bytes)",
            )
        return 200, _shape(stored, anthropic)


class FileEndpoint(_FilesApi):
    path = "/v1/files/"
    methods = ("GET", "DELETE")
    prefix = True

    async def answer(self, store: FileStore, call: Call) -> tuple[int, bytes | StoredFile]:
        file_id, _, rest = call.scope["path"].removeprefix(self.path).partition("/")
        method = call.scope["method"]
        if (rest, method) not in (("", "GET"), ("", "DELETE"), ("content", "GET")):
            raise ApiError(404, f"no route for {method} {call.scope['path'][:256]}; see /openapi.json")
        stored = stored_file(store, file_id, "file_id")
        anthropic = is_anthropic(call)
        if rest == "content":
            return 200, stored
        if method == "DELETE":
            store.delete(file_id)
            gone = AnthropicFileDeleted(file_id) if anthropic else OpenAIFileDeleted(file_id)
            return 200, msgspec.json.encode(gone)
        return 200, _shape(stored, anthropic)


def _query(call: Call) -> dict[str, str]:
    query = call.scope.get("query_string", b"").decode("latin-1")
    return {key: values[0] for key, values in parse_qs(query[:4096]).items()}


def _int(query: dict[str, str], key: str, default: int, high: int) -> int:
    raw = query.get(key)
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw[:8]) <= high:
        raise bad_request(f"{key} must be an integer from 1 to {high}, got {raw[:32]!r}", param=key)
    return int(raw)


def _listed(store: FileStore, query: dict[str, str], anthropic: bool) -> bytes:
    """One page of the stored files, newest first (OpenAI's ``order=asc``: oldest first)."""
    files = store.uploads()
    if anthropic:
        files.reverse()
        limit = _int(query, "limit", 20, 1000)
        files = _after(files, query.get("after_id"), query.get("before_id"))
    else:
        limit = _int(query, "limit", 10000, 10000)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise bad_request(f"order must be asc or desc, got {order[:32]!r}", param="order")
        if order == "desc":
            files.reverse()
        if "purpose" in query:
            files = [f for f in files if f.purpose == query["purpose"]]
        files = _after(files, query.get("after"), None)
    page = files[:limit]
    first, last, more = (page[0].id if page else None), (page[-1].id if page else None), len(files) > limit
    if anthropic:
        return msgspec.json.encode(AnthropicFileList([_anthropic(f) for f in page], first, last, more))
    return msgspec.json.encode(OpenAIFileList([_openai(f) for f in page], first, last, more))


def _after(files: list[StoredFile], after: str | None, before: str | None) -> list[StoredFile]:
    """The files after the one named ``after``, or before ``before`` (none when it is not held)."""
    ids = [f.id for f in files]
    if after is not None:
        return files[ids.index(after) + 1 :] if after in ids else []
    if before is not None:
        return files[: ids.index(before)] if before in ids else []
    return files


def _openai(stored: StoredFile) -> OpenAIFile:
    return OpenAIFile(
        stored.id, stored.size, stored.created_at, stored.expires_at, stored.filename, stored.purpose
    )


def _anthropic(stored: StoredFile) -> AnthropicFile:
    created = datetime.fromtimestamp(stored.created_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return AnthropicFile(stored.id, stored.filename, stored.mime_type, stored.size, created)


def _shape(stored: StoredFile, anthropic: bool) -> bytes:
    return msgspec.json.encode(_anthropic(stored) if anthropic else _openai(stored))


FILES = FilesEndpoint()
FILE = FileEndpoint()
