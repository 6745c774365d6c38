"""A small etcd v3 client over etcd's own JSON gateway (``/v3/...``), on httpx.

etcd serves its gRPC API as JSON over HTTP on the client port (the grpc-gateway, on by default
since etcd 3.3 at ``/v3/``): a unary call is a ``POST`` of the request message as JSON, the
answer is the response message; ``/v3/watch`` streams one JSON object per line. Keys and values
travel base64-encoded and 64-bit integers as strings (proto3's JSON mapping). Only what discovery
needs is here: range, put, delete, txn, lease grant/keepalive/revoke, and watch.

``EtcdGateway`` takes several endpoints (``http://host:port``) and sends each call to the one
that answered last, trying the next one when it cannot be reached; ``EtcdUnavailable`` (a
``ConfigError``: its message says what to fix) when none can. An answer that is an etcd error
raises ``EtcdError`` with etcd's gRPC status code.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

from dyn.core.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://127.0.0.1:2379"
"""Where etcd listens unless told otherwise (its own default client URL; Dynamo's default too)."""

CALL_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 2.0

CODE_NOT_FOUND = 5
CODE_OUT_OF_RANGE = 11
"""gRPC status codes etcd answers with: a lease that does not exist; a compacted revision."""


class EtcdUnavailable(ConfigError):
    """No etcd endpoint could be reached; the message names them and what to check."""


class EtcdError(RuntimeError):
    """etcd answered a call with an error (``code``: the gRPC status code)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"etcd: {message} (code {code})")
        self.code = code


class WatchCompacted(EtcdError):
    """The watch's start revision was compacted away: list again and watch from the new revision."""


def b64(data: str | bytes) -> str:
    """``data`` as the gateway's base64 text."""
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def unb64(text: str | None) -> bytes:
    """The bytes of a base64 field of an answer (absent: empty)."""
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: str) -> str:
    """The ``range_end`` that makes a range or watch cover every key starting with ``prefix``."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1  # prefixes here end with "/", never 0xff
    return b64(bytes(raw))


def parse_endpoints(endpoints: str | Sequence[str] | None) -> tuple[str, ...]:
    """``endpoints`` (comma-separated text or a list; None: ``DEFAULT_ENDPOINT``) as URLs;
    ``ConfigError`` for one that is not ``http://host:port``."""
    if endpoints is None:
        items: list[str] = [DEFAULT_ENDPOINT]
    elif isinstance(endpoints, str):
        items = [e.strip() for e in endpoints.split(",") if e.strip()]
    else:
        items = [e.strip() for e in endpoints if e.strip()]
    if not items:
        raise ConfigError("--etcd-endpoints is empty: give one or more URLs such as http://127.0.0.1:2379")
    urls = []
    for item in items:
        url = item if "://" in item else f"http://{item}"
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"invalid etcd endpoint {item!r}: use http://host:port (comma-separated for several)"
            )
        urls.append(url.rstrip("/"))
    return tuple(urls)


class EtcdGateway:
    """Calls to the etcd cluster at ``endpoints`` (see the module docstring).

    The HTTP client is made on first use, in the caller's event loop; use one gateway within one
    event loop, and ``aclose`` it when done.
    """

    def __init__(self, endpoints: str | Sequence[str] | None) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self._current = 0
        self._http: httpx.AsyncClient | None = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            # trust_env=False: an HTTP proxy set for the internet must not sit between us and etcd
            self._http = httpx.AsyncClient(
                timeout=httpx.Timeout(CALL_TIMEOUT_S, connect=CONNECT_TIMEOUT_S), trust_env=False
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def check(self) -> None:
        """Block until one endpoint answers a v3 range read (at most ``CONNECT_TIMEOUT_S`` per
        endpoint); ``EtcdUnavailable`` naming them when none does. For start-up, before an event
        loop runs: a command that cannot reach etcd stops with one line instead of a traceback."""
        errors = []
        with httpx.Client(
            timeout=httpx.Timeout(CALL_TIMEOUT_S, connect=CONNECT_TIMEOUT_S), trust_env=False
        ) as http:
            for index in self._order():
                endpoint = self.endpoints[index]
                try:
                    response = http.post(
                        f"{endpoint}/v3/kv/range", json={"key": b64("/"), "count_only": True}
                    )
                except httpx.TransportError as exc:
                    errors.append(f"{endpoint}: {_reason(exc)}")
                    continue
                if "header" in _decode(response):
                    self._current = index
                    return
                errors.append(f"{endpoint}: HTTP {response.status_code}, not etcd v3's JSON gateway")
        raise self.unavailable(errors)

    def _order(self) -> list[int]:
        n = len(self.endpoints)
        return [(self._current + i) % n for i in range(n)]

    def unavailable(self, errors: list[str]) -> EtcdUnavailable:
        return EtcdUnavailable(
            f"cannot reach etcd ({', '.join(errors)}); start etcd there or point "
            "--etcd-endpoints (DYN_ETCD_ENDPOINTS) at it"
        )

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``/v3/{path}`` and return the answer; ``EtcdUnavailable`` if no endpoint
        answers, ``EtcdError`` if etcd refuses."""
        errors = []
        for index in self._order():
            endpoint = self.endpoints[index]
            try:
                response = await self.http.post(f"{endpoint}/v3/{path}", json=body)
            except httpx.TransportError as exc:
                errors.append(f"{endpoint}: {_reason(exc)}")
                continue
            self._current = index
            answer = _decode(response)
            if "error" in answer or response.status_code >= 400:
                raise EtcdError(int(answer.get("code", 2)), str(answer.get("message", response.text)))
            return answer
        raise self.unavailable(errors)

    async def watch(self, create_request: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """Open a watch (``create_request``: key, range_end, start_revision...) and yield each
        watch response (``events``, ``header``) until the stream ends or fails.

        ``EtcdUnavailable`` if no endpoint accepts the stream, ``WatchCompacted`` if the start
        revision is compacted, ``httpx.TransportError`` when an open stream breaks (etcd stopped).
        """
        errors = []
        for index in self._order():
            endpoint = self.endpoints[index]
            request = self.http.build_request(
                "POST",
                f"{endpoint}/v3/watch",
                json={"create_request": create_request},
                timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            )
            try:
                response = await self.http.send(request, stream=True)
            except httpx.TransportError as exc:
                errors.append(f"{endpoint}: {_reason(exc)}")
                continue
            self._current = index
            try:
                if response.status_code >= 400:
                    await response.aread()
                    answer = _decode(response)
                    raise EtcdError(int(answer.get("code", 2)), str(answer.get("message", response.text)))
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    message = json.loads(line)
                    if "error" in message:
                        error = message["error"]
                        raise EtcdError(int(error.get("grpc_code", error.get("code", 2))), str(error))
                    result = message.get("result", {})
                    if result.get("compact_revision") not in (None, "0"):
                        raise WatchCompacted(CODE_OUT_OF_RANGE, "required revision has been compacted")
                    if result.get("canceled"):
                        raise EtcdError(2, f"watch canceled: {result.get('cancel_reason', '')}")
                    yield result
            finally:
                await response.aclose()
            return
        raise self.unavailable(errors)


def _decode(response: httpx.Response) -> dict[str, Any]:
    try:
        answer = response.json()
    except ValueError:
        return {"error": response.text, "code": 2, "message": response.text[:200]}
    return answer if isinstance(answer, dict) else {}


def _reason(exc: httpx.TransportError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "cannot connect"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return str(exc) or type(exc).__name__
