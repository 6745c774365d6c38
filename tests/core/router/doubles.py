"""Stand-ins for what a ``KvRouter`` reads, for router tests without processes: a fixed worker
pool, an ingestor that follows nothing, and a settable clock."""

from __future__ import annotations

from collections.abc import Callable

import anyio

from dyn.core.messages import WorkerEndpoints, WorkerRecord
from dyn.core.router.pool import Worker

BS = 4
"""Tokens per KV block in these tests."""


class FakePool:
    """The ``WorkerPool`` methods a router uses, over workers 1..``n`` whose records have
    ``total_kv_blocks``, ``max_num_batched_tokens`` and ``dp_size(instance_id)`` ranks."""

    model_name = "m"
    store = None
    client_factory = None

    def __init__(
        self,
        n: int,
        *,
        total_kv_blocks: int = 1000,
        max_num_batched_tokens: int = 1000,
        dp_size: Callable[[int], int] = lambda i: 1,
    ) -> None:
        self._workers = [
            Worker(
                WorkerRecord(
                    i,
                    "ns",
                    "m",
                    "mocker",
                    WorkerEndpoints(f"tcp://w{i}"),
                    BS,
                    total_kv_blocks,
                    max_num_batched_tokens,
                    dp_size=dp_size(i),
                ),
                None,  # type: ignore[arg-type]  # routers never call a worker
            )
            for i in range(1, n + 1)
        ]

    def workers(self) -> list[Worker]:
        return self._workers

    def get(self, instance_id: int) -> Worker | None:
        return next((w for w in self._workers if w.instance_id == instance_id), None)

    def add_listener(self, listener) -> None:
        for w in self._workers:
            listener(w, True)


class FakeIngestor:
    """Follows nothing: the test feeds the router's indexer itself."""

    def __init__(self, indexer) -> None:
        self.indexer = indexer

    def follow(self, pool) -> None:
        pass

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await anyio.sleep_forever()


class Clock:
    """A clock the test moves (``now``, seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
