"""``CRadixIndexer``: the prefix index on the C tree (``dyn.core.kv._radix``, built at install
where a C compiler is found; ``built`` says whether it was). The contract, events and answers are
``dyn.core.kv.indexer``'s, the same as the Python tree's; the C file's header describes its layout.

This class keeps the worker ids (``RadixIndexer``'s registry) and turns the core's answers over
ids into answers over (worker, dp_rank) keys. Every hash must be an unsigned 64-bit int: a store
that carries another value is ``INVALID_BLOCK`` and such a hash in a remove is missing.
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.kv.hashing import XXH3_SEED
from dyn.core.kv.indexer import ApplyStatus, DumpedBlock, OverlapScores, RadixIndexer, WorkerKey

try:
    from dyn.core.kv import _radix
except ImportError:  # built without a C compiler: RadixIndexer() is the Python tree
    _radix = None  # type: ignore[assignment]

built = _radix is not None
"""Whether the C tree was built at install."""

# the core's status numbers, in order; NEW_WORKER: valid, from a worker it does not know yet
_STATUS = (
    ApplyStatus.OK,
    ApplyStatus.PARENT_BLOCK_NOT_FOUND,
    ApplyStatus.BLOCK_NOT_FOUND,
    ApplyStatus.INVALID_BLOCK,
)
_NEW_WORKER = 4
_U64 = (1 << 64) - 1


class CRadixIndexer(RadixIndexer):
    """``RadixIndexer`` on the C tree."""

    def __init__(self) -> None:
        if _radix is None:
            raise RuntimeError("dyn.core.kv._radix was not built (no C compiler at install)")
        super().__init__()
        self._core = _radix.RadixCore(XXH3_SEED)

    def _store(
        self,
        worker: WorkerKey,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        local_hashes: Sequence[int],
        seq_hashes: Sequence[int] | None,
    ) -> ApplyStatus:
        wid = self._ids.get(worker)
        if wid is None:  # checked before the worker gets an id: a rejected event changes nothing
            status = self._core.store(-1, parent_hash, block_hashes, local_hashes, seq_hashes)
            if status != _NEW_WORKER:
                return _STATUS[status]
            wid = self._register(worker)
        return _STATUS[self._core.store(wid, parent_hash, block_hashes, local_hashes, seq_hashes)]

    def remove(self, worker: WorkerKey, block_hashes: Sequence[int]) -> ApplyStatus:
        wid = self._ids.get(worker)
        if wid is None:
            return ApplyStatus.BLOCK_NOT_FOUND if block_hashes else ApplyStatus.OK
        return _STATUS[self._core.remove(wid, block_hashes)]

    def clear(self, worker: WorkerKey) -> None:
        wid = self._ids.get(worker)
        if wid is None:
            self._register(worker)
        else:
            self._core.clear(wid)

    def find_matches(
        self, local_hashes: Sequence[int], seq_hashes: Sequence[int] | None = None
    ) -> OverlapScores:
        if seq_hashes is None:
            return self._core.scores(local_hashes, self._keys, True)
        return self._core.scores(seq_hashes, self._keys, False)

    def match_pieces(self, seq_hashes: Sequence[int]) -> list[tuple[int, int]] | None:
        return self._core.pieces(seq_hashes)

    def dump(self) -> list[DumpedBlock]:
        keys = self._keys
        return [DumpedBlock(keys[w], parent, own, local) for w, parent, own, local in self._core.dump()]

    @property
    def size(self) -> int:
        return self._core.entries

    def blocks_held(self, worker: WorkerKey) -> int:
        wid = self._ids.get(worker)
        return 0 if wid is None else self._core.held(wid)

    def block_hash_of(self, worker: WorkerKey, seq_hash: int) -> int | None:
        wid = self._ids.get(worker)
        if wid is None or not 0 <= seq_hash <= _U64:
            return None
        return self._core.block_hash_of(wid, seq_hash)

    def depth_histogram(self) -> dict[int, int]:
        return self._core.depth_histogram()

    def hole_counts(self) -> dict[tuple[WorkerKey, int], int]:
        keys = self._keys
        return {(keys[w], node): n for (w, node), n in self._core.hole_counts().items()}

    def _depth(self, node: int) -> int:
        return self._core.depth(node)

    def _added(self, wid: int) -> None:
        self._core.add_worker(wid)

    def _forget(self, wid: int) -> None:
        self._core.drop_worker(wid)
