from __future__ import annotations

import random
import shutil

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dyn.core.bench import trace
from dyn.core.kv import hashing, indexer_c
from dyn.core.kv.hashing import sequence_hashes
from dyn.core.kv.indexer import ApplyStatus, DumpedBlock, RadixIndexer, best_implementation, radix_indexer
from dyn.core.kv.indexer_c import CRadixIndexer
from dyn.core.kv.indexer_py import PyRadixIndexer
from dyn.core.router import block_refs

W1, W2, W3 = (1, 0), (2, 0), (2, 1)

NO_C = pytest.mark.skipif(not indexer_c.built, reason="the C extension was not built")
TREES = [PyRadixIndexer, pytest.param(CRadixIndexer, marks=NO_C)]
"""Both trees answer every test here, and the same way."""


@pytest.fixture(params=TREES, ids=["python", "c"])
def Index(request) -> type[RadixIndexer]:
    return request.param


@pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler here: the install skips the extensions")
def test_an_install_with_a_compiler_builds_every_c_extension():
    """setup.py marks them optional, so a broken C file would only show as skipped tests."""
    assert indexer_c.built and hashing._native is not None
    assert block_refs.BlockRefs is not block_refs.DictBlockRefs and trace._mt is not None


def test_radix_indexer_makes_the_c_tree_where_it_was_built():
    assert type(radix_indexer()) is best_implementation()
    assert best_implementation() is (CRadixIndexer if indexer_c.built else PyRadixIndexer)


def matches(index: RadixIndexer, local: list[int]) -> dict:
    """Both query paths (by sequence hash and by walking local hashes) must agree."""
    fast = index.find_matches(local, sequence_hashes(local))
    walked = index.find_matches(local)
    assert fast == walked
    return fast


def chain(index: RadixIndexer, worker, locals_, parent=None, base=0):
    """Store a chain whose engine hashes are base + position."""
    blocks = [base + i for i in range(len(locals_))]
    return index.store(worker, parent, blocks, locals_)


# ----------------------------------------------------------------------------------- store


def test_store_then_match_counts_contiguous_blocks_per_worker(Index):
    index = Index()
    assert chain(index, W1, [1, 2, 3, 4], base=100) is ApplyStatus.OK
    assert chain(index, W2, [1, 2], base=200) is ApplyStatus.OK
    assert matches(index, [1, 2, 3, 4, 5]) == {W1: 4, W2: 2}
    assert matches(index, [1, 2, 9]) == {W1: 2, W2: 2}
    assert matches(index, [9, 1]) == {}
    assert matches(index, []) == {}
    assert index.size == 6
    assert index.blocks_per_worker() == {W1: 4, W2: 2}


def test_store_under_a_parent_extends_that_workers_chain(Index):
    index = Index()
    chain(index, W1, [1, 2], base=100)
    assert index.store(W1, 101, [102, 103], [3, 4]) is ApplyStatus.OK
    assert matches(index, [1, 2, 3, 4]) == {W1: 4}


def test_parent_must_be_held_by_the_same_rank(Index):
    index = Index()
    chain(index, W2, [1, 2], base=100)
    # W3 is another dp rank of the same instance: its lookup is its own
    assert index.store(W3, 101, [102], [3]) is ApplyStatus.PARENT_BLOCK_NOT_FOUND
    assert index.store(W1, 999, [102], [3]) is ApplyStatus.PARENT_BLOCK_NOT_FOUND
    assert index.size == 2 and W3 not in index.workers()
    assert matches(index, [1, 2, 3]) == {W2: 2}


def test_invalid_events_change_nothing(Index):
    index = Index()
    chain(index, W1, [1], base=100)
    assert index.store(W1, None, [5, 6], [1]) is ApplyStatus.INVALID_BLOCK
    assert index.store(W1, None, [5, 5], [1, 2]) is ApplyStatus.INVALID_BLOCK
    assert index.store(W1, 100, [100], [2]) is ApplyStatus.INVALID_BLOCK
    assert index.size == 1
    assert matches(index, [1, 2]) == {W1: 1}


def test_dp_ranks_are_separate_workers(Index):
    index = Index()
    chain(index, W2, [1, 2, 3], base=100)
    chain(index, W3, [1], base=100)
    assert matches(index, [1, 2, 3]) == {W2: 3, W3: 1}


def test_a_block_hash_stored_again_elsewhere_moves(Index):
    index = Index()
    chain(index, W1, [1, 2], base=100)
    assert index.store(W1, None, [101], [7]) is ApplyStatus.OK  # 101 now names the block [7]
    assert index.blocks_per_worker() == {W1: 2}
    assert matches(index, [1, 2]) == {W1: 1}
    assert matches(index, [7]) == {W1: 1}


