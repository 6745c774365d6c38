"""From decoded engine KV events to indexer operations, and applying them to the indexers.

Two halves, so the expensive one can run off the event loop:

- ``BatchConverter.convert`` (per worker; pure apart from metrics and log lines, safe on any
  thread) turns one ``KvEventBatch`` into ``IndexOp``s: it picks the worker key
  ``(instance_id, dp_rank)`` (a batch's nonzero ``data_parallel_rank`` overrides the registered rank),
  the ``StorageTier`` from each event's ``medium``, and recomputes each stored block's local
  hash from ``token_ids[i*bs:(i+1)*bs]`` (with the event's ``lora_name``). The engine's block
  hashes are opaque ids and are passed through. A ``BlockStored`` stops at the first block whose
  token count differs from the router's block size: the leading good blocks are indexed, the
  rest are rejected (``block_size_mismatch``, at most 3 warnings per worker).
- ``TieredIndexers.apply`` (the indexers' single writer, on the event loop) applies the ops:
  device ops to the primary indexer, lower-tier ops to that tier's indexer if one is given
  (else rejected ``tier_not_indexed``), and counts each event's status. ``AllBlocksCleared``
  carries no medium and clears the device tier only (engines reset their device cache with it).

``apply_event_batch`` does both in one call. Every outcome is returned per event (in event
order) as an ``ApplyStatus`` of the indexer or a ``RejectReason``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

from dyn.core.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    StorageTier,
    tier_of,
)
from dyn.core.kv.hashing import block_hashes as local_block_hashes
from dyn.core.kv.hashing import event_block_keys
from dyn.core.kv.indexer import ApplyStatus

log = logging.getLogger(__name__)

WorkerKey = tuple[int, int]
"""``(instance_id, dp_rank)``."""

MAX_BLOCK_SIZE_WARNINGS = 3
APPLY_STATUSES = ("ok", "parent_block_not_found", "block_not_found", "invalid_block")


class EventType(enum.StrEnum):
    STORED = "stored"
    REMOVED = "removed"
    CLEARED = "cleared"


class RejectReason(enum.StrEnum):
    """Why something was refused before it reached an indexer (the ``reason`` metric label)."""

    BAD_FRAMES = "bad_frames"
    BAD_PAYLOAD = "bad_payload"
    UNKNOWN_EVENT = "unknown_event"
    BLOCK_SIZE_MISMATCH = "block_size_mismatch"
    TIER_NOT_INDEXED = "tier_not_indexed"
    REPLAY_INCOMPLETE = "replay_incomplete"
    OVER_CAPACITY = "over_capacity"
    UNKNOWN_DP_RANK = "unknown_dp_rank"
    TOO_LARGE = "too_large"
    PLAIN_EVENTS = "plain_events"


class KvEventMetrics:
    """The ingestion counters, registered on ``registry`` with every label value at zero.

    - ``dynamo_component_kv_cache_events_applied{status, event_type}``: events an indexer took,
      by the indexer's status.
    - ``dynamo_component_kv_events_rejected_total{reason}``: what was refused before an indexer,
      counted in its own unit: messages (``bad_frames``, ``bad_payload``), events
      (``unknown_event``, ``tier_not_indexed``, ``over_capacity``, ``unknown_dp_rank``), blocks
      (``block_size_mismatch``), gaps (``replay_incomplete``), messages over the size a
      worker's record allows (``too_large``) and, under ``--plane-keys``, worker records that ask
      for unencrypted KV events (``plain_events``: one per record, never subscribed to).
    - ``dynamo_component_kv_events_rejected_by_worker{worker_id, reason}``: the same, for the
      rejections that can be told apart by worker (all but those of the plain ``apply`` path).

    prometheus_client counters are thread-safe, so converters on event threads count here too.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.applied = Counter(
            "dynamo_component_kv_cache_events_applied",
            "KV events applied to an indexer, by indexer status and event type",
            ["status", "event_type"],
            registry=registry,
        )
        self.rejected = Counter(
            "dynamo_component_kv_events_rejected",
            "KV events, blocks, messages or gaps refused before the indexer, by reason",
            ["reason"],
            registry=registry,
        )
        self._applied = {
            (status, event_type): self.applied.labels(status=status, event_type=event_type.value)
            for status in APPLY_STATUSES
            for event_type in EventType
        }
        self.rejected_by_worker = Counter(
            "dynamo_component_kv_events_rejected_by_worker",
            "KV events, blocks, messages or gaps refused before the indexer, by worker and reason",
            ["worker_id", "reason"],
            registry=registry,
        )
        for reason in RejectReason:
            self.rejected.labels(reason=reason.value)

    def count_applied(self, status: str, event_type: EventType) -> None:
        counter = self._applied.get((status, event_type))
        if counter is None:
            counter = self._applied[(str(status), event_type)] = self.applied.labels(
                status=str(status), event_type=event_type.value
            )
        counter.inc()

    def count_rejected(self, reason: RejectReason, amount: int = 1, worker: int | None = None) -> None:
        """Count ``amount`` rejections, also under ``worker`` (an instance id) when given."""
        if amount:
            self.rejected.labels(reason=reason.value).inc(amount)
            if worker is not None:
                self.rejected_by_worker.labels(worker_id=str(worker), reason=reason.value).inc(amount)

    def forget_worker(self, worker: int) -> None:
        """Drop the per-worker series of a worker that left."""
        for reason in RejectReason:
            try:
                self.rejected_by_worker.remove(str(worker), reason.value)
            except KeyError:
                pass


