"""The cost model (worker logits) and worker selection (argmin, ties, softmax temperature)."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from dyn.core.router.cost import select_worker, worker_logit

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
