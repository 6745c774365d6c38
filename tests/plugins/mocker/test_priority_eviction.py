"""SGLang's --radix-eviction-policy priority: least important leaf first, ties by LRU."""

import pytest

from dyn.core.kv.events import BlockRemoved
from dyn.core.messages import StopConditions
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.kv_cache import KvBlockManager, KvSequence, PriorityKvBlockManager
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest

BS = 4


def cache(m: KvBlockManager, tokens, importance=0) -> KvSequence:
    seq = KvSequence(list(tokens), importance=importance)
    hit = m.match_prefix(seq)
    assert m.allocate(seq, len(seq.tokens), hit)
    m.commit(seq, len(seq.tokens))
    m.release(seq)
    return seq


def evict_blocks(m: KvBlockManager, n: int) -> list[int]:
    """Allocate every free block plus ``n``; return the evicted hashes in eviction order."""
    m.drain_events()
    size = (m.num_free + n) * BS
    hog = KvSequence([-1] * size)
    assert m.allocate(hog, size)
    m.release(hog)
    return [h for e in m.drain_events() if isinstance(e, BlockRemoved) for h in e.block_hashes]


def test_least_important_first_then_least_recently_used():
    m = PriorityKvBlockManager(8, BS)
    hi = cache(m, range(8), importance=5)  # oldest
    lo_old = cache(m, range(100, 104), importance=1)
    lo_new = cache(m, range(200, 204), importance=1)
    mid = cache(m, range(300, 308), importance=3)  # newest
    assert evict_blocks(m, 1) == lo_old.hashes  # the older of the two least important
    assert evict_blocks(m, 3) == lo_new.hashes + mid.hashes[::-1]
    assert all(m.is_cached(h) for h in hi.hashes)


def test_lru_manager_ignores_importance():
    m = KvBlockManager(8, BS)
    hi = cache(m, range(8), importance=5)
    cache(m, range(100, 104), importance=1)
    assert evict_blocks(m, 1) == hi.hashes[1:]  # plain LRU: the oldest leaf goes


def test_block_keeps_the_highest_importance_of_its_users():
    m = PriorityKvBlockManager(6, BS)
    shared = cache(m, range(8), importance=1)
    cache(m, range(8), importance=9)  # a later, more important hit on the same blocks
    cache(m, list(range(8)) + [50, 51, 52, 53], importance=0)  # a less important extension
    assert [m.importance_of(h) for h in shared.hashes] == [9, 9]
    other = cache(m, range(100, 104), importance=4)
    extension = m.full_hashes(KvSequence(list(range(8)) + [50, 51, 52, 53]), 3)[2]
    assert evict_blocks(m, 2) == [extension] + other.hashes  # importance 0, then 4; never the 9s
    assert all(m.is_cached(h) for h in shared.hashes)


def run(s: Scheduler, rid, prompt, priority):
    s.add(SimRequest(rid, prompt, StopConditions(max_tokens=1, ignore_eos=True), priority=priority))
    fins = []
    while s.has_work:
        fins += s.step().finished
    return fins[0]


@pytest.mark.parametrize("low_first", [False, True])
def test_scheduler_evicts_smaller_raw_priorities_first_in_either_order(low_first):
    """SGLang's PriorityStrategy keeps larger raw values, even with low-values-first scheduling."""
    s = Scheduler(
        MockerConfig(
            engine_type="sglang",
            radix_eviction_policy="priority",
            block_size=16,
            num_gpu_blocks=12,
            schedule_low_priority_values_first=low_first,
        ),
        SimModel(1000, 4096),
    )
    keep = list(range(64))
    run(s, "keep", keep + [1], 10)  # stored first: LRU alone would evict it first
    run(s, "drop", list(range(500, 564)) + [1], 1)
    run(s, "noise", list(range(900, 964)) + [1], None)
    assert run(s, "again", keep + [2], None).cached_tokens == 64
    assert run(s, "dropped", list(range(500, 564)) + [2], None).cached_tokens < 64


def test_missing_priority_is_least_important_with_priority_scheduling():
    s = Scheduler(
        MockerConfig(
            engine_type="sglang",
            radix_eviction_policy="priority",
            block_size=16,
            num_gpu_blocks=10,
            enable_priority_scheduling=True,
        ),
        SimModel(1000, 4096),
    )
    run(s, "explicit", list(range(64)) + [1], -100)  # even a very low explicit priority beats None
    run(s, "none", list(range(500, 564)) + [1], None)
    run(s, "pressure", list(range(900, 964)) + [1], -100)
    assert run(s, "again", list(range(64)) + [2], -100).cached_tokens == 64