class KvIndexWriter(Protocol):
    """The writing side of ``dyn.core.kv.indexer.RadixIndexer`` (statuses are ``ApplyStatus``)."""

    def store(
        self,
        worker: WorkerKey,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        local_hashes: Sequence[int],
    ) -> ApplyStatus: ...

    def remove(self, worker: WorkerKey, block_hashes: Sequence[int]) -> ApplyStatus: ...

    def clear(self, worker: WorkerKey) -> None: ...

    def remove_worker(self, instance_id: int) -> None: ...

    def remove_rank(self, worker: WorkerKey) -> None: ...


# --------------------------------------------------------------------------- operations


@dataclass(slots=True, frozen=True)
class StoreOp:
    worker: WorkerKey
    tier: StorageTier
    parent_hash: int | None
    block_hashes: list[int]
    local_hashes: list[int]


@dataclass(slots=True, frozen=True)
class RemoveOp:
    worker: WorkerKey
    tier: StorageTier
    block_hashes: list[int]


@dataclass(slots=True, frozen=True)
class ClearOp:
    worker: WorkerKey
    tier: StorageTier


@dataclass(slots=True, frozen=True)
class RejectedOp:
    """An event refused during conversion; kept so outcomes stay one per event."""

    event_type: EventType
    reason: RejectReason


IndexOp = StoreOp | RemoveOp | ClearOp | RejectedOp


