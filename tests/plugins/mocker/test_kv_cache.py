"""Block manager: prefix hits, stores, LRU leaf-first eviction and the events they emit."""

import pytest

from dyn.core.kv.events import BlockRemoved, BlockStored
from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.plugins.mocker.kv_cache import KvBlockManager, KvSequence

BS = 4


def seq_hashes(tokens, bs=BS):
    return sequence_hashes(block_hashes(tokens, bs))


def compute(m: KvBlockManager, tokens) -> KvSequence:
    """Admit a sequence the way the scheduler does and compute all its tokens."""
    seq = KvSequence(list(tokens))
    hit = m.match_prefix(seq)
    assert m.allocate(seq, len(tokens), hit)
    m.commit(seq, len(tokens))
    return seq


def check_accounting(m: KvBlockManager):
    assert m.num_free + m.num_active_blocks + m.num_cached_inactive == m.num_blocks
    assert 0.0 <= m.usage <= 1.0


def stored(events):
    return [e for e in events if isinstance(e, BlockStored)]


def removed_hashes(events):
    return [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]


def test_store_emits_chained_hashes_and_tokens():
    m = KvBlockManager(16, BS)
    tokens = list(range(100, 114))  # 3 full blocks + 2 tokens
    seq = compute(m, tokens)
    (ev,) = m.drain_events()
    assert isinstance(ev, BlockStored)
    assert ev.block_hashes == seq_hashes(tokens)
    assert ev.parent_block_hash is None
    assert ev.token_ids == tokens[:12]
    assert ev.block_size == BS and ev.medium == "GPU"
    assert m.num_active_blocks == 4  # 3 cached + the private partial block
    assert m.drain_events() == []
    check_accounting(m)
    m.release(seq)
    assert m.num_active_blocks == 0 and m.num_cached_inactive == 3
    assert m.drain_events() == []  # releasing keeps blocks cached: no event
    check_accounting(m)


def test_prefix_hit_across_requests_emits_only_new_blocks():
    m = KvBlockManager(32, BS)
    a = list(range(12))  # blocks A0 A1 A2
    b = a[:8] + [50, 51, 52, 53, 54]  # shares A0 A1, then one new block + 1 token
    sa = compute(m, a)
    m.drain_events()
    sb = KvSequence(b)
    assert m.match_prefix(sb) == 2
    assert m.allocate(sb, len(b), 2)
    m.commit(sb, len(b))
    (ev,) = m.drain_events()
    hb = seq_hashes(b)
    assert ev.block_hashes == [hb[2]]
    assert ev.parent_block_hash == seq_hashes(a)[1] == hb[1]
    assert ev.token_ids == [50, 51, 52, 53]
    # shared blocks count once: A0 A1 A2 + B2 + B's partial block
    assert m.num_active_blocks == 5
    check_accounting(m)
    m.release(sa)
    m.release(sb)
    # a hit on inactive (released) blocks revives them without events
    sc = compute(m, b)
    assert m.drain_events() == []
    assert m.num_cached_inactive == 1  # A2
    check_accounting(m)
    m.release(sc)


def test_fully_cached_prompt_leaves_last_block_to_compute():
    m = KvBlockManager(16, BS)
    tokens = list(range(12))
    m.release(compute(m, tokens))
    m.drain_events()
    seq = KvSequence(list(tokens))
    assert m.match_prefix(seq) == 2  # not 3: the last token must be computed
    assert m.allocate(seq, 12, 2)
    m.commit(seq, 12)
    assert m.drain_events() == []  # block 3 is already cached: reused, not stored again
    assert m.num_active_blocks == 3 and m.num_free == 13
    check_accounting(m)


def test_concurrent_compute_of_same_block_stores_once():
    m = KvBlockManager(16, BS)
    tokens = list(range(8))
    s1, s2 = KvSequence(list(tokens)), KvSequence(list(tokens))
    assert m.match_prefix(s1) == 0 and m.match_prefix(s2) == 0
    assert m.allocate(s1, 8) and m.allocate(s2, 8)
    assert m.num_active_blocks == 4
    m.commit(s1, 8)
    m.commit(s2, 8)
    events = m.drain_events()
    assert len(stored(events)) == 1 and events[0].block_hashes == seq_hashes(tokens)
    assert m.num_active_blocks == 2 and m.num_free == 14  # s2's copies were freed
    m.release(s1)
    assert m.num_active_blocks == 2  # still held by s2
    m.release(s2)
    assert m.num_cached_inactive == 2
    check_accounting(m)