def test_moving_a_parent_and_child_away_leaves_a_correct_hole(Index):
    index = Index()
    chain(index, W1, [1, 2], base=100)  # A=[1] (100), B=[1,2] (101)
    index.store(W1, 100, [102], [3])  # C=[1,3] (102)
    chain(index, W2, [1], base=200)  # W2 holds A only
    assert index.store(W1, None, [100, 101], [5, 6]) is ApplyStatus.OK  # A and B move away
    assert matches(index, [1, 3]) == {W2: 1}  # W1 still holds C but no longer A
    assert matches(index, [5, 6]) == {W1: 2}
    assert matches(index, [1, 2]) == {W2: 1}


# ---------------------------------------------------------------------------------- remove


def test_remove_leaf_and_missing_hashes(Index):
    index = Index()
    chain(index, W1, [1, 2, 3], base=100)
    chain(index, W2, [1, 2, 3], base=200)
    assert index.remove(W1, [102]) is ApplyStatus.OK
    assert matches(index, [1, 2, 3]) == {W1: 2, W2: 3}
    assert index.remove(W1, [999, 101]) is ApplyStatus.BLOCK_NOT_FOUND  # 101 still applied
    assert matches(index, [1, 2, 3]) == {W1: 1, W2: 3}
    assert index.remove((9, 0), [1]) is ApplyStatus.BLOCK_NOT_FOUND


def test_remove_in_the_middle_ends_that_workers_match_there(Index):
    index = Index()
    chain(index, W1, [1, 2, 3, 4, 5, 6], base=100)
    chain(index, W2, [1, 2, 3, 4, 5, 6], base=200)
    assert index.remove(W1, [102]) is ApplyStatus.OK  # a hole: W1 keeps blocks 4..6
    assert matches(index, [1, 2, 3, 4, 5, 6]) == {W1: 2, W2: 6}
    assert matches(index, [1, 2]) == {W1: 2, W2: 2}
    assert index.store(W1, 101, [102], [3]) is ApplyStatus.OK  # the hole is filled again
    assert matches(index, [1, 2, 3, 4, 5, 6]) == {W1: 6, W2: 6}


def test_a_hole_closes_when_the_blocks_below_it_go(Index):
    index = Index()
    chain(index, W1, [1, 2, 3, 4], base=100)
    chain(index, W2, [1, 2], base=200)
    index.remove(W1, [101])
    assert len(index.hole_counts()) == 1  # W1 now answers on the slow path
    index.remove(W1, [103])
    index.remove(W1, [102])  # a leaf W2 does not hold either: unlinked
    assert index.hole_counts() == {}
    assert matches(index, [1, 2, 3, 4]) == {W1: 1, W2: 2}


def test_a_node_nobody_holds_drops_its_subtree(Index):
    index = Index()
    chain(index, W1, [1, 2, 3], base=100)
    chain(index, W2, [1, 2, 3], base=200)
    index.remove(W1, [101])
    index.remove(W2, [201])  # block 2 is now held by nobody: block 3 goes with it
    assert matches(index, [1, 2, 3]) == {W1: 1, W2: 1}
    assert index.blocks_per_worker() == {W1: 1, W2: 1}
    assert index.depth_histogram() == {1: 1}
    assert index.remove(W1, [102]) is ApplyStatus.BLOCK_NOT_FOUND
    assert index.store(W1, 102, [103], [4]) is ApplyStatus.PARENT_BLOCK_NOT_FOUND


def test_clear_keeps_the_worker_known_and_remove_worker_forgets_every_rank(Index):
    index = Index()
    chain(index, W1, [1, 2], base=100)
    chain(index, W2, [1, 2], base=200)
    chain(index, W3, [1, 5], base=300)
    index.clear(W1)
    assert matches(index, [1, 2]) == {W2: 2, W3: 1}
    assert index.blocks_per_worker() == {W1: 0, W2: 2, W3: 2}
    index.remove_worker(2)
    assert index.workers() == [W1]
    assert matches(index, [1, 2]) == {} and matches(index, [1, 5]) == {}
    assert index.size == 0 and index.depth_histogram() == {}