class BatchConverter:
    """Converts one worker's batches; owns that worker's warning budget."""

    def __init__(self, instance_id: int, block_size: int, metrics: KvEventMetrics, dp_rank: int = 0) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.instance_id = instance_id
        self.block_size = block_size
        self.dp_rank = dp_rank
        self.metrics = metrics
        self._warnings_left = MAX_BLOCK_SIZE_WARNINGS

    def convert(self, batch: KvEventBatch) -> list[IndexOp]:
        rank = batch.data_parallel_rank or self.dp_rank  # rank 0 on a rank's own socket: that rank
        worker = (self.instance_id, rank)
        ops: list[IndexOp] = []
        for event in batch.events:
            if isinstance(event, BlockStored):
                ops.append(self._stored(worker, event))
            elif isinstance(event, BlockRemoved):
                ops.append(RemoveOp(worker, tier_of(event.medium), event.block_hashes))
            elif isinstance(event, AllBlocksCleared):
                ops.append(ClearOp(worker, StorageTier.DEVICE))
        return ops

    def _stored(self, worker: WorkerKey, event: BlockStored) -> IndexOp:
        bs = self.block_size
        hashes = event.block_hashes
        if event.block_size == bs:
            good = min(len(hashes), len(event.token_ids) // bs)
        else:
            good = 0
        if good < len(hashes):
            self.metrics.count_rejected(
                RejectReason.BLOCK_SIZE_MISMATCH, len(hashes) - good, self.instance_id
            )
            self._warn_mismatch(event, good)
        if good == 0:
            return RejectedOp(EventType.STORED, RejectReason.BLOCK_SIZE_MISMATCH)
        extra = event_block_keys(event.extra_keys, good) if event.extra_keys else None
        local = local_block_hashes(event.token_ids[: good * bs], bs, event.lora_name, extra)
        return StoreOp(worker, tier_of(event.medium), event.parent_block_hash, hashes[:good], local)

    def _warn_mismatch(self, event: BlockStored, good: int) -> None:
        if self._warnings_left <= 0:
            return
        self._warnings_left -= 1
        if event.block_size == 0 and not event.token_ids:
            log.warning(
                "worker %d: BlockStored without tokens (block_size 0, medium %s): vLLM's KV "
                "offloading sends these unless its connector's extra config sets "
                "self_describing_kv_events true; the router cannot hash them, so those blocks are "
                "not indexed.%s",
                self.instance_id,
                event.medium,
                "" if self._warnings_left else " (last such warning for this worker)",
            )
            return
        log.warning(
            "worker %d: BlockStored block %d of %d does not hold %d tokens (event block_size %d, "
            "%d token ids); the blocks from there on are not indexed. Start the router with the "
            "engine's KV block size (--kv-cache-block-size).%s",
            self.instance_id,
            good,
            len(event.block_hashes),
            self.block_size,
            event.block_size,
            len(event.token_ids),
            "" if self._warnings_left else " (last such warning for this worker)",
        )


# --------------------------------------------------------------------------- applying


class TieredIndexers:
    """The primary (device) indexer plus optional lower-tier indexers; their single writer."""

    def __init__(
        self,
        device: KvIndexWriter,
        metrics: KvEventMetrics,
        lower_tiers: Mapping[StorageTier, KvIndexWriter] | None = None,
    ) -> None:
        self.metrics = metrics
        self._by_tier: dict[StorageTier, KvIndexWriter] = dict(lower_tiers or {})
        self._by_tier[StorageTier.DEVICE] = device

    def add_lower_tiers(self, lower_tiers: Mapping[StorageTier, KvIndexWriter]) -> None:
        """Index these lower tiers from now on (the device tier stays as it is)."""
        for tier, writer in lower_tiers.items():
            if tier is not StorageTier.DEVICE:
                self._by_tier[tier] = writer

    def writer(self, tier: StorageTier) -> KvIndexWriter | None:
        """The indexer of ``tier``, or None when that tier is not indexed."""
        return self._by_tier.get(tier)

    def apply(self, ops: Sequence[IndexOp]) -> list[str]:
        """Apply ops in order; returns each one's ``ApplyStatus`` or ``RejectReason``."""
        return [self._apply_one(op) for op in ops]

    def _apply_one(self, op: IndexOp) -> str:
        if isinstance(op, RejectedOp):
            return op.reason
        event_type = (
            EventType.STORED
            if isinstance(op, StoreOp)
            else EventType.REMOVED
            if isinstance(op, RemoveOp)
            else EventType.CLEARED
        )
        indexer = self._by_tier.get(op.tier)
        if indexer is None:
            self.metrics.count_rejected(RejectReason.TIER_NOT_INDEXED)
            return RejectReason.TIER_NOT_INDEXED
        status: str
        if isinstance(op, StoreOp):
            status = indexer.store(op.worker, op.parent_hash, op.block_hashes, op.local_hashes)
        elif isinstance(op, RemoveOp):
            status = indexer.remove(op.worker, op.block_hashes)
        else:
            indexer.clear(op.worker)
            status = "ok"
        self.metrics.count_applied(str(status), event_type)
        return status

    def remove_worker(self, instance_id: int) -> None:
        """Drop every block of every dp rank of ``instance_id`` from every tier."""
        for indexer in self._by_tier.values():
            indexer.remove_worker(instance_id)

    def remove_rank(self, worker: WorkerKey) -> None:
        """Forget one ``(instance_id, dp_rank)`` and its blocks in every tier."""
        for indexer in self._by_tier.values():
            indexer.remove_rank(worker)


def apply_event_batch(batch: KvEventBatch, converter: BatchConverter, indexers: TieredIndexers) -> list[str]:
    """Convert one batch and apply it now; returns one outcome per converted event."""
    return indexers.apply(converter.convert(batch))
