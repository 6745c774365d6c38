"""Simple routing policies: a ``choose`` over the live workers and their load, nothing queued.

``SimpleRouter`` does what every such policy shares: a request that names its worker goes there
(``named_worker``), no live worker is ``NoWorkersError``, and each route is counted as in flight
on its worker from ``route`` until ``Route.finished``. A policy writes only ``choose(request,
view)``, where the ``LoadView`` holds the live workers (never empty) and those counts. Adding a
policy is one class here (or in a package of its own) and one ``RouterMode`` in
``dyn.core.router.modes``.

The counts are this router's own: with several frontends, each sees the requests it sent.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Sequence

from dyn.core.router.policy import (
    Route,
    Router,
    RouteRequest,
    TargetRequiredError,
    named_worker,
    no_workers,
)
from dyn.core.router.pool import Worker, WorkerPool


class LoadView:
    """The live workers of a pool (``workers``, in instance-id order, never empty) and the engine
    requests each has in flight through this router (``active``)."""

    __slots__ = ("workers", "_active")

    def __init__(self, workers: Sequence[Worker], active: dict[int, int]) -> None:
        self.workers = workers
        self._active = active

    def active(self, worker: Worker) -> int:
        """Requests routed to ``worker`` by this router and not yet finished."""
        return self._active.get(worker.instance_id, 0)


class _CountedRoute(Route):
    """A route that stays counted on its worker until ``finished`` (once)."""

    __slots__ = ("_active",)

    def __init__(self, worker: Worker, dp_rank: int | None, active: dict[int, int]) -> None:
        super().__init__(worker, dp_rank)
        self._active: dict[int, int] | None = active
        iid = worker.instance_id
        active[iid] = active.get(iid, 0) + 1

    def finished(self) -> None:
        active = self._active
        if active is None:
            return
        self._active = None
        iid = self.worker.instance_id
        left = active[iid] - 1
        if left:
            active[iid] = left
        else:
            del active[iid]  # a departed worker leaves nothing behind


class SimpleRouter(Router):
    """A policy that picks one worker per request (see the module docstring)."""

    def __init__(self, pool: WorkerPool) -> None:
        super().__init__(pool)
        self._active: dict[int, int] = {}

    async def route(self, request: RouteRequest) -> Route:
        if request.instance_id is not None:
            worker = named_worker(self.pool, request.instance_id)
        else:
            workers = self.pool.workers()
            if not workers:
                raise no_workers(self.pool)
            worker = self.choose(request, LoadView(workers, self._active))
        return _CountedRoute(worker, request.dp_rank, self._active)

    @abc.abstractmethod
    def choose(self, request: RouteRequest, view: LoadView) -> Worker:
        """One of ``view.workers`` for ``request``, which names no worker; may raise
        ``RoutingError`` to refuse it."""


class RoundRobinRouter(SimpleRouter):
    """Each worker in turn."""

    mode = "round-robin"

    def __init__(self, pool: WorkerPool) -> None:
        super().__init__(pool)
        self._next = 0

    def choose(self, request: RouteRequest, view: LoadView) -> Worker:
        worker = view.workers[self._next % len(view.workers)]
        self._next += 1
        return worker


class RandomRouter(SimpleRouter):
    """A worker drawn uniformly."""

    mode = "random"

    def __init__(self, pool: WorkerPool, rng: random.Random | None = None) -> None:
        super().__init__(pool)
        self._rng = rng or random.Random()

    def choose(self, request: RouteRequest, view: LoadView) -> Worker:
        return view.workers[self._rng.randrange(len(view.workers))]


class LeastLoadedRouter(SimpleRouter):
    """The worker with the fewest requests in flight from this router; ties go round the workers
    in turn, so an idle pool is used evenly."""

    mode = "least-loaded"

    def __init__(self, pool: WorkerPool) -> None:
        super().__init__(pool)
        self._next = 0

    def choose(self, request: RouteRequest, view: LoadView) -> Worker:
        return self._least_loaded(view.workers, view)

    def _least_loaded(self, workers: Sequence[Worker], view: LoadView) -> Worker:
        """The least loaded of ``workers`` (not empty), ties in turn."""
        n = len(workers)
        start = self._next % n
        self._next += 1
        best = workers[start]
        best_load = view.active(best)
        for i in range(1, n):
            if best_load == 0:
                break
            worker = workers[(start + i) % n]
            load = view.active(worker)
            if load < best_load:
                best, best_load = worker, load
        return best


DEFAULT_CUDA_TO_CPU_RATIO = 8
"""Dynamo's ``DYN_ENCODER_CUDA_TO_CPU_RATIO`` default."""


class DeviceAwareWeightedRouter(LeastLoadedRouter):
    """Heterogeneous fleets (Dynamo's ``device-aware-weighted``): workers that compute on a CPU
    (``WorkerRecord.device == "cpu"``) and the others (accelerators, or not said) form two groups;
    one accelerator worker counts for ``ratio`` CPU workers. The request goes to the CPU group
    while its requests in flight are fewer than its capability share of the accelerators' load,
    ``accelerator_load * cpu_workers // (ratio * accelerator_workers)``, else to the accelerator
    group; then to the least loaded worker of that group. With one group only, least-loaded."""

    mode = "device-aware-weighted"

    def __init__(self, pool: WorkerPool, ratio: int = DEFAULT_CUDA_TO_CPU_RATIO) -> None:
        super().__init__(pool)
        if ratio < 1:
            raise ValueError(f"the CUDA-to-CPU ratio must be at least 1, got {ratio}")
        self.ratio = ratio

    def choose(self, request: RouteRequest, view: LoadView) -> Worker:
        cpu = [w for w in view.workers if w.record.device == "cpu"]
        if not cpu or len(cpu) == len(view.workers):
            return self._least_loaded(view.workers, view)
        other = [w for w in view.workers if w.record.device != "cpu"]
        cpu_load = sum(view.active(w) for w in cpu)
        other_load = sum(view.active(w) for w in other)
        allowed_cpu = other_load * len(cpu) // (self.ratio * len(other))
        return self._least_loaded(cpu if cpu_load < allowed_cpu else other, view)


class PowerOfTwoRouter(SimpleRouter):
    """Two distinct workers drawn at random, the one with fewer requests in flight from this
    router wins (the first drawn on a tie): near least-loaded balance without reading every
    worker, and no herd onto the one idle worker when several routers see the same counts."""

    mode = "power-of-two"

    def __init__(self, pool: WorkerPool, rng: random.Random | None = None) -> None:
        super().__init__(pool)
        self._rng = rng or random.Random()

    def choose(self, request: RouteRequest, view: LoadView) -> Worker:
        workers = view.workers
        if len(workers) == 1:
            return workers[0]
        first, second = self._rng.sample(workers, 2)
        return second if view.active(second) < view.active(first) else first


class DirectRouter(Router):
    """Only requests that name their worker; any other is ``TargetRequiredError``. Chooses
    nothing, so it is a ``Router`` rather than a ``SimpleRouter``."""

    mode = "direct"

    async def route(self, request: RouteRequest) -> Route:
        if request.instance_id is None:
            raise TargetRequiredError(
                "router mode 'direct' needs a target worker: set nvext.backend_instance_id or the "
                "x-worker-instance-id header"
            )
        return Route(named_worker(self.pool, request.instance_id), request.dp_rank)
