"""Disaggregated serving: two-stage routing over a model's prefill and decode workers.

A model is served disaggregated while it has a live worker whose role
(``WorkerRecord.disaggregation_mode``, ``--disaggregation-mode``) is ``prefill`` or ``decode``;
otherwise every request goes to the aggregated workers as before. ``DisaggRouter`` holds three
routers of the same mode, each over its role's workers (``RolePool``), each with its own KV index
fed by its workers' events:

1. **Prefill** (reference: Dynamo's PrefillRouter): KV overlap and prompt load over the prefill
   workers, active decode blocks not tracked (prefill workers do not decode).
2. **Decode**: decode load over the decode workers, with the decode hop's overrides
   (``DECODE_HOP``: no overlap credit, no KV-reuse assumption, no prefill tokens: the
   ``--no-router-assume-kv-reuse`` / ``--no-router-track-prefill-tokens`` semantics).
3. **Conditional disaggregation** (``--router-conditional-disagg``, Dynamo's policies in
   ``ConditionalDisagg``): a request whose prompt is mostly cached on a decode worker (or whose
   prefill workers are all busy) skips the prefill stage; the decode router then routes it like an
   aggregated request (overlap credit and prefill load on), and that worker prefills locally.

Both stages are booked in one step (``route_all``: the ``n`` choices as one unit, all or none);
the frontend runs the prefill stage (``dyn.core.frontend.prefill``) before it streams from the
decode worker. ``RouteRequest.prefill_instance_id`` names the prefill worker and ``instance_id``
the decode worker. A disaggregated request that finds no live decode worker, or needs a prefill
worker and finds none, is refused with ``NoWorkersError`` (a 503) naming the empty pool, and
``unroutable`` (``/health``) says so while it holds for every request.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import anyio
import msgspec

from dyn.core.router.config import ConditionalDisagg, KvRouterConfig
from dyn.core.router.policy import (
    DECODE_HOP,
    NotDisaggregatedError,
    NoWorkersError,
    Route,
    Router,
    RouteRequest,
    RoutingError,
)
from dyn.core.router.pool import RolePool, WorkerPool

log = logging.getLogger("dyn.router")

PREFILL_REROUTES = 2
"""How many other prefill workers a request tries after its prefill worker fails, before its
decode worker prefills it locally."""


class DisaggRoute(Route):
    """A disaggregated request's route: its decode worker (``worker``, ``dp_rank``; the hooks are
    the decode route's) and its prefill stage (``prefill``; None: the decode worker prefills)."""

    __slots__ = ("decode", "prefill", "router", "request", "reroutes")

    def __init__(self, decode: Route, prefill: Route | None, router: DisaggRouter, request: RouteRequest):
        super().__init__(decode.worker, decode.dp_rank)
        self.decode = decode
        self.prefill = prefill
        self.router = router
        self.request = request
        self.reroutes = 0

    @property
    def decision(self) -> Any:
        # the predicted cache hit is the prefill worker's when it prefills
        return (self.prefill or self.decode).decision

    @property
    def queue_depth(self) -> int | None:  # type: ignore[override]
        return (self.prefill or self.decode).queue_depth

    @property
    def closed(self) -> bool:  # type: ignore[override]
        return self.decode.closed

    def started(self) -> None:
        self.decode.started()

    def first_token(self) -> None:
        if self.prefill is not None:  # the prefill is over by now (a remote router hears no more of it)
            self.prefill.finished()
        self.decode.first_token()

    def progress(self, output_tokens: int) -> None:
        self.decode.progress(output_tokens)

    def finished(self) -> None:
        if self.prefill is not None:
            self.prefill.finished()
        self.decode.finished()

    async def reroute_prefill(self) -> Route | None:
        """A new prefill route after the current one's worker failed (it is finished first), or
        None when the decode worker should prefill locally: no other prefill worker is live, the
        failed one was named by the request, or ``PREFILL_REROUTES`` are spent."""
        failed = self.prefill
        self.prefill = None
        if failed is None:
            return None
        failed.finished()
        if self.request.prefill_instance_id is not None or self.reroutes >= PREFILL_REROUTES:
            return None
        self.reroutes += 1
        try:
            self.prefill = await self.router.prefill.route(self.router.prefill_request(self.request))
        except RoutingError as exc:
            log.warning(
                "request %s: no other prefill worker (%s); its decode worker prefills it",
                self.request.request_id,
                exc,
            )
            return None
        return self.prefill