def test_remove_rank_forgets_one_rank_and_keeps_the_instances_others(Index):
    index = Index()
    chain(index, W2, [1, 2], base=200)
    chain(index, W3, [1, 5], base=300)
    index.remove_rank(W3)
    index.remove_rank(W3)  # twice: nothing left to forget
    assert index.workers() == [W2] and index.blocks_per_worker() == {W2: 2}
    assert matches(index, [1, 5]) == {W2: 1}
    chain(index, W3, [1, 5], base=400)  # known anew, from nothing
    assert matches(index, [1, 5]) == {W2: 1, W3: 2}


# ------------------------------------------------------------------------------ inspection


def test_each_worker_keeps_its_own_names_for_shared_blocks(Index):
    """The index keeps one block hash per node plus per-worker aliases: every worker's own names
    must still resolve in removes, parents, renames and the dump, and beyond 8 worker ids."""
    index = Index()
    workers = [(i, 0) for i in range(12)]
    for i, w in enumerate(workers):
        base = 100 if i % 2 else 1000 * (i + 1)  # odd workers share the first one's names
        assert chain(index, w, [1, 2, 3], base=base) is ApplyStatus.OK
    assert matches(index, [1, 2, 3]) == {w: 3 for w in workers}
    dumped = {(b.worker, b.block_hash) for b in index.dump()}
    assert ((0, 0), 1001) in dumped and ((11, 0), 102) in dumped and ((10, 0), 11002) in dumped
    # a child under each worker's own parent name; another worker's name is not a parent
    assert index.store((10, 0), 11002, [11003], [4]) is ApplyStatus.OK
    assert index.store((10, 0), 102, [11004], [5]) is ApplyStatus.PARENT_BLOCK_NOT_FOUND
    # removing by a name another worker uses for the same node removes nothing of this worker
    assert index.remove((0, 0), [101]) is ApplyStatus.BLOCK_NOT_FOUND
    assert index.remove((0, 0), [1001]) is ApplyStatus.OK
    assert matches(index, [1, 2, 3, 4])[(0, 0)] == 1  # it lost its second block
    assert matches(index, [1, 2, 3, 4])[(10, 0)] == 4
    # a rename: worker 10 calls its second block 77 now; the old name is gone
    assert index.store((10, 0), 11000, [77], [2]) is ApplyStatus.OK
    assert index.remove((10, 0), [11001]) is ApplyStatus.BLOCK_NOT_FOUND
    assert index.remove((10, 0), [77]) is ApplyStatus.OK
    assert matches(index, [1, 2, 3, 4])[(10, 0)] == 1
    assert index.blocks_per_worker()[(10, 0)] == 3  # 11000, 11002, 11003
    index.remove_worker(10)
    copy = Index()
    for b in index.dump():
        copy.store(b.worker, b.parent_hash, [b.block_hash], [b.local_hash])
    assert matches(copy, [1, 2, 3]) == matches(index, [1, 2, 3])


def test_dump_is_breadth_first_with_parents_first_and_round_trips(Index):
    index = Index()
    chain(index, W1, [1, 2, 3], base=100)
    chain(index, W2, [1, 4], base=200)
    dumped = index.dump()
    assert len(dumped) == index.size == 5
    seen: set = set()
    for block in dumped:
        assert block.parent_hash is None or (block.worker, block.parent_hash) in seen
        seen.add((block.worker, block.block_hash))
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(dumped), type=list[DumpedBlock])
    copy = Index()
    for block in wire:
        assert (
            copy.store(block.worker, block.parent_hash, [block.block_hash], [block.local_hash])
            is ApplyStatus.OK
        )
    for query in ([1, 2, 3], [1, 4], [1], [2]):
        assert matches(copy, query) == matches(index, query)
    assert index.depth_histogram() == {1: 1, 2: 2, 3: 1}


# -------------------------------------------------------------- property: brute-force model


