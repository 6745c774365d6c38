"""The client's error for a failure met while routing or generating: one mapping, used by every API."""

from __future__ import annotations

from dyn.core.protocol.errors import ApiError, bad_request, unavailable
from dyn.core.protocol.grammar import one_line, refused_param
from dyn.core.protocol.openai import _GenerationRequest
from dyn.core.protocol.structured import constraint_param
from dyn.core.router.agent import SessionOpenError
from dyn.core.router.policy import (
    AllWorkersBusyError,
    NotDisaggregatedError,
    NoWorkersError,
    RoutingError,
    TargetRequiredError,
    WorkerNotFoundError,
)
from dyn.core.transport.request_plane import RemoteError, WorkerUnavailable


def routing_error(exc: RoutingError) -> ApiError:
    """The client's error for a request the router could not place."""
    if isinstance(exc, (NoWorkersError, AllWorkersBusyError)):
        return unavailable(str(exc))
    if isinstance(exc, WorkerNotFoundError):
        return ApiError(404, str(exc), param="nvext.backend_instance_id", code="worker_not_found")
    if isinstance(exc, TargetRequiredError):
        return bad_request(str(exc), param="nvext.backend_instance_id")
    if isinstance(exc, NotDisaggregatedError):
        return bad_request(str(exc), param="nvext.prefill_worker_id")
    if isinstance(exc, SessionOpenError):
        return unavailable(str(exc))
    return ApiError(500, str(exc))


def as_api_error(exc: Exception, req: _GenerationRequest | None = None) -> ApiError:
    """The client's error for a failure reported during generation. A worker's ``bad_request`` is a
    400 in one line; a refusal of the request's constraint names its field (``param``)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, WorkerUnavailable):
        return unavailable(f"the worker serving this request went away: {exc}")
    assert isinstance(exc, RemoteError)
    if exc.code == "bad_request":
        message = one_line(exc.reply.message)
        param = refused_param(message, constraint_param(req)) if req is not None else None
        return bad_request(message, param=param, code="bad_request")
    return ApiError(500, f"engine error: {exc.reply.message}", code=exc.code)
