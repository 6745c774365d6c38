"""Lower storage tiers (host memory, disk, external pools): their indexes and the tiered lookup
(reference 2.5).

Engines that offload KV blocks out of device memory publish them with a ``medium`` naming the tier
(``dyn.core.kv.events.tier_of``): vLLM's CPU offloading (``CPU``), SGLang's HiCache
(``CPU_PINNED``, ``DISK``, ``EXTERNAL``). Each lower tier has a ``LowerTierIndexer`` that
answers one question: starting from a block a worker holds (named by the engine's own hash), how
many of the prompt's next blocks does that worker hold, one after the other, in this tier?

``LowerTierIndexer`` keeps, per (worker, dp_rank), the *continuation edges* of its stored blocks:
``(parent block hash, local hash) -> block hash``, the parent being the engine's hash of the
block before it (``ROOT`` for a block at the start of a prompt). The parent may live in another
tier, or nowhere any more: a lower tier refuses no store for want of a parent. The walk is then
one dict probe per matched block. Removes take single blocks out (a removed block cuts the walk
there, nothing below it is dropped); clear and worker departure drop a rank's whole tier.

``LowerTierIndexes.hits`` is the tiered lookup: for each rank with lower-tier blocks it starts
from the last block of that rank's device match, walks the host tier, then disk from where host
stopped, then external from where disk stopped; disk and external are counted together (Dynamo's
"disk" bucket). Ranks without lower-tier blocks are not visited, so a router whose workers
publish no lower tier pays one emptiness check per prompt.

Single writer, like ``RadixIndexer``: every method runs on the index's own thread or task.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

from dyn.core.kv.events import StorageTier
from dyn.core.kv.indexer import ApplyStatus, OverlapScores, WorkerKey

ROOT = -1
"""The parent of a prompt's first block (engine hashes are unsigned 64-bit)."""

LOWER_TIERS = (StorageTier.HOST_PINNED, StorageTier.DISK, StorageTier.EXTERNAL)
"""The tiers below device memory, in the order a walk visits them."""

_Edge = tuple[int, int]
"""(parent block hash or ROOT, local hash)."""


class TierHits(NamedTuple):
    """A rank's blocks beyond its device match: ``host`` in host memory, then ``disk`` on disk
    or in an external pool (each continuing where the tier before it stopped)."""

    host: int
    disk: int


TieredScores = dict[WorkerKey, TierHits]
"""Lower-tier hits per rank; a rank that is absent has none."""


class DeviceAnchors(Protocol):
    """Where a rank's device match ends, as the engine names that block (``RadixIndexer``)."""

    def block_hash_of(self, worker: WorkerKey, seq_hash: int) -> int | None: ...


