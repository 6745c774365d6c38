"""``form_parts``: a ``multipart/form-data`` body (RFC 7578) split into its named parts, bounded.

Only what an upload needs: each part's name, its filename and ``Content-Type`` when it has them,
and its bytes. The body is already bounded in size by the caller; the parts are bounded in count
(``MAX_PARTS``) and their heads in bytes (``MAX_HEAD_BYTES``). Anything else is a 400 that says
what is wrong.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from dyn.core.protocol.errors import ApiError, bad_request

MAX_PARTS = 16
MAX_HEAD_BYTES = 4096


class FormPart(NamedTuple):
    name: str
    filename: str | None
    content_type: str | None
    data: bytes


def form_parts(content_type: bytes | None, body: bytes) -> dict[str, FormPart]:
    """The parts of ``body`` by name (the first of a repeated name); 415 unless ``content_type``
    is ``multipart/form-data`` with a boundary, 400 for a body that is not one."""
    media, _, params = (content_type or b"").decode("latin-1").partition(";")
    if media.strip().lower() != "multipart/form-data":
        raise ApiError(
            415,
            f"a file upload is multipart/form-data (a 'file' part), got Content-Type {media.strip()[:100]!r}",
        )
    boundary = _param(params, "boundary")
    if not boundary or len(boundary) > 70:
        raise bad_request("the multipart/form-data Content-Type needs a boundary of 1 to 70 characters")
    # a delimiter is a line of its own: CRLF "--" boundary (the first may open the body), so a
    # part's data may hold the boundary's text anywhere else
    chunks = (b"\r\n" + body).split(b"\r\n--" + boundary.encode("latin-1"))
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        raise bad_request("the multipart body does not end with its closing boundary")
    if len(chunks) - 2 > MAX_PARTS:
        raise bad_request(f"a file upload has at most {MAX_PARTS} parts, got {len(chunks) - 2}")
    parts: dict[str, FormPart] = {}
    for chunk in chunks[1:-1]:
        part = _part(chunk)
        parts.setdefault(part.name, part)
    return parts


def _part(chunk: bytes) -> FormPart:
    if not chunk.startswith(b"\r\n"):
        raise bad_request("a multipart boundary line must end right after the boundary")
    head, sep, data = chunk[2:].partition(b"\r\n\r\n")
    if not sep or len(head) > MAX_HEAD_BYTES:
        raise bad_request(
            f"a multipart part needs its headers (at most {MAX_HEAD_BYTES} bytes), a blank line, then its data"
        )
    headers = {}
    for line in head.decode("utf-8", "replace").split("\r\n"):
        key, colon, value = line.partition(":")
        if colon:
            headers[key.strip().lower()] = value.strip()
    disposition, _, params = headers.get("content-disposition", "").partition(";")
    name = _param(params, "name")
    if disposition.strip().lower() != "form-data" or name is None:
        raise bad_request("a multipart part needs Content-Disposition: form-data with a name")
    return FormPart(name, _param(params, "filename"), headers.get("content-type"), data)


def _param(params: str, key: str) -> str | None:
    """The value of ``key`` in ``; a=b; c="d;e"`` (quotes and their escapes removed), or None."""
    for match in _PARAM.finditer(params):
        if match["name"].lower() == key:
            value = match["value"].strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            return value
    return None


_PARAM = re.compile(r'(?:^|;)\s*(?P<name>[^=;\s]+)\s*=\s*(?P<value>"(?:[^"\\]|\\.)*"|[^;]*)')