class Model:
    """Entries as (worker -> block hash -> path of local hashes); answers by brute force."""

    def __init__(self) -> None:
        self.lookup: dict[tuple[int, int], dict[int, tuple[int, ...]]] = {}

    def held(self, path: tuple[int, ...]) -> bool:
        return any(path in entries.values() for entries in self.lookup.values())

    def drop_below(self, path: tuple[int, ...]) -> None:
        n = len(path)
        for entries in self.lookup.values():
            for block in [b for b, p in entries.items() if len(p) > n and p[:n] == path]:
                del entries[block]

    def store(self, worker, parent, blocks, locals_) -> ApplyStatus:
        if len(blocks) != len(locals_) or len(set(blocks)) != len(blocks) or parent in blocks:
            return ApplyStatus.INVALID_BLOCK
        entries = self.lookup.get(worker)
        if parent is None:
            base: tuple[int, ...] = ()
        elif entries is None or parent not in entries:
            return ApplyStatus.PARENT_BLOCK_NOT_FOUND
        else:
            base = entries[parent]
        entries = self.lookup.setdefault(worker, {})
        displaced = []
        for i, block in enumerate(blocks):
            path = base + tuple(locals_[: i + 1])
            current = [b for b, p in entries.items() if p == path]
            if current == [block]:
                continue
            if current:
                del entries[current[0]]
            if block in entries:
                displaced.append(entries[block])
            entries[block] = path
        for path in displaced:
            if not self.held(path):
                self.drop_below(path)
        return ApplyStatus.OK

    def remove(self, worker, blocks) -> ApplyStatus:
        entries = self.lookup.get(worker)
        if entries is None:
            return ApplyStatus.BLOCK_NOT_FOUND if blocks else ApplyStatus.OK
        missing = False
        for block in blocks:
            path = entries.pop(block, None)
            if path is None:
                missing = True
            elif not self.held(path):
                self.drop_below(path)
        return ApplyStatus.BLOCK_NOT_FOUND if missing else ApplyStatus.OK

    def clear(self, worker) -> None:
        self.remove(worker, list(self.lookup.get(worker, {})))
        self.lookup.setdefault(worker, {})

    def remove_worker(self, instance_id) -> None:
        for worker in [w for w in self.lookup if w[0] == instance_id]:
            self.clear(worker)
            del self.lookup[worker]

    def find_matches(self, local) -> dict:
        scores = {}
        for worker, entries in self.lookup.items():
            paths = set(entries.values())
            depth = 0
            while depth < len(local) and tuple(local[: depth + 1]) in paths:
                depth += 1
            if depth:
                scores[worker] = depth
        return scores

    def paths(self) -> set[tuple[int, ...]]:
        return {p for entries in self.lookup.values() for p in entries.values()}


WORKERS = st.sampled_from([(1, 0), (2, 0), (2, 1), (3, 0)])
LOCALS = st.integers(1, 3)
BLOCKS = st.integers(100, 130)


class IndexerMachine(RuleBasedStateMachine):
    tree: type[RadixIndexer] = PyRadixIndexer

    def __init__(self) -> None:
        super().__init__()
        self.index = self.tree()
        self.model = Model()

    @rule(data=st.data(), worker=WORKERS, locals_=st.lists(LOCALS, max_size=7))
    def store_chain(self, data, worker, locals_):
        held = sorted(self.model.lookup.get(worker, {}))
        parent = data.draw(st.sampled_from([None, *held]) if held else st.none())
        start = data.draw(BLOCKS)
        blocks = [start + 40 * i for i in range(len(locals_))]  # fresh names, chained
        assert self.index.store(worker, parent, blocks, locals_) == self.model.store(
            worker, parent, blocks, locals_
        )

    @rule(worker=WORKERS, parent=st.none() | BLOCKS, pairs=st.lists(st.tuples(BLOCKS, LOCALS), max_size=4))
    def store_anything(self, worker, parent, pairs):
        blocks = [b for b, _ in pairs]
        locals_ = [h for _, h in pairs]
        assert self.index.store(worker, parent, blocks, locals_) == self.model.store(
            worker, parent, blocks, locals_
        )

    @rule(data=st.data(), worker=WORKERS)
    def remove_held(self, data, worker):
        held = sorted(self.model.lookup.get(worker, {}))
        picked = data.draw(st.lists(st.sampled_from(held), max_size=3, unique=True)) if held else []
        extra = data.draw(st.lists(BLOCKS, max_size=1))
        blocks = picked + extra
        assert self.index.remove(worker, blocks) == self.model.remove(worker, blocks)

    @rule(worker=WORKERS)
    def clear(self, worker):
        self.index.clear(worker)
        self.model.clear(worker)

    @rule(instance=st.integers(1, 3))
    def remove_worker(self, instance):
        self.index.remove_worker(instance)
        self.model.remove_worker(instance)

    @rule(query=st.lists(LOCALS, max_size=10))
    def random_query(self, query):
        assert matches(self.index, query) == self.model.find_matches(query)

    @invariant()
    def every_held_path_answers_like_the_model(self):
        for path in self.model.paths():
            query = list(path) + [9]
            assert matches(self.index, query) == self.model.find_matches(query)
        assert self.index.blocks_per_worker() == {w: len(e) for w, e in self.model.lookup.items()}
        assert self.index.size == sum(len(e) for e in self.model.lookup.values())

    @invariant()
    def holes_are_tracked_exactly(self):
        """A worker missing from a node whose child it holds is a "hole" (its slow path); the
        index must know every one, with how many such children, and no others."""
        expected = {}
        for worker, entries in self.model.lookup.items():
            paths = set(entries.values())
            for path in paths:
                if len(path) > 1 and path[:-1] not in paths:
                    key = (worker, sequence_hashes(list(path[:-1]))[-1])
                    expected[key] = expected.get(key, 0) + 1
        assert self.index.hole_counts() == expected

    @rule()
    def dump_round_trip(self):
        copy = self.tree()
        for block in self.index.dump():
            copy.store(block.worker, block.parent_hash, [block.block_hash], [block.local_hash])
        for path in self.model.paths():
            assert matches(copy, list(path)) == matches(self.index, list(path))