class LowerTierIndexer:
    """One lower tier's continuation edges per (worker, dp_rank); the ``KvIndexWriter`` API.

    Invariant: for each rank, ``_edges`` and ``_blocks`` are inverse maps (edge -> block and
    block -> edge), so each block hash sits on exactly one edge.
    """

    def __init__(self) -> None:
        self._edges: dict[WorkerKey, dict[_Edge, int]] = {}
        self._blocks: dict[WorkerKey, dict[int, _Edge]] = {}

    # ------------------------------------------------------------------------------- events

    def store(
        self,
        worker: WorkerKey,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        local_hashes: Sequence[int],
    ) -> ApplyStatus:
        """Add a chain of blocks: ``block_hashes[0]`` follows ``parent_hash`` (None: the start of
        a prompt), each next block the one before it. A block hash stored again takes its new
        place; an edge stored again under another hash takes the new hash. Hash lists of
        different lengths, or a hash repeated (or equal to the parent), are ``INVALID_BLOCK``
        and change nothing."""
        n = len(block_hashes)
        if n != len(local_hashes):
            return ApplyStatus.INVALID_BLOCK
        distinct = set(block_hashes)
        if len(distinct) != n or parent_hash in distinct:
            return ApplyStatus.INVALID_BLOCK
        edges = self._edges.setdefault(worker, {})
        blocks = self._blocks.setdefault(worker, {})
        parent = ROOT if parent_hash is None else parent_hash
        for block, local in zip(block_hashes, local_hashes):
            edge = (parent, local)
            moved_from = blocks.get(block)
            if moved_from is not None and moved_from != edge:
                del edges[moved_from]
            renamed = edges.get(edge)
            if renamed is not None and renamed != block:
                del blocks[renamed]
            edges[edge] = block
            blocks[block] = edge
            parent = block
        return ApplyStatus.OK

    def remove(self, worker: WorkerKey, block_hashes: Sequence[int]) -> ApplyStatus:
        """Take these blocks out of the rank's tier; hashes it does not hold are skipped and
        reported as ``BLOCK_NOT_FOUND``."""
        blocks = self._blocks.get(worker)
        if blocks is None:
            return ApplyStatus.BLOCK_NOT_FOUND if block_hashes else ApplyStatus.OK
        edges = self._edges[worker]
        missing = False
        for block in block_hashes:
            edge = blocks.pop(block, None)
            if edge is None:
                missing = True
            else:
                del edges[edge]
        return ApplyStatus.BLOCK_NOT_FOUND if missing else ApplyStatus.OK

    def clear(self, worker: WorkerKey) -> None:
        """Drop every block of one rank in this tier (a tier keeps no rank without blocks)."""
        self._edges.pop(worker, None)
        self._blocks.pop(worker, None)

    remove_rank = clear

    def remove_worker(self, instance_id: int) -> None:
        """Drop every block of every dp rank of ``instance_id`` in this tier."""
        for key in [key for key in self._blocks if key[0] == instance_id]:
            self.clear(key)

    # ------------------------------------------------------------------------------ queries

    def continuation(
        self, worker: WorkerKey, anchor: int, local_hashes: Sequence[int], start: int
    ) -> tuple[int, int]:
        """How many of ``local_hashes[start:]`` the rank holds here one after the other, the
        first following the block ``anchor`` (``ROOT``: the start of the prompt); and the hash of
        the last of them (``anchor`` when none), where the next tier's walk goes on."""
        edges = self._edges.get(worker)
        if not edges:
            return 0, anchor
        node = anchor
        count = 0
        for i in range(start, len(local_hashes)):
            child = edges.get((node, local_hashes[i]))
            if child is None:
                break
            node = child
            count += 1
        return count, node

    def blocks_held(self, worker: WorkerKey) -> int:
        """How many blocks one rank holds in this tier (0 for one it does not know)."""
        blocks = self._blocks.get(worker)
        return 0 if blocks is None else len(blocks)

    def blocks_per_worker(self) -> dict[WorkerKey, int]:
        """Blocks held per rank, for the ranks that hold any."""
        return {key: len(blocks) for key, blocks in self._blocks.items() if blocks}

    def workers(self) -> Iterable[WorkerKey]:
        """The ranks that hold at least one block in this tier."""
        return (key for key, blocks in self._blocks.items() if blocks)

    @property
    def size(self) -> int:
        """Total (rank, block) entries."""
        return sum(len(blocks) for blocks in self._blocks.values())

    def holds_any(self) -> bool:
        """Whether some rank holds a block in this tier (asked on every route: no count)."""
        return any(self._blocks.values())


class LowerTierIndexes:
    """The host, disk and external tiers' indexes together, and the tiered lookup over them."""

    def __init__(self) -> None:
        self.by_tier: dict[StorageTier, LowerTierIndexer] = {tier: LowerTierIndexer() for tier in LOWER_TIERS}

    def writers(self) -> dict[StorageTier, LowerTierIndexer]:
        """Each lower tier's indexer, to hand to KV-event ingestion (``TieredIndexers``)."""
        return dict(self.by_tier)

    def remove_worker(self, instance_id: int) -> None:
        """Drop every block of ``instance_id`` from every lower tier."""
        for index in self.by_tier.values():
            index.remove_worker(instance_id)

    def empty(self) -> bool:
        """Whether no rank holds any block in any lower tier."""
        return not any([index.holds_any() for index in self.by_tier.values()])

    def hits(
        self,
        device: DeviceAnchors,
        local_hashes: Sequence[int],
        seq_hashes: Sequence[int],
        device_scores: OverlapScores,
    ) -> TieredScores:
        """Per rank, the prompt's blocks found beyond its device match (``device_scores``, from
        the device index ``device`` that names the blocks): host, then disk and external, each
        walk continuing from the last block the one before it matched. A rank whose device match
        ends on a block the device index no longer names is skipped; ranks with no hit are
        absent."""
        host, disk, external = (self.by_tier[tier] for tier in LOWER_TIERS)
        ranks = {*host.workers(), *disk.workers(), *external.workers()}
        out: TieredScores = {}
        for rank in ranks:
            depth = device_scores.get(rank, 0)
            anchor = ROOT if depth == 0 else device.block_hash_of(rank, seq_hashes[depth - 1])
            if anchor is None:
                continue
            in_host, anchor = host.continuation(rank, anchor, local_hashes, depth)
            depth += in_host
            on_disk, anchor = disk.continuation(rank, anchor, local_hashes, depth)
            in_external, _ = external.continuation(rank, anchor, local_hashes, depth + on_disk)
            if in_host or on_disk or in_external:
                out[rank] = TierHits(in_host, on_disk + in_external)
        return out
