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

Layout: a node *is* its sequence hash; its fields live in dicts keyed by it (holders, parent and
depth, children), and workers are small ints inside. Everything the index holds is then ints in
dicts that the garbage collector does not track, so a million cached blocks add no GC pauses.

Single writer: all methods are meant to run on one thread (or one asyncio task).
"""

from __future__ import annotations

import enum
import struct
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence

import msgspec
import xxhash

from dyn.core.kv.hashing import XXH3_SEED

WorkerKey = tuple[int, int]
"""(instance_id, dp_rank)."""

OverlapScores = dict[WorkerKey, int]
"""Contiguous matched prefix blocks per worker; a worker that is absent matched 0."""

_ROOT = -1  # the root's key; sequence hashes are unsigned 64-bit
_PAIR = struct.Struct("<QQ")
_xxh3 = xxhash.xxh3_64_intdigest


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


class RadixIndexer:
    """Exact index of cached blocks per (worker, dp_rank), fed by KV events. Single writer."""

    def __init__(self) -> None:
        self._held: dict[int, dict[int, int]] = {}  # node -> worker id -> its block hash
        self._node: dict[int, tuple[int, int, int]] = {}  # node -> (parent, local hash, depth)
        # node -> its only child, or local hash -> child when it has several; leaves are absent.
        # The hot paths tell the two apart with ``type(c) is int`` (faster than isinstance), which
        # mypy does not narrow in the else branch: the ignores there say "not int: a dict".
        self._children: dict[int, int | dict[int, int]] = {}
        self._ids: dict[WorkerKey, int] = {}
        self._keys: list[WorkerKey] = []  # worker id -> key (a forgotten id waits in _free)
        self._free: list[int] = []
        self._lookup: dict[int, dict[int, int]] = {}  # worker id -> block hash -> node
        self._holes: dict[int, dict[int, int]] = {}  # worker id -> hole -> children holding it
        self._hole_of: dict[int, set[int]] = {}  # hole -> worker ids

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
        wid = self._ids.get(worker)
        if parent_hash is None:
            node, depth = _ROOT, 0
        else:
            found = self._lookup[wid].get(parent_hash) if wid is not None else None
            if found is None:
                return ApplyStatus.PARENT_BLOCK_NOT_FOUND
            node, depth = found, self._node[found][2]
        if wid is None:
            wid = self._register(worker)
        lookup = self._lookup[wid]
        held_by, meta, children_of, hole_of = self._held, self._node, self._children, self._hole_of
        displaced: list[int] | None = None
        child: int | None
        i = 0
        while i < n:  # along nodes that exist
            if seq_hashes is not None:  # a node is its sequence hash: no need to ask the parent
                child = seq_hashes[i]
                holders = held_by.get(child)
                if holders is None:
                    break
            else:
                children = children_of.get(node)
                if children is None:
                    break
                if type(children) is int:
                    child = children if meta[children][1] == local_hashes[i] else None
                else:
                    child = children.get(local_hashes[i])  # type: ignore[union-attr]  # not int: a dict
                if child is None:
                    break
                holders = held_by[child]
            block = block_hashes[i]
            held = holders.get(wid)
            if held != block:
                if held is not None:
                    del lookup[held]  # same node, the engine renamed it
                elif child in hole_of and wid in hole_of[child]:
                    self._unhole(child, wid)
                elsewhere = lookup.get(block)
                if elsewhere is not None:  # the hash moves here; settle its old node at the end
                    del held_by[elsewhere][wid]
                    displaced = (displaced or []) + [elsewhere]
                holders[wid] = block
                lookup[block] = child
            node = child
            i += 1
        depth += i
        for j in range(i, n):  # new nodes, each the only child of the one before
            local = local_hashes[j]
            block = block_hashes[j]
            depth += 1
            if seq_hashes is not None:
                child = seq_hashes[j]
            elif node == _ROOT:
                child = local
            else:  # hashing.extend_sequence_hash, inlined
                child = _xxh3(_PAIR.pack(node, local), seed=XXH3_SEED)
            children = children_of.get(node) if j == i else None
            if children is None:
                children_of[node] = child
            elif type(children) is int:
                children_of[node] = {meta[children][1]: children, local: child}
            else:
                children[local] = child  # type: ignore[index]  # not int: a dict
            meta[child] = (node, local, depth)
            held_by[child] = {wid: block}
            elsewhere = lookup.get(block)
            if elsewhere is not None:
                del held_by[elsewhere][wid]
                displaced = (displaced or []) + [elsewhere]
            lookup[block] = child
            node = child
        if displaced is not None:
            for old in displaced:
                holders = held_by.get(old)
                if holders is not None and wid not in holders:
                    self._after_loss(old, wid, recount=True)
        return ApplyStatus.OK

    def remove(self, worker: WorkerKey, block_hashes: Sequence[int]) -> ApplyStatus:
        """Apply a ``Removed`` event; hashes the worker does not hold are skipped."""
        wid = self._ids.get(worker)
        if wid is None:
            return ApplyStatus.BLOCK_NOT_FOUND if block_hashes else ApplyStatus.OK
        lookup, held_by, meta, children_of = self._lookup[wid], self._held, self._node, self._children
        missing = False
        for block in block_hashes:
            node = lookup.pop(block, None)
            if node is None:
                missing = True
                continue
            holders = held_by[node]
            del holders[wid]
            if self._hole_of or node in children_of:
                self._after_loss(node, wid, recount=False)
            elif not holders:  # the common case, an evicted leaf and no holes anywhere: unlink it
                parent, local, _ = meta.pop(node)
                del held_by[node]
                siblings = children_of[parent]
                if type(siblings) is int:
                    del children_of[parent]
                else:
                    shared: dict[int, int] = siblings  # type: ignore[assignment]  # not int: a dict
                    del shared[local]
                    if len(shared) == 1:
                        children_of[parent] = next(iter(shared.values()))
        return ApplyStatus.BLOCK_NOT_FOUND if missing else ApplyStatus.OK

    def clear(self, worker: WorkerKey) -> None:
        """Apply ``AllBlocksCleared`` for one rank; the rank stays known, with no blocks."""
        wid = self._ids.get(worker)
        if wid is None:
            self._register(worker)
            return
        lookup, held_by = self._lookup[wid], self._held
        nodes = list(lookup.values())
        lookup.clear()
        for node in nodes:  # the worker's holes all go at the end, whatever the order here
            holders = held_by.get(node)
            if holders is not None and holders.pop(wid, None) is not None and not holders:
                self._detach(node)
        for node in self._holes.pop(wid, ()):
            self._drop_hole_flag(node, wid)

    def remove_worker(self, instance_id: int) -> None:
        """Forget every dp rank of ``instance_id`` and all their blocks."""
        for key in [key for key in self._ids if key[0] == instance_id]:
            self.clear(key)
            wid = self._ids.pop(key)
            del self._lookup[wid]
            self._free.append(wid)

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
        held_by = self._held
        first = held_by.get(seq_hashes[0])
        if first is None:
            return {}
        last = held_by.get(seq_hashes[n - 1])
        if last is not None:
            depth = n
        else:  # a node at depth lo exists, at depth hi does not
            lo, hi, last = 1, n, first
            while hi - lo > 1:
                mid = (lo + hi) >> 1
                holders = held_by.get(seq_hashes[mid - 1])
                if holders is None:
                    hi = mid
                else:
                    lo, last = mid, holders
            depth = lo
        return self._score(first, last, depth, lambda d: held_by[seq_hashes[d - 1]])

    def _match_by_walk(self, local_hashes: Sequence[int]) -> OverlapScores:
        children_of, meta = self._children, self._node
        path: list[int] = []
        node = _ROOT
        for local in local_hashes:
            children = children_of.get(node)
            if children is None:
                break
            if type(children) is int:
                if meta[children][1] != local:
                    break
                node = children
            else:
                child = children.get(local)  # type: ignore[union-attr]  # not int: a dict
                if child is None:
                    break
                node = child
            path.append(node)
        if not path:
            return {}
        held_by = self._held
        return self._score(held_by[path[0]], held_by[path[-1]], len(path), lambda d: held_by[path[d - 1]])

    def _score(
        self,
        first: dict[int, int],
        last: dict[int, int],
        depth: int,
        holders_at: Callable[[int], dict[int, int]],
    ) -> OverlapScores:
        """Scores along a query path of ``depth`` attached nodes; ``first`` and ``last`` are the
        holders at depth 1 and ``depth``, ``holders_at(d)`` those at any depth in between."""
        keys = self._keys
        if self._holes:
            depths = self._score_with_holes(first, last, depth, holders_at)
            return {keys[w]: d for w, d in depths.items()}
        if len(last) == len(first):
            return {keys[w]: depth for w in first}
        scores = {keys[w]: depth for w in last}
        stack = [(1, depth, first, last)]
        while stack:  # holder sets shrink with depth; equal sizes mean equal sets
            lo, hi, top, bottom = stack.pop()
            if hi - lo == 1:
                for w in top.keys() - bottom.keys():
                    scores[keys[w]] = lo
                continue
            mid = (lo + hi) >> 1
            holders = holders_at(mid)
            size = len(holders)
            if size != len(top):
                stack.append((lo, mid, top, holders))
            if size != len(bottom):
                stack.append((mid, hi, holders, bottom))
        return scores

    def _score_with_holes(
        self,
        first: dict[int, int],
        last: dict[int, int],
        depth: int,
        holders_at: Callable[[int], dict[int, int]],
    ) -> dict[int, int]:
        holes = self._holes

        def clean_count(holders: dict[int, int]) -> int:
            return len(holders) - sum(1 for w in holes if w in holders)

        scores = {w: depth for w in last if w not in holes}
        stack = [(1, depth, first, last, clean_count(first), clean_count(last))]
        while stack:
            lo, hi, top, bottom, top_n, bottom_n = stack.pop()
            if top_n == bottom_n:
                continue
            if hi - lo == 1:
                for w in top.keys() - bottom.keys():
                    if w not in holes:
                        scores[w] = lo
                continue
            mid = (lo + hi) >> 1
            holders = holders_at(mid)
            mid_n = clean_count(holders)
            stack.append((lo, mid, top, holders, top_n, mid_n))
            stack.append((mid, hi, holders, bottom, mid_n, bottom_n))
        meta = self._node
        for w, worker_holes in holes.items():
            if w not in first:
                continue
            cap = depth + 1  # the first hole on this path; above it the worker is prefix-closed
            for hole in worker_holes:
                d = meta[hole][2]
                if d < cap and holders_at(d) is self._held[hole]:
                    cap = d
            lo, hi = 1, cap
            while hi - lo > 1:
                mid = (lo + hi) >> 1
                if w in holders_at(mid):
                    lo = mid
                else:
                    hi = mid
            scores[w] = lo
        return scores

    # -------------------------------------------------------------------------- inspection

    def dump(self) -> list[DumpedBlock]:
        """Every (node, worker) entry reachable for its worker, breadth first (parents before
        children); storing each as a one-block event into an empty indexer rebuilds the same
        answers. Entries a worker holds below a node it lacks can never match and are left out."""
        out: list[DumpedBlock] = []
        keys, held_by, meta = self._keys, self._held, self._node
        queue: deque[int] = deque(self._kids(_ROOT))
        while queue:
            node = queue.popleft()
            parent, local, _ = meta[node]
            parent_holders = held_by.get(parent)
            for w, block in held_by[node].items():
                if parent == _ROOT:
                    out.append(DumpedBlock(keys[w], None, block, local))
                elif (parent_block := parent_holders.get(w)) is not None:  # type: ignore[union-attr]
                    out.append(DumpedBlock(keys[w], parent_block, block, local))
            queue.extend(self._kids(node))
        return out

    @property
    def size(self) -> int:
        """Total (worker, block) entries."""
        return sum(len(lookup) for lookup in self._lookup.values())

    def blocks_per_worker(self) -> dict[WorkerKey, int]:
        return {key: len(self._lookup[wid]) for key, wid in self._ids.items()}

    def blocks_held(self, worker: WorkerKey) -> int:
        """How many blocks one (worker, dp_rank) holds; 0 for one the index does not know."""
        wid = self._ids.get(worker)
        return 0 if wid is None else len(self._lookup[wid])

    def workers(self) -> list[WorkerKey]:
        """Every known (worker, dp_rank), including those cleared down to no blocks."""
        return list(self._ids)

    def depth_histogram(self) -> dict[int, int]:
        """Node depth -> number of nodes at that depth."""
        return dict(sorted(Counter(depth for _, _, depth in self._node.values()).items()))

    # ---------------------------------------------------------------------------- internals

    def _register(self, worker: WorkerKey) -> int:
        if self._free:
            wid = self._free.pop()
            self._keys[wid] = worker
        else:
            wid = len(self._keys)
            self._keys.append(worker)
        self._ids[worker] = wid
        self._lookup[wid] = {}
        return wid

    def _depth(self, node: int) -> int:
        """The depth of a node (a sequence hash), 0 when it is not in the tree."""
        meta = self._node.get(node)
        return 0 if meta is None else meta[2]

    def _remove_counting(self, worker: WorkerKey, block_hashes: Sequence[int]) -> int:
        """``remove``, returning how many entries went (TTL expiry)."""
        wid = self._ids.get(worker)
        if wid is None:
            return 0
        lookup = self._lookup[wid]
        before = len(lookup)
        self.remove(worker, block_hashes)
        return before - len(lookup)

    def _kids(self, node: int) -> Iterable[int]:
        children = self._children.get(node)
        if children is None:
            return ()
        if type(children) is int:
            return (children,)
        return children.values()  # type: ignore[union-attr]  # not int: a dict

    def _after_loss(self, node: int, wid: int, *, recount: bool) -> None:
        """Keep the tree and the hole records right after worker ``wid`` left ``node``."""
        held_by = self._held
        parent = self._node[node][0]
        parent_holes = self._hole_of.get(parent)
        if parent_holes is not None and wid in parent_holes:
            worker_holes = self._holes[wid]
            if recount:
                left = sum(1 for child in self._kids(parent) if wid in held_by[child])
            else:
                left = worker_holes[parent] - 1
            if left:
                worker_holes[parent] = left
            else:
                self._unhole(parent, wid)
        if not held_by[node]:
            self._detach(node)
            return
        if node in self._children:
            below = sum(1 for child in self._kids(node) if wid in held_by[child])
            if below:
                self._holes.setdefault(wid, {})[node] = below
                self._hole_of.setdefault(node, set()).add(wid)

    def _unhole(self, node: int, wid: int) -> None:
        worker_holes = self._holes[wid]
        del worker_holes[node]
        if not worker_holes:
            del self._holes[wid]
        self._drop_hole_flag(node, wid)

    def _drop_hole_flag(self, node: int, wid: int) -> None:
        flags = self._hole_of.get(node)
        if flags is not None:
            flags.discard(wid)
            if not flags:
                del self._hole_of[node]

    def _detach(self, top: int) -> None:
        """Cut ``top`` (held by no one) and its subtree off the tree, forgetting every entry."""
        held_by, meta, children_of, lookups = self._held, self._node, self._children, self._lookup
        parent, local, _ = meta[top]
        siblings = children_of[parent]
        if type(siblings) is int:
            del children_of[parent]
        else:
            shared: dict[int, int] = siblings  # type: ignore[assignment]  # not int: a dict
            del shared[local]
            if len(shared) == 1:
                children_of[parent] = next(iter(shared.values()))
        stack = [top]
        while stack:
            node = stack.pop()
            del meta[node]
            for wid, block in held_by.pop(node).items():
                lookup = lookups[wid]
                if lookup.get(block) == node:
                    del lookup[block]
            flags = self._hole_of.pop(node, None)
            if flags is not None:
                for wid in flags:
                    worker_holes = self._holes[wid]
                    del worker_holes[node]
                    if not worker_holes:
                        del self._holes[wid]
            children = children_of.pop(node, None)
            if type(children) is int:
                stack.append(children)
            elif children is not None:
                stack.extend(children.values())  # type: ignore[union-attr]  # not int: a dict
