"""The frontend's ASGI application: CORS, auth, dispatch to the endpoint table, errors.

A plain ASGI callable (no framework on the hot path). Each path it serves is an endpoint of
``dyn.core.frontend.endpoints`` (``ENDPOINTS``): ``POST /v1/chat/completions``,
``POST /v1/completions``, ``POST /v1/responses`` (``GET``/``DELETE /v1/responses/{id}``),
``POST /v1/messages`` (streaming SSE or JSON; the APIs of ``dyn.core.frontend.apis``),
``POST /v1/messages/count_tokens``, ``GET /v1/models``, ``GET /health`` (503 with
the reason when no request could be served; ``endpoints.health``), ``GET /live``, ``GET /metrics`` (Prometheus text),
``GET /openapi.json``, ``POST /tokenize``, ``POST /detokenize``; with a KV router, its index views
under ``/kv/``.

Contracts:

- Every error is an OpenAI error body (``dyn.core.protocol.errors``), or the error shape of the
  endpoint's API (``Endpoint.error_body``: Anthropic's under ``/v1/messages``), malformed input a 4xx: a
  body that is not ``application/json`` is a 415 (charset and other parameters allowed); bad JSON,
  invalid UTF-8, deep nesting, a wrong type or an integer out of range a 400 naming the field.
- With an API key every route but ``/live`` and ``/health`` needs ``Authorization: Bearer KEY``
  or ``x-api-key: KEY`` (``dyn.core.api_key``; ``/metrics`` too unless ``public_metrics``; ``/openapi.json`` and
  ``/kv/*`` too): a 401 with ``WWW-Authenticate: Bearer`` otherwise. CORS preflights need none.
- ``x-request-id`` (the client's header, else the body's ``request_id``, else a fresh one) is
  echoed on every generate response; a client's id must be 1 to 256 visible ASCII characters
  (a 400 otherwise), so the echo is always a valid header.
- With ``max_inflight``, a generate request beyond that many in progress is answered 503 with
  ``Retry-After: 1`` before its body is read, and counted in
  ``dynamo_frontend_requests_rejected_total{reason="max_inflight"}``.
- With ``root_path`` (``--root-path``, for a proxy that serves the frontend under a prefix), a
  path that starts with it is served as the path after it, and any other path as it is (vLLM's
  FastAPI ``root_path``): ``/PREFIX/v1/models`` and ``/v1/models`` are the same endpoint, and
  ``scope["root_path"]`` is the prefix. With ``docs`` off (``--disable-fastapi-docs``),
  ``/openapi.json`` is a 404; with ``anthropic_api`` off (``--no-enable-anthropic-api``), so are
  ``/v1/messages`` and its ``count_tokens``.
- A client that disconnects cancels its request, whether it waits in the router's queue or is
  generating. An unexpected exception is logged and answered with a 500, never left to take the
  server down.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from dyn.core.api_key import CHALLENGE, REFUSAL, ApiKey, needs_key
from dyn.core.asgi import JSON, Disconnected, json_error_protocol, lifespan, respond
from dyn.core.frontend.catalog import ModelCatalog
from dyn.core.frontend.cors import CorsPolicy
from dyn.core.frontend.endpoints import Call, Endpoint, find
from dyn.core.frontend.service import OpenAIService
from dyn.core.protocol.errors import ApiError, bad_request, encoded, overloaded

if TYPE_CHECKING:
    from dyn.core.frontend.apis.files.store import FileStore
    from dyn.core.frontend.apis.responses.store import ResponseStore

log = logging.getLogger(__name__)

DOCS_PATHS = frozenset({"/openapi.json"})
"""The paths ``--disable-fastapi-docs`` turns off (vLLM's /docs and /redoc are never served here)."""


class FrontendApp:
    """ASGI app over the models of a ``ModelCatalog``. ``max_inflight``: most generate requests in
    progress at once (0: no limit); ``public_metrics``: ``/metrics`` answers without the API key;
    ``sse_keep_alive_s``: a stream quiet this long gets an SSE comment (0: never)."""

    def __init__(
        self,
        models: ModelCatalog,
        *,
        api_key: str | None = None,
        cors: CorsPolicy | None = None,
        kv_views: Any = None,
        public_metrics: bool = False,
        max_inflight: int = 0,
        root_path: str = "",
        docs: bool = True,
        anthropic_api: bool = True,
        response_store: ResponseStore | None = None,
        file_store: FileStore | None = None,
        sse_keep_alive_s: float = 0,
        tokenizer_info: bool = False,
    ) -> None:
        self.root_path = root_path
        """The prefix a proxy serves this app under ("" for none); no trailing slash."""
        # imported here: at the top they would run while the endpoint table that imports them is half built
        from dyn.core.frontend.apis.anthropic.endpoints import PATHS as ANTHROPIC_PATHS
        from dyn.core.frontend.apis.files.store import FileStore
        from dyn.core.frontend.apis.responses.background import BackgroundResponses
        from dyn.core.frontend.apis.responses.store import ResponseStore
        from dyn.core.frontend.endpoints.tokenizer_info import PATHS as TOKENIZER_INFO_PATHS

        self.off = (
            (frozenset() if docs else DOCS_PATHS)
            | (frozenset() if anthropic_api else ANTHROPIC_PATHS)
            | (frozenset() if tokenizer_info else TOKENIZER_INFO_PATHS)
        )
        """Paths turned off by flags: answered 404 as if there were no such endpoint."""
        self.models = models
        """Every model served, by each name a request may use (``resolve``)."""
        self.response_store = response_store if response_store is not None else ResponseStore()
        """The Responses API's stored responses (``--responses-store-*``), for every model."""
        self.background_responses = BackgroundResponses(self.response_store)
        """The Responses API's background responses running here."""
        self.file_store = file_store if file_store is not None else FileStore()
        """The Files API's uploads (``--files-store-*``), read by ``file_id`` in Responses and
        Messages requests."""
        self.sse_keep_alive_s = sse_keep_alive_s
        """Seconds of a quiet stream before an SSE keep-alive comment (0: never)."""
        self.api_key = ApiKey(api_key) if api_key else None
        self.public_metrics = public_metrics
        self.max_inflight = max_inflight
        self.inflight = 0
        """Generate requests admitted and not yet answered in full."""
        self.cors = cors or CorsPolicy()
        self.kv_views = kv_views
        """The KV router's index under ``/kv/`` (``dyn indexer``'s read views), when it has one."""
        self.started = int(time.time())

    @property
    def service(self) -> OpenAIService:
        """The frontend's own model's service: the one without a ``model`` field, and the
        frontend-wide views (metrics, the OpenAPI document)."""
        return self.models.primary.service

    @staticmethod
    def http_protocol() -> type | str:
        """The uvicorn protocol to serve this app with: its own 400s for requests it cannot parse
        are OpenAI error bodies too."""
        return json_error_protocol(
            lambda reason: encoded(
                bad_request(
                    f"the HTTP request could not be parsed ({reason.rstrip('.')}): a header holds a control "
                    "character, or the request line or framing is malformed"
                )
            )
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await lifespan(receive, send)
            return
        if kind != "http":
            return
        if self.root_path:
            scope = _under_root(scope, self.root_path)
        headers = dict(scope["headers"])
        extra: list[tuple[bytes, bytes]] = []
        origin = headers.get(b"origin")
        if origin is not None:
            origin_s = origin.decode("latin-1")
            if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
                status, cors_headers = self.cors.preflight(
                    origin_s,
                    headers[b"access-control-request-method"].decode("latin-1"),
                    headers.get(b"access-control-request-headers", b"").decode("latin-1"),
                )
                await respond(
                    send,
                    status,
                    b"OK" if status == 200 else b"Disallowed CORS request",
                    cors_headers + [(b"content-type", b"text/plain")],
                )
                return
            extra = self.cors.response_headers(origin_s)
        path = scope["path"]
        endpoint = find(path) if path not in self.off else None
        error_body = endpoint.error_body if endpoint is not None else encoded
        try:
            self._authorize(path, headers)
            await self._dispatch(Call(scope, headers, receive, send, extra), endpoint)
        except ApiError as exc:
            await _respond_error(send, error_body(exc), exc, extra)
        except Disconnected:
            pass
        except Exception:
            log.exception("unexpected error serving %s %s", scope["method"], path)
            internal = ApiError(500, "internal server error; see the frontend log")
            await _respond_error(send, error_body(internal), internal, extra)

    async def _dispatch(self, call: Call, endpoint: Endpoint | None) -> None:
        path, method = call.scope["path"], call.scope["method"]
        if endpoint is not None:
            if method not in endpoint.methods:
                raise ApiError(405, f"{path} accepts {endpoint.methods[0]} only")
            await endpoint.serve(self, call)
        elif path.startswith("/kv/") and self.kv_views is not None:
            await self.kv_views(call.scope, call.receive, call.send)
        else:
            raise ApiError(404, f"no route for {method} {path}; see /openapi.json")

    def _authorize(self, path: str, headers: dict[bytes, bytes]) -> None:
        """401 unless ``path`` is open or the request carries the API key."""
        key = self.api_key
        if key is None or not needs_key(key, path) or (path == "/metrics" and self.public_metrics):
            return
        if not key.allows(headers.get(b"authorization"), headers.get(b"x-api-key")):
            raise ApiError(
                401, REFUSAL, code="invalid_api_key", headers={CHALLENGE[0].decode(): CHALLENGE[1].decode()}
            )

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Count a generate request as in progress for its duration, or refuse it with a 503 at
        once (before its body is read) when ``max_inflight`` are in progress already."""
        if self.max_inflight and self.inflight >= self.max_inflight:
            service = self.service
            service.metrics.rejected.labels(service.model_name, "max_inflight").inc()
            raise overloaded(
                f"the frontend is serving its limit of {self.max_inflight} requests "
                "(--max-inflight); retry after the Retry-After seconds"
            )
        with self.admitted():
            yield

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """Count work admitted already as in progress for its duration (a background response,
        going on after its request was answered)."""
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1


async def _respond_error(send: Any, body: bytes, exc: ApiError, extra: list[tuple[bytes, bytes]]) -> None:
    headers = extra + [JSON] + [(k.encode(), v.encode("latin-1")) for k, v in exc.headers.items()]
    try:
        await respond(send, exc.status, body, _dedupe(headers))
    except (OSError, RuntimeError):
        pass  # the response had started or the client is gone; nothing more can be said


def _dedupe(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    seen: dict[bytes, bytes] = {}
    for k, v in headers:
        seen[k.lower()] = v
    return list(seen.items())


def _under_root(scope: dict[str, Any], root_path: str) -> dict[str, Any]:
    """``scope`` with ``root_path`` set and, when its path starts with that prefix, the path
    after it (as Starlette routes under FastAPI's ``root_path``)."""
    path = scope["path"]
    if path.startswith(root_path) and (len(path) == len(root_path) or path[len(root_path)] == "/"):
        path = path[len(root_path) :] or "/"
    return {**scope, "path": path, "root_path": root_path}
