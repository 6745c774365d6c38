"""Lower storage tiers: the continuation-edge index of one tier, and the tiered lookup that walks
device -> host -> disk -> external from each rank's device match (reference 2.5)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from dyn.core.kv.convert import BatchConverter, KvEventMetrics, TieredIndexers, apply_event_batch
from dyn.core.kv.events import BlockRemoved, BlockStored, KvEventBatch, StorageTier
from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.core.kv.indexer import ApplyStatus, RadixIndexer, radix_indexer
from dyn.core.kv.tiers import ROOT, LowerTierIndexer, LowerTierIndexes, TierHits

BS = 4
TOKENS = list(range(1000, 1040))  # 10 blocks
LOCAL = block_hashes(TOKENS, BS)
SEQ = sequence_hashes(LOCAL)
W, V = (1, 0), (2, 0)


def names(worker: int, first: int, last: int) -> list[int]:
    """A worker's own (opaque) engine hashes of blocks ``first .. last - 1`` of TOKENS."""
    return [worker * 1000 + i for i in range(first, last)]


# ------------------------------------------------------------------------- one tier's index


def test_a_stored_chain_continues_from_its_parent_and_counts_consecutive_blocks():
    tier = LowerTierIndexer()
    assert tier.store(W, 1004, names(1, 5, 8), LOCAL[5:8]) == ApplyStatus.OK
    assert tier.continuation(W, 1004, LOCAL, 5) == (3, 1007)
    assert tier.continuation(W, 1003, LOCAL, 5) == (0, 1003)  # another anchor: no edge
    assert tier.continuation(W, 1004, LOCAL, 4) == (0, 1004)  # another position: another local hash
    assert tier.continuation(V, 1004, LOCAL, 5) == (0, 1004)  # another rank
    assert tier.blocks_held(W) == 3 and tier.size == 3 and list(tier.workers()) == [W]


def test_a_chain_from_the_root_and_a_query_that_runs_past_it():
    tier = LowerTierIndexer()
    tier.store(W, None, names(1, 0, 4), LOCAL[:4])
    assert tier.continuation(W, ROOT, LOCAL, 0) == (4, 1003)
    assert tier.continuation(W, ROOT, LOCAL[:2], 0) == (2, 1001)


def test_a_removed_block_cuts_the_walk_there_and_nothing_else_goes():
    tier = LowerTierIndexer()
    tier.store(W, None, names(1, 0, 6), LOCAL[:6])
    assert tier.remove(W, [1002]) == ApplyStatus.OK
    assert tier.continuation(W, ROOT, LOCAL, 0) == (2, 1001)
    assert tier.continuation(W, 1001, LOCAL, 2) == (0, 1001)  # its edge is gone ...
    assert tier.continuation(W, 1002, LOCAL, 3) == (3, 1005)  # ... the blocks below it stay
    assert tier.blocks_held(W) == 5
    assert tier.remove(W, [1002, 1003]) == ApplyStatus.BLOCK_NOT_FOUND  # 1002 is gone, 1003 goes
    assert tier.blocks_held(W) == 4
    assert tier.remove(V, [1]) == ApplyStatus.BLOCK_NOT_FOUND and tier.remove(V, []) == ApplyStatus.OK


def test_stores_that_rename_or_move_a_block_keep_one_edge_per_hash():
    tier = LowerTierIndexer()
    tier.store(W, None, [10, 11], LOCAL[:2])
    tier.store(W, None, [10, 99], LOCAL[:2])  # the engine renamed the second block
    assert tier.continuation(W, ROOT, LOCAL, 0) == (2, 99) and tier.blocks_held(W) == 2
    assert tier.remove(W, [11]) == ApplyStatus.BLOCK_NOT_FOUND
    tier.store(W, 10, [99], [LOCAL[5]])  # hash 99 moves under another local hash
    assert tier.continuation(W, ROOT, LOCAL, 0) == (1, 10) and tier.blocks_held(W) == 2
    assert tier.remove(W, [99, 10]) == ApplyStatus.OK and tier.size == 0


@pytest.mark.parametrize(
    ("parent", "hashes", "local"),
    [(None, [1, 2], LOCAL[:1]), (None, [1, 1], LOCAL[:2]), (2, [1, 2], LOCAL[:2])],
    ids=["lengths differ", "repeated hash", "parent in its own chain"],
)
def test_invalid_stores_change_nothing(parent, hashes, local):
    tier = LowerTierIndexer()
    assert tier.store(W, parent, hashes, local) == ApplyStatus.INVALID_BLOCK
    assert tier.size == 0


def test_clear_drops_one_rank_and_remove_worker_every_rank_of_an_instance():
    tier = LowerTierIndexer()
    for rank in (W, (1, 1), V):
        tier.store(rank, None, names(rank[0], 0, 3), LOCAL[:3])
    tier.clear((1, 1))
    assert tier.blocks_per_worker() == {W: 3, V: 3}
    tier.store((1, 1), None, [5], LOCAL[:1])
    tier.remove_worker(1)
    assert tier.blocks_per_worker() == {V: 3}
    assert tier.continuation(W, ROOT, LOCAL, 0) == (0, ROOT)


# ------------------------------------------------------------------------- the tiered lookup


def device_holding(*held: tuple[tuple[int, int], int, int]) -> RadixIndexer:
    """A device index where each (rank, salt, n) holds TOKENS' first n blocks, named
    ``salt * 1000 + i``."""
    device = radix_indexer()
    for rank, salt, n in held:
        device.store(rank, None, names(salt, 0, n), LOCAL[:n])
    return device


