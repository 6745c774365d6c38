"""A routing policy as a scorer and a picker over the KV router's view of each rank.

``KvRouter(policy=...)`` hashes the prompt, asks its overlap sources, filters busy ranks, queues
and books as always (``dyn.core.router.kv``); only the choice is the policy's: ``score`` gives
each candidate rank a number from its ``RankView`` (lower is better for the default picker), and
``pick`` chooses a rank from the scores. ``CostModel`` is the built-in KV mode's policy (Dynamo's
cost, argmin or softmax at ``--router-temperature``): a ``KvRouter`` given it decides exactly as
one given none, which runs the same cost inlined (with bulk scoring at fleet size).

A package adds a policy as a router mode: ``policy_mode(name, summary, make)`` is the
``RouterMode`` to declare under the ``dyn.router_modes`` entry point group (``make(config)``
builds the policy from the KV router config, so the KV flags reach it).
"""

from __future__ import annotations

import abc
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from dyn.core.kv.indexer import WorkerKey
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.cost import select_worker, worker_logit
from dyn.core.router.modes import RouterContext, RouterMode

if TYPE_CHECKING:
    from dyn.core.router.policy import Router
    from dyn.core.router.pool import Worker


class RankView(NamedTuple):
    """What the router knows of one candidate rank for one request.

    ``overlap_blocks``: the prompt's leading blocks in the rank's device cache; ``host_blocks``
    and ``disk_blocks``: the blocks continuing them in its lower tiers; ``cached_tokens``: the
    prompt tokens all of those are worth; ``prefill_tokens``: the prompt tokens the rank would
    have to compute in flight, this request's ``isl_tokens - cached_tokens`` included (0 when
    prefill is not tracked); ``decode_blocks``: its active KV blocks with this request's;
    ``requests``: requests booked there; ``overlap_credit`` and ``track_prefill``: the request's
    effective KV flags."""

    key: WorkerKey
    worker: Worker
    isl_tokens: int
    block_size: int
    overlap_blocks: int
    host_blocks: int
    disk_blocks: int
    cached_tokens: int
    prefill_tokens: int
    decode_blocks: int
    requests: int
    overlap_credit: float
    track_prefill: bool


class Policy(abc.ABC):
    """How a KV router chooses among the candidate ranks of one request."""

    @abc.abstractmethod
    def score(self, view: RankView) -> float:
        """The rank's score for this request."""

    def pick(self, scores: Mapping[WorkerKey, float], rng: random.Random) -> WorkerKey:
        """The rank to use (``scores`` is never empty): by default the lowest, ties at random."""
        return select_worker(scores, 0.0, rng)


class CostModel(Policy):
    """The built-in KV mode: Dynamo's cost (``dyn.core.router.cost``) with ``config``'s weights,
    picked by argmin or by softmax at ``config.temperature``."""

    def __init__(self, config: KvRouterConfig) -> None:
        self.config = config

    def score(self, view: RankView) -> float:
        c = self.config
        return worker_logit(
            potential_prefill_tokens=view.prefill_tokens,
            cached_tokens=view.cached_tokens,
            isl_tokens=view.isl_tokens,
            device_overlap_blocks=view.overlap_blocks,
            host_overlap_blocks=view.host_blocks,
            disk_overlap_blocks=view.disk_blocks,
            potential_decode_blocks=view.decode_blocks,
            block_size=view.block_size,
            overlap_score_credit=view.overlap_credit,
            prefill_load_scale=c.prefill_load_scale,
            track_prefill_tokens=view.track_prefill,
            host_cache_hit_weight=c.host_cache_hit_weight,
            disk_cache_hit_weight=c.disk_cache_hit_weight,
            shared_cache_multiplier=c.effective_shared_cache_multiplier,
        )

    def pick(self, scores: Mapping[WorkerKey, float], rng: random.Random) -> WorkerKey:
        return select_worker(scores, self.config.temperature, rng)


def policy_mode(
    name: str, summary: str, make: Callable[[KvRouterConfig], Policy], *, offline: bool = True
) -> RouterMode:
    """The router mode of a KV router choosing with ``make(config)``'s policy."""

    def build(ctx: RouterContext) -> Router:
        from dyn.core.router.kv import KvRouter

        return KvRouter(
            ctx.pool,
            ctx.config,
            ctx.metrics,
            ingest=ctx.ingest,
            rng=ctx.rng,
            clock=ctx.clock,
            policy=make(ctx.config),
        )

    return RouterMode(name=name, summary=summary, build=build, offline=offline)
