"""``RadixIndexer``: the exact prefix index of cached KV blocks, fed by KV events (reference 2.1).

The tree has one node per distinct prefix of local (content) block hashes. A node records which
(worker, dp_rank) pairs hold it and, for each, the engine's own block hash (engines' hashes are
opaque to the router), so ``lookup[worker][block_hash] -> node`` and "worker holds node" are one
and the same fact, kept as a bijection.

Events, as Dynamo applies them:

- ``store`` finds the parent through the worker's own lookup (``PARENT_BLOCK_NOT_FOUND`` when it
  is not there), descends by local hash creating nodes, and adds the worker to every node below
  the parent. An event whose hash lists differ in length, or that repeats a hash (or its parent),
  is ``INVALID_BLOCK``. Rejected events change nothing.
- ``remove`` drops the worker from each named node (missing hashes are skipped and reported as
  ``BLOCK_NOT_FOUND``). A node no worker holds any more is cut off together with its subtree.
- ``clear`` does that for every block of one rank; ``remove_worker`` for every rank of an
  instance, which is then forgotten.

Two deliberate differences from Dynamo's tree, neither visible in ``find_matches``: a cut-off
subtree is forgotten entirely (Dynamo keeps the workers' lookup entries pointing at the orphaned
nodes), and a block hash stored again at another position moves there instead of re-attaching the
old node.

``find_matches`` returns, per (worker, dp_rank), the number of contiguous blocks from the root of
the query that it holds: Dynamo's answer with ``early_exit=False``. It is fast because every
node is also keyed by the router's sequence hash of its path (``hashing.sequence_hashes``), and
because a worker's set of blocks is normally *prefix-closed*: whenever it holds a node it holds
every ancestor. Along one query path the holders then form nested sets, so the deepest matching
node is found by binary search on sequence hashes, and each worker's depth by bisecting between
depths whose holder sets differ: O(log n) probes per distinct answer instead of a walk of n
levels. Only a remove that takes a worker off a node while one of that node's children still
holds it breaks prefix closure; such nodes ("holes") are tracked exactly per worker, and a worker
with holes is bisected only above the first hole on the query path. Without sequence hashes the
query walks the tree by local hash instead. ``match_pieces`` gives the same answer as pieces,
``(depth, holder bitmask)``, which a router scoring a large fleet reads as an array over worker
ids (``pieces_depths``) without building a dict of every holder.

Two trees give these answers, the same ones (tests/core/kv/test_indexer.py runs both against a
brute-force model): ``CRadixIndexer`` (``dyn.core.kv.indexer_c``, in C, tens of bytes per cached
block) and ``PyRadixIndexer`` (``dyn.core.kv.indexer_py``, Python objects, hundreds).
``radix_indexer()`` makes the C tree where its extension was built at install, else the Python
one. Hashes are unsigned 64-bit ints, as KV events arrive normalised (``dyn.core.kv.events``); the
C tree refuses a store of any other value as ``INVALID_BLOCK``.

Single writer: all methods are meant to run on one thread (or one asyncio task).
"""

from __future__ import annotations

import abc
import enum
import functools
from collections.abc import Mapping, Sequence

import msgspec
import numpy as np

WorkerKey = tuple[int, int]
"""(instance_id, dp_rank)."""

OverlapScores = dict[WorkerKey, int]
"""Contiguous matched prefix blocks per worker; a worker that is absent matched 0."""


class ApplyStatus(enum.StrEnum):
    """The outcome of applying one KV event."""

    OK = "ok"
    PARENT_BLOCK_NOT_FOUND = "parent_block_not_found"
    BLOCK_NOT_FOUND = "block_not_found"
    INVALID_BLOCK = "invalid_block"


class DumpedBlock(msgspec.Struct, array_like=True, frozen=True):
    """One (node, worker) entry of a dump; storing it as a one-block event rebuilds the entry."""

    worker: tuple[int, int]
    parent_hash: int | None
    block_hash: int
    local_hash: int


