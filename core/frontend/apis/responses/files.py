"""``input_file`` content parts, read as text before the request is adapted: in a user message's
``content`` and in a ``function_call_output``'s ``output``.

A part's ``file_data`` is a data URL (``data:<type>;base64,<data>``; the bare base64 of a PDF is
taken too): a PDF (``application/pdf``) reads as its pages' text
(``dyn.core.frontend.documents``, with its bounds), a ``text/*`` file as its UTF-8 text (bounded
by ``--max-media-bytes``). A part's ``file_url`` (http or https) is fetched, all of a request's at
once, and reads the same way (``dyn.core.frontend.documents.fetched_texts``: the media fetch's
bounds and ``--allowed-media-domains``). The part becomes an ``input_text`` part: the file's
``filename`` on the first line, then its text. ``file_id`` (OpenAI's Files API) is a 400 naming
the part: no files are stored here.
"""

from __future__ import annotations

import base64
from typing import Any

from dyn.core.frontend.documents import PDF, decoded, fetched_texts, read_pdf
from dyn.core.frontend.media import MediaSettings
from dyn.core.protocol.errors import bad_request

_PDF_BASE64 = base64.b64encode(b"%PDF").decode()[:5]


async def with_files_read(items: list[Any], media: MediaSettings) -> list[Any]:
    """``items`` with every ``input_file`` part replaced by an ``input_text`` part of its text."""
    if not any(_has_file(item) for item in items):
        return items
    by_url = [
        (part["file_url"], f"{where}.file_url")
        for part, where in _files(items)
        if isinstance(part.get("file_url"), str) and "file_data" not in part
    ]
    fetched = dict(zip((param for _, param in by_url), await fetched_texts(by_url, media), strict=True))
    out = []
    for i, item in enumerate(items):
        if _has_file(item):
            key = "content" if "content" in item else "output"
            parts = [
                await _text_part(part, f"input[{i}].{key}[{j}]", media, fetched) if _is_file(part) else part
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
    return isinstance(part, dict) and part.get("type") == "input_file"


def _has_file(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    parts = item.get("content", item.get("output"))
    return isinstance(parts, list) and any(_is_file(part) for part in parts)


async def _text_part(
    part: dict[str, Any], where: str, media: MediaSettings, fetched: dict[str, str]
) -> dict[str, Any]:
    data = part.get("file_data")
    if f"{where}.file_url" in fetched:
        text = fetched[f"{where}.file_url"]
    elif not isinstance(data, str):
        raise bad_request(
            f"{where}: an input_file needs its file_data or a file_url here"
            + ("; file_id is not supported (no files are stored here)" if "file_id" in part else ""),
            param=where,
        )
    else:
        text = await _data_text(data, where, media)
    name = part.get("filename")
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
