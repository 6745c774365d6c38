"""The frontend's ASGI application: routes, auth, CORS, request ids, errors, disconnects.

A plain ASGI callable (no framework on the hot path). Endpoints:

- ``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming SSE or JSON)
- ``GET /v1/models``, ``GET /health`` (200 with live instances, 503 with none), ``GET /live``,
  ``GET /metrics`` (Prometheus text), ``GET /openapi.json``

Contracts: every error is an OpenAI error body (``dyn.core.protocol.errors``); ``x-request-id``
(the client's, else the body's ``request_id``, else a fresh one) is echoed on every ``/v1``
response; with an API key, ``/v1/*`` needs ``Authorization: Bearer KEY``; a client that
disconnects cancels its engine requests. An unexpected exception is logged and answered with a
500, never left to take the server down.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import anyio
import msgspec
import orjson

from dyn.core.asgi import BodyTooLarge, Disconnected, lifespan, read_body
from dyn.core.frontend.cors import CorsPolicy
from dyn.core.frontend.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from dyn.core.frontend.openapi import openapi_document
from dyn.core.frontend.service import Generation, OpenAIService, RequestContext
from dyn.core.protocol.errors import ApiError
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


class FrontendApp:
    """ASGI app over an ``OpenAIService``."""

    def __init__(self, service: OpenAIService, *, api_key: str | None = None,
                 cors: CorsPolicy | None = None, kv_views: Any = None) -> None:
        self.service = service
        self.api_key = api_key
        self.cors = cors or CorsPolicy()
        self.kv_views = kv_views
        """The KV router's index under ``/kv/`` (``dyn indexer``'s read views), when it has one."""
        self.started = int(time.time())
        self._openapi: bytes | None = None

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
            self._authorize(headers)
            await self._generate(path, headers, receive, send, extra)
        elif path in _GET:
            if method not in ("GET", "HEAD"):
                raise ApiError(405, f"{path} accepts GET only")
            if path.startswith("/v1/"):
                self._authorize(headers)
            status, body, content_type = self._read_only(path)
            await _respond(send, status, body, extra + [(b"content-type", content_type)])
        elif path.startswith("/kv/") and self.kv_views is not None:
            await self.kv_views(scope, receive, send)
        else:
            raise ApiError(404, f"no route for {method} {path}; see /openapi.json")

    def _authorize(self, headers: dict[bytes, bytes]) -> None:
        if self.api_key is None:
            return
        if headers.get(b"authorization", b"") != b"Bearer " + self.api_key.encode():
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

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
            self._openapi = orjson.dumps(openapi_document())
        return 200, self._openapi, b"application/json"

    async def _generate(self, path, headers, receive, send, extra) -> None:
        try:
            body = await read_body(receive, MAX_BODY_BYTES)
        except BodyTooLarge as exc:
            raise ApiError(413, str(exc)) from None
        kind = _GENERATE[path]
        req = decode_request(body, kind)
        header_rid = headers.get(b"x-request-id")
        rid = header_rid.decode("latin-1") if header_rid else (req.request_id or uuid.uuid4().hex)
        ctx = RequestContext(rid, worker_instance_id=_int_header(headers, b"x-worker-instance-id"),
                             prefill_instance_id=_int_header(headers, b"x-prefill-instance-id"),
                             dp_rank=_int_header(headers, b"x-dp-rank", b"x-data-parallel-rank"))
        extra = extra + [(b"x-request-id", rid.encode())]
        service = self.service
        try:
            if kind is ChatCompletionRequest:
                gen = await service.prepare_chat(req, ctx)
            else:
                gen = await service.prepare_completion(req, ctx)
        except ApiError as exc:
            service.metrics.requests.labels(service.model_name, path[4:].replace("/", "_"),
                                            "stream" if req.stream else "unary", "error").inc()
            raise _with_headers(exc, extra) from None
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
        await _respond(send, exc.status, msgspec.json.encode(exc.body()), _dedupe(headers))
    except (OSError, RuntimeError):
        pass  # the response had started or the client is gone; nothing more can be said


def _dedupe(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    seen: dict[bytes, bytes] = {}
    for k, v in headers:
        seen[k.lower()] = v
    return list(seen.items())