def set_bits(values: np.ndarray, mask: int, value: int) -> None:
    """``values[i] = value`` for every bit ``i`` set in ``mask`` (each ``i < len(values)``)."""
    if mask:
        n = len(values)
        bits = np.unpackbits(
            np.frombuffer(mask.to_bytes((n + 7) // 8, "little"), np.uint8), bitorder="little"
        )
        values[bits[:n].view(bool)] = value


def members(mask: int) -> list[int]:
    """The worker ids whose bits are set in ``mask``, ascending."""
    if mask < 256:
        return _BYTE_MEMBERS[mask]
    out: list[int] = []
    base = 0
    while mask:
        byte = mask & 255
        if byte:
            out.extend(base + w for w in _BYTE_MEMBERS[byte])
        mask >>= 8
        base += 8
    return out


_BYTE_MEMBERS = [[w for w in range(8) if m >> w & 1] for m in range(256)]


def radix_indexer() -> RadixIndexer:
    """A new, empty index on the best tree built here (``best_implementation``)."""
    return best_implementation()()


@functools.cache
def best_implementation() -> type[RadixIndexer]:
    """The C tree where its extension was built at install, else the Python tree."""
    from dyn.core.kv.indexer_c import CRadixIndexer, built  # both modules import this one

    if built:
        return CRadixIndexer
    from dyn.core.kv.indexer_py import PyRadixIndexer

    return PyRadixIndexer


class RadixIndexer(abc.ABC):
    """Exact index of cached blocks per (worker, dp_rank), fed by KV events. Single writer.

    ``radix_indexer()`` makes one on the best tree built here. This class keeps what both trees
    share: the worker ids (a worker's bit in holder masks, its place in ``pieces_depths``), given
    out on a worker's first event and reused once it is forgotten."""

    def __init__(self) -> None:
        self._ids: dict[WorkerKey, int] = {}
        self._keys: list[WorkerKey] = []  # worker id -> key (a forgotten id waits in _free)
        self._free: list[int] = []
        self.generation = 0
        """Counts the changes of ``worker_ids()`` (a worker id given or forgotten)."""

    # ------------------------------------------------------------------------------- events

    def store(
        self,
        worker: WorkerKey,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        local_hashes: Sequence[int],
    ) -> ApplyStatus:
        """Apply a ``Stored`` event: ``block_hashes[i]`` is the engine's hash of the block whose
        content hash is ``local_hashes[i]``, each block the child of the one before, the first
        the child of ``parent_hash`` (``None``: the root)."""
        return self._store(worker, parent_hash, block_hashes, local_hashes, None)

    @abc.abstractmethod
    def _store(
        self,
        worker: WorkerKey,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        local_hashes: Sequence[int],
        seq_hashes: Sequence[int] | None,
    ) -> ApplyStatus:
        """``store``; ``seq_hashes`` (the path's sequence hashes, when the caller has them)
        saves hashing the new nodes."""

    @abc.abstractmethod
    def remove(self, worker: WorkerKey, block_hashes: Sequence[int]) -> ApplyStatus:
        """Apply a ``Removed`` event; hashes the worker does not hold are skipped."""

    @abc.abstractmethod
    def clear(self, worker: WorkerKey) -> None:
        """Apply ``AllBlocksCleared`` for one rank; the rank stays known, with no blocks."""

    def remove_worker(self, instance_id: int) -> None:
        """Forget every dp rank of ``instance_id`` and all their blocks."""
        for key in [key for key in self._ids if key[0] == instance_id]:
            self.remove_rank(key)

    def remove_rank(self, worker: WorkerKey) -> None:
        """Forget one ``(instance_id, dp_rank)`` and its blocks (nothing when it is not known)."""
        if worker not in self._ids:
            return
        self.clear(worker)
        wid = self._ids.pop(worker)
        self._forget(wid)
        self._free.append(wid)
        self.generation += 1

    # ------------------------------------------------------------------------------ queries

    @abc.abstractmethod
    def find_matches(
        self, local_hashes: Sequence[int], seq_hashes: Sequence[int] | None = None
    ) -> OverlapScores:
        """How many leading blocks of the query each worker holds. ``seq_hashes``, when given,
        must be ``sequence_hashes(local_hashes)``; it makes the query O(log n) per answer."""

    @abc.abstractmethod
    def match_pieces(self, seq_hashes: Sequence[int]) -> list[tuple[int, int]] | None:
        """``find_matches(local, seq_hashes)`` as ``(depth, worker-id bitmask)`` pieces, the
        masks disjoint: what ``pieces_scores`` and ``pieces_depths`` read. None while a worker
        has holes (ask ``find_matches``)."""

    def pieces_scores(self, pieces: list[tuple[int, int]]) -> OverlapScores:
        """``match_pieces``' answer as ``find_matches`` gives it."""
        keys = self._keys
        return {keys[w]: d for d, mask in pieces for w in members(mask)}

    def pieces_depths(self, pieces: list[tuple[int, int]], size: int) -> np.ndarray:
        """``match_pieces``' answer as the matched depth of each worker id, in an array of
        ``size`` (at least ``id_count``), zeros elsewhere."""
        depths = np.zeros(size, np.int64)
        for d, mask in pieces:
            set_bits(depths, mask, d)
        return depths

    def worker_ids(self) -> Mapping[WorkerKey, int]:
        """The worker id of each (worker, dp_rank) in the index: the bit of its holder masks
        (``match_pieces``) and its place in ``pieces_depths``; it changes only when
        ``generation`` does."""
        return self._ids

    @property
    def id_count(self) -> int:
        """One more than the largest worker id given out (the size ``pieces_depths`` needs)."""
        return len(self._keys)

    # -------------------------------------------------------------------------- inspection

    @abc.abstractmethod
    def dump(self) -> list[DumpedBlock]:
        """Every (node, worker) entry reachable for its worker, breadth first (parents before
        children); storing each as a one-block event into an empty indexer rebuilds the same
        answers. Entries a worker holds below a node it lacks can never match and are left out."""

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """Total (worker, block) entries."""

    def blocks_per_worker(self) -> dict[WorkerKey, int]:
        return {key: self.blocks_held(key) for key in self._ids}

    @abc.abstractmethod
    def blocks_held(self, worker: WorkerKey) -> int:
        """How many blocks one (worker, dp_rank) holds; 0 for one the index does not know."""

    @abc.abstractmethod
    def block_hash_of(self, worker: WorkerKey, seq_hash: int) -> int | None:
        """The engine's own hash of the block at node ``seq_hash`` (a router sequence hash) as
        ``worker`` names it, or None when the worker does not hold that node: where a walk of the
        worker's lower storage tiers continues from (``dyn.core.kv.tiers``)."""

    def workers(self) -> list[WorkerKey]:
        """Every known (worker, dp_rank), including those cleared down to no blocks."""
        return list(self._ids)

    @abc.abstractmethod
    def depth_histogram(self) -> dict[int, int]:
        """Node depth -> number of nodes at that depth."""

    @abc.abstractmethod
    def hole_counts(self) -> dict[tuple[WorkerKey, int], int]:
        """``(worker, node's sequence hash) -> children held`` for every node a worker lacks
        while it holds one of its children: the holes, which only the slow path scores."""

    @abc.abstractmethod
    def _depth(self, node: int) -> int:
        """The depth of a node (a sequence hash), 0 when it is not in the tree."""

    def _remove_counting(self, worker: WorkerKey, block_hashes: Sequence[int]) -> int:
        """``remove``, returning how many entries went (TTL expiry)."""
        before = self.blocks_held(worker)
        self.remove(worker, block_hashes)
        return before - self.blocks_held(worker)

    # ------------------------------------------------------------------------ worker ids

    def _register(self, worker: WorkerKey) -> int:
        self.generation += 1
        if self._free:
            wid = self._free.pop()
            self._keys[wid] = worker
        else:
            wid = len(self._keys)
            self._keys.append(worker)
        self._ids[worker] = wid
        self._added(wid)
        return wid

    @abc.abstractmethod
    def _added(self, wid: int) -> None:
        """Make room for a worker id just given out."""

    @abc.abstractmethod
    def _forget(self, wid: int) -> None:
        """Drop a cleared worker id's records (it goes back to the free ids)."""
