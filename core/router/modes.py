"""The router modes: every router ``--router-mode`` can name, in one registry.

A ``RouterMode`` says how to build its router from a ``RouterContext`` (the pool, the KV router
config, metrics, and the clock, RNG and KV-event ingestion of whoever builds it: a live frontend
or ``dyn router`` through ``dyn.core.router.build``, or the offline replay in virtual time) and
whether the offline replay can use it (a mode that needs each request to name its worker cannot
replay a trace). ``dyn frontend --router-mode`` lists ``mode_names()``, ``build_router`` and the
replay look a mode up with ``router_mode``.

A package outside dyn adds a mode by declaring a ``RouterMode`` under the ``dyn.router_modes``
entry point group (``[project.entry-points."dyn.router_modes"] NAME = "pkg.module:MODE"``); the
entry point's name is the mode's name. Built-in names win over entry points.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from dyn.core.router.config import KvRouterConfig

if TYPE_CHECKING:  # the CLI reads the modes for its help: keep this module light to import
    from dyn.core.router.metrics import RouterMetrics
    from dyn.core.router.policy import Router
    from dyn.core.router.pool import WorkerPool

ROUTER_MODE_ENTRY_POINT_GROUP = "dyn.router_modes"
CUDA_TO_CPU_RATIO_ENV = "DYN_ENCODER_CUDA_TO_CPU_RATIO"


@dataclass(kw_only=True)
class RouterContext:
    """What a mode's router may be built from. ``ingest(indexer)`` returns the object that feeds a
    KV index from the workers' events (a live ``KvEventIngestor``, or the replay's direct path);
    ``rng`` None: a fresh unseeded one."""

    pool: WorkerPool
    metrics: RouterMetrics
    ingest: Callable[[Any], Any]
    config: KvRouterConfig = field(default_factory=KvRouterConfig)
    rng: random.Random | None = None
    clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True, kw_only=True)
class RouterMode:
    """One ``--router-mode``: ``summary`` completes "NAME: ..." in the flag's help; ``build``
    makes its router; ``offline``: the offline replay can route with it."""

    name: str
    summary: str
    build: Callable[[RouterContext], Router]
    offline: bool = True


def _kv(ctx: RouterContext) -> Router:
    from dyn.core.router.kv import KvRouter

    return KvRouter(ctx.pool, ctx.config, ctx.metrics, ingest=ctx.ingest, rng=ctx.rng, clock=ctx.clock)


def _round_robin(ctx: RouterContext) -> Router:
    from dyn.core.router.simple import RoundRobinRouter

    return RoundRobinRouter(ctx.pool)


def _random(ctx: RouterContext) -> Router:
    from dyn.core.router.simple import RandomRouter

    return RandomRouter(ctx.pool, ctx.rng)


def _power_of_two(ctx: RouterContext) -> Router:
    from dyn.core.router.simple import PowerOfTwoRouter

    return PowerOfTwoRouter(ctx.pool, ctx.rng)


def _least_loaded(ctx: RouterContext) -> Router:
    from dyn.core.router.simple import LeastLoadedRouter

    return LeastLoadedRouter(ctx.pool)


def _device_aware_weighted(ctx: RouterContext) -> Router:
    import os

    from dyn.core.router.simple import DEFAULT_CUDA_TO_CPU_RATIO, DeviceAwareWeightedRouter

    text = os.environ.get(CUDA_TO_CPU_RATIO_ENV, "").strip()
    if not text:
        return DeviceAwareWeightedRouter(ctx.pool, DEFAULT_CUDA_TO_CPU_RATIO)
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ValueError(
            f"{CUDA_TO_CPU_RATIO_ENV}={text!r}: give a whole number of 1 or more (the throughput of "
            f"one accelerator worker in CPU workers; default {DEFAULT_CUDA_TO_CPU_RATIO})"
        )
    return DeviceAwareWeightedRouter(ctx.pool, int(text))


def _direct(ctx: RouterContext) -> Router:
    from dyn.core.router.simple import DirectRouter

    return DirectRouter(ctx.pool)


BUILTIN_MODES: dict[str, RouterMode] = {
    m.name: m
    for m in (
        RouterMode(name="kv", summary="KV-cache and load aware, tuned with the KV router flags", build=_kv),
        RouterMode(name="round-robin", summary="each worker in turn", build=_round_robin),
        RouterMode(name="random", summary="a worker drawn at random", build=_random),
        RouterMode(
            name="power-of-two",
            summary="the less loaded of two workers drawn at random",
            build=_power_of_two,
        ),
        RouterMode(
            name="least-loaded",
            summary="the worker with the fewest requests in flight from this router",
            build=_least_loaded,
        ),
        RouterMode(
            name="device-aware-weighted",
            summary="CPU workers and accelerator workers as two groups, an accelerator worth "
            f"${CUDA_TO_CPU_RATIO_ENV} (default 8) CPU workers: the group below its share of the "
            "load, then its least loaded worker",
            build=_device_aware_weighted,
        ),
        RouterMode(
            name="direct",
            summary="the request names its worker with "
            "nvext.backend_instance_id or the x-worker-instance-id header",
            build=_direct,
            offline=False,
        ),
    )
}


@functools.cache
def _registered() -> dict[str, Any]:
    return {
        ep.name: ep
        for ep in entry_points(group=ROUTER_MODE_ENTRY_POINT_GROUP)
        if ep.name not in BUILTIN_MODES
    }


def mode_names(*, offline: bool = False) -> list[str]:
    """Every mode's name, built-in first (``offline``: only those the offline replay can use;
    a registered mode must be loaded to know that, so this loads them)."""
    names = [m.name for m in BUILTIN_MODES.values() if m.offline or not offline]
    if offline:
        return names + [name for name in _registered() if router_mode(name).offline]
    return names + list(_registered())


@functools.cache
def router_mode(name: str) -> RouterMode:
    """The mode called ``name``; ``ValueError`` names the valid ones (and why a registered mode
    that fails to load is unusable)."""
    mode = BUILTIN_MODES.get(name)
    if mode is not None:
        return mode
    ep = _registered().get(name)
    if ep is None:
        raise ValueError(f"unknown router mode {name!r}: choose one of {', '.join(mode_names())}")
    try:
        mode = ep.load()
    except Exception as exc:
        raise ValueError(f"router mode {name!r} ({ep.value}) could not be loaded: {exc}") from exc
    if not isinstance(mode, RouterMode):
        raise ValueError(
            f"router mode {name!r}: {ep.value} is a {type(mode).__name__}, not a "
            "dyn.core.router.modes.RouterMode"
        )
    return mode


def modes_help(*, offline: bool = False) -> str:
    """The ``--router-mode`` help: each built-in mode (``offline``: those the offline replay can
    use) and what it does. Registered modes are not loaded for it: help and man pages must not
    depend on what else is installed."""
    modes = [m for m in BUILTIN_MODES.values() if m.offline or not offline]
    return (
        "How to pick a worker: "
        + "; ".join(f"{m.name} ({m.summary})" for m in modes)
        + f"; or a mode a package registers under the {ROUTER_MODE_ENTRY_POINT_GROUP} entry points."
    )
