"""The frontend's ASGI application: routes, auth, CORS, request ids, errors, disconnects.

A plain ASGI callable (no framework on the hot path). Endpoints:

- ``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming SSE or JSON)
- ``GET /v1/models``, ``GET /health`` (200 with live instances, 503 with none), ``GET /live``,
  ``GET /metrics`` (Prometheus text), ``GET /openapi.json``

Contracts:

- Every error is an OpenAI error body (``dyn.core.protocol.errors``), malformed input a 4xx: a
  body that is not ``application/json`` is a 415 (charset and other parameters allowed); bad JSON,
  invalid UTF-8, deep nesting, a wrong type or an integer out of range a 400 naming the field.
- With an API key every route but ``/live`` and ``/health`` needs ``Authorization: Bearer KEY``
  (``dyn.core.api_key``; ``/metrics`` too unless ``public_metrics``; ``/openapi.json`` and
  ``/kv/*`` too): a 401 with ``WWW-Authenticate: Bearer`` otherwise. CORS preflights need none.
- ``x-request-id`` (the client's header, else the body's ``request_id``, else a fresh one) is
  echoed on every generate response; a client's id must be 1 to 256 visible ASCII characters
  (a 400 otherwise), so the echo is always a valid header.
- With ``max_inflight``, a generate request beyond that many in progress is answered 503 with
  ``Retry-After: 1`` before its body is read, and counted in
  ``dynamo_frontend_requests_rejected_total{reason="max_inflight"}``.
- A client that disconnects cancels its request, whether it waits in the router's queue or is
  generating. An unexpected exception is logged and answered with a 500, never left to take the
  server down.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

import anyio
import msgspec
import orjson

from dyn.core.api_key import CHALLENGE, REFUSAL, ApiKey, needs_key
from dyn.core.asgi import BodyTooLarge, Disconnected, json_error_protocol, lifespan, read_body
from dyn.core.frontend.cors import CorsPolicy
from dyn.core.frontend.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from dyn.core.frontend.openapi import openapi_document
from dyn.core.frontend.service import Generation, OpenAIService, RequestContext
from dyn.core.protocol.errors import ApiError, bad_request, encoded, overloaded
from dyn.core.protocol.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    decode_request,
)

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 1024 * 1024
_JSON = (b"content-type", b"application/json")
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
_GENERATE = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}
_GET = ("/v1/models", "/health", "/live", "/metrics", "/openapi.json")
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,256}")
"""A client's request id: visible ASCII, so it can be echoed as a header and logged as it is."""


