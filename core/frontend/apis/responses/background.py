"""Background responses (``background: true``): answered at once, generated after, read back with
``GET /v1/responses/{id}`` and stopped with ``POST /v1/responses/{id}/cancel``.

As OpenAI and vLLM define them: the request is checked, rendered and routed as any other, then
answered with the response object at ``status: "queued"``; its generation goes on in a task of
this frontend process, detached from the connection (a client that leaves does not stop it),
and the store holds the response at ``in_progress`` until it ends ``completed``, ``incomplete``
or ``failed``. ``cancel`` stops a running one (its engine requests are cancelled as for a client
that disconnects) and stores it ``cancelled``; cancelling one that is not running is a 400.

With ``stream: true`` as well, the request is answered with the response's events as they come
instead, and they are kept (``EventLog``): ``GET /v1/responses/{id}?stream=true`` reads them
again, from the event after ``starting_after`` (a sequence number) or from the first, and
follows them until the response ends, as often as a client asks, while it runs and after. A
cancelled one's events end without a terminal event (its stored body says ``cancelled``).

Bounded: a background response needs ``store`` (a 400 otherwise, as vLLM's), counts against
``--max-inflight`` until it ends, and is refused (429) while ``max_running`` run (the store's
entry count; requests being prepared at that moment may each still start one). The kept events
of all responses hold at most the store's byte budget (``--responses-store-max-bytes``) on top of
it, and the logs of at most its entry count: past either, the logs of ended responses go first,
oldest first, then a running one's oldest events (a ``starting_after`` before what is kept is a
400); at most ``MAX_READERS`` clients read one response's events at once (a 429 beyond). A background response lives in its frontend process: one that exits gives its running
ones its graceful-shutdown time to end, then cancels them; its store goes with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from dyn.core.frontend.apis.responses.event_log import EventLog
from dyn.core.frontend.apis.responses.query import query_args, whole_number
from dyn.core.frontend.apis.responses.store import ResponseStore
from dyn.core.frontend.apis.responses.wire import ResponsesWire
from dyn.core.frontend.generation import Generation
from dyn.core.protocol.errors import ApiError, bad_request

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp

log = logging.getLogger(__name__)

MAX_READERS = 16
"""The most clients reading one response's kept events at once (the creator among them)."""


class BackgroundResponses:
    """The background responses running in this frontend process, by response id."""

    def __init__(self, store: ResponseStore) -> None:
        self._store = store
        self.max_running = store.max_count
        self.max_log_bytes = store.max_bytes
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._logs: OrderedDict[str, EventLog] = OrderedDict()
        """The kept events of streamed background responses, oldest first."""
        self.log_bytes = 0

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
        if len(self._tasks) >= self.max_running:
            raise ApiError(
                429,
                f"{self.max_running} background responses are running on this frontend, its limit "
                "(--responses-store-max-entries); wait for one to end",
                param="background",
            )

    def start(self, app: FrontendApp, gen: Generation) -> bytes | AsyncIterator[bytes]:
        """Run ``gen`` (a Responses generation, routed) in the background; what to answer with:
        the queued response's body, or its events (streamed)."""
        wire = gen.wire
        assert isinstance(wire, ResponsesWire)
        wire.store_progress("in_progress")
        events = self._new_log(wire.response_id) if wire.req.stream else None
        task = asyncio.get_running_loop().create_task(self._run(app, gen, wire, events))
        self._tasks[wire.response_id] = task
        return events.follow(-1) if events is not None else wire.progress_body("queued")

    def events(self, response_id: str, starting_after: int) -> AsyncIterator[bytes]:
        """The kept events of ``response_id`` after sequence number ``starting_after`` (-1: all),
        followed until it ends; a 400 when none are kept or those asked for are gone."""
        events = self._logs.get(response_id)
        if events is None:
            raise bad_request(
                f"response {response_id[:256]} has no events to stream: only a response created with "
                "background: true and stream: true has them, while this frontend keeps them; GET it "
                "without stream=true",
                param="stream",
            )
        if events.readers >= MAX_READERS:
            raise ApiError(
                429,
                f"response {response_id[:256]} has {MAX_READERS} readers of its events already, the "
                "most this server allows; wait for one to end",
                param="stream",
            )
        if starting_after + 1 < events.first:
            raise bad_request(
                f"the events of response {response_id[:256]} before sequence number {events.first} are no "
                "longer kept (the frontend's budget for them, --responses-store-max-bytes, was "
                f"reached); send starting_after >= {events.first - 1}, or GET it without stream=true",
                param="starting_after",
            )
        return events.follow(starting_after)

    def forget(self, response_id: str) -> None:
        """Drop the kept events of ``response_id`` (deleted)."""
        events = self._logs.pop(response_id, None)
        if events is not None:
            self.log_bytes -= events.bytes

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

    def _new_log(self, response_id: str) -> EventLog:
        events = EventLog(self._grown)
        self._logs[response_id] = events
        self._drop_ended(lambda: len(self._logs) > self.max_running)
        return events

    def _grown(self, grown: EventLog, added: int) -> None:
        """Keep the logs within ``max_log_bytes``: the ended ones go first, then ``grown``'s
        oldest events."""
        self.log_bytes += added
        if self.log_bytes <= self.max_log_bytes:
            return
        self._drop_ended(lambda: self.log_bytes > self.max_log_bytes)
        over = self.log_bytes - self.max_log_bytes
        if over > 0:
            self.log_bytes -= grown.trim(grown.bytes - over)

    def _drop_ended(self, needed: Callable[[], bool]) -> None:
        """Drop the logs of ended responses, oldest first, while ``needed()``."""
        for response_id in [rid for rid, kept in self._logs.items() if kept.done]:
            if not needed():
                return
            self.forget(response_id)

    async def _run(
        self, app: FrontendApp, gen: Generation, wire: ResponsesWire, events: EventLog | None
    ) -> None:
        active = gen.service.model_metrics.active
        with app.admitted():
            active.inc()
            try:
                if events is None:
                    await gen.collect()  # the wire stores the final response
                else:
                    events.write(await gen.stream(events.emit, open_at_once=True))
            except asyncio.CancelledError:
                wire.stop("cancelled")
            except ApiError as exc:
                _fail(wire, events, exc)
            except Exception as exc:  # never leave a stored response in_progress for good
                log.exception("background response %s failed", wire.response_id)
                _fail(
                    wire,
                    events,
                    ApiError(500, f"internal error ({type(exc).__name__}); see the frontend log"),
                )
            finally:
                if events is not None:
                    events.close()
                active.dec()
                gen.release()
                self._tasks.pop(wire.response_id, None)


def _fail(wire: ResponsesWire, events: EventLog | None, error: ApiError) -> None:
    """Store the response as ``failed`` (streamed: with its output so far, and the event)."""
    if events is None:
        wire.stop("failed", error)
    else:
        events.write(wire.failed(error))


def resume_point(query: bytes) -> int | None:
    """``GET /v1/responses/{id}``'s query: None unless ``stream=true``; else the sequence number
    after which to stream (``starting_after``, -1 when absent)."""
    args = query_args(query)
    stream = args.get("stream", "false").lower()
    if stream not in ("true", "false"):
        raise bad_request(f"stream must be true or false, got {stream[:64]!r}", param="stream")
    if stream == "false":
        return None
    raw = args.get("starting_after")
    return -1 if raw is None else whole_number(raw, "starting_after", 0, 2**62)
