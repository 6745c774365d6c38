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
depths whose holder counts differ: O(log n) dict probes per distinct answer instead of a walk of
n levels. Only a remove that takes a worker off a node while one of that node's children still
holds it breaks prefix closure; such nodes ("holes") are tracked exactly per worker, and a worker
with holes is bisected only above the first hole on the query path. Without sequence hashes the
query walks the tree by local hash instead.

Single writer: all methods are meant to run on one thread (or one asyncio task).
"""

from __future__ import annotations

import enum
from collections import Counter, deque
from collections.abc import Callable, Sequence

import msgspec

from dyn.core.kv.hashing import extend_sequence_hash

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


class _Node:
    __slots__ = ("seq", "local", "parent", "depth", "workers", "children", "hole_of")

    def __init__(self, seq: int | None, local: int | None, parent: _Node | None, depth: int) -> None:
        self.seq = seq
        self.local = local
        self.parent = parent
        self.depth = depth
        self.workers: dict[WorkerKey, int] = {}  # holder -> its block hash for this node
        self.children: dict[int, _Node] | None = None  # by local hash; None while a leaf
        self.hole_of: set[WorkerKey] | None = None  # workers absent here but held by a child


class RadixIndexer:
    """Exact index of cached blocks per (worker, dp_rank), fed by KV events. Single writer."""

    def __init__(self) -> None:
        self._root = _Node(None, None, None, 0)
        self._nodes: dict[int, _Node] = {}  # sequence hash of the path -> node, attached only
        self._lookup: dict[WorkerKey, dict[int, _Node]] = {}
        self._holes: dict[WorkerKey, dict[_Node, int]] = {}  # hole -> children holding the worker

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
        n = len(block_hashes)
        if n != len(local_hashes) or (seq_hashes is not None and len(seq_hashes) != n):
            return ApplyStatus.INVALID_BLOCK
        distinct = set(block_hashes)
        if len(distinct) != n or parent_hash in distinct:
            return ApplyStatus.INVALID_BLOCK
        lookup = self._lookup.get(worker)
        if parent_hash is None:
            node = self._root
        else:
            node = lookup.get(parent_hash) if lookup is not None else None
            if node is None:
                return ApplyStatus.PARENT_BLOCK_NOT_FOUND
        if lookup is None:
            lookup = self._lookup[worker] = {}
        nodes = self._nodes
        displaced: list[_Node] | None = None
        for i in range(n):
            local = local_hashes[i]
            block = block_hashes[i]
            children = node.children
            child = children.get(local) if children is not None else None
            if child is None:
                seq = extend_sequence_hash(node.seq, local) if seq_hashes is None else seq_hashes[i]
                child = _Node(seq, local, node, node.depth + 1)
                if children is None:
                    node.children = {local: child}
                else:
                    children[local] = child
                nodes[seq] = child
            held = child.workers.get(worker)
            if held != block:
                if held is not None:
                    del lookup[held]  # same node, the engine renamed it
                elif child.hole_of is not None and worker in child.hole_of:
                    self._unhole(child, worker)
                elsewhere = lookup.get(block)
                if elsewhere is not None:  # the hash moves here; settle its old node at the end
                    del elsewhere.workers[worker]
                    if displaced is None:
                        displaced = []
                    displaced.append(elsewhere)
                child.workers[worker] = block
                lookup[block] = child
            node = child
        if displaced is not None:
            for old in displaced:
                if nodes.get(old.seq) is old and worker not in old.workers:  # type: ignore[arg-type]
                    self._after_loss(old, worker, recount=True)
        return ApplyStatus.OK

    def remove(self, worker: WorkerKey, block_hashes: Sequence[int]) -> ApplyStatus:
        """Apply a ``Removed`` event; hashes the worker does not hold are skipped."""
        lookup = self._lookup.get(worker)
        if lookup is None:
            return ApplyStatus.BLOCK_NOT_FOUND if block_hashes else ApplyStatus.OK
        missing = False
        for block in block_hashes:
            node = lookup.pop(block, None)
            if node is None:
                missing = True
                continue
            del node.workers[worker]
            self._after_loss(node, worker, recount=False)
        return ApplyStatus.BLOCK_NOT_FOUND if missing else ApplyStatus.OK

    def clear(self, worker: WorkerKey) -> None:
        """Apply ``AllBlocksCleared`` for one rank; the rank stays known, with no blocks."""
        lookup = self._lookup.setdefault(worker, {})
        held = sorted(lookup.values(), key=lambda node: node.depth, reverse=True)
        lookup.clear()
        for node in held:  # deepest first: no holes on the way
            if node.workers.pop(worker, None) is not None and not node.workers:
                self._detach(node)
        for node in self._holes.pop(worker, ()):
            self._drop_hole_flag(node, worker)

    def remove_worker(self, instance_id: int) -> None:
        """Forget every dp rank of ``instance_id`` and all their blocks."""
        for key in [key for key in self._lookup if key[0] == instance_id]:
            self.clear(key)
            del self._lookup[key]

    # ------------------------------------------------------------------------------ queries

    def find_matches(
        self, local_hashes: Sequence[int], seq_hashes: Sequence[int] | None = None
    ) -> OverlapScores:
        """How many leading blocks of the query each worker holds. ``seq_hashes``, when given,
        must be ``sequence_hashes(local_hashes)``; it makes the query O(log n) per answer."""
        if seq_hashes is None:
            return self._match_by_walk(local_hashes)
        n = len(seq_hashes)
        if n == 0:
            return {}
        nodes = self._nodes
        first = nodes.get(seq_hashes[0])
        if first is None:
            return {}
        last = nodes.get(seq_hashes[n - 1])
        if last is not None:
            depth = n
        else:  # node at depth lo exists, at depth hi does not
            lo, hi, last = 1, n, first
            while hi - lo > 1:
                mid = (lo + hi) >> 1
                node = nodes.get(seq_hashes[mid - 1])
                if node is None:
                    hi = mid
                else:
                    lo, last = mid, node
            depth = lo
        return self._score(first, last, depth, lambda d: nodes[seq_hashes[d - 1]])

    def _match_by_walk(self, local_hashes: Sequence[int]) -> OverlapScores:
        path: list[_Node] = []
        node = self._root
        for local in local_hashes:
            children = node.children
            if children is None:
                break
            node = children.get(local)  # type: ignore[assignment]
            if node is None:
                break
            path.append(node)
        if not path:
            return {}
        return self._score(path[0], path[-1], len(path), lambda d: path[d - 1])

    def _score(
        self, first: _Node, last: _Node, depth: int, node_at: Callable[[int], _Node]
    ) -> OverlapScores:
        """Scores along a query path of ``depth`` attached nodes, ``node_at(d)`` for 1 <= d <= depth."""
        holes = self._holes
        if not holes:
            if len(last.workers) == len(first.workers):
                return dict.fromkeys(first.workers, depth)
            scores = dict.fromkeys(last.workers, depth)
            stack = [(1, depth, first, last)]
            while stack:  # holder sets shrink with depth; equal sizes mean equal sets
                lo, hi, top, bottom = stack.pop()
                if hi - lo == 1:
                    for worker in top.workers.keys() - bottom.workers.keys():
                        scores[worker] = lo
                    continue
                mid = (lo + hi) >> 1
                node = node_at(mid)
                size = len(node.workers)
                if size != len(top.workers):
                    stack.append((lo, mid, top, node))
                if size != len(bottom.workers):
                    stack.append((mid, hi, node, bottom))
            return scores
        return self._score_with_holes(first, last, depth, node_at)

    def _score_with_holes(
        self, first: _Node, last: _Node, depth: int, node_at: Callable[[int], _Node]
    ) -> OverlapScores:
        holes = self._holes

        def clean_count(node: _Node) -> int:
            held = node.workers
            return len(held) - sum(1 for worker in holes if worker in held)

        scores = {worker: depth for worker in last.workers if worker not in holes}
        stack = [(1, depth, first, last, clean_count(first), clean_count(last))]
        while stack:
            lo, hi, top, bottom, top_n, bottom_n = stack.pop()
            if top_n == bottom_n:
                continue
            if hi - lo == 1:
                for worker in top.workers.keys() - bottom.workers.keys():
                    if worker not in holes:
                        scores[worker] = lo
                continue
            mid = (lo + hi) >> 1
            node = node_at(mid)
            mid_n = clean_count(node)
            stack.append((lo, mid, top, node, top_n, mid_n))
            stack.append((mid, hi, node, bottom, mid_n, bottom_n))
        for worker, worker_holes in holes.items():
            if worker not in first.workers:
                continue
            cap = depth + 1  # the first hole on this path; above it the worker is prefix-closed
            for hole in worker_holes:
                d = hole.depth
                if d < cap and node_at(d) is hole:
                    cap = d
            lo, hi = 1, cap
            while hi - lo > 1:
                mid = (lo + hi) >> 1
                if worker in node_at(mid).workers:
                    lo = mid
                else:
                    hi = mid
            scores[worker] = lo
        return scores

    # -------------------------------------------------------------------------- inspection

    def dump(self) -> list[DumpedBlock]:
        """Every (node, worker) entry reachable for its worker, breadth first (parents before
        children); storing each as a one-block event into an empty indexer rebuilds the same
        answers. Entries a worker holds below a node it lacks can never match and are left out."""
        out: list[DumpedBlock] = []
        queue: deque[_Node] = deque()
        if self._root.children:
            queue.extend(self._root.children.values())
        while queue:
            node = queue.popleft()
            parent = node.parent
            assert parent is not None and node.local is not None
            for worker, block in node.workers.items():
                if parent is self._root:
                    out.append(DumpedBlock(worker, None, block, node.local))
                elif (parent_block := parent.workers.get(worker)) is not None:
                    out.append(DumpedBlock(worker, parent_block, block, node.local))
            if node.children:
                queue.extend(node.children.values())
        return out

    @property
    def size(self) -> int:
        """Total (worker, block) entries."""
        return sum(len(lookup) for lookup in self._lookup.values())

    def blocks_per_worker(self) -> dict[WorkerKey, int]:
        return {worker: len(lookup) for worker, lookup in self._lookup.items()}

    def workers(self) -> list[WorkerKey]:
        """Every known (worker, dp_rank), including those cleared down to no blocks."""
        return list(self._lookup)

    def depth_histogram(self) -> dict[int, int]:
        """Node depth -> number of nodes at that depth."""
        return dict(sorted(Counter(node.depth for node in self._nodes.values()).items()))

    # ---------------------------------------------------------------------------- internals

    def _after_loss(self, node: _Node, worker: WorkerKey, *, recount: bool) -> None:
        """Keep the tree and the hole records right after ``worker`` left ``node``."""
        parent = node.parent
        assert parent is not None
        if parent.hole_of is not None and worker in parent.hole_of:
            parent_holes = self._holes[worker]
            left = (sum(1 for c in parent.children.values() if worker in c.workers)  # type: ignore[union-attr]
                    if recount else parent_holes[parent] - 1)
            if left:
                parent_holes[parent] = left
            else:
                self._unhole(parent, worker)
        if not node.workers:
            self._detach(node)
            return
        if node.children:
            below = sum(1 for c in node.children.values() if worker in c.workers)
            if below:
                self._holes.setdefault(worker, {})[node] = below
                if node.hole_of is None:
                    node.hole_of = {worker}
                else:
                    node.hole_of.add(worker)

    def _unhole(self, node: _Node, worker: WorkerKey) -> None:
        worker_holes = self._holes[worker]
        del worker_holes[node]
        if not worker_holes:
            del self._holes[worker]
        self._drop_hole_flag(node, worker)

    @staticmethod
    def _drop_hole_flag(node: _Node, worker: WorkerKey) -> None:
        if node.hole_of is not None:
            node.hole_of.discard(worker)
            if not node.hole_of:
                node.hole_of = None

    def _detach(self, top: _Node) -> None:
        """Cut ``top`` (held by no one) and its subtree off the tree, forgetting every entry."""
        parent = top.parent
        assert parent is not None and parent.children is not None
        del parent.children[top.local]  # type: ignore[arg-type]
        if not parent.children:
            parent.children = None
        nodes, lookups = self._nodes, self._lookup
        stack = [top]
        while stack:
            node = stack.pop()
            del nodes[node.seq]  # type: ignore[arg-type]
            for worker, block in node.workers.items():
                lookups[worker].pop(block, None)
            node.workers.clear()
            if node.hole_of is not None:
                for worker in node.hole_of:
                    worker_holes = self._holes[worker]
                    del worker_holes[node]
                    if not worker_holes:
                        del self._holes[worker]
                node.hole_of = None
            if node.children is not None:
                stack.extend(node.children.values())
                node.children = None
            node.parent = None
