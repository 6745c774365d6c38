"""The mocker's host (CPU) KV tier: where blocks evicted from the device cache are offloaded.

Modelled on vLLM's CPU offloading and Dynamo's KVBM G2 tier, with offloading on eviction: a
cached block the device cache reclaims is copied to host memory instead of being lost, and a
later prompt whose prefix continues there copies it back (onboards it) instead of recomputing it.

``HostTier`` is a bounded LRU of blocks, each kept with what its KV event needs (its parent's
hash, its tokens, its LoRA and extra keys). Every change it makes is published the way an
engine that offloads publishes it: a ``BlockStored`` or ``BlockRemoved`` whose ``medium`` is
``HOST_MEDIUM``, which the router indexes as its host tier (``dyn.core.kv.events.tier_of``).

Onboarding leaves the host copy in place and only refreshes its recency, as vLLM's CPU
offloading does (its LRU manager touches a block on a hit and a later store of the same block is
skipped): host memory is a second copy, not a move, so a device block and its host copy coexist.
Blocks being onboarded are protected while the device makes room for them: an offload that finds
no unprotected block to drop is skipped, as vLLM skips a store it has no room for, so a small host
tier never loses the blocks it is copying back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

from dyn.core.kv.events import BlockRemoved, BlockStored, KvEvent

HOST_MEDIUM = "CPU_PINNED"
"""The ``medium`` of the host tier's events: Dynamo's name for pinned host memory."""


class HostBlock(NamedTuple):
    """One block's KV-event payload: its parent's sequence hash (None for a prompt's first
    block), its ``block_size`` token ids, its LoRA name and its ``extra_keys`` entry."""

    parent: int | None
    token_ids: list[int]
    lora_name: str | None
    extra_key: Any


class HostTier:
    """At most ``capacity`` (> 0) blocks by sequence hash, least recently offloaded or used
    dropped first. ``offload`` appends its store and any drop to the caller's event list, so
    the host events interleave with the device ones in the order things happened; ``touch``
    publishes nothing (recency is not an event)."""

    def __init__(self, capacity: int, block_size: int) -> None:
        if capacity <= 0:
            raise ValueError("a host tier needs a positive capacity")
        self._capacity = capacity
        self._bs = block_size
        self._blocks: OrderedDict[int, HostBlock] = OrderedDict()
        self._protected: frozenset[int] = frozenset()

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, seq_hash: object) -> bool:
        return seq_hash in self._blocks

    def hashes(self) -> list[int]:
        """The blocks held, least recently used first."""
        return list(self._blocks)

    def run_length(self, hashes: Sequence[int], start: int, stop: int) -> int:
        """How many of ``hashes[start:stop]`` are held, one after the other from ``start``."""
        blocks = self._blocks
        n = 0
        for i in range(start, stop):
            if hashes[i] not in blocks:
                break
            n += 1
        return n

    def touch(self, hashes: Sequence[int]) -> None:
        """Make these held blocks the most recently used, the first of them most of all (an
        onboarding read them; a chain's head is worth more than its tail, which needs it)."""
        move = self._blocks.move_to_end
        for h in reversed(hashes):
            move(h)

    def protect(self, hashes: Sequence[int]) -> None:
        """Keep these held blocks from being dropped until ``unprotect`` (they are being read)."""
        self._protected = frozenset(hashes)

    def unprotect(self) -> None:
        self._protected = frozenset()

    def offload(self, seq_hash: int, block: HostBlock, events: list[KvEvent]) -> None:
        """Copy a block the device is evicting here. A block already held (onboarded earlier,
        so both tiers had it) is only refreshed; a new one is stored, dropping the least
        recently used unprotected block first when full (or skipping the store when every held
        block is protected), each change appended to ``events``."""
        blocks = self._blocks
        if seq_hash in blocks:
            blocks.move_to_end(seq_hash)
            return
        if len(blocks) >= self._capacity:
            victim = self._victim()
            if victim is None:
                return
            del blocks[victim]
            _append_removed(events, victim)
        blocks[seq_hash] = block
        self._append_stored(events, seq_hash, block)

    def _victim(self) -> int | None:
        """The least recently used block not protected, or None."""
        protected = self._protected
        if not protected:
            return next(iter(self._blocks))
        return next((h for h in self._blocks if h not in protected), None)

    def _append_stored(self, events: list[KvEvent], seq_hash: int, block: HostBlock) -> None:
        """Publish the store, merged into the previous host store when that one starts with
        this block's child: the device evicts a chain tail first, so one eviction's run of a
        chain becomes one event, in prefix order, as an engine's store of a run would be."""
        last = events[-1] if events else None
        if (
            type(last) is BlockStored
            and last.medium == HOST_MEDIUM
            and last.parent_block_hash == seq_hash
            and last.lora_name == block.lora_name
        ):
            last.block_hashes.insert(0, seq_hash)
            last.parent_block_hash = block.parent
            last.token_ids[:0] = block.token_ids
            if last.extra_keys is not None or block.extra_key is not None:
                tail = last.extra_keys or [None] * (len(last.block_hashes) - 1)
                last.extra_keys = [block.extra_key, *tail]
            return
        events.append(
            BlockStored(
                block_hashes=[seq_hash],
                parent_block_hash=block.parent,
                token_ids=list(block.token_ids),
                block_size=self._bs,
                medium=HOST_MEDIUM,
                lora_name=block.lora_name,
                extra_keys=None if block.extra_key is None else [block.extra_key],
            )
        )


def _append_removed(events: list[KvEvent], seq_hash: int) -> None:
    """Publish a drop, merged into a host removal that is the latest event."""
    last = events[-1] if events else None
    if type(last) is BlockRemoved and last.medium == HOST_MEDIUM:
        last.block_hashes.append(seq_hash)
    else:
        events.append(BlockRemoved(block_hashes=[seq_hash], medium=HOST_MEDIUM))
