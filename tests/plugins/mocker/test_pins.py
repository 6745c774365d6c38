"""Pinned prefixes: protected from eviction until their TTL on the manager's clock, then evictable."""

from dyn.core.kv.events import BlockRemoved
from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.core.messages import StopConditions
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.kv_cache import KvBlockManager, KvSequence
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest

BS = 4


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def cache(m: KvBlockManager, tokens) -> KvSequence:
    """Compute a sequence and release it: its full blocks stay cached, inactive."""
    seq = KvSequence(list(tokens))
    assert m.allocate(seq, len(tokens), m.match_prefix(seq))
    m.commit(seq, len(tokens))
    m.release(seq)
    return seq


def removed(m: KvBlockManager) -> list[int]:
    return [h for e in m.drain_events() if isinstance(e, BlockRemoved) for h in e.block_hashes]


def check_accounting(m: KvBlockManager):
    assert m.num_free + m.num_active_blocks + m.num_cached_inactive == m.num_blocks


def test_pin_counts_leading_cached_full_blocks():
    m = KvBlockManager(32, BS, clock=FakeClock())
    cache(m, range(12))  # 3 full blocks
    assert m.pin_prefix(list(range(14)), 10) == 3  # the partial tail and uncached blocks do not count
    assert m.pin_prefix(list(range(8)), 10) == 2
    assert m.pin_prefix([99] + list(range(1, 12)), 10) == 0  # first block differs: nothing matches
    assert m.pin_prefix(list(range(3)), 10) == 0  # no full block
    assert KvBlockManager(32, BS, enable_prefix_caching=False).pin_prefix(list(range(12)), 10) == 0


def test_pinned_blocks_survive_pressure_until_their_ttl_then_reenter_eviction_order():
    clock = FakeClock()
    m = KvBlockManager(6, BS, clock=clock)
    pinned = cache(m, range(12))  # oldest: LRU would evict it first
    other = cache(m, range(100, 112))
    assert m.pin_prefix(list(range(12)), 30.0) == 3
    assert m.num_available == 3  # the pinned inactive blocks are not evictable
    hog = KvSequence(list(range(200, 216)))
    assert not m.allocate(hog, 16)  # would need a pinned block
    assert m.allocate(hog, 12)
    assert set(removed(m)) == set(other.hashes)  # the unpinned prefix went, the older pinned one stayed
    assert all(m.is_cached(h) and m.is_pinned(h) for h in pinned.hashes)
    check_accounting(m)
    m.release(hog)
    clock.now += 29.9
    assert all(m.is_pinned(h) for h in pinned.hashes)
    clock.now += 0.1  # the pin ends: its blocks are the least recently released, evicted first
    assert not m.is_pinned(pinned.hashes[0])
    newer = cache(m, range(400, 412))  # released after the pinned prefix
    evictor = KvSequence(list(range(300, 312)))
    assert m.num_available == 6 and m.allocate(evictor, 12)
    assert removed(m) == pinned.hashes[::-1]  # the old LRU rank is kept: older than `newer`
    assert all(m.is_cached(h) for h in newer.hashes)
    check_accounting(m)


def test_a_later_pin_extends_and_never_shortens():
    clock = FakeClock()
    m = KvBlockManager(8, BS, clock=clock)
    seq = cache(m, range(8))
    m.pin_prefix(list(range(8)), 50)
    m.pin_prefix(list(range(8)), 5)  # shorter: ignored
    clock.now += 20
    assert m.is_pinned(seq.hashes[0]) and m.is_pinned(seq.hashes[1])
    m.pin_prefix(list(range(4)), 100)  # extends only the first block
    clock.now += 40
    assert m.is_pinned(seq.hashes[0]) and not m.is_pinned(seq.hashes[1])
    assert m.num_available == 8 - 1


def test_pinned_block_in_use_is_counted_when_released():
    clock = FakeClock()
    m = KvBlockManager(4, BS, clock=clock)
    cache(m, range(8))
    m.pin_prefix(list(range(8)), 10)
    user = KvSequence(list(range(9)))
    hit = m.match_prefix(user)
    assert hit == 2 and m.allocate(user, 9, hit)  # revives the pinned blocks
    assert m.num_available == 1
    check_accounting(m)
    m.release(user)
    assert m.num_available == 2  # pinned again once inactive
    clock.now += 10
    assert m.num_available == 4
    check_accounting(m)


def test_scheduler_keeps_a_pinned_prompt_cached_while_others_are_evicted():
    clock = FakeClock()
    s = Scheduler(MockerConfig(block_size=16, num_gpu_blocks=12), SimModel(1000, 4096), clock=clock)
    system = list(range(64))

    def run(rid, prompt):
        s.add(SimRequest(rid, prompt, StopConditions(max_tokens=1, ignore_eos=True)))
        fins = []
        while s.has_work:
            fins += s.step().finished
        return fins[0]

    run("first", system + [1])
    assert s.kv.pin_prefix(system, 60) == 4
    for i in range(6):  # each fills the cache with 5 new blocks
        run(f"noise{i}", list(range(1000 * (i + 1), 1000 * (i + 1) + 80)))
    assert run("again", system + [2]).cached_tokens == 64
    clock.now += 60
    for i in range(6):
        run(f"late{i}", list(range(50_000 * (i + 1), 50_000 * (i + 1) + 120)))
    assert run("expired", system + [3]).cached_tokens == 0


def test_pin_hashes_match_the_router_hashes():
    m = KvBlockManager(8, BS, clock=FakeClock())
    seq = cache(m, range(8))
    assert seq.hashes == sequence_hashes(block_hashes(list(range(8)), BS))
    m.pin_prefix(list(range(8)), 1)
    assert all(m.is_pinned(h) for h in seq.hashes)
