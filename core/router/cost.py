"""The KV router's cost model and worker selection.

A candidate rank's cost (its *logit*; lower is better) is Dynamo's (reference 3.3)::

    raw_prefill_blocks = (active prefill tokens + isl) / block_size     (0 without prefill tracking)
    overlap_credit     = credit * device_blocks
                         + host_cache_hit_weight * host_blocks
                         + disk_cache_hit_weight * disk_blocks
                         + shared_cache_multiplier * shared_hits_beyond(round(device_blocks))
    logit              = prefill_load_scale * max(raw_prefill_blocks - overlap_credit, 0)
                         + potential_decode_blocks

``device_blocks`` is the rank's matched prefix in device memory; ``host_blocks`` and
``disk_blocks`` the prompt's blocks that continue it in that rank's host and disk (or external)
tiers; shared hits are block positions held by a cache every rank shares. The same weights give
the rank's *effective* overlap, ``device + host_w * host + disk_w * disk`` blocks, whose tokens
(``effective_cached_tokens``) are the prompt tokens the rank is expected not to prefill.

``select_worker`` takes the argmin (ties broken uniformly at random) at temperature 0, and
otherwise samples a softmax over the min-max normalised logits.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import TypeVar

import numpy as np

HOST_CACHE_HIT_WEIGHT = 0.75
DISK_CACHE_HIT_WEIGHT = 0.25

K = TypeVar("K")

SharedCacheHits = Sequence[tuple[int, int]]
"""Block positions of the prompt held in a shared cache, as half-open ranges ``[start, end)``."""


def shared_hits_beyond(hits: SharedCacheHits, position: int) -> int:
    """How many shared-cache block positions are at or after ``position``."""
    return sum(max(0, end - max(start, position)) for start, end in hits)


def effective_overlap_blocks(
    device_blocks: float,
    host_blocks: float,
    disk_blocks: float,
    host_cache_hit_weight: float = HOST_CACHE_HIT_WEIGHT,
    disk_cache_hit_weight: float = DISK_CACHE_HIT_WEIGHT,
) -> float:
    """The blocks a rank's caches are worth: device ones in full, lower-tier ones weighted."""
    return device_blocks + host_cache_hit_weight * host_blocks + disk_cache_hit_weight * disk_blocks


def effective_cached_tokens(effective_blocks: float, block_size: int, isl_tokens: int) -> int:
    """``effective_blocks`` in tokens, rounded half up as Dynamo does, at most the prompt."""
    return min(math.floor(effective_blocks * block_size + 0.5), isl_tokens)


def worker_logit(
    *,
    isl_tokens: int,
    block_size: int,
    potential_prefill_tokens: float | None,
    cached_tokens: float,
    device_overlap_blocks: float,
    potential_decode_blocks: float,
    overlap_score_credit: float,
    prefill_load_scale: float,
    track_prefill_tokens: bool,
    host_overlap_blocks: float = 0.0,
    disk_overlap_blocks: float = 0.0,
    host_cache_hit_weight: float = HOST_CACHE_HIT_WEIGHT,
    disk_cache_hit_weight: float = DISK_CACHE_HIT_WEIGHT,
    shared_cache_multiplier: float = 0.0,
    shared_cache_hits: SharedCacheHits = (),
) -> float:
    """The cost of sending the request to one rank (the module docstring's formula).

    ``potential_prefill_tokens`` is the rank's active prefill tokens plus ``isl - cached_tokens``
    (``None`` for a rank with no load entry: the raw prompt load is then ``isl``), so adding
    ``cached_tokens`` back gives the full prompt the rank would have in flight; the overlap
    credit then subtracts what its caches already hold.
    """
    if not track_prefill_tokens:
        raw_tokens = 0.0
    elif potential_prefill_tokens is None:
        raw_tokens = float(isl_tokens)
    else:
        raw_tokens = potential_prefill_tokens + cached_tokens
    raw_blocks = raw_tokens / block_size
    credit = (
        overlap_score_credit * device_overlap_blocks
        + host_cache_hit_weight * host_overlap_blocks
        + disk_cache_hit_weight * disk_overlap_blocks
    )
    if shared_cache_multiplier and shared_cache_hits:
        device_end = math.floor(device_overlap_blocks + 0.5)
        credit += shared_cache_multiplier * shared_hits_beyond(shared_cache_hits, device_end)
    adjusted = max(raw_blocks - credit, 0.0)
    return prefill_load_scale * adjusted + potential_decode_blocks


def select_worker(logits: Mapping[K, float], temperature: float, rng: random.Random) -> K:
    """Pick a key of ``logits`` (non-empty).

    ``temperature == 0``: the lowest logit; among equal lowest, each is equally likely (reservoir:
    the k-th tie replaces the pick with probability 1/k). ``temperature > 0``: sample with
    ``p_i ∝ exp(-(l_i - lo) / ((hi - lo) * T))``, uniform when every logit is equal.
    """
    if not logits:
        raise ValueError("select_worker needs at least one candidate")
    if temperature <= 0:
        return _argmin(logits, rng)
    values = logits.values()
    lo, hi = min(values), max(values)
    keys = list(logits)
    if hi == lo:
        return keys[int(rng.random() * len(keys)) % len(keys)]
    scale = (hi - lo) * temperature
    weights = [math.exp(-(v - lo) / scale) for v in values]
    u = rng.random() * sum(weights)
    acc = 0.0
    for key, w in zip(keys, weights):
        acc += w
        if u < acc:
            return key
    return keys[-1]  # rounding left u at the very top


def _argmin(logits: Mapping[K, float], rng: random.Random) -> K:
    best_key: K | None = None
    best = math.inf
    ties = 0
    for key, value in logits.items():
        if best_key is None or value < best:
            best_key, best, ties = key, value, 1
        elif value == best:
            ties += 1
            if rng.random() * ties < 1.0:
                best_key = key
    assert best_key is not None
    return best_key


def argmin_position(values: np.ndarray, rng: random.Random) -> int:
    """The position ``select_worker`` picks at temperature 0 among ``values`` taken in order (as
    the logits of keys in that order), drawing from ``rng`` exactly as it does: one draw for
    every value equal to the lowest seen before it, the ties of the final lowest deciding."""
    n = len(values)
    if n == 1:
        return 0
    running = np.minimum.accumulate(values)
    events = np.flatnonzero(values[1:] == running[:-1]) + 1
    pick = int(np.argmin(values))  # the first of the lowest: where the last reset happened
    later = events[events > pick]
    for _ in range(len(events) - len(later)):  # ties with an earlier, higher best: drawn, unused
        rng.random()
    ties = 1
    for position in later.tolist():
        ties += 1
        if rng.random() * ties < 1.0:
            pick = position
    return pick
