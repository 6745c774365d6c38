"""The ``--api-key`` guard shared by dyn's HTTP apps: the frontend, ``dyn router`` and ``dyn indexer``.

With a key, every route needs ``Authorization: Bearer KEY`` (or ``x-api-key: KEY``, as
Anthropic's clients send it) except the probes in ``OPEN_PATHS``,
which orchestrators call without credentials. The scheme is matched case-insensitively (RFC 9110
11.1: ``bearer`` and ``BEARER`` are the same scheme), and the key is compared in constant time:
both sides are hashed with SHA-256 and the digests compared with ``hmac.compare_digest``, so the
time taken says nothing about the key's content or length. A refusal is a 401 with
``WWW-Authenticate: Bearer``; each app words the body in its own error shape. The key itself is
never logged or shown (``repr`` hides it).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TypeGuard

OPEN_PATHS = frozenset({"/live", "/health"})
"""Paths answered without the key: liveness and readiness probes."""

CHALLENGE = (b"www-authenticate", b"Bearer")
"""The header a 401 carries (RFC 6750 3)."""

REFUSAL = "missing or wrong API key: send 'Authorization: Bearer <key>'"


class ApiKey:
    """A server's API key, kept only as its SHA-256 digest."""

    __slots__ = ("_digest",)

    def __init__(self, key: str) -> None:
        if not key:
            raise ValueError("an API key must not be empty")
        self._digest = _digest(key.encode())

    def allows(self, authorization: bytes | None, x_api_key: bytes | None = None) -> bool:
        """Whether an ``Authorization`` header value (raw bytes, None when absent) carries the key,
        or, without one, an ``x-api-key`` header (Anthropic's clients send the key there)."""
        if not authorization:
            return x_api_key is not None and hmac.compare_digest(_digest(x_api_key.strip()), self._digest)
        scheme, _, token = authorization.strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(_digest(token.strip()), self._digest)

    def __repr__(self) -> str:
        return "ApiKey(<hidden>)"


def needs_key(key: ApiKey | None, path: str) -> TypeGuard[ApiKey]:
    """Whether a request for ``path`` must carry ``key`` (never without a key, never for a probe);
    True also tells the type checker that ``key`` is not None."""
    return key is not None and path not in OPEN_PATHS


def authorization(headers: list[tuple[bytes, bytes]] | dict[bytes, bytes]) -> bytes | None:
    """The ``Authorization`` header of an ASGI request (names are lowercase in ASGI)."""
    if isinstance(headers, dict):
        return headers.get(b"authorization")
    for name, value in headers:
        if name == b"authorization":
            return value
    return None


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()
