"""``GenerateEndpoint``: the flow every generating endpoint shares, from body to last byte.

- The body must be declared ``application/json`` (415 otherwise, any parameters allowed), and
  the request is admitted under ``--max-inflight`` before its body is read (``FrontendApp.admit``).
- The body (at most ``MAX_BODY_BYTES``) is decoded into the endpoint's request type (400s name
  the field); ``x-request-id`` (the client's header, else the body's ``request_id``, else a fresh
  one; a client's id must be 1 to 256 visible ASCII characters) is echoed on every response. The
  agent session it belongs to is read from its headers (``dyn.core.frontend.session_identity``).
- ``prepare(app, service, request, context)`` checks, renders, tokenizes and routes it into a
  ``Generation``, which streams as SSE or is collected into one JSON body (or, where the
  endpoint's ``detach`` takes it, runs on its own while the request is answered at once). From
  then on a client that disconnects while its request is routed (routing may wait in the
  router's queue, and the request leaves it) or generated cancels it (``until_disconnect``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio

from dyn.core.asgi import (
    DISCONNECT_HOOK,
    JSON,
    BodyTooLarge,
    Disconnected,
    DisconnectHook,
    read_body,
    respond_parts,
)
from dyn.core.frontend.endpoints.base import Call, Endpoint, Headers
from dyn.core.frontend.generation import Generation, RequestContext
from dyn.core.frontend.service import OpenAIService
from dyn.core.frontend.session_identity import session_ids
from dyn.core.protocol.errors import ApiError, bad_request
from dyn.core.protocol.openai import decode_request, ignored_fields

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 1024 * 1024
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,256}")
"""A client's request id: visible ASCII, so it can be echoed as a header and logged as it is."""

Prepare = Callable[["FrontendApp", OpenAIService, Any, RequestContext], Awaitable[Generation]]
Detach = Callable[["FrontendApp", Any, Generation], "bytes | AsyncIterator[bytes] | None"]
"""Runs a prepared generation on its own and returns what to answer with: a JSON body at once, or
SSE events to send as they come (a client that leaves stops only their sending); None: the
request is answered as usual (the Responses API's background responses)."""


class GenerateEndpoint(Endpoint):
    """A POST endpoint whose JSON body of type ``request_type`` becomes a ``Generation`` through
    ``prepare`` (see the module docstring)."""

    methods = ("POST",)

    def __init__(self, path: str, request_type: type, prepare: Prepare, detach: Detach | None = None) -> None:
        self.path = path
        self.request_type = request_type
        self.prepare = prepare
        self.detach = detach
        self.label = path.removeprefix("/v1/").replace("/", "_")
        """The ``endpoint`` label of this endpoint's request metrics."""

    async def serve(self, app: FrontendApp, call: Call) -> None:
        require_json(call.headers)
        with app.admit():
            await self._generate(app, call)

    async def _generate(self, app: FrontendApp, call: Call) -> None:
        try:
            body = await read_body(call.receive, MAX_BODY_BYTES)
        except BodyTooLarge as exc:
            raise ApiError(413, str(exc)) from None
        req = decode_request(body, self.request_type)
        headers = call.headers
        rid = _request_id(headers.get(b"x-request-id"), getattr(req, "request_id", None))
        warn_ignored(body, self.request_type, rid)
        extra = call.extra + [(b"x-request-id", rid.encode())]
        try:
            session, parent = session_ids(headers)
        except ApiError as exc:
            raise _with_headers(exc, extra) from None
        ctx = RequestContext(
            rid,
            worker_instance_id=_int_header(headers, b"x-worker-instance-id"),
            prefill_instance_id=_int_header(headers, b"x-prefill-instance-id"),
            dp_rank=_int_header(headers, b"x-dp-rank", b"x-data-parallel-rank"),
            session_id=session,
            parent_session_id=parent,
        )
        try:
            service = app.models.resolve(req.model)
        except ApiError as exc:
            raise _with_headers(exc, extra) from None
        label = "stream" if req.stream else "unary"
        detached_events = False

        async def serve() -> None:
            nonlocal detached_events
            try:
                gen = await self.prepare(app, service, req, ctx)
            except ApiError as exc:
                service.model_metrics.requests(self.label, label, "error").inc()
                raise _with_headers(exc, extra) from None
            detached = self.detach(app, req, gen) if self.detach is not None else None
            if isinstance(detached, bytes):
                await respond_parts(call.send, 200, [detached], extra + [JSON])
                return
            if detached is not None:
                detached_events = True
                await send_events(call, extra, detached)
                return
            active = service.model_metrics.active
            active.inc()
            try:
                if req.stream:
                    await _stream(gen, call, extra, app.sse_keep_alive_s)
                else:
                    await respond_parts(call.send, 200, await gen.collect(), extra + [JSON])
            finally:
                active.dec()
                gen.release()

        if await until_disconnect(serve(), call):
            service.model_metrics.disconnects.inc()
            if detached_events:
                log.info("client disconnected from a background response's events; it goes on")
            else:
                log.info("client disconnected; its engine requests were cancelled")


