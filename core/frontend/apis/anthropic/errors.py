"""Errors in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}, "request_id"}``.

The HTTP status stays the one dyn chose (``dyn.core.protocol.errors``); the ``error.type`` is
Anthropic's name for it, which its SDKs map to their exception classes. A 503 (no worker, or the
frontend at ``--max-inflight``) is ``overloaded_error``: Anthropic answers 529 with that type, and
its SDKs retry both statuses. ``request_id`` is the request's ``x-request-id`` when it has one.
"""

from __future__ import annotations

import msgspec

from dyn.core.frontend.apis.anthropic.protocol import ErrorObject, ErrorResponse
from dyn.core.protocol.errors import ApiError

_TYPE_OF_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """Anthropic's ``error.type`` for an HTTP status (``api_error`` for any other)."""
    return _TYPE_OF_STATUS.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")


def error_response(exc: ApiError) -> ErrorResponse:
    return ErrorResponse(ErrorObject(error_type(exc.status), exc.message), exc.headers.get("x-request-id"))


def encoded(exc: ApiError) -> bytes:
    """The error body as JSON bytes."""
    return msgspec.json.encode(error_response(exc))


def error_event(exc: ApiError) -> bytes:
    """An error after the stream started: an SSE ``error`` event with the error body."""
    return b"event: error\ndata: " + encoded(exc) + b"\n\n"
