"""Anthropic's ``document`` blocks, read as text for the model: in a user turn or a tool result
(where Claude Code's Read tool puts a PDF it reads).

Sources, as Anthropic defines them:

- ``{"type": "text", "media_type": "text/plain", "data": ...}``: the text as it is;
- ``{"type": "content", "content": [text blocks]}``: the blocks' texts, one per line;
- ``{"type": "base64", "media_type": "application/pdf", "data": ...}``: the text of its pages,
  read before the request is adapted (``read_documents``) by ``dyn.core.frontend.documents``,
  with its bounds and its 400s;
- ``{"type": "url", "url": ...}``: fetched then, all of a request's at once
  (``dyn.core.frontend.documents.fetched_texts``: a PDF's pages, or UTF-8 text; the media
  fetch's bounds and ``--allowed-media-domains``).
- ``{"type": "file", "file_id": ...}``: a file uploaded to this frontend (``POST /v1/files``,
  ``dyn.core.frontend.apis.files``), read then too: a PDF's pages, or UTF-8 text (a 404 naming
  the block for a file the store does not hold). An ``image`` block's ``file`` source becomes a
  base64 source of the uploaded file, for the adapter to load as any image.

A document reads as its ``title``, its ``context`` and its text, each on lines of their own.
Citations are not produced (``citations`` is accepted and ignored).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

from dyn.core.frontend.apis.anthropic.protocol import DocumentBlock, ImageBlock, MessageParam, ToolResultBlock
from dyn.core.frontend.apis.files.store import FileReads, FileStore
from dyn.core.frontend.documents import PDF, fetched_texts, file_text, read_pdf
from dyn.core.frontend.media import MediaSettings
from dyn.core.protocol.errors import bad_request


def document_text(block: DocumentBlock, where: str) -> str:
    """The text a document block gives the model (a PDF or a URL already read by
    ``read_documents``)."""
    source = block.source if isinstance(block.source, dict) else {}
    kind = source.get("type")
    if kind == "text" and isinstance(source.get("data"), str):
        text = source["data"]
    elif kind == "content" and isinstance(source.get("content"), (str, list)):
        text = _content_text(source["content"], f"{where}.source.content")
    elif kind == "base64" and source.get("media_type") == PDF:
        raise AssertionError("read_documents turns PDF sources into text before adapting")
    else:
        raise bad_request(
            f"{where}.source: a document takes a text, content, base64 PDF, url or file source",
            param=f"{where}.source",
        )
    return "\n\n".join(part for part in (block.title, block.context, text) if part)


def _content_text(content: str | list[Any], where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            raise bad_request(f"{where}[{i}]: a document's content holds text blocks", param=f"{where}[{i}]")
        texts.append(part["text"])
    return "\n".join(texts)


async def read_documents(messages: list[MessageParam], media: MediaSettings, files: FileStore) -> None:
    """Replace every base64 PDF, URL and file document of ``messages`` (user turns and their tool
    results) by a text source of its text, and every image's file source by a base64 source of
    the uploaded file, in place."""
    by_url: list[tuple[DocumentBlock, str]] = []
    reads = FileReads(files, media.max_request_media_bytes)
    for block, where in _documents(messages):
        source = block.source if isinstance(block.source, dict) else {}
        if isinstance(block, ImageBlock):
            if source.get("type") == "file" and isinstance(source.get("file_id"), str):
                stored = reads.take(source["file_id"], f"{where}.source.file_id")
                data = base64.b64encode(stored.data).decode()
                block.source = {"type": "base64", "media_type": stored.mime_type, "data": data}
        elif source.get("type") == "base64" and source.get("media_type") == PDF:
            _read(block, await read_pdf(source.get("data"), f"{where}.source.data", media))
        elif source.get("type") == "file" and isinstance(source.get("file_id"), str):
            stored = reads.take(source["file_id"], f"{where}.source.file_id")
            _read(block, await file_text(stored.data, f"{where}.source.file_id", media))
        elif source.get("type") == "url" and isinstance(source.get("url"), str):
            by_url.append((block, where))
    texts = await fetched_texts([(b.source["url"], f"{where}.source.url") for b, where in by_url], media)
    for (block, _), text in zip(by_url, texts, strict=True):
        _read(block, text)


def _documents(messages: list[MessageParam]) -> Iterator[tuple[DocumentBlock | ImageBlock, str]]:
    """Every document and image block of the user turns and their tool results, with where it is."""
    for i, message in enumerate(messages):
        if message.role == "assistant" or isinstance(message.content, str):
            continue
        for j, block in enumerate(message.content):
            where = f"messages[{i}].content[{j}]"
            if isinstance(block, (DocumentBlock, ImageBlock)):
                yield block, where
            elif isinstance(block, ToolResultBlock) and isinstance(block.content, list):
                for k, part in enumerate(block.content):
                    if isinstance(part, (DocumentBlock, ImageBlock)):
                        yield part, f"{where}.content[{k}]"


def _read(block: DocumentBlock, text: str) -> None:
    block.source = {"type": "text", "media_type": "text/plain", "data": text}