KEEP_ALIVE = b": keep-alive\n\n"
"""vLLM's SSE keep-alive comment (clients skip comment lines; proxies count the bytes)."""


async def _stream(gen: Generation, call: Call, extra: Headers, keep_alive_s: float = 0) -> None:
    """The SSE response of ``gen``. Its head goes out with its first events (as vLLM's does,
    with the first output), so that both take one write (``dyn.core.asgi.HeadWithBody``).
    ``keep_alive_s`` > 0: a ``KEEP_ALIVE`` comment whenever that long passed since the last
    write (the head with the first one, while the request is queued or in prefill)."""
    emit = _sse(call, extra)
    if not keep_alive_s > 0:
        await emit(await gen.stream(emit), more=False)
        return
    lock = anyio.Lock()
    last = anyio.current_time()

    async def written(data: bytes, more: bool = True) -> None:
        nonlocal last
        async with lock:
            await emit(data, more)
            last = anyio.current_time()

    async def keep_alive() -> None:
        while True:
            await anyio.sleep(max(last + keep_alive_s - anyio.current_time(), 0.0))
            if anyio.current_time() - last >= keep_alive_s:
                try:
                    with anyio.CancelScope(shield=True):  # a comment is written whole
                        await written(KEEP_ALIVE)
                except Disconnected:
                    return  # the stream's own next write says so

    outcome: list[bytes | Exception] = []

    async def stream() -> None:
        try:
            outcome.append(await gen.stream(written))
        except Exception as exc:  # raised below, as itself rather than in the task group's group
            outcome.append(exc)
        finally:
            tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(keep_alive)
        tg.start_soon(stream)
    (end,) = outcome
    if isinstance(end, Exception):
        raise end
    await written(end, more=False)


async def send_events(call: Call, extra: Headers, events: AsyncIterator[bytes]) -> None:
    """An SSE response of ``events`` (whole SSE events), each chunk sent as it comes."""
    emit = _sse(call, extra)
    async for chunk in events:
        await emit(chunk)
    await emit(b"", more=False)


def _sse(call: Call, extra: Headers) -> Callable[..., Awaitable[None]]:
    """``emit(data, more=True)``: send ``data`` as the next part of an SSE response (its head
    with the first); a lost connection raises ``Disconnected``."""
    send = call.send
    started = False

    async def emit(data: bytes, more: bool = True) -> None:
        nonlocal started
        try:
            if not started:
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + extra})
            await send({"type": "http.response.body", "body": data, "more_body": more})
        except OSError:
            raise Disconnected() from None

    return emit


