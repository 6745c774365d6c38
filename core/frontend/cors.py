"""CORS as vLLM configures it (``--allowed-origins``, ``--allowed-methods``, ``--allowed-headers``,
``--allow-credentials``), with Starlette's ``CORSMiddleware`` semantics for the cases clients use:
simple requests get ``access-control-allow-origin``; preflight ``OPTIONS`` requests are answered
directly (200 when allowed, 400 when not).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CorsPolicy:
    allowed_origins: tuple[str, ...] = ("*",)
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.allowed_origins or origin in self.allowed_origins

    def response_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        """Headers for an actual (non-preflight) response to a request from ``origin``."""
        if not self.origin_allowed(origin):
            return []
        explicit = self.allow_credentials or "*" not in self.allowed_origins
        headers = [(b"access-control-allow-origin", origin.encode() if explicit else b"*")]
        if explicit:
            headers.append((b"vary", b"Origin"))
        if self.allow_credentials:
            headers.append((b"access-control-allow-credentials", b"true"))
        return headers

    def preflight(
        self, origin: str, method: str, request_headers: str
    ) -> tuple[int, list[tuple[bytes, bytes]]]:
        """Status and headers answering a preflight from ``origin`` for ``method``."""
        ok = self.origin_allowed(origin)
        if "*" not in self.allowed_methods and method.upper() not in {
            m.upper() for m in self.allowed_methods
        }:
            ok = False
        asked = [h.strip().lower() for h in request_headers.split(",") if h.strip()]
        if "*" not in self.allowed_headers:
            allowed = {h.lower() for h in self.allowed_headers}
            if any(h not in allowed for h in asked):
                ok = False
        methods = (
            "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"
            if "*" in self.allowed_methods
            else ", ".join(self.allowed_methods)
        )
        allow_headers = ", ".join(asked) if "*" in self.allowed_headers else ", ".join(self.allowed_headers)
        headers = self.response_headers(origin) + [
            (b"access-control-allow-methods", methods.encode()),
            (b"access-control-max-age", b"600"),
        ]
        if allow_headers:
            headers.append((b"access-control-allow-headers", allow_headers.encode()))
        return (200 if ok else 400), headers
