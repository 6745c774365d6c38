"""The inspector's arithmetic against a known index state: what the views answer, turned into
per-worker blocks, occupancy, tree size, depth histogram and a request's overlap."""

from __future__ import annotations

import random

import msgspec
import pytest

from dyn.core.inspect.snapshot import (
    DepthBucket,
    Dump,
    DumpEvent,
    KvSnapshot,
    WorkerEntry,
    depth_buckets,
    entry_depths,
    overlap,
    snapshot_json,
    tree_stats,
    worker_caches,
)
from dyn.core.kv.hashing import block_hashes
from dyn.core.kv.views import dump_body, overlap_body, workers_body
from tests.core.inspect.index_state import (
    B1,
    BS,
    BUCKETS,
    ENTRIES,
    MODEL,
    NODES,
    TOKENS,
    A,
    B,
    C,
    D,
    view,
)


def dumped() -> Dump:
    return msgspec.convert(dump_body(view())[MODEL], Dump)


def entries() -> list[WorkerEntry]:
    return msgspec.convert(workers_body(view()), list[WorkerEntry])


def test_tree_counts_shared_prefixes_once_and_buckets_entries_by_depth():
    stats, deepest = tree_stats(dumped())
    assert (stats.nodes, stats.entries, stats.max_depth) == (NODES, ENTRIES, 6)
    assert [(b.min_depth, b.max_depth, b.blocks) for b in stats.depth_histogram] == BUCKETS
    assert deepest == {A: 6, B: 2, B1: 4, C: 3}


def test_depths_do_not_depend_on_the_order_of_the_dump():
    events = dumped().events
    shuffled = events[:]
    random.Random(7).shuffle(shuffled)
    assert entry_depths(shuffled) == entry_depths(events)


def test_an_entry_whose_parent_is_missing_starts_a_chain_of_its_own():
    events = [
        DumpEvent(1, 0, None, 10, 100),
        DumpEvent(1, 0, 10, 11, 101),
        DumpEvent(2, 0, 99, 20, 101),
    ]  # worker 2's parent 99 is not in the dump
    depths, nodes = entry_depths(events)
    assert depths == {((1, 0), 10): 1, ((1, 0), 11): 2, ((2, 0), 20): 1}
    assert nodes == 3  # the orphan's content hash equals block 11's, but not its path


def test_a_parent_cycle_ends_instead_of_looping():
    depths, nodes = entry_depths([DumpEvent(1, 0, 11, 10, 100), DumpEvent(1, 0, 10, 11, 101)])
    assert sorted(depths.values()) == [1, 2] and nodes == 2


@pytest.mark.parametrize(
    ("depths", "buckets"),
    [
        ([], []),
        ([1, 1, 2, 3, 4, 8, 15, 16], [(1, 1, 2), (2, 3, 2), (4, 7, 1), (8, 15, 2), (16, 31, 1)]),
        ([1000], [(512, 1023, 1)]),
    ],
)
def test_depth_buckets_are_powers_of_two(depths, buckets):
    assert depth_buckets(depths) == [DepthBucket(*b) for b in buckets]


def test_workers_show_blocks_and_occupancy_where_the_capacity_is_known():
    _, deepest = tree_stats(dumped())
    caches = {(w.instance_id, w.dp_rank): w for w in worker_caches(entries(), deepest)}
    assert list(caches) == [A, B, B1, C, D]
    assert [caches[k].blocks for k in caches] == [6, 2, 4, 3, 0]
    assert caches[A].total_blocks == 100 and caches[A].occupancy == pytest.approx(0.06)
    assert caches[B].occupancy == pytest.approx(0.25)
    assert caches[B1].total_blocks is None and caches[B1].occupancy is None
    assert caches[D].occupancy == 0.0 and caches[D].endpoint == "tcp://d:4"
    assert caches[D].max_depth == 0 and caches[B1].max_depth == 4
    assert worker_caches(entries())[0].max_depth is None  # no dump read


def test_overlap_lists_every_worker_best_first_with_its_share_of_the_prompt():
    prompt = TOKENS + [1, 2]  # 26 tokens, 6 full blocks
    local = block_hashes(prompt, BS)
    answer = msgspec.json.decode(msgspec.json.encode(overlap_body(view().find_matches(local), BS)))
    result = overlap(answer, len(prompt), worker_caches(entries()))
    assert (result.prompt_tokens, result.prompt_blocks, result.block_size) == (26, 6, BS)
    rows = [((w.instance_id, w.dp_rank), w.matched_blocks, w.matched_tokens) for w in result.workers]
    assert rows == [(A, 6, 24), (B1, 4, 16), (B, 2, 8), (C, 0, 0), (D, 0, 0)]
    assert result.workers[0].share == pytest.approx(24 / 26)
    assert result.workers[-1].share == 0.0


def test_json_holds_every_documented_field():
    stats, deepest = tree_stats(dumped())
    workers = worker_caches(entries(), deepest)
    snapshot = KvSnapshot(
        target="http://x",
        model=MODEL,
        block_size=BS,
        workers=workers,
        cached_blocks=sum(w.blocks for w in workers),
        tree=stats,
    )
    data = msgspec.json.decode(snapshot_json(snapshot))
    assert set(data) == {
        "target",
        "model",
        "block_size",
        "workers",
        "cached_blocks",
        "tree",
        "hit_rate",
        "events",
        "overlap",
    }
    assert set(data["workers"][0]) == {
        "instance_id",
        "dp_rank",
        "blocks",
        "total_blocks",
        "occupancy",
        "max_depth",
        "endpoint",
    }
    assert set(data["tree"]) == {"nodes", "entries", "max_depth", "depth_histogram"}
    assert data["tree"]["depth_histogram"][0] == {"min_depth": 1, "max_depth": 1, "blocks": 4}
    assert data["cached_blocks"] == ENTRIES
    assert data["hit_rate"] is None and data["overlap"] is None
