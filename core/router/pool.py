"""The live workers a frontend can send to, kept in step with the discovery store.

``WorkerPool.run`` watches the store: a record that appears gets a request-plane client
(``WorkerClient``), a record that goes away (deleted, or expired because its heartbeat stopped)
is removed from routing at once; its in-flight streams go on while its connection lives (a
draining worker finishes them), and fail with ``WorkerUnavailable`` when it closes. A worker is
never handed out after the watch reported it gone. Workers serving another model than the pool's are
skipped (logged once).

The request plane knows sooner than discovery: a worker whose client reports it unhealthy (its
connection dropped, it never connected, or it went silent past a timeout; see
``dyn.core.transport.request_plane``) is taken out of routing at once, and put back when its
client reports it healthy again, until discovery removes it for good.

Listeners (``add_listener``) hear every add and removal, so a KV router can keep its indexer and
load tracking in step with the same membership.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import anyio

from dyn.core.discovery.store import DiscoveryStore, WorkerAdded, WorkerRemoved
from dyn.core.messages import WorkerRecord
from dyn.core.transport.request_plane import WorkerClient, WorkerUnavailable

log = logging.getLogger(__name__)

_DRAIN_POLL_S = 0.05


class Worker:
    """One routable worker: its discovery record and its open request-plane client."""

    __slots__ = ("record", "client")

    def __init__(self, record: WorkerRecord, client: WorkerClient) -> None:
        self.record = record
        self.client = client

    @property
    def instance_id(self) -> int:
        return self.record.instance_id

    def __repr__(self) -> str:
        return f"Worker({self.instance_id}, {self.record.endpoints.request})"


Listener = Callable[[Worker, bool], None]
"""Called with ``(worker, added)``: ``added`` is False when the worker left."""

ClientFactory = Callable[..., WorkerClient]
"""Opens a worker's request-plane client as ``factory(endpoint, first_token_timeout_s=...,
inter_token_timeout_s=..., on_health=...)``: ``WorkerClient`` itself, or a stand-in with its
interface (an async context manager with ``generate_batches``, ``call``, ``in_flight``,
``healthy`` and ``fail_all``), as the in-process frontend tests give."""


class WorkerPool:
    """Workers of one namespace serving ``model_name`` (every model when None). Each worker's
    client is opened by ``client_factory`` (see ``ClientFactory``), which may be replaced until
    ``run`` starts. ``warn_other_models``: log a warning for each other model's workers it skips
    (a frontend that serves every model logs them at debug); ``lora_name``: only the workers
    that serve that LoRA adapter of the model."""

    def __init__(
        self,
        store: DiscoveryStore,
        model_name: str | None = None,
        *,
        first_token_timeout_s: float = 0.0,
        inter_token_timeout_s: float = 0.0,
        client_factory: ClientFactory = WorkerClient,
        warn_other_models: bool = True,
        lora_name: str | None = None,
    ) -> None:
        self.store = store
        self.lora_name = lora_name
        """With a LoRA adapter's name, only the workers that serve the adapter (``WorkerRecord.loras``)."""
        self._skip_level = logging.WARNING if warn_other_models else logging.DEBUG
        self.model_name = model_name
        self.client_factory = client_factory
        self._timeouts = {
            "first_token_timeout_s": first_token_timeout_s,
            "inter_token_timeout_s": inter_token_timeout_s,
        }
        self._workers: dict[int, Worker] = {}
        self._unhealthy: dict[int, Worker] = {}
        self._ordered: list[Worker] = []
        self._gone: dict[int, anyio.Event] = {}
        self._listeners: list[Listener] = []
        self._skipped_models: set[str] = set()
        self._changed = anyio.Event()

    # ----------------------------------------------------------------- reading

    def get(self, instance_id: int) -> Worker | None:
        return self._workers.get(instance_id)

    def workers(self) -> list[Worker]:
        """Live workers in ``instance_id`` order (a shared list: do not mutate)."""
        return self._ordered

    def __len__(self) -> int:
        return len(self._workers)

    def add_listener(self, listener: Listener) -> None:
        """Hear about later changes; current workers are reported as added at once."""
        self._listeners.append(listener)
        for worker in self._ordered:
            listener(worker, True)

    async def wait_for(self, count: int) -> None:
        """Return once at least ``count`` workers are live (callers bound it with a timeout)."""
        while len(self._workers) < count:
            await self._changed.wait()

    # ----------------------------------------------------------------- membership

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the store until cancelled; ``task_status.started()`` once the workers live now
        are in the pool."""
        async with anyio.create_task_group() as tg:
            for record in await self.store.list():
                await self._on_added(tg, record)
            task_status.started()
            async with aclosing(self.store.watch()) as events:
                async for event in events:
                    if isinstance(event, WorkerAdded):
                        await self._on_added(tg, event.record)
                    elif isinstance(event, WorkerRemoved):
                        self._on_removed(event.instance_id)
            tg.cancel_scope.cancel()

    async def _on_added(self, tg: anyio.abc.TaskGroup, record: WorkerRecord) -> None:
        if self.model_name is not None and record.model_name != self.model_name:
            if record.model_name not in self._skipped_models:
                self._skipped_models.add(record.model_name)
                log.log(
                    self._skip_level,
                    "ignoring worker %d: it serves model %r, this frontend serves %r",
                    record.instance_id,
                    record.model_name,
                    self.model_name,
                )
            return
        if self.lora_name is not None and self.lora_name not in record.loras:
            self._on_removed(record.instance_id)  # a worker that unloaded the adapter
            return
        current = self._workers.get(record.instance_id) or self._unhealthy.get(record.instance_id)
        if current is not None:
            if current.record.endpoints.request == record.endpoints.request:
                current.record = record
                return
            self._on_removed(record.instance_id)
        await tg.start(self._hold, record)

    async def _hold(self, record: WorkerRecord, *, task_status: Any) -> None:
        """Own one worker's client for as long as the worker is live."""
        gone = anyio.Event()
        client = self.client_factory(record.endpoints.request, on_health=self._on_health, **self._timeouts)
        async with client:
            worker = Worker(record, client)
            self._gone[record.instance_id] = gone
            self._workers[record.instance_id] = worker
            self._reorder()
            log.info("worker %d joined (%s)", record.instance_id, record.endpoints.request)
            self._notify(worker, True)
            task_status.started()
            try:
                await gone.wait()
                # It left discovery, so nothing new goes to it; if it is draining, what it still
                # serves finishes (or ends with worker_shutdown) before its connection closes.
                while client.in_flight and client.healthy:  # noqa: ASYNC110 (a rare drain, polled)
                    await anyio.sleep(_DRAIN_POLL_S)
            finally:
                client.fail_all(WorkerUnavailable(f"worker {record.instance_id} left"))

    def _on_removed(self, instance_id: int) -> None:
        if self._unhealthy.pop(instance_id, None) is not None:  # out of routing already
            log.info("worker %d left", instance_id)
            self._gone.pop(instance_id).set()
            return
        worker = self._workers.pop(instance_id, None)
        if worker is None:
            return
        self._reorder()
        log.info("worker %d left", instance_id)
        self._gone.pop(instance_id).set()
        self._notify(worker, False)

    def _on_health(self, client: WorkerClient, healthy: bool, reason: str) -> None:
        """A worker's client lost or regained it: take it out of routing or put it back."""
        source, target = (self._unhealthy, self._workers) if healthy else (self._workers, self._unhealthy)
        worker = next((w for w in source.values() if w.client is client), None)
        if worker is None:
            return
        del source[worker.instance_id]
        target[worker.instance_id] = worker
        self._reorder()
        if healthy:
            log.info("worker %d is reachable again (%s); routing to it", worker.instance_id, reason)
        else:
            log.warning("worker %d is unreachable (%s); not routing to it", worker.instance_id, reason)
        self._notify(worker, healthy)

    def _reorder(self) -> None:
        self._ordered = [self._workers[i] for i in sorted(self._workers)]
        self._changed.set()
        self._changed = anyio.Event()

    def _notify(self, worker: Worker, added: bool) -> None:
        for listener in self._listeners:
            try:
                listener(worker, added)
            except Exception:
                log.exception("worker pool listener failed")


class RolePool(WorkerPool):
    """The workers of ``parent`` whose disaggregation role (``WorkerRecord.disaggregation_mode``)
    is ``role``: a view that shares the parent's workers and their clients, so a disaggregated
    model's prefill and decode routers each see their own pool. It follows the parent through a
    listener; ``run`` does nothing (the parent's ``run`` follows discovery)."""

    def __init__(self, parent: WorkerPool, role: str) -> None:
        super().__init__(parent.store, parent.model_name, client_factory=parent.client_factory)
        self.parent = parent
        self.role = role
        parent.add_listener(self._on_parent)

    def _on_parent(self, worker: Worker, added: bool) -> None:
        if worker.record.disaggregation_mode != self.role:
            return
        if added:
            self._workers[worker.instance_id] = worker
        elif self._workers.pop(worker.instance_id, None) is None:
            return
        self._reorder()
        self._notify(worker, added)

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
