"""Documents read as text for a model that reads text: a PDF's pages through pypdf (``pip install
'dyn[pdf]'``), for the APIs that take documents (Anthropic's ``document`` blocks, the Responses
API's ``input_file`` parts).

``fetched_texts`` reads documents named by http(s) URL, fetched as media items are
(``dyn.core.frontend.media.fetch_documents``: allowed domains, sizes, timeout, at most
``MAX_DOCUMENT_URLS`` a request): a body that starts as a PDF does reads as one, any other as
UTF-8 text (else a 400).

``read_pdf`` decodes a PDF's base64 data, bounded by ``--max-media-bytes``, and extracts the text
of its pages in a worker thread, at most ``MAX_PDF_PAGES`` pages (Anthropic's limit) and
``MAX_DOCUMENT_CHARS`` characters; every failure is a 400 naming ``param``: data that is not
base64, a PDF pypdf cannot read, too many pages or too much text, and no pypdf installed (saying
what to install). Pages are not seen as images: a scan without a text layer reads as nothing.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging

import anyio.to_thread

from dyn.core.frontend.media import MediaSettings, fetch_documents
from dyn.core.protocol.errors import bad_request

log = logging.getLogger(__name__)

MAX_PDF_PAGES = 100
MAX_DOCUMENT_CHARS = 4 << 20
"""The most text one document gives (the prompt's own byte limit applies after)."""
PDF = "application/pdf"


def decoded(data: object, param: str, media: MediaSettings) -> bytes:
    """The bytes of a file's base64 ``data``, at most ``--max-media-bytes`` of them; else a 400."""
    if not isinstance(data, str) or len(data) > media.max_media_bytes * 4 // 3 + 4:
        raise bad_request(
            f"{param}: base64 data of at most {media.max_media_bytes} bytes decoded (--max-media-bytes)",
            param=param,
        )
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{param}: not valid base64", param=param) from None


async def read_pdf(data: object, param: str, media: MediaSettings) -> str:
    """The text of the PDF whose base64 is ``data``, a page per paragraph."""
    return await anyio.to_thread.run_sync(_pdf_text, decoded(data, param, media), param)


async def fetched_texts(urls: list[tuple[str, str]], media: MediaSettings) -> list[str]:
    """The text of each document named by an http(s) URL, each ``(url, param)``, in order."""
    bodies = await fetch_documents(urls, media)
    return [await anyio.to_thread.run_sync(_text_of, body, param) for body, (_, param) in zip(bodies, urls)]


async def file_text(data: bytes, param: str, media: MediaSettings) -> str:
    """The text of an uploaded file (the Files API's): a PDF's pages, else UTF-8 text; at most
    ``--max-media-bytes`` of it, as a file sent in the request would be."""
    if len(data) > media.max_media_bytes:
        raise bad_request(
            f"{param}: the file's {len(data)} bytes are more than the {media.max_media_bytes} a "
            "document may have here (--max-media-bytes)",
            param=param,
        )
    return await anyio.to_thread.run_sync(_text_of, data, param)


def _text_of(body: bytes, param: str) -> str:
    if body.startswith(b"%PDF"):
        return _pdf_text(body, param)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request(f"{param}: the document is neither a PDF nor UTF-8 text", param=param) from None


def _pdf_text(pdf: bytes, param: str) -> str:
    try:
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError
    except ImportError:
        raise bad_request(
            f"{param}: reading a PDF needs pypdf in the frontend's environment: "
            "pip install 'dyn[pdf]', or send the document's text",
            param=param,
        ) from None
    try:
        pages = PdfReader(io.BytesIO(pdf)).pages
        if len(pages) > MAX_PDF_PAGES:
            raise bad_request(
                f"{param}: the PDF has {len(pages)} pages, more than {MAX_PDF_PAGES}; send fewer", param=param
            )
        texts: list[str] = []
        size = 0
        for page in pages:
            text = page.extract_text() or ""
            size += len(text)
            if size > MAX_DOCUMENT_CHARS:
                raise bad_request(
                    f"{param}: the PDF's text is over {MAX_DOCUMENT_CHARS} characters; send fewer pages",
                    param=param,
                )
            texts.append(text)
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as exc:
        log.info("%s: pypdf could not read the PDF: %r", param, exc)
        raise bad_request(
            f"{param}: the PDF could not be read ({type(exc).__name__}); check the file", param=param
        ) from None
    return "\n\n".join(texts)