class DisaggRouter(Router):
    """Aggregated, prefill and decode routers over one model's pool (see the module docstring).
    ``build(pool, config)`` makes a router of the frontend's mode."""

    def __init__(self, pool: WorkerPool, build: Any, config: KvRouterConfig, metrics: Any = None) -> None:
        """``metrics``: the ``RouterMetrics`` whose ``disaggregated`` counter hears where each
        disaggregated request was prefilled."""
        super().__init__(pool)
        self._counted = (
            (metrics.disaggregated.labels("remote"), metrics.disaggregated.labels("local"))
            if metrics is not None
            else None
        )
        self.agg: Router = build(RolePool(pool, "agg"), config)
        self.mode = self.agg.mode
        self.prefill: Router = build(
            RolePool(pool, "prefill"),
            dataclasses.replace(config, track_active_blocks=False, track_output_blocks=False),
        )
        self.decode: Router = build(RolePool(pool, "decode"), config)
        self.conditional: ConditionalDisagg | None = (
            (config.conditional_disagg_config or ConditionalDisagg()) if config.conditional_disagg else None
        )
        self._queue_threshold = config.queue_threshold
        self._warned_mixed = False

    def __getattr__(self, name: str) -> Any:
        # the aggregated router's own views (its index, block size) stay reachable
        return getattr(self.agg, name)

    def unroutable(self) -> str | None:
        """A disaggregated model with no decode worker, or no prefill worker and no conditional
        disaggregation to keep requests on their decode worker, serves nothing (every request
        would be refused); else what the role routers say."""
        if self.disaggregated:
            if len(self.decode.pool) == 0:
                return self._empty("decode")
            if len(self.prefill.pool) == 0 and self.conditional is None:
                return self._empty("prefill")
        return self.agg.unroutable() or self.prefill.unroutable() or self.decode.unroutable()

    def degraded(self) -> str | None:
        if self.disaggregated and len(self.prefill.pool) == 0:
            return (
                f"model {self.pool.model_name!r} has no live prefill worker: only the requests "
                "conditional disaggregation keeps on their decode worker are served"
            )
        return self.agg.degraded() or self.prefill.degraded() or self.decode.degraded()

    @property
    def disaggregated(self) -> bool:
        """Whether the model has a live prefill or decode worker now."""
        return len(self.prefill.pool) > 0 or len(self.decode.pool) > 0

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            for router in (self.agg, self.prefill, self.decode):
                await tg.start(router.run)
            task_status.started()

    async def route(self, request: RouteRequest) -> Route:
        return (await self.route_all([request]))[0]

    async def route_all(self, requests: list[RouteRequest]) -> list[Route]:
        if not self.disaggregated:
            for request in requests:
                if request.prefill_instance_id is not None:
                    raise NotDisaggregatedError(
                        f"prefill worker {request.prefill_instance_id} was named, but model "
                        f"{self.pool.model_name!r} has no disaggregated workers (every worker does "
                        "prefill and decode); name the worker with nvext.backend_instance_id or "
                        "x-worker-instance-id"
                    )
            return await self.agg.route_all(requests)
        if len(self.agg.pool) and not self._warned_mixed:
            self._warned_mixed = True
            log.warning(
                "model %r has aggregated workers beside prefill/decode ones; while any prefill or "
                "decode worker is live the aggregated ones get no requests",
                self.pool.model_name,
            )
        if len(self.decode.pool) == 0:
            raise NoWorkersError(self._empty("decode"))
        local = [await self._prefills_locally(r) for r in requests]
        remote = [self.prefill_request(r) for r, here in zip(requests, local, strict=True) if not here]
        if remote and len(self.prefill.pool) == 0:
            raise NoWorkersError(self._empty("prefill"))
        prefills = iter(await self.prefill.route_all(remote) if remote else [])
        try:
            decodes = await self.decode.route_all(
                [
                    msgspec.structs.replace(
                        r, prefill_instance_id=None, overrides=None if here else DECODE_HOP
                    )
                    for r, here in zip(requests, local, strict=True)
                ]
            )
        except BaseException:
            for route in prefills:
                route.finished()
            raise
        here = sum(local)
        if self._counted is not None:
            self._counted[0].inc(len(requests) - here)
            self._counted[1].inc(here)
        return [
            DisaggRoute(decode, None if here else next(prefills), self, request)
            for request, decode, here in zip(requests, decodes, local, strict=True)
        ]

    def prefill_request(self, request: RouteRequest) -> RouteRequest:
        """``request`` as the prefill router sees it: its prefill target, if named."""
        return msgspec.structs.replace(
            request, instance_id=request.prefill_instance_id, dp_rank=None, prefill_instance_id=None
        )

    def _empty(self, role: str) -> str:
        other = "prefill" if role == "decode" else "decode"
        return (
            f"model {self.pool.model_name!r} is served disaggregated, but no {role} worker is live "
            f"(its {other} pool has {len(getattr(self, other).pool)}); start one with "
            f"'dyn worker <engine> --disaggregation-mode {role}' or retry later"
        )

    async def _prefills_locally(self, request: RouteRequest) -> bool:
        """Conditional disaggregation: whether ``request`` skips the prefill stage."""
        policy = self.conditional
        if policy is None or request.prefill_instance_id is not None:
            return False
        bypass = False
        preview: tuple[Any, int] = (None, 0)
        if policy.policy in ("isl_bounding", "isl_or_load"):
            preview = await self._decode_preview(request)
            block_size = getattr(self.decode, "block_size", None) or 0
            isl = len(request.token_ids)
            eff_isl = max(isl - preview[1] * block_size, 0)
            bypass = (
                eff_isl < policy.eff_isl_threshold and eff_isl / max(isl, 1) < policy.eff_isl_ratio_threshold
            )
        if not bypass and policy.policy in ("prefill_load", "isl_or_load"):
            fraction = policy.prefill_busy_threshold or self._queue_threshold
            saturated = getattr(self.prefill, "saturated", None)
            bypass = fraction is not None and saturated is not None and saturated(fraction)
        if bypass and policy.decode_busy_threshold is not None:
            key = preview[0]
            decode_busy = getattr(self.decode, "decode_busy", None)
            if key is None or decode_busy is None or decode_busy(key, policy.decode_busy_threshold):
                bypass = False  # the decode gate needs a calm, known decode worker
        return bypass

    async def _decode_preview(self, request: RouteRequest) -> tuple[Any, int]:
        preview = getattr(self.decode, "best_cached", None)
        if preview is None:
            return None, 0
        result: tuple[Any, int] = await preview(request)
        return result
