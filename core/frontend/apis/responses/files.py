"""``input_file`` content parts, read as text before the request is adapted: in a user message's
``content`` and in a ``function_call_output``'s ``output``.

A part's ``file_data`` is a data URL (``data:<type>;base64,<data>``; the bare base64 of a PDF is
taken too): a PDF (``application/pdf``) reads as its pages' text
(``dyn.core.frontend.documents``, with its bounds), a ``text/*`` file as its UTF-8 text (bounded
by ``--max-media-bytes``). A part's ``file_url`` (http or https) is fetched, all of a request's at
once, and reads the same way (``dyn.core.frontend.documents.fetched_texts``: the media fetch's
bounds and ``--allowed-media-domains``). A part's ``file_id`` names a file uploaded to this
frontend (``POST /v1/files``, ``dyn.core.frontend.apis.files``), read the same way: a PDF or UTF-8
text (404 naming the part for a file the store does not hold). The part becomes an
``input_text`` part: the file's ``filename`` (an uploaded file's own when the part names none) on
the first line, then its text. An ``input_image`` part's ``file_id`` becomes the uploaded file
as a data URL, loaded and checked as any image.
"""

from __future__ import annotations

import base64
from typing import Any

from dyn.core.frontend.apis.files.store import FileReads, FileStore
from dyn.core.frontend.documents import PDF, decoded, fetched_texts, file_text, read_pdf
from dyn.core.frontend.media import MediaSettings
from dyn.core.protocol.errors import bad_request

_PDF_BASE64 = base64.b64encode(b"%PDF").decode()[:5]


async def with_files_read(items: list[Any], media: MediaSettings, files: FileStore) -> list[Any]:
    """``items`` with every ``input_file`` part replaced by an ``input_text`` part of its text, and
    every ``input_image`` naming an uploaded file by one whose ``image_url`` is its data URL."""
    if not any(_has_file(item) for item in items):
        return items
    by_url = [
        (part["file_url"], f"{where}.file_url")
        for part, where in _files(items)
        if isinstance(part.get("file_url"), str) and "file_data" not in part
    ]
    fetched = dict(zip((param for _, param in by_url), await fetched_texts(by_url, media), strict=True))
    reads = FileReads(files, media.max_request_media_bytes)
    out = []
    for i, item in enumerate(items):
        if _has_file(item):
            key = "content" if "content" in item else "output"
            parts = [
                await _text_part(part, f"input[{i}].{key}[{j}]", media, fetched, reads)
                if _is_file(part)
                else part
                for j, part in enumerate(item[key])
            ]
            item = {**item, key: parts}
        out.append(item)
    return out


def _files(items: list[Any]) -> list[tuple[dict[str, Any], str]]:
    """Every ``input_file`` part, with where it is."""
    found = []
    for i, item in enumerate(items):
        if _has_file(item):
            key = "content" if "content" in item else "output"
            found += [(part, f"input[{i}].{key}[{j}]") for j, part in enumerate(item[key]) if _is_file(part)]
    return found


def _is_file(part: Any) -> bool:
    """An ``input_file`` part, or an ``input_image`` part naming an uploaded file."""
    if not isinstance(part, dict):
        return False
    kind = part.get("type")
    return kind == "input_file" or (kind == "input_image" and isinstance(part.get("file_id"), str))


def _has_file(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    parts = item.get("content", item.get("output"))
    return isinstance(parts, list) and any(_is_file(part) for part in parts)


async def _text_part(
    part: dict[str, Any], where: str, media: MediaSettings, fetched: dict[str, str], reads: FileReads
) -> dict[str, Any]:
    if part["type"] == "input_image":
        stored = reads.take(part["file_id"], f"{where}.file_id")
        url = f"data:{stored.mime_type};base64,{base64.b64encode(stored.data).decode()}"
        return {"type": "input_image", "image_url": url, "detail": part.get("detail", "auto")}
    data = part.get("file_data")
    name = part.get("filename")
    if f"{where}.file_url" in fetched:
        text = fetched[f"{where}.file_url"]
    elif isinstance(data, str):
        text = await _data_text(data, where, media)
    elif isinstance(part.get("file_id"), str):
        stored = reads.take(part["file_id"], f"{where}.file_id")
        text = await file_text(stored.data, f"{where}.file_id", media)
        name = name or stored.filename
    else:
        raise bad_request(f"{where}: an input_file needs its file_data, a file_url or a file_id", param=where)
    return {"type": "input_text", "text": f"{name}\n\n{text}" if isinstance(name, str) and name else text}


async def _data_text(data: str, where: str, media: MediaSettings) -> str:
    """The text of a part's ``file_data``."""
    if data.startswith("data:"):
        kind, _, payload = data.removeprefix("data:").partition(";base64,")
        kind = kind.lower()
    else:  # bare base64: a PDF's begins with the encoding of "%PDF"
        kind, payload = (PDF if data.startswith(_PDF_BASE64) else "unknown (not a data URL)"), data
    if kind == PDF:
        text = await read_pdf(payload, f"{where}.file_data", media)
    elif kind.startswith("text/"):
        text = _text(payload, f"{where}.file_data", media)
    else:
        raise bad_request(
            f"{where}.file_data: a PDF or a text/* file is read here, got {kind[:64]!r}",
            param=f"{where}.file_data",
        )
    return text


def _text(payload: str, param: str, media: MediaSettings) -> str:
    try:
        return decoded(payload, param, media).decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request(f"{param}: not UTF-8 text", param=param) from None
