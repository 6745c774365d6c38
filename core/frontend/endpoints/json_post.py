"""``JsonEndpoint``: a POST endpoint that answers a JSON body with one JSON body and generates
nothing (``/tokenize``, ``/detokenize``).

The body must be declared ``application/json`` (415 otherwise, as for the generating endpoints),
is read up to ``MAX_BODY_BYTES`` (413 beyond), and ``handle(app, body)`` turns it into the
response Struct, raising ``ApiError`` for a 4xx. Such requests are not counted under
``--max-inflight``, which bounds generation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec

from dyn.core.asgi import JSON, BodyTooLarge, read_body, respond
from dyn.core.frontend.endpoints.base import Call, Endpoint
from dyn.core.frontend.endpoints.generate import MAX_BODY_BYTES, require_json
from dyn.core.protocol.errors import ApiError

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp

Handle = Callable[["FrontendApp", bytes], Awaitable[msgspec.Struct]]


class JsonEndpoint(Endpoint):
    """POST ``path``: the body through ``handle``, its result encoded as the 200 body."""

    methods = ("POST",)

    def __init__(self, path: str, handle: Handle) -> None:
        self.path = path
        self.handle = handle

    async def serve(self, app: FrontendApp, call: Call) -> None:
        require_json(call.headers)
        try:
            body = await read_body(call.receive, MAX_BODY_BYTES)
        except BodyTooLarge as exc:
            raise ApiError(413, str(exc)) from None
        result = await self.handle(app, body)
        await respond(call.send, 200, msgspec.json.encode(result), call.extra + [JSON])
