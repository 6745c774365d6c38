"""Keeping a request alive when its worker is not: migration, as Dynamo's ``--migration-limit``.

A choice whose worker dies, leaves, drains (``worker_shutdown``) or goes silent past a timeout
(``WorkerUnavailable`` / ``WorkerSilent`` from the request plane) continues on another worker:
the frontend sends the prompt plus every token generated so far as a new engine request, with
the token budget (``max_tokens``, ``min_tokens``) reduced by what was already generated, and
keeps streaming to the client from where it was: no gap, no repeated text, usage counted once.
A request migrates at most ``migration_limit`` times; ``migration_max_seq_len`` stops tracking
(and so migrating) a choice whose prompt plus output grew past it, which bounds the memory kept
per choice. Dynamo counts migrations as ``new_request`` (no token had arrived) or
``ongoing_request``; so do we.

Not migrated, because the continuation would be wrong: a choice in an engine streaming session
(its KV lives on that worker) and a structured-output choice that already produced tokens (the
new worker's grammar would start over). Engine errors (``engine_error``, ``bad_request``) are
not worker failures and are never migrated.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from dyn.core.messages import GenerateRequest
from dyn.core.transport.request_plane import RemoteError, WorkerUnavailable

MIGRATABLE_CODES = frozenset({"worker_shutdown"})
"""``ErrorReply`` codes that mean the worker, not the request, failed."""


@dataclass(frozen=True, slots=True)
class Reliability:
    """``--migration-limit``: how many times a request moves to another worker when its own dies
    or goes silent; ``migration_max_seq_len`` (``None``: no bound): prompt plus output tokens past
    which a choice is no longer tracked for migration; ``first_token_timeout_s`` /
    ``inter_token_timeout_s`` (0: none): how long a worker may stay silent before that happens."""

    migration_limit: int = 0
    migration_max_seq_len: int | None = None
    first_token_timeout_s: float = 300.0
    inter_token_timeout_s: float = 60.0


def worker_failed(exc: BaseException) -> bool:
    """Whether ``exc`` says the worker (not the request) failed, so another worker may finish it."""
    if isinstance(exc, WorkerUnavailable):
        return True
    return isinstance(exc, RemoteError) and exc.code in MIGRATABLE_CODES


def continued_request(request: GenerateRequest, generated: list[int], request_id: str) -> GenerateRequest:
    """``request`` continued after ``generated`` output tokens: those appended to the prompt, the
    token budget reduced by as many, under a new ``request_id``. Prompt logprobs, if asked, cover
    the longer prompt; the caller keeps the original prompt's."""
    n = len(generated)
    stop = request.stop
    stop = msgspec.structs.replace(
        stop,
        max_tokens=None if stop.max_tokens is None else max(stop.max_tokens - n, 0),
        min_tokens=max(stop.min_tokens - n, 0),
    )
    return msgspec.structs.replace(
        request, request_id=request_id, token_ids=request.token_ids + generated, stop=stop
    )
