"""``SoleHolders`` (C) and ``DictSoleHolders`` against a plain dict, and ``HolderMap`` on each
against the slots a model says hold each hash."""

from __future__ import annotations

import random

import pytest

from dyn.core.kv.hashing import sequence_hashes
from dyn.core.router import holders
from dyn.core.router.holders import DictSoleHolders, HolderMap, SoleHolders

C_BUILT = SoleHolders is not DictSoleHolders
IMPLEMENTATIONS = [
    DictSoleHolders,
    pytest.param(SoleHolders, marks=pytest.mark.skipif(not C_BUILT, reason="not built")),
]


@pytest.mark.parametrize("kind", IMPLEMENTATIONS, ids=["dict", "c"])
def test_bulk_puts_and_pops_follow_a_dict(kind):
    rng = random.Random(5)
    table, model = kind(), {}
    for _ in range(1500):
        hashes = [rng.getrandbits(64) for _ in range(rng.randrange(0, 20))]
        if model and rng.random() < 0.3:
            hashes += rng.sample(list(model), min(len(model), 5))
        start = rng.randrange(0, len(hashes) + 2)
        if rng.random() < 0.5:
            slot = rng.randrange(1 << 20)
            table.put_all(hashes, start, slot)
            model.update(dict.fromkeys(hashes[start:], slot))
        else:
            table.pop_all(hashes, start)
            for h in hashes[start:]:
                model.pop(h, None)
        assert len(table) == len(model)
        probe = rng.sample(list(model), min(len(model), 8)) + [rng.getrandbits(64)]
        assert [table.get(h) for h in probe] == [model.get(h) for h in probe]
        assert [h in table for h in probe] == [h in model for h in probe]
    h = next(iter(model))
    table.set(h, 7)
    assert table.pop(h) == 7 and table.pop(h, -1) == -1 and h not in table


@pytest.mark.skipif(not C_BUILT, reason="not built")
def test_the_c_table_refuses_what_is_not_a_hash_or_a_slot():
    table = SoleHolders()
    with pytest.raises(TypeError, match="block hash must be an int"):
        table.put_all(["x"], 0, 1)
    with pytest.raises(OverflowError):
        table.put_all([1 << 64], 0, 1)
    with pytest.raises(ValueError, match="start is at least 0"):
        table.put_all([1], -1, 1)
    with pytest.raises(ValueError, match="slot is at least 0 and below"):
        table.set(1, (1 << 32) - 1)
    assert "x" not in table and -1 not in table and len(table) == 0


@pytest.mark.parametrize("kind", IMPLEMENTATIONS, ids=["dict", "c"])
def test_holder_map_follows_the_slots_of_every_booking(kind, monkeypatch):
    monkeypatch.setattr(holders, "SoleHolders", kind)
    rng = random.Random(11)
    chains = [sequence_hashes([rng.getrandbits(32) for _ in range(rng.randrange(1, 24))]) for _ in range(8)]
    held: dict[int, dict[int, int]] = {}  # slot -> hash -> bookings
    booked: list[tuple[int, list[int]]] = []
    hmap = HolderMap()
    for _ in range(1500):
        if booked and rng.random() < 0.45:
            slot, blocks = booked.pop(rng.randrange(len(booked)))
            rank = held[slot]
            for h in blocks:
                rank[h] -= 1
            depth = sum(1 for h in blocks if rank[h] > 0)
            hmap.unhold(blocks, slot, depth)
            for h in blocks:
                if not rank[h]:
                    del rank[h]
        else:
            slot, chain = rng.randrange(70), rng.choice(chains)
            blocks = chain[: rng.randrange(1, len(chain) + 1)]
            rank = held.setdefault(slot, {})
            hmap.hold(blocks, slot, sum(1 for h in blocks if h in rank))
            for h in blocks:
                rank[h] = rank.get(h, 0) + 1
            booked.append((slot, blocks))
        for chain in chains:
            want = [sum(1 << s for s, rank in held.items() if h in rank) for h in chain]
            assert [hmap.held_by(h) for h in chain] == want
            assert [h in hmap for h in chain] == [bool(m) for m in want]
            depths = hmap.prefix_depths(chain, 70)
            for s in range(70):
                assert depths[s] == sum(1 for h in chain if h in held.get(s, {}))
