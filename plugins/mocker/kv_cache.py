"""Paged KV blocks with prefix caching, emitting the KV events a real engine would (reference 7.3).

A sequence (``KvSequence``) holds ``ceil(tokens / block_size)`` blocks of two kinds:

- *registered*: full, computed blocks in the prefix cache under their sequence hash (the xxh3
  chain of ``dyn.core.kv.hashing``); they are the leading blocks of the sequence and may be
  shared. A registered block is *active* while some sequence holds it and *inactive* (cached,
  reusable, evictable) when none does.
- *private*: the partial tail block and blocks reserved for tokens not computed yet; never
  matched. ``commit`` registers them once computed.

Every physical block is free, active or inactive: ``num_free + num_active_blocks +
num_cached_inactive == num_blocks``. Using a cached block (a prefix hit at admission, or a block
another sequence stored first) emits nothing; only a new store emits ``BlockStored`` and only an
eviction emits ``BlockRemoved``. Eviction takes the least recently released inactive *leaf* (a
cached block with no cached child), so a chain is evicted tail first. With prefix caching off
nothing is hashed, matched or reported and every block is private.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from dyn.core.kv.events import BlockRemoved, BlockStored, KvEvent
from dyn.core.kv.hashing import block_hashes, extend_sequence_hash

# Fields of a cache entry (a small list, keyed by sequence hash).
_REF, _PARENT, _CHILDREN, _TICK = 0, 1, 2, 3


class KvSequence:
    """One request's view of the cache: its tokens (shared, append-only) and the blocks it holds.

    ``hashes`` are the sequence hashes of the full blocks of ``tokens`` computed so far (filled
    lazily by the manager); the first ``num_registered`` of them are held in the cache.
    """

    __slots__ = ("tokens", "lora_name", "hashes", "num_registered", "num_private")

    def __init__(self, tokens: list[int], lora_name: str | None = None) -> None:
        self.tokens = tokens
        self.lora_name = lora_name
        self.hashes: list[int] = []
        self.num_registered = 0
        self.num_private = 0

    @property
    def num_blocks(self) -> int:
        """Blocks this sequence holds."""
        return self.num_registered + self.num_private


class KvBlockManager:
    """A pool of ``num_blocks`` KV blocks of ``block_size`` tokens with an optional prefix cache.

    Typical use per pass: ``match_prefix`` then ``allocate`` at admission, ``allocate`` for a
    running sequence's new tokens, ``commit`` once the pass computed them, ``release`` when the
    request finishes, is preempted or aborted; ``drain_events`` at the pass boundary.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self._total = num_blocks
        self._bs = block_size
        self._caching = enable_prefix_caching
        self._free = num_blocks
        self._active = 0
        self._inactive = 0
        self._cache: dict[int, list] = {}
        self._heap: list[tuple[int, int, int]] = []  # (tick, push order, hash); lazily invalidated
        self._clock = 0
        self._pushes = 0
        self._events: list[KvEvent] = []

    # ------------------------------------------------------------------ counts

    @property
    def num_blocks(self) -> int:
        return self._total

    @property
    def block_size(self) -> int:
        return self._bs

    @property
    def enable_prefix_caching(self) -> bool:
        return self._caching

    @property
    def num_free(self) -> int:
        """Blocks holding nothing."""
        return self._free

    @property
    def num_active_blocks(self) -> int:
        """Blocks held by at least one sequence; a shared block counts once."""
        return self._active

    @property
    def num_cached_inactive(self) -> int:
        """Cached blocks no sequence holds (reusable on a hit, evictable)."""
        return self._inactive

    @property
    def num_available(self) -> int:
        """Blocks an allocation could obtain: free plus evictable."""
        return self._free + self._inactive

    @property
    def usage(self) -> float:
        """Active blocks over total blocks, in [0, 1]."""
        return self._active / self._total

    def is_cached(self, seq_hash: int) -> bool:
        """Whether a block with this sequence hash is in the cache (active or inactive)."""
        return seq_hash in self._cache

    # ------------------------------------------------------------------ hashing and matching

    def full_hashes(self, seq: KvSequence, n_blocks: int) -> list[int]:
        """``seq.hashes`` extended to cover at least ``n_blocks`` full blocks of its tokens."""
        hashes = seq.hashes
        have = len(hashes)
        if have < n_blocks:
            bs = self._bs
            local = block_hashes(seq.tokens[have * bs : n_blocks * bs], bs, seq.lora_name)
            prev = hashes[-1] if have else None
            for h in local:
                prev = extend_sequence_hash(prev, h)
                hashes.append(prev)
        return hashes

    def match_prefix(self, seq: KvSequence) -> int:
        """Number of leading full blocks of ``seq`` that are cached, leaving at least its last
        token uncached (so a fully cached prompt still computes one token). No side effects."""
        if not self._caching:
            return 0
        limit = (len(seq.tokens) - 1) // self._bs
        if limit <= 0:
            return 0
        cache = self._cache
        n = 0
        for h in self.full_hashes(seq, limit)[:limit]:
            if h not in cache:
                break
            n += 1
        return n

    # ------------------------------------------------------------------ allocation

    def allocate(self, seq: KvSequence, num_tokens: int, num_cached_blocks: int = 0) -> bool:
        """Make ``seq`` hold blocks for ``num_tokens`` tokens, evicting inactive blocks if needed.

        ``num_cached_blocks`` (only for a sequence holding nothing, from ``match_prefix``) first
        acquires that many cached prefix blocks. Returns False, changing nothing, when free plus
        evictable blocks do not suffice.
        """
        bs = self._bs
        need = (num_tokens + bs - 1) // bs - seq.num_registered - seq.num_private - num_cached_blocks
        if num_cached_blocks:
            cache = self._cache
            prefix = seq.hashes[:num_cached_blocks]
            revived = 0
            for h in prefix:
                if cache[h][_REF] == 0:
                    revived += 1
            if need > self._free + self._inactive - revived:
                return False
            for h in prefix:
                e = cache[h]
                e[_REF] += 1
            self._inactive -= revived
            self._active += revived
            seq.num_registered = num_cached_blocks
        elif need > self._free + self._inactive:
            return False
        if need > 0:
            take = need if need <= self._free else self._free
            self._free -= take
            if need > take:
                self._evict(need - take)
            self._active += need
            seq.num_private += need
        return True

    def _evict(self, n: int) -> None:
        cache = self._cache
        heap = self._heap
        removed: list[int] = []
        while len(removed) < n:
            if not heap:
                raise RuntimeError("KV cache accounting broken: no evictable block")
            tick, _, h = heapq.heappop(heap)
            e = cache.get(h)
            if e is None or e[_REF] or e[_CHILDREN] or e[_TICK] != tick:
                continue
            del cache[h]
            removed.append(h)
            parent = e[_PARENT]
            if parent is not None:
                p = cache[parent]
                p[_CHILDREN] -= 1
                if p[_CHILDREN] == 0 and p[_REF] == 0:
                    self._pushes += 1
                    heapq.heappush(heap, (p[_TICK], self._pushes, parent))
        self._inactive -= n
        events = self._events
        if events and type(events[-1]) is BlockRemoved:
            events[-1].block_hashes.extend(removed)
        else:
            events.append(BlockRemoved(block_hashes=removed))

    def commit(self, seq: KvSequence, num_computed: int) -> None:
        """Register the full blocks among the first ``num_computed`` tokens of ``seq`` (all of
        them must be allocated). A block already cached is shared and ``seq``'s private copy
        freed; new blocks are stored, each consecutive run as one ``BlockStored``."""
        if not self._caching:
            return
        bs = self._bs
        n_full = num_computed // bs
        start = seq.num_registered
        if n_full <= start:
            return
        hashes = self.full_hashes(seq, n_full)
        cache = self._cache
        parent = hashes[start - 1] if start else None
        run = -1
        for idx in range(start, n_full):
            h = hashes[idx]
            e = cache.get(h)
            if e is None:
                cache[h] = [1, parent, 0, 0]
                if parent is not None:
                    cache[parent][_CHILDREN] += 1
                if run < 0:
                    run = idx
            else:
                if e[_REF] == 0:
                    self._inactive -= 1
                else:
                    self._active -= 1
                self._free += 1
                e[_REF] += 1
                if run >= 0:
                    self._stored(seq, run, idx)
                    run = -1
            parent = h
        if run >= 0:
            self._stored(seq, run, n_full)
        seq.num_private -= n_full - start
        seq.num_registered = n_full

    def _stored(self, seq: KvSequence, start: int, end: int) -> None:
        bs = self._bs
        hashes = seq.hashes
        self._events.append(
            BlockStored(
                block_hashes=hashes[start:end],
                parent_block_hash=hashes[start - 1] if start else None,
                token_ids=seq.tokens[start * bs : end * bs],
                block_size=bs,
                lora_name=seq.lora_name,
            )
        )

    def release(self, seq: KvSequence) -> None:
        """Drop every block ``seq`` holds: private ones are freed, registered ones stay cached
        (inactive once unreferenced, most recently used as of now). ``seq.hashes`` is kept."""
        p = seq.num_private
        if p:
            self._free += p
            self._active -= p
            seq.num_private = 0
        k = seq.num_registered
        if not k:
            return
        self._clock += 1
        tick = self._clock
        cache = self._cache
        heap = self._heap
        for h in seq.hashes[:k]:
            e = cache[h]
            e[_REF] -= 1
            if e[_REF] == 0:
                self._active -= 1
                self._inactive += 1
                e[_TICK] = tick
                if e[_CHILDREN] == 0:
                    self._pushes += 1
                    heapq.heappush(heap, (tick, self._pushes, h))
        seq.num_registered = 0
        if len(heap) > 2 * self._inactive + 1024:
            self._compact()

    def _compact(self) -> None:
        cache = self._cache
        live = []
        for item in self._heap:
            e = cache.get(item[2])
            if e is not None and not e[_REF] and not e[_CHILDREN] and e[_TICK] == item[0]:
                live.append(item)
        heapq.heapify(live)
        self._heap = live

    # ------------------------------------------------------------------ events

    def drain_events(self) -> list[KvEvent]:
        """KV events since the last drain, in order; clears them."""
        events = self._events
        if not events:
            return []
        self._events = []
        return events

    def cached_hashes(self) -> Sequence[int]:
        """Sequence hashes of every cached block (active or inactive), e.g. for a full dump."""
        return list(self._cache)
