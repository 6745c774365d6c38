"""OpenAI error bodies and the exception that carries one to the HTTP layer.

Every failure a client sees is ``{"error": {"message", "type", "param", "code"}}`` with an HTTP
status that says whose fault it was: 4xx for the client's mistakes (never a 500), 401 with
``WWW-Authenticate`` for a missing or wrong API key, 415 for a body that is not JSON, 503 with
``Retry-After`` when no worker (or no room in the frontend) can take the request now, 500 only for
dyn's own bugs.
"""

from __future__ import annotations

import msgspec


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(msgspec.Struct):
    error: ErrorDetail


_TYPE_OF_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    499: "cancelled",
    500: "internal_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """A request failed; ``status`` and ``body()`` are what the client receives.

    ``headers`` are extra response headers (``Retry-After`` for 503).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        return ErrorResponse(
            ErrorDetail(self.message, _TYPE_OF_STATUS.get(self.status, "error"), self.param, self.code)
        )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unavailable(message: str, retry_after_s: int = 1) -> ApiError:
    """503: nothing can serve the request now; the client should retry after ``retry_after_s``."""
    return ApiError(503, message, code="no_workers", headers={"retry-after": str(retry_after_s)})


def overloaded(message: str, retry_after_s: int = 1) -> ApiError:
    """503: the frontend is at its capacity; the client should retry after ``retry_after_s``."""
    return ApiError(503, message, code="overloaded", headers={"retry-after": str(retry_after_s)})


def encoded(exc: ApiError) -> bytes:
    """The error body as JSON bytes."""
    return msgspec.json.encode(exc.body())


def error_message(body: bytes | str) -> str:
    """The sentence in an error answer a client received: OpenAI's ``{"error": {"message"}}``,
    dyn's views' ``{"error": "..."}``, else the text itself (cut to 300 characters)."""
    try:
        parsed = msgspec.json.decode(body)
    except msgspec.DecodeError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
    text = (body.decode(errors="replace") if isinstance(body, bytes) else body).strip()
    return text[:300] if text else "(empty answer)"
