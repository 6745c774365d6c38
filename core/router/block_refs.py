"""``BlockRefs``: one rank's active block refcounts, block hash -> count (never 0), for
``dyn.core.router.load``. In C (``dyn.core.router._block_refs``) where it was built at install,
else ``DictBlockRefs``, a dict with the same calls: booking a 4,096-token prompt adds 256 hashes
and freeing it removes them, so the C table takes the per-hash loop out of Python."""

from __future__ import annotations

from collections import _count_elements  # type: ignore[attr-defined]  # Counter's C helper
from collections.abc import Iterable, Sequence


class DictBlockRefs(dict[int, int]):
    """``BlockRefs`` as a dict (installs without a C compiler)."""

    def add(self, hashes: Iterable[int]) -> None:
        """Each hash's count + 1."""
        _count_elements(self, hashes)

    def remove(self, hashes: Iterable[int]) -> None:
        """Each hash's count - 1; a hash at 1 (or absent) goes."""
        for h in hashes:
            n = self.get(h, 0)
            if n > 1:
                self[h] = n - 1
            else:
                self.pop(h, None)

    def set(self, h: int, count: int) -> None:
        """Set a hash's count (at least 1)."""
        self[h] = count

    def prefix_depth(self, seq_hashes: Sequence[int]) -> int:
        """How many leading ``seq_hashes`` are here (chained hashes: bisection)."""
        if not self or not seq_hashes or seq_hashes[0] not in self:
            return 0
        lo, hi = 1, len(seq_hashes)
        while lo < hi:
            mid = (lo + hi) // 2
            if seq_hashes[mid] in self:
                lo = mid + 1
            else:
                hi = mid
        return lo


try:
    from dyn.core.router._block_refs import BlockRefs
except ImportError:  # built without a C compiler
    BlockRefs = DictBlockRefs  # type: ignore[misc, assignment]
