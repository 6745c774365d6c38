"""``HolderMap``: every booked prompt block hash -> the rank slots holding it, for
``dyn.core.router.load.ActiveLoad`` at fleet size.

With it the active prefix depth of every rank at once (``prefix_depths``) is a bisection over
depths, as the KV index answers overlaps: hashes are chained, so a rank holding block ``i`` holds
blocks ``0..i`` and holder sets shrink with depth. Most blocks are held by one rank (a prompt's
body); those go in ``SoleHolders`` (hash -> slot, a C table where it was built at install, else
``DictSoleHolders``). The few held by several (shared system prompts) keep a bitmask of slots in a
dict. Booking adds the blocks new to its rank: those another rank holds are a prefix (bisection),
each moved to or updated in the masks; the rest, usually most, enter ``SoleHolders`` in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dyn.core.kv.indexer import set_bits


class DictSoleHolders(dict[int, int]):
    """``SoleHolders`` as a dict (installs without a C compiler)."""

    def put_all(self, hashes: Sequence[int], start: int, slot: int) -> None:
        """``hashes[start:]`` -> ``slot``."""
        self.update(dict.fromkeys(hashes[start:], slot))

    def pop_all(self, hashes: Sequence[int], start: int) -> None:
        """Remove ``hashes[start:]`` (those absent ignored)."""
        for h in hashes[start:]:
            self.pop(h, None)

    def set(self, h: int, slot: int) -> None:
        self[h] = slot


try:
    from dyn.core.router._block_refs import SoleHolders
except ImportError:  # built without a C compiler
    SoleHolders = DictSoleHolders  # type: ignore[misc, assignment]


def held_prefix(blocks: Sequence[int], start: int, held: Callable[[int], bool]) -> int:
    """How many of ``blocks[start:]`` are ``held``, given that those that are come first."""
    lo, hi = start, len(blocks)
    while lo < hi:
        mid = (lo + hi) >> 1
        if held(blocks[mid]):
            lo = mid + 1
        else:
            hi = mid
    return lo - start


class HolderMap:
    """Booked prompt hash -> the slots holding it (see the module docstring)."""

    def __init__(self) -> None:
        self._sole = SoleHolders()
        self._shared: dict[int, int] = {}
        """Hash -> the bitmask of the two or more slots holding it."""

    def __contains__(self, h: int) -> bool:
        return h in self._shared or h in self._sole

    def held_by(self, h: int) -> int:
        """The bitmask of the slots holding ``h`` (0: none)."""
        mask = self._shared.get(h)
        if mask is not None:
            return mask
        slot = self._sole.get(h)
        return 0 if slot is None else 1 << slot

    def hold(self, blocks: Sequence[int], slot: int, depth: int) -> None:
        """Add ``slot`` to the holders of ``blocks[depth:]``, the blocks new to its rank (the
        first ``depth`` are already held there: prefix closure)."""
        shared = held_prefix(blocks, depth, self.__contains__)
        bit = 1 << slot
        masks, sole = self._shared, self._sole
        for h in blocks[depth : depth + shared]:
            mask = masks.get(h)
            masks[h] = (1 << sole.pop(h)) | bit if mask is None else mask | bit
        sole.put_all(blocks, depth + shared, slot)

    def unhold(self, blocks: Sequence[int], slot: int, depth: int) -> None:
        """Drop ``slot`` from the holders of ``blocks[depth:]``, the blocks its rank no longer
        holds; those only it held (a suffix, found by bisection) go in one call."""
        masks, sole = self._shared, self._sole
        shared = held_prefix(blocks, depth, lambda h: h in masks or sole.get(h, slot) != slot)
        for h in blocks[depth : depth + shared]:
            self.drop(h, slot)
        sole.pop_all(blocks, depth + shared)

    def drop(self, h: int, slot: int) -> None:
        """Take ``slot`` out of ``h``'s holders (``h`` forgotten when none is left)."""
        mask = self._shared.get(h)
        if mask is None:
            if self._sole.get(h) == slot:
                self._sole.pop(h)
            return
        mask &= ~(1 << slot)
        if mask & (mask - 1):
            self._shared[h] = mask
            return
        del self._shared[h]
        if mask:
            self._sole.set(h, mask.bit_length() - 1)

    def prefix_depths(self, seq_hashes: Sequence[int], slots: int) -> np.ndarray:
        """Per slot (``slots`` of them), how many leading ``seq_hashes`` its rank holds."""
        held_by = self.held_by
        depths = np.zeros(slots, np.int64)
        n = len(seq_hashes)
        first = held_by(seq_hashes[0]) if n else 0
        if not first:
            return depths
        lo = 1 + held_prefix(seq_hashes, 1, self.__contains__)  # depth lo has holders, lo + 1 none
        bottom = held_by(seq_hashes[lo - 1])
        set_bits(depths, bottom, lo)
        stack = [(1, lo, first, bottom)]
        while stack:  # holder sets shrink with depth: equal masks mean no change between
            top_depth, bottom_depth, top, bottom = stack.pop()
            if top == bottom:
                continue
            if bottom_depth - top_depth == 1:
                set_bits(depths, top & ~bottom, top_depth)
                continue
            mid = (top_depth + bottom_depth) >> 1
            at_mid = held_by(seq_hashes[mid - 1])
            stack.append((top_depth, mid, top, at_mid))
            stack.append((mid, bottom_depth, at_mid, bottom))
        return depths