class CIndexerMachine(IndexerMachine):
    tree = CRadixIndexer


_MACHINE = settings(
    max_examples=150, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
IndexerMachine.TestCase.settings = CIndexerMachine.TestCase.settings = _MACHINE
TestPythonTreeAgainstModel = IndexerMachine.TestCase
TestCTreeAgainstModel = NO_C(CIndexerMachine.TestCase)


# ------------------------------------------------------------ the two trees, side by side


@NO_C
@pytest.mark.parametrize("seed", range(6))
def test_the_c_tree_answers_as_the_python_tree_over_many_workers(seed):
    """Seeded random events over 70 workers (holder sets past one 64-bit word), with shared and
    own block names, renames, removes in the middle (holes), clears and forgotten instances: after
    every step both trees give the same answers, pieces, holes, dump and sizes."""
    rng = random.Random(seed)
    py, c = PyRadixIndexer(), CRadixIndexer()
    workers = [(i // 2, i % 2) for i in range(70)]
    paths = [[rng.randrange(1, 4) for _ in range(rng.randrange(1, 12))] for _ in range(40)]
    for i, worker in enumerate(workers):  # every worker gets an id first: ids past 64 in use
        first = [rng.choice(paths)[0]]
        assert py.store(worker, None, [i], first) == c.store(worker, None, [i], first)
    holes = wide = 0
    for step in range(400):
        worker = rng.choice(workers)
        roll = rng.random()
        held = sorted(py._lookup.get(py._ids.get(worker, -1), {}))
        if roll < 0.55:
            path = rng.choice(paths)
            start = rng.randrange(len(path))
            parent = rng.choice(held) if held and start else None
            shared = rng.random() < 0.5  # a name every worker uses for this block, or its own
            blocks = [
                (hash((tuple(path[: i + 1]),)) if shared else rng.getrandbits(64)) & (2**64 - 1)
                for i in range(start, len(path))
            ]
            args = (worker, parent, blocks, path[start:])
            assert py.store(*args) == c.store(*args), step
        elif roll < 0.85:
            if rng.random() < 0.8:  # mostly the deepest blocks, as engines evict: few holes
                lookup = py._lookup[py._ids[worker]] if held else {}
                held.sort(key=lambda b: -py._depth(lookup[b]))
                blocks = held[: rng.randrange(1, 4)]
            else:
                blocks = rng.sample(held, min(len(held), rng.randrange(1, 4)))
            blocks += [rng.getrandbits(64)] * (roll > 0.8)
            assert py.remove(worker, blocks) == c.remove(worker, blocks), step
        elif roll < 0.95 or step % 40 == 39:  # and now and then every worker with holes: the fast path
            for key in {worker} | ({k for k, _ in py.hole_counts()} if step % 40 == 39 else set()):
                py.clear(key)
                c.clear(key)
        else:
            py.remove_worker(worker[0])
            c.remove_worker(worker[0])
        for path in paths[:10]:
            seqs = sequence_hashes(path)
            assert py.find_matches(path, seqs) == c.find_matches(path, seqs) == c.find_matches(path), step
            assert py.match_pieces(seqs) == c.match_pieces(seqs), step
        assert py.hole_counts() == c.hole_counts(), step
        assert py.blocks_per_worker() == c.blocks_per_worker() and py.size == c.size, step
        holes += bool(py.hole_counts())
        wide += any(mask >> 64 for p in paths[:10] for _, mask in py.match_pieces(sequence_hashes(p)) or ())
    assert holes and wide, (holes, wide)  # the slow path and holder sets of two words were both exercised
    assert sorted(py.dump(), key=repr) == sorted(c.dump(), key=repr)
    assert py.depth_histogram() == c.depth_histogram()
