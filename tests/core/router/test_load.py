"""Active load tracking: block refcounts, prefill FIFO, output block decay, potential loads."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dyn.core.kv.hashing import sequence_hashes
from dyn.core.router.load import ActiveLoad, ActiveSequences, tracking_hashes

W1, W2 = (1, 0), (2, 0)


def chain(*local: int) -> list[int]:
    return sequence_hashes(list(local))


def test_shared_prefix_blocks_count_once_per_worker():
    load = ActiveLoad()
    a, b = chain(1, 2, 3, 4), chain(1, 2, 7)
    load.add_request("a", W1, a, 64, 0, None, True, 0.0)
    load.add_request("b", W1, b, 48, 0, None, True, 0.0)
    assert load.active_decode_blocks(W1) == 5  # 1, 2 shared
    assert load.num_requests(W1) == 2
    load.free("a")
    assert load.active_decode_blocks(W1) == 3
    load.free("a")  # idempotent
    load.free("nobody")
    load.free("b")
    assert load.active_decode_blocks(W1) == 0 and load.num_requests(W1) == 0


def test_without_kv_reuse_tracking_hashes_never_share():
    rng = random.Random(1)
    seq = chain(1, 2, 3)
    assert tracking_hashes(seq, True, rng) == seq
    load = ActiveLoad()
    load.add_request("a", W1, tracking_hashes(seq, False, rng), 48, 0, None, True, 0.0)
    load.add_request("b", W1, tracking_hashes(seq, False, rng), 48, 0, None, True, 0.0)
    assert load.active_decode_blocks(W1) == 6


def test_prefill_tokens_count_uncached_prompt_until_first_token():
    load = ActiveLoad()
    load.add_request("a", W1, chain(1, 2), 40, 16, None, True, 0.0)
    load.add_request("b", W1, chain(3), 20, 50, None, True, 0.0)  # fully cached: skipped
    load.add_request("c", W1, chain(4), 30, 0, None, False, 0.0)  # not tracked
    assert load.active_tokens(W1, 1.0) == 24
    load.add_request("d", W1, chain(5), 100, 0, None, True, 0.0)
    assert load.active_prefill_tokens(W1, 1.0) == 124
    load.mark_prefill_completed("a", now=1.0)
    assert load.active_tokens(W1, 1.0) == 100
    load.mark_prefill_completed("a", now=1.0)
    load.mark_prefill_completed("ghost", now=1.0)
    load.free("d", now=2.0)
    assert load.active_tokens(W1, 2.0) == 0
    assert load.active_decode_blocks(W1) == 4  # b and c still hold blocks


def test_anchor_decays_only_with_a_predicted_duration():
    seqs = ActiveSequences()
    seqs.add_prefill("a", 100, 10.0, now=0.0)
    seqs.add_prefill("b", 50, 10.0, now=2.0)
    assert seqs.active_tokens(0.0) == 150
    assert seqs.active_tokens(5.0) == 50 + 50  # anchor half done
    assert seqs.active_tokens(30.0) == 50  # anchor fully decayed, never negative
    seqs.remove_prefill("a", now=30.0)  # b becomes the anchor now, with a fresh start
    assert seqs.active_tokens(30.0) == 50
    assert seqs.active_tokens(32.5) == 38  # ceil(50 * 0.75)
    static = ActiveSequences()
    static.add_prefill("x", 100, None, now=0.0)
    assert static.active_tokens(1e6) == 100


def test_removing_a_non_anchor_keeps_the_anchor_clock():
    seqs = ActiveSequences()
    seqs.add_prefill("a", 100, 10.0, now=0.0)
    seqs.add_prefill("b", 40, None, now=1.0)
    seqs.remove_prefill("b", now=5.0)
    assert seqs.active_tokens(5.0) == 50


def test_expire_stale_frees_old_bookings():
    load = ActiveLoad()
    load.add_request("old", W1, chain(1), 16, 0, None, True, 0.0)
    load.add_request("new", W2, chain(2), 16, 0, None, True, 250.0)
    assert load.expire_stale(301.0, 300.0) == ["old"]
    assert "old" not in load and "new" in load
    assert load.active_decode_blocks(W1) == 0 and load.active_tokens(W1, 301.0) == 0


def test_output_blocks_grow_and_decay_unshared_blocks():
    load = ActiveLoad(rng=random.Random(3))
    shared = chain(1, 2)
    load.add_request("a", W1, shared + chain(1, 2, 3)[2:], 48, 0, 100, True, 0.0)
    load.add_request("b", W1, shared, 32, 0, None, True, 0.0)
    assert load.active_decode_blocks(W1) == 3
    load.add_output_tokens("a", 10, 16)  # 58 tokens: 4 blocks, one output block
    # a's unshared blocks (block 3 + the output block) count 1 - 10/100 = 0.9 each
    assert load.active_decode_blocks(W1) == round(2 + 2 * 0.9)
    load.add_output_tokens("a", 12, 16)  # same block count: nothing changes
    assert load.active_decode_blocks(W1) == 4
    load.add_output_tokens("a", 90, 16)  # 138 tokens: 9 blocks, decay 0.1 on 7 sole blocks
    assert load.active_decode_blocks(W1) == round(2 + 7 * 0.1)
    load.free("b")  # the shared prefix is still counted whole until the next decay update
    assert load.active_decode_blocks(W1) == round(2 + 7 * 0.1)
    load.free("a")
    assert load.active_decode_blocks(W1) == 0


def test_output_blocks_without_osl_count_fully():
    load = ActiveLoad()
    load.add_request("a", W1, chain(1), 16, 0, None, True, 0.0)
    load.add_output_tokens("a", 1, 16)
    load.add_output_tokens("a", 33, 16)
    assert load.active_decode_blocks(W1) == 4
    load.add_output_tokens("ghost", 5, 16)


def test_decayed_block_counts_whole_once_shared():
    seqs = ActiveSequences()
    seqs.add_blocks([1, 2])
    seqs.set_decay([1, 2], 0.0)
    assert seqs.active_blocks == 0
    seqs.add_blocks([1])
    assert seqs.active_blocks == 1
    seqs.remove_blocks([1, 1, 2])
    assert seqs.active_blocks == 0 and not seqs.refs


def test_potential_loads():
    load = ActiveLoad()
    load.add_worker(W1)
    load.add_worker(W2)
    load.add_request("a", W1, chain(1, 2, 3), 48, 0, None, True, 0.0)
    load.add_request("b", W2, chain(9), 16, 0, None, True, 0.0)
    request = chain(1, 2, 5, 6)
    decode, prefill = load.potential_loads([W1, W2, (3, 0)], request, 70, {W1: 32}, True, 0.0)
    assert decode == {W1: 3 + 4 - 2, W2: 1 + 4, (3, 0): 4}
    assert prefill == {W1: 48 + 70 - 32, W2: 16 + 70, (3, 0): 70}
    decode, prefill = load.potential_loads([W1], request, 70, {W1: 32}, False, 0.0)
    assert prefill == {W1: 0} and decode == {W1: 5}


def test_remove_worker_drops_all_ranks_and_bookings():
    load = ActiveLoad()
    load.add_request("a", (7, 0), chain(1), 16, 0, None, True, 0.0)
    load.add_request("b", (7, 1), chain(2), 16, 0, None, True, 0.0)
    load.add_request("c", W1, chain(3), 16, 0, None, True, 0.0)
    assert sorted(load.remove_worker(7)) == ["a", "b"]
    assert load.workers() == [W1]
    load.free("a")  # a finished stream after its worker left
    assert load.worker_of("c") == W1 and len(load) == 1
    assert load.active_decode_blocks((7, 0)) == 0 and load.num_requests((7, 1)) == 0


def test_rebooking_an_id_replaces_the_old_booking():
    load = ActiveLoad()
    load.add_request("a", W1, chain(1), 16, 0, None, True, 0.0)
    load.add_request("a", W2, chain(2), 32, 0, None, True, 0.0)
    assert load.active_decode_blocks(W1) == 0 and load.active_tokens(W1, 0.0) == 0
    assert load.worker_of("a") == W2 and load.active_tokens(W2, 0.0) == 32


prompts = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=0, max_size=6)


@settings(max_examples=150, deadline=None)
@given(active=prompts, candidate=st.lists(st.integers(0, 3), max_size=14))
def test_prefix_depth_matches_a_linear_scan(active, candidate):
    """Small alphabets force shared prefixes; bisection must agree with walking the prompt."""
    seqs = ActiveSequences()
    for prompt in active:
        seqs.add_blocks(sequence_hashes(prompt))
    hashes = sequence_hashes(candidate)
    expected = 0
    while expected < len(hashes) and hashes[expected] in seqs.refs:
        expected += 1
    assert seqs.prefix_depth(hashes) == expected


def test_holder_masks_give_every_ranks_prefix_depth_as_bisecting_each_rank_does():
    rng = random.Random(3)
    load = ActiveLoad(rng=rng)
    ranks = [(i, r) for i in range(40) for r in range(1 + i % 2)]
    for key in ranks:
        load.add_worker(key)
    prompts = [[rng.getrandbits(64) for _ in range(rng.randint(1, 30))] for _ in range(6)]
    chains = [sequence_hashes(p) for p in prompts]

    def query() -> list[int]:
        chain = rng.choice(chains)
        cut = rng.randint(0, len(chain))
        return chain[:cut] + [rng.getrandbits(64) for _ in range(rng.randint(0, 4))]  # then diverges

    booked: list[str] = []
    for step in range(600):
        if step == 150:
            load.index_holders()  # built from the bookings there are, then kept
        op = rng.random()
        if op < 0.5 or not booked:
            rid = f"r{step}"
            chain = rng.choice(chains)
            load.add_request(rid, rng.choice(ranks), chain[: rng.randint(1, len(chain))], 64, 0, 8, True, 0.0)
            booked.append(rid)
        elif op < 0.85:
            load.free(booked.pop(rng.randrange(len(booked))), now=0.0)
        elif op < 0.95:
            load.add_output_tokens(rng.choice(booked), rng.randint(1, 64), 16)
        else:
            gone = rng.randrange(40)
            for rid in load.remove_worker(gone):
                booked.remove(rid)
            for r in range(1 + gone % 2):
                load.add_worker((gone, r))
        if step >= 150:
            track = query()
            depths = load.prefix_depths(track)
            assert depths is not None
            for key in ranks:
                seqs = load._ranks[key]
                assert depths[load._slots[key]] == seqs.prefix_depth(track), (step, key)