class FrontendApp:
    """ASGI app over an ``OpenAIService``. ``max_inflight``: most generate requests in progress
    at once (0: no limit); ``public_metrics``: ``/metrics`` answers without the API key."""

    def __init__(self, service: OpenAIService, *, api_key: str | None = None,
                 cors: CorsPolicy | None = None, kv_views: Any = None, public_metrics: bool = False,
                 max_inflight: int = 0) -> None:
        self.service = service
        self.api_key = ApiKey(api_key) if api_key else None
        self.public_metrics = public_metrics
        self.max_inflight = max_inflight
        self.inflight = 0
        """Generate requests admitted and not yet answered in full."""
        self.cors = cors or CorsPolicy()
        self.kv_views = kv_views
        """The KV router's index under ``/kv/`` (``dyn indexer``'s read views), when it has one."""
        self.started = int(time.time())
        self._openapi: bytes | None = None

    @staticmethod
    def http_protocol() -> type | str:
        """The uvicorn protocol to serve this app with: its own 400s for requests it cannot parse
        are OpenAI error bodies too."""
        return json_error_protocol(lambda reason: encoded(bad_request(
            f"the HTTP request could not be parsed ({reason.rstrip('.')}): a header holds a control "
            "character, or the request line or framing is malformed")))

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await lifespan(receive, send)
            return
        if kind != "http":
            return
        headers = dict(scope["headers"])
        extra: list[tuple[bytes, bytes]] = []
        origin = headers.get(b"origin")
        if origin is not None:
            origin_s = origin.decode("latin-1")
            if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
                status, cors_headers = self.cors.preflight(
                    origin_s, headers[b"access-control-request-method"].decode("latin-1"),
                    headers.get(b"access-control-request-headers", b"").decode("latin-1"))
                await _respond(send, status, b"OK" if status == 200 else b"Disallowed CORS request",
                               cors_headers + [(b"content-type", b"text/plain")])
                return
            extra = self.cors.response_headers(origin_s)
        try:
            self._authorize(scope["path"], headers)
            await self._dispatch(scope, headers, receive, send, extra)
        except ApiError as exc:
            await _respond_error(send, exc, extra)
        except Disconnected:
            pass
        except Exception:
            log.exception("unexpected error serving %s %s", scope["method"], scope["path"])
            await _respond_error(send, ApiError(500, "internal server error; see the frontend log"),
                                 extra)

    async def _dispatch(self, scope, headers, receive, send, extra) -> None:
        path, method = scope["path"], scope["method"]
        if path in _GENERATE:
            if method != "POST":
                raise ApiError(405, f"{path} accepts POST only")
            _require_json(headers)
            await self._admitted(path, headers, receive, send, extra)
        elif path in _GET:
            if method not in ("GET", "HEAD"):
                raise ApiError(405, f"{path} accepts GET only")
            status, body, content_type = self._read_only(path)
            await _respond(send, status, body, extra + [(b"content-type", content_type)])
        elif path.startswith("/kv/") and self.kv_views is not None:
            await self.kv_views(scope, receive, send)
        else:
            raise ApiError(404, f"no route for {method} {path}; see /openapi.json")

    def _authorize(self, path: str, headers: dict[bytes, bytes]) -> None:
        """401 unless ``path`` is open or the request carries the API key."""
        key = self.api_key
        if not needs_key(key, path) or (path == "/metrics" and self.public_metrics):
            return
        if not key.allows(headers.get(b"authorization")):
            raise ApiError(401, REFUSAL, code="invalid_api_key",
                           headers={CHALLENGE[0].decode(): CHALLENGE[1].decode()})

    def _read_only(self, path: str) -> tuple[int, bytes, bytes]:
        service = self.service
        if path == "/v1/models":
            info = service.preprocessor.info
            card = ModelCard(service.model_name, self.started, root=str(info.path),
                             max_model_len=info.context_length)
            return 200, msgspec.json.encode(ModelList([card])), b"application/json"
        if path == "/health":
            instances = [w.instance_id for w in service.router.pool.workers()]
            status = "healthy" if instances else "unhealthy"
            body = orjson.dumps({"status": status, "instances": instances,
                                 "model": service.model_name, "router_mode": service.router.mode})
            return (200 if instances else 503), body, b"application/json"
        if path == "/live":
            return 200, b'{"status":"live"}', b"application/json"
        if path == "/metrics":
            return 200, service.metrics.render(), METRICS_CONTENT_TYPE.encode()
        if self._openapi is None:
            info = service.preprocessor.info
            self._openapi = orjson.dumps(openapi_document(
                service.model_name, context_length=info.context_length, vocab_size=info.vocab_size,
                max_logprobs=service.outputs.max_logprobs))
        return 200, self._openapi, b"application/json"

    async def _admitted(self, path, headers, receive, send, extra) -> None:
        """Serve a generate request if fewer than ``max_inflight`` are in progress; else 503 at
        once, before its body is read."""
        if self.max_inflight and self.inflight >= self.max_inflight:
            service = self.service
            service.metrics.rejected.labels(service.model_name, "max_inflight").inc()
            raise overloaded(f"the frontend is serving its limit of {self.max_inflight} requests "
                             "(--max-inflight); retry after the Retry-After seconds")
        self.inflight += 1
        try:
            await self._generate(path, headers, receive, send, extra)
        finally:
            self.inflight -= 1

    async def _generate(self, path, headers, receive, send, extra) -> None:
        try:
            body = await read_body(receive, MAX_BODY_BYTES)
        except BodyTooLarge as exc:
            raise ApiError(413, str(exc)) from None
        kind = _GENERATE[path]
        req = decode_request(body, kind)
        rid = _request_id(headers.get(b"x-request-id"), req.request_id)
        ctx = RequestContext(rid, worker_instance_id=_int_header(headers, b"x-worker-instance-id"),
                             prefill_instance_id=_int_header(headers, b"x-prefill-instance-id"),
                             dp_rank=_int_header(headers, b"x-dp-rank", b"x-data-parallel-rank"))
        extra = extra + [(b"x-request-id", rid.encode())]
        service = self.service
        prepared: list[Generation] = []

        async def prepare() -> None:
            if kind is ChatCompletionRequest:
                prepared.append(await service.prepare_chat(req, ctx))
            else:
                prepared.append(await service.prepare_completion(req, ctx))

        try:
            # Routing may wait in the router's queue: a client that leaves meanwhile takes its
            # place in the queue with it.
            if not await self._until_disconnect(prepare(), receive):
                for gen in prepared:
                    gen.release()
                return
        except ApiError as exc:
            service.metrics.requests.labels(service.model_name, path[4:].replace("/", "_"),
                                            "stream" if req.stream else "unary", "error").inc()
            raise _with_headers(exc, extra) from None
        gen = prepared[0]
        active = service.metrics.active.labels(service.model_name)
        active.inc()
        try:
            if req.stream:
                await self._stream(gen, receive, send, extra)
            else:
                await self._unary(gen, receive, send, extra)
        finally:
            active.dec()
            gen.release()

    async def _stream(self, gen: Generation, receive, send, extra) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + extra})

        async def emit(data: bytes) -> None:
            try:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            except OSError:
                raise Disconnected() from None

        if not await self._until_disconnect(gen.stream(emit), receive):
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _unary(self, gen: Generation, receive, send, extra) -> None:
        result: list[bytes] = []

        async def collect() -> None:
            result.append(await gen.collect())

        if await self._until_disconnect(collect(), receive):
            await _respond(send, 200, result[0], extra + [_JSON])

    async def _until_disconnect(self, work, receive) -> bool:
        """Run ``work`` unless the client disconnects first (then cancel it); True if it ran."""
        disconnected = False

        async def watch(scope: anyio.CancelScope) -> None:
            nonlocal disconnected
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected = True
                    scope.cancel()
                    return

        error: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, tg.cancel_scope)
            try:
                await work
            except Disconnected:
                disconnected = True
            except Exception as exc:  # re-raised below, unwrapped from the task group's group
                error = exc
            tg.cancel_scope.cancel()
        if error is not None:
            raise error
        if disconnected:
            self.service.metrics.disconnects.labels(self.service.model_name).inc()
            log.info("client disconnected; its engine requests were cancelled")
        return not disconnected


