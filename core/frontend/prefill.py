"""The prefill stage of a disaggregated request (``dyn.core.router.disagg``), run by the frontend
before it streams from the decode worker.

``run_prefill(route, request)`` sends the prefill request (``prefill_request``: one token at most,
no logprobs or constraint, ``KvTransfer(phase="prefill")``) to ``route.prefill``'s worker, drops
its token, and returns the decode request: ``request`` carrying the prefill worker's transfer
descriptor (``Finish.kv_transfer``). When the prefill worker fails (it died, went silent, or
answered without a descriptor), the stage moves to another prefill worker
(``Route.reroute_prefill``); when none is left, the decode request goes without a descriptor and
the decode worker prefills locally. Either way the client's request is not lost; an error of the
request itself (a bad prompt) is raised as the aggregated path would raise it.
"""

from __future__ import annotations

import logging
from contextlib import aclosing

import msgspec

from dyn.core.frontend.migration import worker_failed
from dyn.core.messages import Finish, GenerateRequest, KvTransfer
from dyn.core.router.policy import Route
from dyn.core.transport.request_plane import RemoteError, WorkerUnavailable

log = logging.getLogger(__name__)

PREFILL = KvTransfer(phase="prefill")


class NoTransfer(Exception):
    """The prefill worker finished without a transfer descriptor."""


def prefill_request(request: GenerateRequest) -> GenerateRequest:
    """What the prefill worker is sent for ``request``: its prompt, sampling and priority, at
    most one token, nothing the decode worker alone needs (logprobs, a constraint, tools)."""
    return msgspec.structs.replace(
        request,
        stop=msgspec.structs.replace(request.stop, max_tokens=1, min_tokens=0),
        logprobs=None,
        prompt_logprobs=None,
        constraint=None,
        tools=[],
        kv_transfer=PREFILL,
    )


async def run_prefill(route: Route, request: GenerateRequest) -> GenerateRequest:
    """The decode request for ``request`` after its prefill stage (see the module docstring)."""
    route.started()  # the decode booking is in use from here: its request is being served
    prefill = route.prefill
    while prefill is not None:
        try:
            transfer = await _prefill_on(prefill, request)
        except (WorkerUnavailable, RemoteError, NoTransfer) as exc:
            if not isinstance(exc, NoTransfer) and not worker_failed(exc):
                raise
            failed = prefill.worker.instance_id
            prefill = await route.reroute_prefill()
            log.warning(
                "request %s: prefill worker %d failed (%s); %s",
                request.request_id,
                failed,
                exc,
                f"prefilling on worker {prefill.worker.instance_id}"
                if prefill is not None
                else f"its decode worker {route.worker.instance_id} prefills it",
            )
            continue
        return msgspec.structs.replace(request, kv_transfer=transfer)
    return request


async def _prefill_on(route: Route, request: GenerateRequest) -> KvTransfer:
    stream = route.worker.client.generate_batches(prefill_request(request))
    route.started()
    finish: Finish | None = None
    try:
        async with aclosing(stream):
            async for batch in stream:
                last = batch[-1]
                if isinstance(last, Finish):
                    finish = last
                if len(batch) > (finish is not None):
                    route.first_token()
    finally:
        route.finished()
    if finish is None or finish.reason in ("error", "cancelled") or finish.kv_transfer is None:
        why = (
            "no descriptor"
            if finish is None or finish.reason not in ("error", "cancelled")
            else finish.reason
        )
        raise NoTransfer(f"the prefill ended with {why}")
    transfer = finish.kv_transfer
    if transfer.source_instance_id == 0:  # an engine that does not know its instance id
        transfer = msgspec.structs.replace(transfer, source_instance_id=route.worker.instance_id)
    return transfer
