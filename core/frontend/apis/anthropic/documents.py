"""Anthropic's ``document`` blocks, read as text for the model: in a user turn or a tool result
(where Claude Code's Read tool puts a PDF it reads).

Sources, as Anthropic defines them:

- ``{"type": "text", "media_type": "text/plain", "data": ...}``: the text as it is;
- ``{"type": "content", "content": [text blocks]}``: the blocks' texts, one per line;
- ``{"type": "base64", "media_type": "application/pdf", "data": ...}``: the text of each page,
  extracted with pypdf (``pip install 'dyn[pdf]'``; without it, a 400 that says so), in a worker
  thread, before the request is adapted (``read_pdfs``); the PDF is bounded by
  ``--max-media-bytes`` and ``MAX_PDF_PAGES`` pages (Anthropic's limit), its text by
  ``MAX_DOCUMENT_CHARS``, and a PDF pypdf cannot read is a 400. Pages are not seen as images:
  a chart or a scan without a text layer gives no text.
- ``url`` and ``file`` sources are a 400 (no fetching of documents, no Files API here).

A document reads as its ``title``, its ``context`` and its text, each on lines of their own.
Citations are not produced (``citations`` is accepted and ignored).
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
from typing import Any

import anyio.to_thread

from dyn.core.frontend.apis.anthropic.protocol import DocumentBlock, MessageParam, ToolResultBlock
from dyn.core.frontend.media import MediaSettings
from dyn.core.protocol.errors import bad_request

log = logging.getLogger(__name__)

MAX_PDF_PAGES = 100
MAX_DOCUMENT_CHARS = 4 << 20
"""The most text one document gives (the prompt's own byte limit applies after)."""
PDF = "application/pdf"


def document_text(block: DocumentBlock, where: str) -> str:
    """The text a document block gives the model (a PDF already read by ``read_pdfs``)."""
    source = block.source if isinstance(block.source, dict) else {}
    kind = source.get("type")
    if kind == "text" and isinstance(source.get("data"), str):
        text = source["data"]
    elif kind == "content" and isinstance(source.get("content"), (str, list)):
        text = _content_text(source["content"], f"{where}.source.content")
    elif kind == "base64" and source.get("media_type") == PDF:
        raise AssertionError("read_pdfs turns PDF sources into text before adapting")
    else:
        raise bad_request(
            f"{where}.source: a document takes a text source, a content source, or a base64 PDF"
            + (f"; {kind} sources are not supported here" if kind in ("url", "file") else ""),
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


async def read_pdfs(messages: list[MessageParam], media: MediaSettings) -> None:
    """Replace every base64 PDF document of ``messages`` (user turns and their tool results) by
    a text source of its pages' text, in place."""
    for i, message in enumerate(messages):
        if message.role == "assistant" or isinstance(message.content, str):
            continue
        for j, block in enumerate(message.content):
            where = f"messages[{i}].content[{j}]"
            if isinstance(block, DocumentBlock):
                await _read_pdf(block, where, media)
            elif isinstance(block, ToolResultBlock) and isinstance(block.content, list):
                for k, part in enumerate(block.content):
                    if isinstance(part, DocumentBlock):
                        await _read_pdf(part, f"{where}.content[{k}]", media)


async def _read_pdf(block: DocumentBlock, where: str, media: MediaSettings) -> None:
    source = block.source if isinstance(block.source, dict) else {}
    if source.get("type") != "base64" or source.get("media_type") != PDF:
        return
    data = source.get("data")
    if not isinstance(data, str) or len(data) > media.max_media_bytes * 4 // 3 + 4:
        raise bad_request(
            f"{where}.source.data: a PDF's base64 data of at most {media.max_media_bytes} bytes "
            "decoded (--max-media-bytes)",
            param=f"{where}.source.data",
        )
    try:
        pdf = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where}.source.data: not valid base64", param=f"{where}.source.data") from None
    text = await anyio.to_thread.run_sync(_pdf_text, pdf, where)
    block.source = {"type": "text", "media_type": "text/plain", "data": text}


def _pdf_text(pdf: bytes, where: str) -> str:
    """The text of ``pdf``'s pages, a page per paragraph (runs in a worker thread)."""
    try:
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError
    except ImportError:
        raise bad_request(
            f"{where}: reading a PDF document needs pypdf in the frontend's environment: "
            "pip install 'dyn[pdf]', or send the document's text as a text source",
            param=f"{where}.source",
        ) from None
    try:
        reader = PdfReader(io.BytesIO(pdf))
        pages = reader.pages
        if len(pages) > MAX_PDF_PAGES:
            raise bad_request(
                f"{where}: the PDF has {len(pages)} pages, more than {MAX_PDF_PAGES}; send fewer",
                param=f"{where}.source",
            )
        texts: list[str] = []
        size = 0
        for page in pages:
            text = page.extract_text() or ""
            size += len(text)
            if size > MAX_DOCUMENT_CHARS:
                raise bad_request(
                    f"{where}: the PDF's text is over {MAX_DOCUMENT_CHARS} characters; send fewer pages",
                    param=f"{where}.source",
                )
            texts.append(text)
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as exc:
        log.info("%s: pypdf could not read the PDF: %r", where, exc)
        raise bad_request(
            f"{where}: the PDF could not be read ({type(exc).__name__}); check the file",
            param=f"{where}.source",
        ) from None
    return "\n\n".join(texts)