def _require_json(headers: dict[bytes, bytes]) -> None:
    """415 unless the body is declared ``application/json`` (any parameters, any case), as
    Dynamo's frontend requires: a page in a browser cannot send that cross-origin without a CORS
    preflight, so it cannot make the server generate unasked."""
    value = headers.get(b"content-type")
    media = value.split(b";", 1)[0].strip().lower() if value else b""
    if media == b"application/json":
        return
    got = f"Content-Type {value.decode('latin-1')[:100]!r}" if value else "no Content-Type"
    hint = (" (curl -d sends form data unless told -H 'Content-Type: application/json')"
            if media == b"application/x-www-form-urlencoded" else "")
    raise ApiError(415, f"the request body must be JSON; got {got}{hint}: send "
                        "Content-Type: application/json", code="unsupported_media_type")


def _request_id(header: bytes | None, body_id: str | None) -> str:
    """The request's id: the ``x-request-id`` header, else the body's ``request_id``, else a fresh
    one; a client's id that is not 1 to 256 visible ASCII characters is a 400."""
    for value, where in ((header.decode("latin-1") if header else None, "x-request-id"),
                         (body_id, "request_id")):
        if value is None:
            continue
        if not _REQUEST_ID.fullmatch(value):
            raise bad_request(f"{where} must be 1 to 256 visible ASCII characters (letters, digits, "
                              f"punctuation; no spaces or control characters), got {value[:80]!r}",
                              param=where)
        return value
    return uuid.uuid4().hex


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


def _with_headers(exc: ApiError, extra: list[tuple[bytes, bytes]]) -> ApiError:
    exc.headers = {**exc.headers, **{k.decode(): v.decode("latin-1") for k, v in extra}}
    return exc


async def _respond(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": headers + [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _respond_error(send, exc: ApiError, extra: list[tuple[bytes, bytes]]) -> None:
    headers = extra + [_JSON] + [(k.encode(), v.encode("latin-1")) for k, v in exc.headers.items()]
    try:
        await _respond(send, exc.status, encoded(exc), _dedupe(headers))
    except (OSError, RuntimeError):
        pass  # the response had started or the client is gone; nothing more can be said


def _dedupe(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    seen: dict[bytes, bytes] = {}
    for k, v in headers:
        seen[k.lower()] = v
    return list(seen.items())