def test_each_tier_continues_where_the_one_above_stopped():
    device = device_holding((W, 1, 3), (V, 2, 2))
    tiers = LowerTierIndexes()
    host, disk, external = (
        tiers.by_tier[t] for t in (StorageTier.HOST_PINNED, StorageTier.DISK, StorageTier.EXTERNAL)
    )
    host.store(W, 1002, names(1, 3, 5), LOCAL[3:5])  # W: device 0-2, host 3-4
    disk.store(W, 1004, names(1, 5, 7), LOCAL[5:7])  # disk 5-6
    external.store(W, 1006, names(1, 7, 8), LOCAL[7:8])  # external 7
    disk.store(V, 2001, names(2, 2, 4), LOCAL[2:4])  # V: device 0-1, no host, disk 2-3
    host.store(V, 2005, names(2, 6, 9), LOCAL[6:9])  # not after V's match: never reached
    scores = device.find_matches(LOCAL, SEQ)
    assert scores == {W: 3, V: 2}
    assert tiers.hits(device, LOCAL, SEQ, scores) == {W: TierHits(2, 3), V: TierHits(0, 2)}


def test_a_rank_with_nothing_on_device_walks_its_tiers_from_the_start_of_the_prompt():
    device = device_holding((V, 2, 1))
    tiers = LowerTierIndexes()
    tiers.by_tier[StorageTier.HOST_PINNED].store(W, None, names(1, 0, 4), LOCAL[:4])
    tiers.by_tier[StorageTier.HOST_PINNED].store(V, None, names(2, 0, 4), LOCAL[:4])
    scores = device.find_matches(LOCAL, SEQ)
    # V's host copy of block 0 is not counted again: its walk starts after its device block
    assert tiers.hits(device, LOCAL, SEQ, scores) == {W: TierHits(4, 0), V: TierHits(3, 0)}


def test_the_walk_follows_the_name_each_engine_gives_its_device_blocks():
    device = device_holding((W, 1, 2))
    device.store(V, None, names(2, 0, 2), LOCAL[:2])  # same node, V's own engine hashes (aliases)
    tiers = LowerTierIndexes()
    tiers.by_tier[StorageTier.HOST_PINNED].store(V, 2001, names(2, 2, 3), LOCAL[2:3])
    tiers.by_tier[StorageTier.HOST_PINNED].store(W, 2001, names(1, 2, 3), LOCAL[2:3])  # after V's name
    scores = device.find_matches(LOCAL, SEQ)
    assert scores == {W: 2, V: 2}
    assert tiers.hits(device, LOCAL, SEQ, scores) == {V: TierHits(1, 0)}


def test_no_lower_tier_blocks_means_no_hits_and_an_empty_index():
    device = device_holding((W, 1, 3))
    tiers = LowerTierIndexes()
    assert tiers.empty() and tiers.hits(device, LOCAL, SEQ, device.find_matches(LOCAL, SEQ)) == {}
    tiers.by_tier[StorageTier.DISK].store(W, None, [1], LOCAL[5:6])  # not a continuation
    assert not tiers.empty() and tiers.hits(device, LOCAL, SEQ, {W: 3}) == {}


def test_a_device_match_the_device_index_cannot_name_anchors_no_walk():
    device = device_holding((W, 1, 2))
    tiers = LowerTierIndexes()
    tiers.by_tier[StorageTier.HOST_PINNED].store(W, 1003, names(1, 4, 5), LOCAL[4:5])
    # a score from elsewhere (a side index) claims 4 blocks W's device index does not hold
    assert tiers.hits(device, LOCAL, SEQ, {W: 4}) == {}


def test_device_blocks_hash_names_by_worker():
    device = device_holding((W, 1, 3))
    device.store(V, None, [7, 8], LOCAL[:2])
    assert device.block_hash_of(W, SEQ[2]) == 1002 and device.block_hash_of(V, SEQ[1]) == 8
    assert device.block_hash_of(V, SEQ[2]) is None and device.block_hash_of((9, 0), SEQ[0]) is None
    assert device.block_hash_of(W, 12345) is None


# ------------------------------------------------------------------------- fed by events


def test_events_reach_their_tier_and_departure_drops_every_tier():
    metrics = KvEventMetrics(CollectorRegistry())
    device = radix_indexer()
    tiers = LowerTierIndexes()
    indexers = TieredIndexers(device, metrics)
    indexers.add_lower_tiers(tiers.writers())
    converter = BatchConverter(1, BS, metrics)
    events = [
        BlockStored(names(1, 0, 2), None, TOKENS[:8], BS),  # device (GPU by default)
        BlockStored(names(1, 2, 4), 1001, TOKENS[8:16], BS, None, "CPU"),  # vLLM's CPU offload
        BlockStored(names(1, 4, 5), 1003, TOKENS[16:20], BS, None, "STORAGE"),  # vLLM's storage
        BlockStored(names(1, 5, 6), 1004, TOKENS[20:24], BS, None, "EXTERNAL"),
    ]
    assert apply_event_batch(KvEventBatch(1.0, events), converter, indexers) == ["ok"] * 4
    scores = device.find_matches(LOCAL, SEQ)
    assert tiers.hits(device, LOCAL, SEQ, scores) == {W: TierHits(2, 2)}
    apply_event_batch(KvEventBatch(2.0, [BlockRemoved([1003], "CPU")]), converter, indexers)
    assert tiers.hits(device, LOCAL, SEQ, scores) == {W: TierHits(1, 0)}
    indexers.remove_worker(1)
    assert tiers.empty() and device.find_matches(LOCAL, SEQ) == {}
