"""Background responses (``background: true``): answered at once, generated after, read back with
``GET /v1/responses/{id}`` and stopped with ``POST /v1/responses/{id}/cancel``.

As OpenAI and vLLM define them: the request is checked, rendered and routed as any other, then
answered with the response object at ``status: "queued"``; its generation goes on in a task of
this frontend process, detached from the connection (a client that leaves does not stop it),
and the store holds the response at ``in_progress`` until it ends ``completed``, ``incomplete``
or ``failed``. ``cancel`` stops a running one (its engine requests are cancelled as for a client
that disconnects) and stores it ``cancelled``; cancelling one that is not running is a 400.

Bounded: a background response needs ``store`` (a 400 otherwise, as vLLM's), counts against
``--max-inflight`` until it ends, and is refused (429) while ``max_running`` run (the store's
entry count; requests being prepared at that moment may each still start one). Streaming one (``stream: true`` as well) is not built: a 400 says to poll.
A background response lives in its frontend process: one that exits gives its running ones its
graceful-shutdown time to end, then cancels them; its store goes with it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from dyn.core.frontend.apis.responses.store import ResponseStore
from dyn.core.frontend.apis.responses.wire import ResponsesWire
from dyn.core.frontend.generation import Generation
from dyn.core.protocol.errors import ApiError, bad_request

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp

log = logging.getLogger(__name__)


class BackgroundResponses:
    """The background responses running in this frontend process, by response id."""

    def __init__(self, store: ResponseStore) -> None:
        self._store = store
        self.max_running = store.max_count
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def check(self, req: Any) -> None:
        """400 for a background request this server cannot run; 429 when ``max_running`` are."""
        if not req.background:
            return
        if req.store is False:
            raise bad_request("background responses must be stored: send store: true", param="background")
        if req.stream:
            raise bad_request(
                "streaming a background response is not supported by this server; send stream: false "
                "and poll GET /v1/responses/{id}",
                param="stream",
                code="unsupported_parameter",
            )
        if len(self._tasks) >= self.max_running:
            raise ApiError(
                429,
                f"{self.max_running} background responses are running on this frontend, its limit "
                "(--responses-store-max-entries); wait for one to end",
                param="background",
            )

    def start(self, app: FrontendApp, gen: Generation) -> bytes:
        """Run ``gen`` (a Responses generation, routed) in the background; the body to answer with."""
        wire = gen.wire
        assert isinstance(wire, ResponsesWire)
        wire.store_progress("in_progress")
        task = asyncio.get_running_loop().create_task(self._run(app, gen, wire))
        self._tasks[wire.response_id] = task
        return wire.progress_body("queued")

    async def drain(self, timeout_s: float) -> None:
        """The frontend is exiting: let the running background responses end for ``timeout_s``
        seconds, then cancel the rest (their engine requests with them) and wait for that."""
        tasks = list(self._tasks.values())
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("cancelled %d background responses still running at exit", len(pending))
            await asyncio.wait(pending, timeout=5.0)

    async def cancel(self, response_id: str) -> bytes:
        """Stop a running background response; its stored body, now ``cancelled`` (or what it
        ended as, had it ended before the cancellation reached it)."""
        task = self._tasks.get(response_id)
        if task is None:
            raise bad_request(
                f"response {response_id[:256]} is not running in the background: only a background "
                "response that has not ended can be cancelled",
                param="response_id",
            )
        task.cancel()
        await asyncio.wait([task])
        stored = self._store.get(response_id)
        if stored is None:  # evicted meanwhile by newer responses
            raise ApiError(404, f"response {response_id[:256]} was cancelled and is no longer stored")
        return stored.body

    async def _run(self, app: FrontendApp, gen: Generation, wire: ResponsesWire) -> None:
        active = gen.service.model_metrics.active
        with app.admitted():
            active.inc()
            try:
                await gen.collect()  # the wire stores the final response
            except asyncio.CancelledError:
                wire.stop("cancelled")
            except ApiError as exc:
                wire.stop("failed", exc)
            except Exception as exc:  # never leave a stored response in_progress for good
                log.exception("background response %s failed", wire.response_id)
                wire.stop(
                    "failed", ApiError(500, f"internal error ({type(exc).__name__}); see the frontend log")
                )
            finally:
                active.dec()
                gen.release()
                self._tasks.pop(wire.response_id, None)