def test_eviction_is_lru_among_leaves():
    m = KvBlockManager(6, 2)
    a = [1, 2, 3, 4, 5, 6, 7, 8]  # a1 a2 a3 a4
    b = [1, 2, 3, 4, 9, 10, 11, 12]  # a1 a2 b3 b4
    ha, hb = seq_hashes(a, 2), seq_hashes(b, 2)
    sa = compute(m, a)
    sb = compute(m, b)
    assert m.num_free == 0
    m.release(sa)  # a3 a4 unreferenced first
    m.release(sb)  # then a1 a2 b3 b4
    m.drain_events()
    fresh = KvSequence(list(range(100, 112)))
    order = []
    for n in (4, 8, 12):
        assert m.allocate(fresh, n)
        order.append(removed_hashes(m.drain_events()))
        check_accounting(m)
    assert order == [[ha[3], ha[2]], [hb[3], hb[2]], [ha[1], ha[0]]]
    assert not m.allocate(fresh, 14)  # nothing left to evict
    for h in ha + hb:
        assert not m.is_cached(h)


def test_reuse_refreshes_recency():
    m = KvBlockManager(6, 2)
    a = [1, 2, 3, 4, 5, 6, 7, 8]
    b = [1, 2, 3, 4, 9, 10, 11, 12]
    hb = seq_hashes(b, 2)
    m.release(compute(m, a))
    m.release(compute(m, b))
    m.release(compute(m, a))  # a is now the most recently used chain
    m.drain_events()
    fresh = KvSequence(list(range(100, 104)))
    assert m.allocate(fresh, 4)
    assert removed_hashes(m.drain_events()) == [hb[3], hb[2]]


def test_free_blocks_are_used_before_evicting():
    m = KvBlockManager(8, BS)
    m.release(compute(m, list(range(16))))
    m.drain_events()
    s = KvSequence(list(range(100, 116)))
    assert m.allocate(s, 16)  # 4 free blocks remain: no eviction
    assert m.drain_events() == []
    assert m.allocate(s, 20)
    assert len(removed_hashes(m.drain_events())) == 1


def test_allocation_fails_without_side_effects_when_all_active():
    m = KvBlockManager(4, BS)
    s1 = compute(m, list(range(12)))
    m.drain_events()
    s2 = KvSequence(list(range(50, 58)))
    assert not m.allocate(s2, 8)
    assert s2.num_blocks == 0 and m.num_free == 1 and m.drain_events() == []
    assert m.allocate(s2, 4)
    m.release(s1)
    assert m.allocate(s2, 8)  # now evicts one of s1's cached blocks
    assert len(removed_hashes(m.drain_events())) == 1
    check_accounting(m)


def test_admission_hit_does_not_count_its_own_prefix_as_evictable():
    m = KvBlockManager(3, BS)
    m.release(compute(m, list(range(8))))  # 2 inactive cached blocks, 1 free
    m.drain_events()
    seq = KvSequence(list(range(8)) + [99, 98, 97, 96, 95])
    hit = m.match_prefix(seq)
    assert hit == 2
    assert not m.allocate(seq, 13, hit)  # needs 2 more blocks; only 1 free
    assert m.num_cached_inactive == 2 and m.drain_events() == []
    assert m.allocate(seq, 12, hit)
    assert m.num_free == 0 and m.num_active_blocks == 3


def test_prefix_caching_disabled_emits_nothing_and_frees_everything():
    m = KvBlockManager(8, BS, enable_prefix_caching=False)
    tokens = list(range(12))
    s1 = compute(m, tokens)
    s2 = KvSequence(list(tokens))
    assert m.match_prefix(s2) == 0
    assert m.allocate(s2, 12)
    m.commit(s2, 12)
    assert m.num_active_blocks == 6
    m.release(s1)
    m.release(s2)
    assert m.drain_events() == []
    assert m.num_free == 8 and m.num_cached_inactive == 0


def test_many_reuse_cycles_keep_eviction_exact():
    m = KvBlockManager(4, 2)
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    for _ in range(1500):
        m.release(compute(m, a))
        m.release(compute(m, b))
    m.drain_events()
    s = KvSequence(list(range(100, 108)))
    assert m.allocate(s, 8)
    ha, hb = seq_hashes(a, 2), seq_hashes(b, 2)
    assert removed_hashes(m.drain_events()) == [ha[1], ha[0], hb[1], hb[0]]


def test_lora_name_changes_hashes_and_is_reported():
    m = KvBlockManager(8, BS)
    tokens = list(range(8))
    seq = KvSequence(list(tokens), lora_name="adapter")
    assert m.allocate(seq, 8)
    m.commit(seq, 8)
    (ev,) = m.drain_events()
    assert ev.lora_name == "adapter"
    assert ev.block_hashes == sequence_hashes(block_hashes(tokens, BS, "adapter"))
    assert ev.block_hashes != seq_hashes(tokens)


@pytest.mark.parametrize("bad", [(0, 4), (4, 0)])
def test_rejects_non_positive_sizes(bad):
    with pytest.raises(ValueError):
        KvBlockManager(*bad)
