"""A streamed response's lines as server-sent events split them: at CR, LF or CRLF only.

httpx's ``aiter_lines`` splits as ``str.splitlines`` does, also at U+0085, U+2028 and U+2029 (and
a few control characters JSON always escapes). A model's text may hold those three, JSON carries
them raw (so do vLLM's and OpenAI's streams), and a ``data:`` line cut there is not JSON: a test
reading a mocker's random text at volume met one now and then."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx

_EOL = re.compile(r"\r\n|\r|\n")


async def sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """Each line of ``response``'s body, without its end of line; a CR at the end of one chunk and
    an LF at the start of the next make an empty line between (SSE reads it as no event)."""
    pending = ""
    async for text in response.aiter_text():
        *lines, pending = _EOL.split(pending + text)
        for line in lines:
            yield line
    if pending:
        yield pending
