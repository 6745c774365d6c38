"""``PyRadixIndexer``: the prefix index's tree in Python objects, where the C tree
(``dyn.core.kv.indexer_c``) is not built, and the reference it is tested against. The contract,
events and answers are ``dyn.core.kv.indexer``'s.

Layout: a node *is* its sequence hash, and one dict maps it to a tuple ``(parent, local hash,
depth, block hash, holders, children)``: the holders are a bitmask of small worker ids; the children
are None (a leaf), the only child, or a dict local hash -> child. The engine's block hash is kept
once per node (the first holder's); a worker that names the node otherwise has its name in its own
alias dict. A change of holders or children replaces the node's tuple. Everything the index holds
is then ints, tuples of ints and dicts of ints, which the garbage collector does not track (a tuple
from its first collection on), so a million cached blocks add no GC pauses. About 260 bytes of RSS
per cached block at 8 workers (one dict entry, the tuple, its ints, the worker's lookup entry); a
dict of holders per node and separate dicts per field cost 570.
"""

from __future__ import annotations

import struct
from collections import Counter, deque
from collections.abc import Iterable, Sequence

import xxhash

from dyn.core.kv.hashing import XXH3_SEED
from dyn.core.kv.indexer import ApplyStatus, DumpedBlock, OverlapScores, RadixIndexer, WorkerKey, members

_ROOT = -1  # the root's key; sequence hashes are unsigned 64-bit
_PAIR = struct.Struct("<QQ")
_xxh3 = xxhash.xxh3_64_intdigest

_Node = tuple[int, int, int, int, int, int | dict[int, int] | None]
"""(parent, local hash, depth, block hash, holder bitmask, children): children are None for a
leaf, the child for an only child, else a dict local hash -> child."""


class PyRadixIndexer(RadixIndexer):
    """``RadixIndexer`` in Python objects (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        # node -> (parent, local hash, depth, block hash, holders, children); see the module
        # docstring. The root (-1) has an entry too, for its children.
        self._node: dict[int, _Node] = {_ROOT: (_ROOT, 0, 0, 0, 0, None)}
        self._lookup: dict[int, dict[int, int]] = {}  # worker id -> block hash -> node
        self._alias: dict[int, dict[int, int]] = {}  # worker id -> node -> its own block hash
        self._holes: dict[int, dict[int, int]] = {}  # worker id -> hole -> children holding it
        self._hole_of: dict[int, set[int]] = {}  # hole -> worker ids

    # ------------------------------------------------------------------------------- events

    def _store(
        self,
        worker: WorkerKey,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        local_hashes: Sequence[int],
        seq_hashes: Sequence[int] | None,
    ) -> ApplyStatus:
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

    # ------------------------------------------------------------------------------ queries

    def find_matches(
        self, local_hashes: Sequence[int], seq_hashes: Sequence[int] | None = None
    ) -> OverlapScores:
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
        if self._holes:
            return None
        span = self._span(seq_hashes)
        return [] if span is None else self._pieces(*span, seq_hashes)

    def _score_with_holes(self, first: int, last: int, depth: int, path: Sequence[int]) -> dict[int, int]:
        holes, meta = self._holes, self._node
        holed = 0
        for w in holes:
            holed |= 1 << w
        clean = ~holed
        top_clean = first & clean
        scores = {w: depth for w in members(last & clean)}
        stack = [(1, depth, top_clean, last & clean)]
        while stack:  # the workers without holes, as in _score
            lo, hi, top, bottom = stack.pop()
            if top == bottom:
                continue
            if hi - lo == 1:
                for w in members(top & ~bottom):
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
        out: list[DumpedBlock] = []
        keys, meta, alias = self._keys, self._node, self._alias
        queue: deque[int] = deque(self._kids(_ROOT))
        while queue:
            node = queue.popleft()
            parent, local, _, block, mask, _ = meta[node]
            parent_mask = meta[parent][4]
            for w in members(mask):
                own = alias[w].get(node, block)
                if parent == _ROOT:
                    out.append(DumpedBlock(keys[w], None, own, local))
                elif parent_mask >> w & 1:
                    out.append(DumpedBlock(keys[w], alias[w].get(parent, meta[parent][3]), own, local))
            queue.extend(self._kids(node))
        return out

    @property
    def size(self) -> int:
        return sum(len(lookup) for lookup in self._lookup.values())

    def blocks_held(self, worker: WorkerKey) -> int:
        wid = self._ids.get(worker)
        return 0 if wid is None else len(self._lookup[wid])

    def block_hash_of(self, worker: WorkerKey, seq_hash: int) -> int | None:
        wid = self._ids.get(worker)
        entry = self._node.get(seq_hash)
        if wid is None or entry is None or seq_hash == _ROOT or not entry[4] >> wid & 1:
            return None
        alias = self._alias[wid]
        return alias.get(seq_hash, entry[3]) if alias else entry[3]

    def depth_histogram(self) -> dict[int, int]:
        return dict(sorted(Counter(meta[2] for node, meta in self._node.items() if node != _ROOT).items()))

    def hole_counts(self) -> dict[tuple[WorkerKey, int], int]:
        keys = self._keys
        return {(keys[w], node): n for w, holes in self._holes.items() for node, n in holes.items()}

    # ---------------------------------------------------------------------------- internals

    def _added(self, wid: int) -> None:
        self._lookup[wid] = {}
        self._alias[wid] = {}

    def _forget(self, wid: int) -> None:
        del self._lookup[wid], self._alias[wid]

    def _depth(self, node: int) -> int:
        meta = self._node.get(node)
        return 0 if meta is None else meta[2]

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
            for wid in members(mask):
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
