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

Three additions that an LRU-only run never pays for:

- **Pins** (``pin_prefix``): cached blocks protected from eviction until a deadline on the
  manager's injectable ``clock`` (default ``time.monotonic``; an offline replay passes virtual
  time). A pinned inactive block is not evictable (``num_available`` excludes it); once the pin
  expires the block re-enters the eviction order with its old rank.
- **Priority eviction** (``PriorityKvBlockManager``, SGLang's ``--radix-eviction-policy
  priority``): the least important evictable leaf goes first, ties least recently released first.
- **A host tier** (``host_blocks`` > 0, ``--num-host-kv-blocks``; ``host_tier.HostTier``): every
  evicted block is offloaded there (after the device ``BlockRemoved``, a ``BlockStored`` with the
  host medium, its parent and tokens as the device store had them; the host tier's own LRU drops
  publish host ``BlockRemoved``). ``match_host`` finds how far a prompt continues there past its
  device match and ``allocate_onboarding`` copies those blocks back: they are stored on the device
  again (device ``BlockStored``) and keep their host copy.

A sequence can also hold blocks *outside* the prefix cache (``KvSequence.outside``: a streaming
session's later turns): ``commit`` registers nothing for it, so its new blocks stay private,
unmatchable and unreported.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence

from dyn.core.kv.events import DEFAULT_MEDIUM, BlockRemoved, BlockStored, KvEvent
from dyn.core.kv.hashing import (
    MediaSpan,
    block_hashes,
    extend_sequence_hash,
    media_block_keys,
    mm_key,
    sequence_hashes,
)
from dyn.plugins.mocker.host_tier import HostBlock, HostTier

# Fields of a cache entry (a small list, keyed by sequence hash). _IMP: importance (priority
# eviction only). Eviction-heap items end with (tick, push order, hash).
_REF, _PARENT, _CHILDREN, _TICK, _IMP = 0, 1, 2, 3, 4


class KvSequence:
    """One request's view of the cache: its tokens (shared, append-only) and the blocks it holds.

    ``hashes`` are the sequence hashes of the full blocks of ``tokens`` computed so far (filled
    lazily by the manager); the first ``num_registered`` of them are held in the cache.
    ``importance`` is what priority eviction gives the blocks it stores or uses; ``outside``
    keeps its new blocks out of the prefix cache. ``media``: the prompt's images (audio, video) as
    ``(offset, length, mm_hash)``: the blocks their placeholder tokens fall in hash with them (a
    different image at the same tokens is another block, as in vLLM) and their stored events
    carry them in ``extra_keys`` as vLLM's do.
    """

    __slots__ = (
        "tokens",
        "lora_name",
        "media",
        "hashes",
        "num_registered",
        "num_private",
        "importance",
        "outside",
    )

    def __init__(
        self,
        tokens: list[int],
        lora_name: str | None = None,
        importance: float = 0,
        media: tuple[tuple[int, int, str], ...] = (),
    ) -> None:
        self.tokens = tokens
        self.lora_name = lora_name
        self.media = media
        self.hashes: list[int] = []
        self.num_registered = 0
        self.num_private = 0
        self.importance = importance
        self.outside = False

    @property
    def num_blocks(self) -> int:
        """Blocks this sequence holds."""
        return self.num_registered + self.num_private


class KvBlockManager:
    """A pool of ``num_blocks`` KV blocks of ``block_size`` tokens with an optional prefix cache.

    Typical use per pass: ``match_prefix`` then ``allocate`` at admission, ``allocate`` for a
    running sequence's new tokens, ``commit`` once the pass computed them, ``release`` when the
    request finishes, is preempted or aborted; ``drain_events`` at the pass boundary. With a
    host tier (``host_blocks`` > 0), admission also asks ``match_host`` and, when that finds
    blocks, allocates with ``allocate_onboarding``.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        clock: Callable[[], float] = time.monotonic,
        host_blocks: int = 0,
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self._total = num_blocks
        self._bs = block_size
        self._caching = enable_prefix_caching
        self._now = clock
        self._free = num_blocks
        self._active = 0
        self._inactive = 0
        self._cache: dict[int, list] = {}
        self._heap: list[tuple] = []  # eviction candidates, lazily invalidated (see _push_leaf)
        self._tick = 0
        self._pushes = 0
        self._events: list[KvEvent] = []
        self._pins: dict[int, float] = {}  # hash -> expiry, until the expiry is processed
        self._pin_heap: list[tuple[float, int]] = []
        self._pinned_inactive = 0  # inactive blocks in _pins
        self._host = HostTier(host_blocks, block_size) if host_blocks > 0 and enable_prefix_caching else None
        self._payload: dict[int, HostBlock] = {}  # with a host tier: what offloading a cached block needs

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
        """Blocks an allocation could obtain: free plus evictable (inactive and not pinned)."""
        return self._free + self._evictable()

    @property
    def clock(self) -> Callable[[], float]:
        return self._now

    @property
    def usage(self) -> float:
        """Active blocks over total blocks, in [0, 1]."""
        return self._active / self._total

    def is_cached(self, seq_hash: int) -> bool:
        """Whether a block with this sequence hash is in the cache (active or inactive)."""
        return seq_hash in self._cache

    @property
    def host(self) -> HostTier | None:
        """The host tier, or None without one."""
        return self._host

    # ------------------------------------------------------------------ hashing and matching

    def full_hashes(self, seq: KvSequence, n_blocks: int) -> list[int]:
        """``seq.hashes`` extended to cover at least ``n_blocks`` full blocks of its tokens."""
        hashes = seq.hashes
        have = len(hashes)
        if have < n_blocks:
            bs = self._bs
            extra = None
            if seq.media:
                spans = [MediaSpan(offset, length, mm_key(h) or 0) for offset, length, h in seq.media]
                extra = media_block_keys(spans, bs, n_blocks - have, first_block=have)
            local = block_hashes(seq.tokens[have * bs : n_blocks * bs], bs, seq.lora_name, extra)
            if not have:  # a whole prompt: chained in one call
                hashes.extend(sequence_hashes(local))
                return hashes
            prev = hashes[-1]
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
            pins = self._pins
            if pins:
                self._expire_pins()
            prefix = seq.hashes[:num_cached_blocks]
            revived = revived_pinned = 0
            for h in prefix:
                if cache[h][_REF] == 0:
                    revived += 1
                    if pins and h in pins:
                        revived_pinned += 1
            evictable = self._inactive - self._pinned_inactive - (revived - revived_pinned)
            if need > self._free and need > self._free + evictable:
                return False
            for h in prefix:
                e = cache[h]
                e[_REF] += 1
            self._inactive -= revived
            self._pinned_inactive -= revived_pinned
            self._active += revived
            seq.num_registered = num_cached_blocks
        elif need > self._free and need > self._free + self._evictable():
            return False
        if need > 0:
            take = need if need <= self._free else self._free
            self._free -= take
            if need > take:
                self._evict(need - take)
            self._active += need
            seq.num_private += need
        return True

    def _evictable(self) -> int:
        if self._pins:
            self._expire_pins()
        return self._inactive - self._pinned_inactive

    def _push_leaf(self, h: int, e: list) -> None:
        """Make an inactive leaf an eviction candidate; LRU ranks by release tick."""
        self._pushes += 1
        heapq.heappush(self._heap, (e[_TICK], self._pushes, h))

    def _evict(self, n: int) -> None:
        """Evict ``n`` blocks; the caller checked they are evictable (pins expired just before)."""
        cache = self._cache
        heap = self._heap
        pins = self._pins
        removed: list[int] = []
        while len(removed) < n:
            if not heap:
                raise RuntimeError("KV cache accounting broken: no evictable block")
            item = heapq.heappop(heap)
            h = item[-1]
            e = cache.get(h)
            if e is None or e[_REF] or e[_CHILDREN] or e[_TICK] != item[-3]:
                continue
            if pins and h in pins:
                continue  # pushed again when its pin expires
            del cache[h]
            removed.append(h)
            parent = e[_PARENT]
            if parent is not None:
                p = cache[parent]
                p[_CHILDREN] -= 1
                if p[_CHILDREN] == 0 and p[_REF] == 0:
                    self._push_leaf(parent, p)
        self._inactive -= n
        events = self._events
        last = events[-1] if events else None
        if type(last) is BlockRemoved and last.medium == DEFAULT_MEDIUM:
            last.block_hashes.extend(removed)
        else:
            events.append(BlockRemoved(block_hashes=removed))
        host = self._host
        if host is not None:
            payload = self._payload
            for h in removed:
                host.offload(h, payload.pop(h), events)

    def commit(self, seq: KvSequence, num_computed: int) -> None:
        """Register the full blocks among the first ``num_computed`` tokens of ``seq`` (all of
        them must be allocated). A block already cached is shared and ``seq``'s private copy
        freed; new blocks are stored, each consecutive run as one ``BlockStored``."""
        if not self._caching:
            return
        bs = self._bs
        n_full = num_computed // bs
        start = seq.num_registered
        if n_full <= start or seq.outside:
            return
        hashes = self.full_hashes(seq, n_full)
        cache = self._cache
        parent = hashes[start - 1] if start else None
        run = -1
        for idx in range(start, n_full):
            h = hashes[idx]
            e = cache.get(h)
            if e is None:
                cache[h] = [1, parent, 0, 0, seq.importance]
                if parent is not None:
                    cache[parent][_CHILDREN] += 1
                if run < 0:
                    run = idx
            else:
                if e[_REF] == 0:
                    self._inactive -= 1
                    if self._pins and h in self._pins:
                        self._pinned_inactive -= 1
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
        token_ids = seq.tokens[start * bs : end * bs]
        extra_keys = _extra_keys(seq.media, bs, start, end) if seq.media else None
        self._events.append(
            BlockStored(
                block_hashes=hashes[start:end],
                parent_block_hash=hashes[start - 1] if start else None,
                token_ids=token_ids,
                block_size=bs,
                lora_name=seq.lora_name,
                extra_keys=extra_keys,
            )
        )
        if self._host is not None:
            self._keep_payload(seq, start, end, token_ids, extra_keys)

    def _keep_payload(
        self, seq: KvSequence, start: int, end: int, token_ids: list[int], extra_keys: list | None
    ) -> None:
        """Remember what the host store of blocks ``start..end`` will publish if evicted."""
        bs = self._bs
        hashes = seq.hashes
        payload = self._payload
        for i in range(start, end):
            offset = (i - start) * bs
            payload[hashes[i]] = HostBlock(
                hashes[i - 1] if i else None,
                token_ids[offset : offset + bs],
                seq.lora_name,
                None if extra_keys is None else extra_keys[i - start],
            )

    # ------------------------------------------------------------------ host tier

    def match_host(self, seq: KvSequence, start: int) -> int:
        """How many full blocks of ``seq`` after its first ``start`` (its device match) are in
        the host tier, one after the other, leaving its last token uncached as ``match_prefix``
        does; 0 without a host tier. No side effects."""
        host = self._host
        if host is None or not len(host):
            return 0
        limit = (len(seq.tokens) - 1) // self._bs
        if start >= limit:
            return 0
        return host.run_length(self.full_hashes(seq, limit), start, limit)

    def allocate_onboarding(
        self, seq: KvSequence, num_tokens: int, num_cached_blocks: int, host_blocks: int
    ) -> bool:
        """``allocate``, then copy back from the host tier the ``host_blocks`` blocks of ``seq``
        that follow its ``num_cached_blocks`` device hits (``match_host``'s count, just asked):
        they enter the device cache as computed (device ``BlockStored``) and stay in the host
        tier, now its most recently used. While the allocation evicts (and offloads), those
        host blocks cannot be dropped. Returns False, changing nothing, when ``allocate`` does."""
        host = self._host
        if host is None:
            raise RuntimeError("onboarding needs a host tier")
        start = num_cached_blocks
        onboarding = seq.hashes[start : start + host_blocks]
        host.protect(onboarding)
        try:
            if not self.allocate(seq, num_tokens, num_cached_blocks):
                return False
        finally:
            host.unprotect()
        host.touch(onboarding)
        self.commit(seq, (start + host_blocks) * self._bs)
        return True

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
        self._tick += 1
        tick = self._tick
        cache = self._cache
        pins = self._pins
        for h in seq.hashes[:k]:
            e = cache[h]
            e[_REF] -= 1
            if e[_REF] == 0:
                self._active -= 1
                self._inactive += 1
                if pins and h in pins:
                    self._pinned_inactive += 1
                e[_TICK] = tick
                if e[_CHILDREN] == 0:
                    self._push_leaf(h, e)
        seq.num_registered = 0
        if len(self._heap) > 2 * self._inactive + 1024:
            self._compact()

    def truncate(self, seq: KvSequence, num_blocks: int) -> None:
        """Free ``seq``'s private blocks beyond its first ``num_blocks`` (registered blocks, which
        lead, are kept): a session turn giving back what it added to its slot's KV."""
        extra = seq.num_registered + seq.num_private - num_blocks
        if extra > 0:
            if extra > seq.num_private:
                raise RuntimeError("truncate would drop registered blocks")
            seq.num_private -= extra
            self._free += extra
            self._active -= extra

    def _compact(self) -> None:
        cache = self._cache
        live = []
        for item in self._heap:
            e = cache.get(item[-1])
            if e is not None and not e[_REF] and not e[_CHILDREN] and e[_TICK] == item[-3]:
                live.append(item)
        heapq.heapify(live)
        self._heap = live

    # ------------------------------------------------------------------ pins

    def pin_prefix(self, token_ids: Sequence[int], ttl_s: float, lora_name: str | None = None) -> int:
        """Pin the leading cached full blocks of ``token_ids`` (matched by sequence hash, every
        full block, unlike ``match_prefix``) until ``clock() + ttl_s``; a block already pinned
        longer keeps its later expiry. Returns how many blocks are pinned."""
        if not self._caching or ttl_s <= 0:
            return 0
        n_full = len(token_ids) // self._bs
        if n_full == 0:
            return 0
        self._expire_pins()
        expiry = self._now() + ttl_s
        probe = KvSequence(list(token_ids[: n_full * self._bs]), lora_name)
        cache = self._cache
        pins = self._pins
        count = 0
        for h in self.full_hashes(probe, n_full):
            e = cache.get(h)
            if e is None:
                break
            old = pins.get(h)
            if old is None or expiry > old:
                if old is None and e[_REF] == 0:
                    self._pinned_inactive += 1
                pins[h] = expiry
                heapq.heappush(self._pin_heap, (expiry, h))
            count += 1
        return count

    def is_pinned(self, seq_hash: int) -> bool:
        """Whether the block's pin is still in force."""
        self._expire_pins()
        return seq_hash in self._pins

    def _expire_pins(self) -> None:
        """Unpin blocks whose pin ran out; an inactive leaf becomes an eviction candidate again."""
        heap = self._pin_heap
        if not heap:
            return
        now = self._now()
        pins = self._pins
        cache = self._cache
        while heap and heap[0][0] <= now:
            expiry, h = heapq.heappop(heap)
            if pins.get(h) != expiry:
                continue  # extended: a later heap item holds the new expiry
            del pins[h]
            e = cache[h]  # pinned blocks are never evicted
            if e[_REF] == 0:
                self._pinned_inactive -= 1
                if e[_CHILDREN] == 0:
                    self._push_leaf(h, e)

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


class PriorityKvBlockManager(KvBlockManager):
    """SGLang's ``--radix-eviction-policy priority``: evict the least important evictable leaf
    first, ties least recently released first (SGLang's ``PriorityStrategy`` ranks a node by
    ``(priority, last_access_time)``).

    Following SGLang's ``RadixCache._insert_helper`` (``node.priority = max(node.priority,
    priority)`` on every node of the inserted path), a block's importance is the highest
    ``KvSequence.importance`` among the sequences that stored it or used it (a prefix hit or a
    shared store). Since a sequence holds its whole chain, a parent is never less important than
    its children, so leaf-first eviction and importance order agree.
    """

    def _push_leaf(self, h: int, e: list) -> None:
        self._pushes += 1
        heapq.heappush(self._heap, (e[_IMP], e[_TICK], self._pushes, h))

    def allocate(self, seq: KvSequence, num_tokens: int, num_cached_blocks: int = 0) -> bool:
        if not super().allocate(seq, num_tokens, num_cached_blocks):
            return False
        if num_cached_blocks:
            self._raise_importance(seq, 0, num_cached_blocks)
        return True

    def commit(self, seq: KvSequence, num_computed: int) -> None:
        start = seq.num_registered
        super().commit(seq, num_computed)
        if seq.num_registered > start:
            self._raise_importance(seq, start, seq.num_registered)

    def _raise_importance(self, seq: KvSequence, start: int, end: int) -> None:
        imp = seq.importance
        cache = self._cache
        for h in seq.hashes[start:end]:
            e = cache[h]
            if imp > e[_IMP]:
                e[_IMP] = imp

    def importance_of(self, seq_hash: int) -> float:
        """A cached block's importance (for inspection)."""
        return self._cache[seq_hash][_IMP]


def _extra_keys(
    media: tuple[tuple[int, int, str], ...], bs: int, start: int, end: int
) -> list[tuple[tuple[str, int], ...] | None]:
    """vLLM's ``extra_keys`` of blocks ``start..end``: per block the ``(mm_hash, offset)`` of each
    item its tokens overlap, or None."""
    out: list[tuple[tuple[str, int], ...] | None] = []
    for block in range(start, end):
        lo, hi = block * bs, (block + 1) * bs
        keys = tuple((h, offset) for offset, length, h in media if offset < hi and lo < offset + length)
        out.append(keys or None)
    return out
