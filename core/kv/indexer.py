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
query walks the tree by local hash instead. ``match_pieces`` gives the same answer as pieces,
``(depth, holder bitmask)``, which a router scoring a large fleet reads as an array over worker
ids (``pieces_depths``) without building a dict of every holder.

Layout: a node *is* its sequence hash, and one dict maps it to a tuple ``(parent, local hash,
depth, block hash, holders, children)``: the holders are a bitmask of small worker ids; the children
are None (a leaf), the only child, or a dict local hash -> child. The engine's block hash is kept
once per node (the first holder's); a worker that names the node otherwise has its name in its own
alias dict. A change of holders or children replaces the node's tuple. Everything the index holds
is then ints, tuples of ints and dicts of ints, which the garbage collector does not track (a tuple
from its first collection on), so a million cached blocks add no GC pauses. About 285 bytes of RSS
per node at 8 workers (one dict entry, the tuple, its ints, the worker's lookup entry); a dict of
holders per node and separate dicts per field cost 570.

Single writer: all methods are meant to run on one thread (or one asyncio task).
"""

from __future__ import annotations

import enum
import struct
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence

import msgspec
import numpy as np
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


def set_bits(values: np.ndarray, mask: int, value: int) -> None:
    """``values[i] = value`` for every bit ``i`` set in ``mask`` (each ``i < len(values)``)."""
    if mask:
        n = len(values)
        bits = np.unpackbits(
            np.frombuffer(mask.to_bytes((n + 7) // 8, "little"), np.uint8), bitorder="little"
        )
        values[bits[:n].view(bool)] = value


def _members(mask: int) -> list[int]:
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

_Node = tuple[int, int, int, int, int, int | dict[int, int] | None]
"""(parent, local hash, depth, block hash, holder bitmask, children): children are None for a
leaf, the child for an only child, else a dict local hash -> child."""


class RadixIndexer:
    """Exact index of cached blocks per (worker, dp_rank), fed by KV events. Single writer."""

    def __init__(self) -> None:
        # node -> (parent, local hash, depth, block hash, holders, children); see the module
        # docstring. The root (-1) has an entry too, for its children.
        self._node: dict[int, _Node] = {_ROOT: (_ROOT, 0, 0, 0, 0, None)}
        self._ids: dict[WorkerKey, int] = {}
        self._keys: list[WorkerKey] = []  # worker id -> key (a forgotten id waits in _free)
        self._free: list[int] = []
        self._lookup: dict[int, dict[int, int]] = {}  # worker id -> block hash -> node
        self._alias: dict[int, dict[int, int]] = {}  # worker id -> node -> its own block hash
        self._holes: dict[int, dict[int, int]] = {}  # worker id -> hole -> children holding it
        self._hole_of: dict[int, set[int]] = {}  # hole -> worker ids
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
        meta = self._node
        if parent_hash is None:
            node = _ROOT
        else:
            found = self._lookup[wid].get(parent_hash) if wid is not None else None
            if found is None:
                return ApplyStatus.PARENT_BLOCK_NOT_FOUND
            node = found
        if wid is None:
            wid = self._register(worker)
        bit = 1 << wid
        lookup, alias, hole_of = self._lookup[wid], self._alias[wid], self._hole_of
        displaced: list[int] | None = None
        child: int | None
        i = 0
        while i < n:  # along nodes that exist
            if seq_hashes is not None:  # a node is its sequence hash: no need to ask the parent
                child = seq_hashes[i]
                entry = meta.get(child)
                if entry is None:
                    break
            else:
                kids = meta[node][5]
                if kids is None:
                    break
                if type(kids) is int:
                    child = kids if meta[kids][1] == local_hashes[i] else None
                else:
                    child = kids.get(local_hashes[i])  # type: ignore[union-attr]  # not int: a dict
                if child is None:
                    break
                entry = meta[child]
            block = block_hashes[i]
            parent, local, depth, canonical, mask, kids = entry
            held = (alias.get(child, canonical) if alias else canonical) if mask & bit else None
            if held != block:
                if held is not None:
                    del lookup[held]  # same node, the engine renamed it
                elif child in hole_of and wid in hole_of[child]:
                    self._unhole(child, wid)
                elsewhere = lookup.get(block)
                if elsewhere is not None:  # the hash moves here; settle its old node at the end
                    self._drop_holder(elsewhere, wid)
                    displaced = (displaced or []) + [elsewhere]
                meta[child] = (parent, local, depth, canonical, mask | bit, kids)
                if block == canonical:
                    alias.pop(child, None)
                else:
                    alias[child] = block
                lookup[block] = child
            node = child
            i += 1
        if i < n:  # new nodes, each the only child of the one before
            if seq_hashes is not None:
                new = list(seq_hashes[i:])
            else:  # hashing.extend_sequence_hash, inlined
                new = []
                prev = node
                for local in local_hashes[i:]:
                    prev = local if prev == _ROOT else _xxh3(_PAIR.pack(prev, local), XXH3_SEED)
                    new.append(prev)
            self._add_child(node, local_hashes[i], new[0])
            depth = meta[node][2]
            below = iter(new)
            next(below)
            for j, child in enumerate(new, i):
                block = block_hashes[j]
                if block == child:  # engines that name blocks by sequence hash: one int, not two
                    block = child
                depth += 1
                meta[child] = (node, local_hashes[j], depth, block, bit, next(below, None))
                elsewhere = lookup.setdefault(block, child)
                if elsewhere is not child:
                    self._drop_holder(elsewhere, wid)
                    displaced = (displaced or []) + [elsewhere]
                    lookup[block] = child
                node = child
        if displaced is not None:
            for old in displaced:
                entry = meta.get(old)
                if entry is not None and not entry[4] & bit:
                    self._after_loss(old, wid, recount=True)
        return ApplyStatus.OK

    def remove(self, worker: WorkerKey, block_hashes: Sequence[int]) -> ApplyStatus:
        """Apply a ``Removed`` event; hashes the worker does not hold are skipped."""
        wid = self._ids.get(worker)
        if wid is None:
            return ApplyStatus.BLOCK_NOT_FOUND if block_hashes else ApplyStatus.OK
        lookup, alias, meta = self._lookup[wid], self._alias[wid], self._node
        keep = ~(1 << wid)
        missing = False
        for block in block_hashes:
            node = lookup.pop(block, None)
            if node is None:
                missing = True
                continue
            parent, local, depth, canonical, mask, kids = meta[node]
            mask &= keep
            if alias:
                alias.pop(node, None)
            if mask or kids is not None or self._hole_of:
                meta[node] = (parent, local, depth, canonical, mask, kids)
                if kids is not None or self._hole_of:
                    self._after_loss(node, wid, recount=False)
            else:  # the common case, an evicted leaf and no holes anywhere: unlink it
                del meta[node]
                self._remove_child(parent, local)
        return ApplyStatus.BLOCK_NOT_FOUND if missing else ApplyStatus.OK

    def clear(self, worker: WorkerKey) -> None:
        """Apply ``AllBlocksCleared`` for one rank; the rank stays known, with no blocks."""
        wid = self._ids.get(worker)
        if wid is None:
            self._register(worker)
            return
        lookup, meta = self._lookup[wid], self._node
        nodes = list(lookup.values())
        lookup.clear()
        self._alias[wid].clear()
        bit = 1 << wid
        for node in nodes:  # the worker's holes all go at the end, whatever the order here
            entry = meta.get(node)
            if entry is not None and entry[4] & bit:
                parent, local, depth, canonical, mask, kids = entry
                meta[node] = (parent, local, depth, canonical, mask ^ bit, kids)
                if mask == bit:
                    self._detach(node)
        for node in self._holes.pop(wid, ()):
            self._drop_hole_flag(node, wid)

    def remove_worker(self, instance_id: int) -> None:
        """Forget every dp rank of ``instance_id`` and all their blocks."""
        for key in [key for key in self._ids if key[0] == instance_id]:
            self.clear(key)
            wid = self._ids.pop(key)
            del self._lookup[wid], self._alias[wid]
            self._free.append(wid)
            self.generation += 1

    # ------------------------------------------------------------------------------ queries

    def find_matches(
        self, local_hashes: Sequence[int], seq_hashes: Sequence[int] | None = None
    ) -> OverlapScores:
        """How many leading blocks of the query each worker holds. ``seq_hashes``, when given,
        must be ``sequence_hashes(local_hashes)``; it makes the query O(log n) per answer."""
        if seq_hashes is None:
            return self._match_by_walk(local_hashes)
        span = self._span(seq_hashes)
        return {} if span is None else self._score(*span, seq_hashes)

    def _span(self, seq_hashes: Sequence[int]) -> tuple[int, int, int] | None:
        """``(holders at depth 1, holders at the deepest node, its depth)`` of the query's
        path in the tree; None when not even its first block is there."""
        n = len(seq_hashes)
        meta = self._node
        first = meta.get(seq_hashes[0]) if n else None
        if first is None:
            return None
        last = meta.get(seq_hashes[n - 1])
        if last is not None:
            return first[4], last[4], n
        lo, hi, last = 1, n, first  # a node at depth lo exists, at depth hi does not
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            entry = meta.get(seq_hashes[mid - 1])
            if entry is None:
                hi = mid
            else:
                lo, last = mid, entry
        return first[4], last[4], lo

    def _match_by_walk(self, local_hashes: Sequence[int]) -> OverlapScores:
        meta = self._node
        path: list[int] = []
        kids = meta[_ROOT][5]
        for local in local_hashes:
            if kids is None:
                break
            if type(kids) is int:
                entry = meta[kids]
                if entry[1] != local:
                    break
                path.append(kids)
            else:
                child = kids.get(local)  # type: ignore[union-attr]  # not int: a dict
                if child is None:
                    break
                path.append(child)
                entry = meta[child]
            kids = entry[5]
        if not path:
            return {}
        return self._score(meta[path[0]][4], meta[path[-1]][4], len(path), path)

    def _score(self, first: int, last: int, depth: int, path: Sequence[int]) -> OverlapScores:
        """Scores along a query path of ``depth`` attached nodes, ``path[d - 1]`` the node at
        depth ``d``; ``first`` and ``last`` are the holder masks at depth 1 and ``depth``."""
        keys = self._keys
        if self._holes:
            depths = self._score_with_holes(first, last, depth, path)
            return {keys[w]: d for w, d in depths.items()}
        return self.pieces_scores(self._pieces(first, last, depth, path))

    def _pieces(self, first: int, last: int, depth: int, path: Sequence[int]) -> list[tuple[int, int]]:
        """``_score``'s answer as ``(depth, holders)`` pieces, the holder masks disjoint (no
        holes anywhere)."""
        pieces = [(depth, last)]
        if last == first:
            return pieces
        meta = self._node
        stack = [(1, depth, first, last)]
        while stack:  # holder sets shrink with depth (nested): equal masks mean no change between
            lo, hi, top, bottom = stack.pop()
            if hi - lo == 1:
                pieces.append((lo, top & ~bottom))
                continue
            mid = (lo + hi) >> 1
            holders = meta[path[mid - 1]][4]
            if holders != top:
                stack.append((lo, mid, top, holders))
            if holders != bottom:
                stack.append((mid, hi, holders, bottom))
        return pieces

    def match_pieces(self, seq_hashes: Sequence[int]) -> list[tuple[int, int]] | None:
        """``find_matches(local, seq_hashes)`` as ``(depth, worker-id bitmask)`` pieces, the
        masks disjoint: what ``pieces_scores`` and ``pieces_depths`` read. None while a worker
        has holes (ask ``find_matches``)."""
        if self._holes:
            return None
        span = self._span(seq_hashes)
        return [] if span is None else self._pieces(*span, seq_hashes)

    def pieces_scores(self, pieces: list[tuple[int, int]]) -> OverlapScores:
        """``match_pieces``' answer as ``find_matches`` gives it (in the same order)."""
        keys = self._keys
        return {keys[w]: d for d, mask in pieces for w in _members(mask)}

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

    def _score_with_holes(self, first: int, last: int, depth: int, path: Sequence[int]) -> dict[int, int]:
        holes, meta = self._holes, self._node
        holed = 0
        for w in holes:
            holed |= 1 << w
        clean = ~holed
        top_clean = first & clean
        scores = {w: depth for w in _members(last & clean)}
        stack = [(1, depth, top_clean, last & clean)]
        while stack:  # the workers without holes, as in _score
            lo, hi, top, bottom = stack.pop()
            if top == bottom:
                continue
            if hi - lo == 1:
                for w in _members(top & ~bottom):
                    scores[w] = lo
                continue
            mid = (lo + hi) >> 1
            holders = meta[path[mid - 1]][4] & clean
            stack.append((lo, mid, top, holders))
            stack.append((mid, hi, holders, bottom))
        for w, worker_holes in holes.items():
            if not first >> w & 1:
                continue
            cap = depth + 1  # the first hole on this path; above it the worker is prefix-closed
            for hole in worker_holes:
                d = meta[hole][2]
                if d < cap and path[d - 1] == hole:
                    cap = d
            lo, hi = 1, cap
            while hi - lo > 1:
                mid = (lo + hi) >> 1
                if meta[path[mid - 1]][4] >> w & 1:
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
        keys, meta, alias = self._keys, self._node, self._alias
        queue: deque[int] = deque(self._kids(_ROOT))
        while queue:
            node = queue.popleft()
            parent, local, _, block, mask, _ = meta[node]
            parent_mask = meta[parent][4]
            for w in _members(mask):
                own = alias[w].get(node, block)
                if parent == _ROOT:
                    out.append(DumpedBlock(keys[w], None, own, local))
                elif parent_mask >> w & 1:
                    out.append(DumpedBlock(keys[w], alias[w].get(parent, meta[parent][3]), own, local))
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

    def block_hash_of(self, worker: WorkerKey, seq_hash: int) -> int | None:
        """The engine's own hash of the block at node ``seq_hash`` (a router sequence hash) as
        ``worker`` names it, or None when the worker does not hold that node: where a walk of the
        worker's lower storage tiers continues from (``dyn.core.kv.tiers``)."""
        wid = self._ids.get(worker)
        entry = self._node.get(seq_hash)
        if wid is None or entry is None or seq_hash == _ROOT or not entry[4] >> wid & 1:
            return None
        alias = self._alias[wid]
        return alias.get(seq_hash, entry[3]) if alias else entry[3]

    def workers(self) -> list[WorkerKey]:
        """Every known (worker, dp_rank), including those cleared down to no blocks."""
        return list(self._ids)

    def depth_histogram(self) -> dict[int, int]:
        """Node depth -> number of nodes at that depth."""
        return dict(sorted(Counter(meta[2] for node, meta in self._node.items() if node != _ROOT).items()))

    # ---------------------------------------------------------------------------- internals

    def _register(self, worker: WorkerKey) -> int:
        self.generation += 1
        if self._free:
            wid = self._free.pop()
            self._keys[wid] = worker
        else:
            wid = len(self._keys)
            self._keys.append(worker)
        self._ids[worker] = wid
        self._lookup[wid] = {}
        self._alias[wid] = {}
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
        children = self._node[node][5]
        if children is None:
            return ()
        if type(children) is int:
            return (children,)
        return children.values()  # type: ignore[union-attr]  # not int: a dict

    def _drop_holder(self, node: int, wid: int) -> None:
        """Take worker ``wid`` off ``node`` (the caller settles holes and detaching)."""
        parent, local, depth, block, mask, kids = self._node[node]
        self._node[node] = (parent, local, depth, block, mask & ~(1 << wid), kids)
        self._alias[wid].pop(node, None)

    def _add_child(self, node: int, local: int, child: int) -> None:
        parent, own, depth, block, mask, kids = self._node[node]
        if kids is None:
            kids = child
        elif type(kids) is int:
            kids = {self._node[kids][1]: kids, local: child}
        else:
            kids[local] = child  # type: ignore[index]  # not int: a dict
        self._node[node] = (parent, own, depth, block, mask, kids)

    def _remove_child(self, node: int, local: int) -> None:
        parent, own, depth, block, mask, kids = self._node[node]
        if type(kids) is int:
            kids = None
        else:
            shared: dict[int, int] = kids  # type: ignore[assignment]  # not int: a dict
            del shared[local]
            if len(shared) > 1:
                return
            kids = next(iter(shared.values()))
        self._node[node] = (parent, own, depth, block, mask, kids)

    def _after_loss(self, node: int, wid: int, *, recount: bool) -> None:
        """Keep the tree and the hole records right after worker ``wid`` left ``node``."""
        meta = self._node
        parent = meta[node][0]
        parent_holes = self._hole_of.get(parent)
        if parent_holes is not None and wid in parent_holes:
            worker_holes = self._holes[wid]
            if recount:
                left = sum(1 for child in self._kids(parent) if meta[child][4] >> wid & 1)
            else:
                left = worker_holes[parent] - 1
            if left:
                worker_holes[parent] = left
            else:
                self._unhole(parent, wid)
        if not meta[node][4]:
            self._detach(node)
            return
        if meta[node][5] is not None:
            below = sum(1 for child in self._kids(node) if meta[child][4] >> wid & 1)
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
        meta, lookups, aliases = self._node, self._lookup, self._alias
        parent, local = meta[top][:2]
        self._remove_child(parent, local)
        stack = [top]
        while stack:
            node = stack.pop()
            _, _, _, canonical, mask, children = meta.pop(node)
            for wid in _members(mask):
                block = aliases[wid].pop(node, canonical)
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
            if type(children) is int:
                stack.append(children)
            elif children is not None:
                stack.extend(children.values())  # type: ignore[union-attr]  # not int: a dict
