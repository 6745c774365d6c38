"""Run worker hosts in one process until SIGINT or SIGTERM, then stop them in order."""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence

import anyio

from dyn.core.engine import EngineStartError
from dyn.core.worker.host import WorkerHost

log = logging.getLogger(__name__)


async def run_hosts(hosts: Sequence[WorkerHost], *, stop: anyio.Event | None = None) -> None:
    """Start every host, wait for a signal (or ``stop``), then deregister and drain them all.

    Raises ``EngineStartError`` (the first one, unwrapped) when an engine cannot start; the hosts
    already started are stopped first.
    """
    stop = stop or anyio.Event()
    try:
        await _run(hosts, stop)
    except* EngineStartError as group:
        raise _first(group) from None


def _first(group: BaseExceptionGroup) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


async def _run(hosts: Sequence[WorkerHost], stop: anyio.Event) -> None:
    async with anyio.create_task_group() as tg:

        async def watch_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    log.info("%s received; stopping %d worker(s)", signal.Signals(signum).name, len(hosts))
                    stop.set()
                    return

        tg.start_soon(watch_signals)
        async with anyio.create_task_group() as hosts_tg:
            for host in hosts:
                await hosts_tg.start(host.run, stop)
            log.info("%d worker(s) ready", len(hosts))
        tg.cancel_scope.cancel()
