"""What every endpoint is: ``Endpoint``, the ``Call`` it answers, and ``ReadEndpoint``."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dyn.core.asgi import respond
from dyn.core.protocol.errors import ApiError, encoded

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp

Headers = list[tuple[bytes, bytes]]


@dataclass(slots=True, eq=False)
class Call:
    """One HTTP request being answered: its ASGI ``scope``, ``receive`` and ``send``, its request
    ``headers`` (lower-case names), and ``extra``: the headers every response to it carries (CORS;
    an endpoint adds its own, such as ``x-request-id``)."""

    scope: dict[str, Any]
    headers: dict[bytes, bytes]
    receive: Any
    send: Any
    extra: Headers


class Endpoint(abc.ABC):
    """One path of the frontend. ``serve`` answers a request whose method is in ``methods``; it
    raises ``ApiError`` for the app to answer as an OpenAI error body (with ``call.extra``), and
    ``Disconnected`` when the client is gone."""

    path: str
    methods: tuple[str, ...]
    prefix: bool = False
    """``path`` is a prefix: the endpoint also serves every path under it (``/v1/responses/{id}``,
    ``/v1/responses/{id}/input_items``)."""

    @abc.abstractmethod
    async def serve(self, app: FrontendApp, call: Call) -> None: ...

    def error_body(self, exc: ApiError) -> bytes:
        """An error answered on this path, in its API's error shape (OpenAI's by default)."""
        return encoded(exc)


Reply = tuple[int, bytes, bytes]
"""A read endpoint's answer: status, body, content type."""


class ReadEndpoint(Endpoint):
    """A GET (and HEAD) endpoint whose body ``read(app)`` computes from the app's state."""

    methods = ("GET", "HEAD")

    def __init__(self, path: str, read: Callable[[FrontendApp], Reply]) -> None:
        self.path = path
        self.read = read

    async def serve(self, app: FrontendApp, call: Call) -> None:
        status, body, content_type = self.read(app)
        await respond(call.send, status, body, call.extra + [(b"content-type", content_type)])
