"""``BackgroundTasks``: fire-and-forget async work started from synchronous code.

Route hooks (``Route.finished``) and response handlers are synchronous or must not wait, yet some
work follows them: a ``close_session`` or ``pin_prefix`` call to a worker, a speculative prefill.
``spawn`` queues such a job; ``run`` (started in the owning service's task group) runs every job
as its own task. Contract: ``spawn`` never blocks and never raises; a job's failure is logged and
goes no further; when more than ``limit`` jobs wait to start, new ones are dropped with a warning
(a stalled loop must not grow memory without bound); cancelling ``run`` cancels running jobs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

log = logging.getLogger(__name__)


class BackgroundTasks:
    def __init__(self, limit: int = 4096) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[tuple](max_buffer_size=limit)
        self.dropped = 0

    def spawn(self, name: str, job: Callable[..., Awaitable[Any]], *args: Any) -> bool:
        """Queue ``job(*args)``; False (and a warning) when the queue is full."""
        try:
            self._send.send_nowait((name, job, args))
        except anyio.WouldBlock:
            self.dropped += 1
            log.warning("background queue full; dropped %s", name)
            return False
        return True

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Run queued jobs until cancelled."""
        async with anyio.create_task_group() as tg:
            task_status.started()
            async for name, job, args in self._receive:
                tg.start_soon(_guarded, name, job, args)


async def _guarded(name: str, job: Callable[..., Awaitable[Any]], args: tuple) -> None:
    try:
        await job(*args)
    except Exception as exc:
        log.warning("%s failed: %s", name, exc)
