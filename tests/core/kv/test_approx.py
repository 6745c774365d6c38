from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyn.core.kv.approx import TtlIndexer, max_merge
from dyn.core.kv.hashing import sequence_hashes
from dyn.core.kv.indexer import DumpedBlock

W1, W2, W3 = (1, 0), (2, 0), (2, 1)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(index: TtlIndexer, worker, local: list[int]) -> None:
    index.record(worker, local, sequence_hashes(local))


def entries(index: TtlIndexer) -> set:
    return {(b.worker, b.block_hash) for b in index.dump()}


def test_records_are_stores_from_the_root_keyed_by_sequence_hash():
    clock = FakeClock()
    index = TtlIndexer(10, clock=clock)
    record(index, W1, [1, 2, 3])
    record(index, W2, [1, 2])
    local = [1, 2, 3, 4]
    assert index.find_matches(local, sequence_hashes(local)) == {W1: 3, W2: 2}
    assert index.find_matches(local) == {W1: 3, W2: 2}
    seq = sequence_hashes([1, 2, 3])
    assert index.dump()[:2] == [DumpedBlock(W1, None, seq[0], 1), DumpedBlock(W2, None, seq[0], 1)]
    assert index.size == 5 and index.blocks_per_worker() == {W1: 3, W2: 2}
    assert index.depth_histogram() == {1: 1, 2: 1, 3: 1}


def test_entries_expire_ttl_after_their_last_record():
    clock = FakeClock()
    index = TtlIndexer(10, clock=clock)
    record(index, W1, [1, 2, 3])
    assert index.next_expiry() == 1010.0
    clock.now = 1005.0
    record(index, W1, [1, 2])  # refreshes the first two blocks only
    clock.now = 1009.9
    assert index.find_matches([1, 2, 3]) == {W1: 3}
    clock.now = 1010.0
    assert index.find_matches([1, 2, 3]) == {W1: 2}
    assert index.next_expiry() == 1015.0
    assert index.expire(1015.0) == 2
    assert index.find_matches([1, 2, 3]) == {} and index.size == 0
    assert index.next_expiry() is None


def test_expire_removes_deepest_first_when_expiries_tie():
    clock = FakeClock()
    index = TtlIndexer(5, clock=clock)
    record(index, W1, [1, 2, 3, 4])
    record(index, W2, [1, 2])
    removed_order = []
    remove = index.tree.remove

    def spy(worker, blocks):
        removed_order.append((worker, list(blocks)))
        return remove(worker, blocks)

    index.tree.remove = spy  # type: ignore[method-assign]
    assert index.expire(1005.0) == 6
    seq = sequence_hashes([1, 2, 3, 4])
    assert (W1, seq[::-1]) in removed_order
    assert (W2, seq[1::-1]) in removed_order
    assert index.tree.hole_counts() == {}


def test_remove_worker_forgets_every_rank_and_its_timers():
    clock = FakeClock()
    index = TtlIndexer(5, clock=clock)
    record(index, W2, [1, 2])
    record(index, W3, [1])
    record(index, W1, [1])
    index.remove_worker(2)
    assert index.workers() == [W1]
    assert index.find_matches([1, 2]) == {W1: 1}
    assert index.expire(2000.0) == 1


def test_bad_arguments_say_what_to_fix():
    with pytest.raises(ValueError, match="TTL"):
        TtlIndexer(0)
    with pytest.raises(ValueError, match="one sequence hash per local hash"):
        TtlIndexer(1).record(W1, [1, 2], [1])


def test_max_merge_takes_the_larger_score_per_worker():
    primary = {W1: 3, W2: 1}
    assert max_merge(primary, {W2: 4, W3: 2}) == {W1: 3, W2: 4, W3: 2}
    assert max_merge(primary, {W1: 1}) == {W1: 3, W2: 1}
    assert max_merge({}, {W3: 2}) == {W3: 2}
    assert max_merge(primary, {}) == primary
    assert primary == {W1: 3, W2: 1}


RECORDS = st.lists(
    st.tuples(
        st.integers(0, 30),  # time step before the record
        st.sampled_from([W1, W2, W3]),
        st.lists(st.integers(1, 3), min_size=1, max_size=6),  # prompt blocks
        st.booleans(),  # expire explicitly after it
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(RECORDS, st.integers(0, 60))
def test_expiry_removes_exactly_the_expired_entries(steps, tail):
    clock = FakeClock()
    index = TtlIndexer(20, clock=clock)
    last_recorded: dict = {}
    for step, worker, local, expire_now in steps:
        clock.now += step
        record(index, worker, local)
        for seq in sequence_hashes(local):
            last_recorded[(worker, seq)] = clock.now
        if expire_now:
            index.expire()
    clock.now += tail
    before = index.size
    removed = index.expire()
    alive = {key for key, at in last_recorded.items() if at + 20 > clock.now}
    assert entries(index) == alive
    assert index.size == len(alive) and removed == before - len(alive)
    assert index.tree.hole_counts() == {}
    upcoming = [at + 20 for key, at in last_recorded.items() if key in alive]
    assert index.next_expiry() == (min(upcoming) if upcoming else None)


def test_heap_is_compacted_when_refreshes_pile_up(monkeypatch):
    from dyn.core.kv import approx

    monkeypatch.setattr(approx, "_REBUILD_FLOOR", 0)
    clock = FakeClock()
    index = TtlIndexer(10, clock=clock)
    for _ in range(50):
        clock.now += 0.1
        record(index, W1, [1, 2, 3])
    record(index, W2, [1])
    last = clock.now
    assert len(index._heap) <= 4  # 51 records of which only the latest per worker are live
    clock.now += 9.95
    assert index.find_matches([1, 2, 3]) == {W1: 3, W2: 1}
    assert index.next_expiry() == last + 10
    clock.now += 0.05
    assert index.find_matches([1, 2, 3]) == {} and index.size == 0
