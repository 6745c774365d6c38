"""``BlockRefs`` (C) and ``DictBlockRefs`` (its fallback) against a plain dict of counts; the
install builds both C tables of ``_block_refs`` (``SoleHolders``: tests/core/router/test_holders.py)."""

from __future__ import annotations

import random
import shutil

import pytest

from dyn.core.router import block_refs, holders
from dyn.core.router.block_refs import BlockRefs, DictBlockRefs

C_BUILT = BlockRefs is not DictBlockRefs
IMPLEMENTATIONS = [
    DictBlockRefs,
    pytest.param(BlockRefs, marks=pytest.mark.skipif(not C_BUILT, reason="not built")),
]


@pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler here: the install skips the extensions")
def test_an_install_with_a_compiler_builds_the_c_tables():
    assert C_BUILT and block_refs.BlockRefs.__module__ == "dyn.core.router._block_refs"
    assert holders.SoleHolders.__module__ == "dyn.core.router._block_refs"


@pytest.mark.parametrize("kind", IMPLEMENTATIONS, ids=["dict", "c"])
def test_counts_follow_a_dict_model_through_random_bookings(kind):
    rng = random.Random(7)
    refs, model = kind(), {}
    chains = [[rng.getrandbits(64) for _ in range(rng.randrange(1, 40))] for _ in range(30)]
    booked = []
    for _ in range(2000):
        if booked and rng.random() < 0.45:
            hashes = booked.pop(rng.randrange(len(booked)))
            refs.remove(hashes)
            for h in hashes:
                if model.get(h, 0) > 1:
                    model[h] -= 1
                else:
                    model.pop(h, None)
        else:
            chain = rng.choice(chains)
            hashes = chain[: rng.randrange(1, len(chain) + 1)]
            refs.add(hashes)
            booked.append(hashes)
            for h in hashes:
                model[h] = model.get(h, 0) + 1
        assert len(refs) == len(model) and bool(refs) == bool(model)
        probe = rng.choice(chains)
        assert [refs.get(h) for h in probe] == [model.get(h) for h in probe]
        assert [h in refs for h in probe] == [h in model for h in probe]
        depth = 0
        while depth < len(probe) and probe[depth] in model:
            depth += 1
        # bisection assumes chained hashes (held prefixes); it agrees where the model is a prefix
        if all(h not in model for h in probe[depth:]):
            assert refs.prefix_depth(probe) == depth


@pytest.mark.parametrize("kind", IMPLEMENTATIONS, ids=["dict", "c"])
def test_set_get_pop_and_removing_what_is_absent(kind):
    refs = kind()
    refs.set(5, 3)
    assert refs.get(5) == 3 and refs.get(6, 0) == 0 and refs.get(6) is None
    refs.remove([5, 6, 2**64 - 1])  # absent hashes are skipped
    assert refs.get(5) == 2
    assert refs.pop(5) == 2 and refs.pop(5, "gone") == "gone" and 5 not in refs
    assert refs.prefix_depth([]) == 0 and refs.prefix_depth([1, 2]) == 0
    refs.add([2**64 - 1, 0])
    assert 2**64 - 1 in refs and 0 in refs and len(refs) == 2


@pytest.mark.skipif(not C_BUILT, reason="not built")
def test_the_c_table_refuses_what_is_not_a_u64_and_keeps_its_counts():
    refs = BlockRefs()
    refs.add([1, 2])
    with pytest.raises(TypeError):
        refs.add([3, "4"])
    with pytest.raises(OverflowError):
        refs.add([-1])
    with pytest.raises(ValueError):
        refs.set(1, 0)
    assert refs.get(1) == 1 and refs.get(3) == 1 and "x" not in refs and -1 not in refs
