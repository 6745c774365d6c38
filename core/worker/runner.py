"""Run worker hosts in one process until SIGINT or SIGTERM, then stop them in order."""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence

import anyio

from dyn.core.engine import EngineStartError
from dyn.core.worker.host import WorkerHost

log = logging.getLogger(__name__)


async def run_hosts(
    hosts: Sequence[WorkerHost], *, stop: anyio.Event | None = None, task_status=anyio.TASK_STATUS_IGNORED
) -> None:
    """Start every host, wait for a signal (or ``stop``), then deregister and drain them all.
    Started (``task_status``) once every host serves and SIGINT/SIGTERM are this runner's.

    Raises ``EngineStartError`` (the first one, unwrapped) when an engine cannot start; the hosts
    already started are stopped first.
    """
    stop = stop or anyio.Event()
    try:
        await _run(hosts, stop, task_status)
    except* EngineStartError as group:
        raise _first(group) from None


def _first(group: BaseExceptionGroup) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


async def _run(hosts: Sequence[WorkerHost], stop: anyio.Event, task_status) -> None:
    async with anyio.create_task_group() as tg:
        async with anyio.create_task_group() as hosts_tg:
            async with anyio.create_task_group() as starting:
                await starting.start(_watch_signals, stop, len(hosts))
                for host in hosts:
                    await hosts_tg.start(host.run, stop)
                starting.cancel_scope.cancel()
            # An engine may take SIGTERM for itself while it starts (SGLang's tokenizer manager
            # does, to drain its own requests and kill its processes): take both signals back,
            # so a stop deregisters the workers first and drains them (the host's contract).
            await tg.start(_watch_signals, stop, len(hosts))
            log.info("%d worker(s) ready", len(hosts))
            task_status.started()
        tg.cancel_scope.cancel()


async def _watch_signals(stop: anyio.Event, count: int, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Set ``stop`` on the first SIGINT or SIGTERM; the handlers are in place once started."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            log.info("%s received; stopping %d worker(s)", signal.Signals(signum).name, count)
            stop.set()
            return
