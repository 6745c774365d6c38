"""The frontend's side of ``nvext``: routing targets in, response metadata and annotations out.

- ``routing_target``: the worker and dp rank a request names, headers beating the body
  (``x-worker-instance-id`` sets ``backend_instance_id`` and ``decode_worker_id``,
  ``x-prefill-instance-id`` sets ``prefill_worker_id``, ``x-dp-rank`` sets ``dp_rank``). A decode
  worker other than the backend instance is a 400; a prefill worker is honoured when the model is
  served disaggregated (``dyn.core.router.disagg``) and a 400 otherwise.
- ``response_nvext``: the ``nvext`` object of a response, holding the fields named in
  ``nvext.extra_fields``: ``worker_id`` and ``timing`` (reference 6.5, 6.6).
- ``annotation``: an SSE event for one of ``nvext.annotations`` (reference 6.7): an ``event:``
  line and a comment line holding the JSON value, as Dynamo sends them. The openai SDK's chunk
  iterator cannot parse such events; they are for clients that read the SSE stream themselves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from dyn.core.messages import EngineTiming
from dyn.core.protocol.errors import bad_request
from dyn.core.protocol.openai import NvExt
from dyn.core.router.policy import Route


def routing_target(
    nvext: NvExt | None, worker_header: int | None, prefill_header: int | None, dp_rank_header: int | None
) -> tuple[int | None, int | None, int | None]:
    """``(instance_id, dp_rank, prefill_instance_id)`` the request names (``None``: the router
    chooses): the decode (or aggregated) worker, its rank, and a disaggregated request's prefill
    worker (a model served aggregated refuses one: ``dyn.core.router.disagg``)."""
    backend = decode = prefill = dp_rank = None
    if nvext is not None:
        backend, decode = nvext.backend_instance_id, nvext.decode_worker_id
        prefill, dp_rank = nvext.prefill_worker_id, nvext.dp_rank
    if worker_header is not None:
        backend = decode = worker_header
    if prefill_header is not None:
        prefill = prefill_header
    if dp_rank_header is not None:
        dp_rank = dp_rank_header
    if decode is not None and backend is not None and decode != backend:
        raise bad_request(
            f"nvext.decode_worker_id {decode} and backend_instance_id {backend} name two workers; "
            "name the decode worker once",
            param="nvext.decode_worker_id",
        )
    return decode if decode is not None else backend, dp_rank, prefill


@dataclass(slots=True)
class ChoiceTiming:
    """Clock readings of one engine request (``time.perf_counter`` seconds)."""

    received: float
    received_wall: float
    routed: float = 0.0
    first: float | None = None
    last: float = 0.0
    tokens: int = 0
    engine: EngineTiming | None = None
    prefilled: float | None = None
    """When a disaggregated request's prefill stage ended (its KV is then in transfer)."""
    session_id: str | None = None
    """The agent session the request belongs to, when the client named one."""


def worker_id(route: Route) -> dict[str, Any]:
    """``nvext.worker_id``: the prefill and decode workers (one worker when it did both phases)."""
    rank = _rank(route)
    prefill = route.prefill or route
    return {
        "prefill_worker_id": prefill.worker.instance_id,
        "prefill_dp_rank": _rank(prefill),
        "decode_worker_id": route.worker.instance_id,
        "decode_dp_rank": rank,
    }


def _rank(route: Route) -> int | None:
    rank = route.dp_rank
    if rank is None and route.worker.record.dp_size <= 1:
        rank = 0
    return rank


def timing(t: ChoiceTiming, route: Route, now: float | None = None) -> dict[str, Any]:
    """``nvext.timing`` (reference 6.6); fields that are not known are left out."""
    now = time.perf_counter() if now is None else now
    out: dict[str, Any] = {"request_received_ms": int(t.received_wall * 1000)}
    queue_ms = t.engine.queue_ms if t.engine is not None else 0.0
    if t.first is not None:
        ttft_ms = (t.first - t.received) * 1000
        wait_ms = min((t.routed - t.received) * 1000 + queue_ms, ttft_ms)
        out["prefill_wait_time_ms"] = round(wait_ms, 3)
        out["prefill_time_ms"] = round(ttft_ms - wait_ms, 3)
        out["ttft_ms"] = round(ttft_ms, 3)
    out["total_time_ms"] = round((now - t.received) * 1000, 3)
    if t.first is not None and t.tokens > 1:
        out["itl_ms"] = round((t.last - t.first) * 1000 / (t.tokens - 1), 3)
    if route.cached_tokens is not None and route.isl_tokens:
        out["kv_hit_rate"] = round(route.cached_tokens / route.isl_tokens, 6)
    if route.queue_depth is not None:
        out["router_queue_depth"] = route.queue_depth
    if t.prefilled is not None and t.first is not None:
        out["kv_transfer_estimated_latency_ms"] = round((t.first - t.prefilled) * 1000, 3)
    if t.session_id is not None:
        out["session_id"] = t.session_id
    return out


def response_nvext(fields: list[str] | None, t: ChoiceTiming, route: Route) -> bytes | None:
    """The JSON of the response's ``nvext`` for ``extra_fields``; None when none is asked."""
    if not fields:
        return None
    out: dict[str, Any] = {}
    if "worker_id" in fields:
        out["worker_id"] = worker_id(route)
    if "timing" in fields:
        out["timing"] = timing(t, route)
    return orjson.dumps(out)


def annotation(name: str, value: Any) -> bytes:
    """One annotation as an SSE event: ``event: NAME`` and a comment holding the JSON value."""
    return b"event: " + name.encode() + b"\n: " + orjson.dumps(value) + b"\n\n"


def llm_metrics(
    route: Route, prompt_tokens: int, output_tokens: int, chunk_tokens: int, cached_tokens: int
) -> dict[str, Any]:
    """The ``llm_metrics`` annotation of a finished choice."""
    ids = worker_id(route)
    return {
        "input_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "chunk_tokens": chunk_tokens,
        "cached_tokens": cached_tokens,
        "prefill_worker_id": ids["prefill_worker_id"],
        "decode_worker_id": ids["decode_worker_id"],
        "dp_rank": ids["decode_dp_rank"],
        "worker_type": "aggregated" if route.prefill is None else "disaggregated",
    }