async def until_disconnect(work: Coroutine[Any, Any, None], call: Call) -> bool:
    """Run ``work`` unless the client disconnects first; then cancel it and return True.

    The server's ``DisconnectHook`` (``dyn.core.asgi``) cancels the work when the connection is
    lost. Under a server without one, a watcher task waits in ``receive()`` for the disconnect;
    it is cancelled and not awaited when ``work`` ends: waiting for it to wind down would put
    event-loop turns (milliseconds each under load) between a request's routing and its first
    token, and between its last byte and the end of its response.
    """
    disconnected = False
    scope = anyio.CancelScope()

    def lost() -> None:
        nonlocal disconnected
        disconnected = True
        scope.cancel()

    hook: DisconnectHook | None = call.scope.get(DISCONNECT_HOOK)
    watcher = None
    if hook is not None:
        hook.watch(lost)
    else:
        watcher = asyncio.get_running_loop().create_task(_watch(call.receive, lost))
    try:
        with scope:
            await work
    except Disconnected:
        disconnected = True
    finally:
        if watcher is not None:
            watcher.cancel()
        elif hook is not None:
            hook.unwatch()
    return disconnected


async def _watch(receive: Any, lost: Callable[[], None]) -> None:
    """Call ``lost()`` when ``receive`` says the client disconnected."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # the server's receive failed: nothing more to watch
        log.exception("watching the client for a disconnect failed")
        return
    lost()


def warn_ignored(body: bytes, kind: type, request_id: str) -> None:
    """Log the top-level fields of a request that its type ignores, as vLLM does (a client's
    typo or a parameter this server does not know is then visible in the log)."""
    ignored = ignored_fields(body, kind)
    if ignored:
        log.warning(
            "request %s: these fields were present in the request but ignored: %s", request_id, ignored
        )


def require_json(headers: dict[bytes, bytes]) -> None:
    """415 unless the body is declared ``application/json`` (any parameters, any case), as
    Dynamo's frontend requires: a page in a browser cannot send that cross-origin without a CORS
    preflight, so it cannot make the server generate unasked."""
    value = headers.get(b"content-type")
    media = value.split(b";", 1)[0].strip().lower() if value else b""
    if media == b"application/json":
        return
    got = f"Content-Type {value.decode('latin-1')[:100]!r}" if value else "no Content-Type"
    hint = (
        " (curl -d sends form data unless told -H 'Content-Type: application/json')"
        if media == b"application/x-www-form-urlencoded"
        else ""
    )
    raise ApiError(
        415,
        f"the request body must be JSON; got {got}{hint}: send Content-Type: application/json",
        code="unsupported_media_type",
    )


def _request_id(header: bytes | None, body_id: str | None) -> str:
    """The request's id: the ``x-request-id`` header, else the body's ``request_id``, else a fresh
    one; a client's id that is not 1 to 256 visible ASCII characters is a 400."""
    for value, where in (
        (header.decode("latin-1") if header else None, "x-request-id"),
        (body_id, "request_id"),
    ):
        if value is None:
            continue
        if not _REQUEST_ID.fullmatch(value):
            raise bad_request(
                f"{where} must be 1 to 256 visible ASCII characters (letters, digits, "
                f"punctuation; no spaces or control characters), got {value[:80]!r}",
                param=where,
            )
        return value
    return f"{_FRESH_IDS.getrandbits(128):032x}"


# Fresh ids come from a generator seeded from os.urandom, reseeded in a forked child; not from
# os.urandom itself, which releases the GIL: at 128 streams the encode thread took it each time,
# and a call cost the event loop 49 us of wall time and 12 us of CPU (measured in the frontend).
_FRESH_IDS = random.Random()
os.register_at_fork(after_in_child=_FRESH_IDS.seed)


def _int_header(headers: dict[bytes, bytes], *names: bytes) -> int | None:
    """An integer routing header; unparsable values are ignored (as Dynamo does)."""
    for name in names:
        value = headers.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _with_headers(exc: ApiError, extra: Headers) -> ApiError:
    exc.headers = {**exc.headers, **{k.decode(): v.decode("latin-1") for k, v in extra}}
    return exc
