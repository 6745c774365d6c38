"""The cost model (worker logits) and worker selection (argmin, ties, softmax temperature)."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from dyn.core.router.cost import (
    effective_cached_tokens,
    effective_overlap_blocks,
    select_worker,
    shared_hits_beyond,
    worker_logit,
)

BS = 16


def logit(
    *,
    isl: int = 128,
    prefill: float | None = None,
    cached: float = 0.0,
    overlap: float = 0.0,
    decode: float = 0.0,
    credit: float = 1.0,
    scale: float = 1.0,
    track: bool = True,
    **extra: float,
) -> float:
    return worker_logit(
        isl_tokens=isl,
        block_size=BS,
        potential_prefill_tokens=prefill,
        cached_tokens=cached,
        device_overlap_blocks=overlap,
        potential_decode_blocks=decode,
        overlap_score_credit=credit,
        prefill_load_scale=scale,
        track_prefill_tokens=track,
        **extra,
    )


def test_docs_worked_example_picks_w2():
    """An 8-block prompt; W2 and W3 hold 3 and 6 of its blocks: 8+10, 5+5, 2+9."""
    isl = 8 * BS
    logits = {
        (1, 0): logit(isl=isl, prefill=isl, cached=0, overlap=0, decode=10),
        (2, 0): logit(isl=isl, prefill=isl - 3 * BS, cached=3 * BS, overlap=3, decode=5),
        (3, 0): logit(isl=isl, prefill=isl - 6 * BS, cached=6 * BS, overlap=6, decode=9),
    }
    assert logits == {(1, 0): 18.0, (2, 0): 10.0, (3, 0): 11.0}
    assert select_worker(logits, 0.0, random.Random(0)) == (2, 0)


def test_active_prefill_load_counts_against_a_worker():
    idle = logit(prefill=128, decode=8)
    busy = logit(prefill=128 + 320, decode=8)
    assert busy - idle == 320 / BS


def test_zero_credit_ignores_overlap():
    assert logit(prefill=80, cached=48, overlap=3, credit=0.0) == logit(prefill=128) == 8.0
    assert logit(prefill=80, cached=48, overlap=3, credit=0.5) == 8.0 - 1.5


def test_prefill_load_scale_multiplies_only_the_adjusted_prefill():
    assert logit(prefill=80, cached=48, overlap=3, decode=4, scale=2.0) == 2 * 5 + 4
    assert logit(prefill=80, cached=48, overlap=3, decode=4, scale=0.0) == 4


def test_adjusted_prefill_never_goes_negative():
    assert logit(prefill=0, cached=16, overlap=40, decode=3) == 3


def test_untracked_prefill_leaves_decode_only():
    assert logit(prefill=999, overlap=1, decode=7, track=False) == 7


def test_missing_load_entry_counts_the_whole_prompt():
    assert logit(isl=160, prefill=None, decode=2) == 10 + 2


def test_lower_tiers_are_credited_at_fixed_weights():
    base = logit(prefill=128)
    assert logit(prefill=128, host_overlap_blocks=4) == base - 3.0
    assert logit(prefill=128, disk_overlap_blocks=4) == base - 1.0


def test_host_and_disk_credits_by_hand():
    """A 16-block prompt on a rank with 320 active prefill tokens (20 blocks): 4 device blocks,
    then 6 in host memory and 2 on disk; effective overlap 4 + 0.75*6 + 0.25*2 = 9 blocks."""
    isl = 16 * BS
    effective = effective_overlap_blocks(4, 6, 2)
    cached = effective_cached_tokens(effective, BS, isl)
    assert (effective, cached) == (9.0, 144)
    cost = logit(
        isl=isl, prefill=320 + isl - cached, cached=cached, overlap=4, decode=5,
        host_overlap_blocks=6, disk_overlap_blocks=2,
    )  # fmt: skip
    # raw (320 + 256) / 16 = 36 blocks; credit 4 + 4.5 + 0.5 = 9; 27 + 5 decode blocks
    assert cost == 32.0
    # the overlap credit is for device blocks only; a half credit, other weights, a load scale
    cost = logit(
        isl=isl, prefill=320 + isl - cached, cached=cached, overlap=4, decode=5, credit=0.5, scale=2.0,
        host_overlap_blocks=6, disk_overlap_blocks=2, host_cache_hit_weight=0.5, disk_cache_hit_weight=1.0,
    )  # fmt: skip
    assert cost == 2.0 * (36 - (0.5 * 4 + 0.5 * 6 + 1.0 * 2)) + 5


def test_zero_weights_ignore_the_lower_tiers():
    base = logit(prefill=128, overlap=2)
    tiered = logit(
        prefill=128, overlap=2, host_overlap_blocks=3, disk_overlap_blocks=3,
        host_cache_hit_weight=0.0, disk_cache_hit_weight=0.0,
    )  # fmt: skip
    assert tiered == base == 8.0 - 2.0


def test_effective_cached_tokens_round_half_up_and_stop_at_the_prompt():
    assert effective_cached_tokens(effective_overlap_blocks(0, 1, 0), 6, 100) == 5  # 4.5: up, as Dynamo
    assert effective_cached_tokens(effective_overlap_blocks(0, 0, 1), 2, 100) == 1  # 0.5: up
    assert effective_cached_tokens(effective_overlap_blocks(1, 1, 1, 0.3, 0.1), 10, 100) == 14
    assert effective_cached_tokens(effective_overlap_blocks(8, 8, 8), BS, 40) == 40


def test_shared_cache_hits_count_beyond_the_device_prefix_at_the_multiplier():
    hits = [(0, 4), (6, 10)]  # block positions 0-3 and 6-9
    assert shared_hits_beyond(hits, 0) == 8 and shared_hits_beyond(hits, 3) == 5
    assert shared_hits_beyond(hits, 7) == 3 and shared_hits_beyond(hits, 12) == 0
    base = logit(prefill=256, overlap=3)  # 16 - 3
    assert (
        logit(prefill=256, overlap=3, shared_cache_multiplier=0.5, shared_cache_hits=hits) == base - 0.5 * 5
    )
    assert logit(prefill=256, overlap=3, shared_cache_hits=hits) == base  # multiplier 0: no shared cache


def test_select_needs_a_candidate():
    with pytest.raises(ValueError):
        select_worker({}, 0.0, random.Random(0))


def test_ties_break_uniformly_at_temperature_zero():
    rng = random.Random(7)
    logits = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 2.0}
    n = 30_000
    counts = Counter(select_worker(logits, 0.0, rng) for _ in range(n))
    assert counts["d"] == 0
    for key in "abc":
        assert abs(counts[key] / n - 1 / 3) < 0.02


def test_temperature_sampling_follows_the_normalised_softmax():
    rng = random.Random(11)
    logits = {"a": 0.0, "b": 5.0, "c": 10.0}
    t = 0.5
    weights = {k: math.exp(-(v - 0.0) / ((10.0 - 0.0) * t)) for k, v in logits.items()}
    total = sum(weights.values())
    n = 40_000
    counts = Counter(select_worker(logits, t, rng) for _ in range(n))
    for key, w in weights.items():
        assert abs(counts[key] / n - w / total) < 0.02


def test_temperature_is_scale_free_and_uniform_on_equal_logits():
    rng = random.Random(5)
    n = 20_000
    small = Counter(select_worker({"a": 0.0, "b": 1.0}, 1.0, rng) for _ in range(n))
    large = Counter(select_worker({"a": 0.0, "b": 1000.0}, 1.0, rng) for _ in range(n))
    expected_a = 1 / (1 + math.exp(-1))
    assert abs(small["a"] / n - expected_a) < 0.02 and abs(large["a"] / n - expected_a) < 0.02
    flat = Counter(select_worker({"a": 3.0, "b": 3.0}, 0.7, rng) for _ in range(n))
    assert abs(flat["a"] / n - 0.5) < 0.02


def test_high_temperature_spreads_low_temperature_concentrates():
    rng = random.Random(9)
    logits = {"a": 0.0, "b": 10.0}
    cold = Counter(select_worker(logits, 0.05, rng) for _ in range(5_000))
    hot = Counter(select_worker(logits, 100.0, rng) for _ in range(5_000))
    assert cold["b"] == 0  # p(b) = e^-20
    assert abs(hot["b"] / 5_000 - 0.5) < 0.03
