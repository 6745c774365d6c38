"""What ``dyn inspect-kv`` reports, and the arithmetic that turns the index views into it.

Pure functions over what the views answer (``dyn.core.kv.views``): ``/workers`` entries,
``/dump`` events, a ``/query`` answer and the metrics ``dyn.core.inspect.metrics`` reads. Nothing
here does I/O, so every number can be checked against a hand-built index state.

``--json`` prints one ``KvSnapshot`` as a JSON object (``--watch --json``: one per refresh, one
per line). Its schema, field by field (``null`` where the target cannot know):

- ``target`` (str): the base URL of the views read (``http://HOST:PORT`` for a ``dyn indexer``,
  ``http://HOST:PORT/kv`` for a frontend or a ``dyn router``).
- ``model`` (str | null), ``block_size`` (int | null): the indexed model and its KV block size
  in tokens (from ``/dump``).
- ``workers``: one object per (worker instance, dp rank), sorted by ``instance_id, dp_rank``:
  ``instance_id``, ``dp_rank`` (int), ``blocks`` (int, cached blocks the index holds for it),
  ``total_blocks`` (int | null, its KV capacity in blocks), ``occupancy`` (float | null,
  ``blocks / total_blocks``), ``max_depth`` (int | null, the deepest block it holds, counted from
  the root; null without a dump), ``endpoint`` (str | null, its KV-event socket).
- ``cached_blocks`` (int): the sum of the workers' ``blocks``.
- ``tree`` (null in ``--watch``): ``nodes`` (distinct cached prefixes: blocks shared by several
  workers count once), ``entries`` ((worker, block) pairs in the dump), ``max_depth`` and
  ``depth_histogram``: ``[{"min_depth", "max_depth", "blocks"}]``, the entries by depth in their
  worker's chain (depth 1 = a prompt's first block), in power-of-two buckets 1, 2-3, 4-7, ...
  (empty buckets are left out).
- ``hit_rate``: the KV router's predicted hit rate, from the
  ``dynamo_component_router_kv_hit_rate`` histogram: ``mean`` (float | null, its sum / count) and
  ``requests`` (its count); null when the target has no router (a bare ``dyn indexer``).
- ``events``: KV events applied to the index, from
  ``dynamo_component_kv_cache_events_applied_total``: ``applied`` (int, every status), ``failed``
  (int, a status other than ``ok``) and ``per_second`` (float | null: the rate since the previous
  refresh, in ``--watch`` only); null when the target is not fed by KV events.
- ``overlap`` (only with ``--prompt`` or ``--messages``): ``prompt_tokens``, ``prompt_blocks``
  (full blocks of the prompt), ``block_size`` and ``workers``: ``[{"instance_id", "dp_rank",
  "matched_blocks", "matched_tokens", "share"}]`` for every listed worker (``share``:
  ``matched_tokens / prompt_tokens``), best match first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

WorkerKey = tuple[int, int]


class WorkerCache(msgspec.Struct, kw_only=True):
    """One (instance, dp rank)'s share of the index."""

    instance_id: int
    dp_rank: int
    blocks: int
    total_blocks: int | None = None
    occupancy: float | None = None
    max_depth: int | None = None
    endpoint: str | None = None


class DepthBucket(msgspec.Struct):
    min_depth: int
    max_depth: int
    blocks: int


class TreeStats(msgspec.Struct, kw_only=True):
    nodes: int
    entries: int
    max_depth: int
    depth_histogram: list[DepthBucket]


class HitRate(msgspec.Struct, kw_only=True):
    mean: float | None
    requests: int


class EventCounts(msgspec.Struct, kw_only=True):
    applied: int
    failed: int
    per_second: float | None = None


class WorkerOverlap(msgspec.Struct, kw_only=True):
    instance_id: int
    dp_rank: int
    matched_blocks: int
    matched_tokens: int
    share: float


class Overlap(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    prompt_blocks: int
    block_size: int
    workers: list[WorkerOverlap]


class KvSnapshot(msgspec.Struct, kw_only=True):
    """Everything one inspection shows (the JSON schema is in the module docstring)."""

    target: str
    model: str | None
    block_size: int | None
    workers: list[WorkerCache]
    cached_blocks: int
    tree: TreeStats | None = None
    hit_rate: HitRate | None = None
    events: EventCounts | None = None
    overlap: Overlap | None = None


# --------------------------------------------------------------------------- the dump


class DumpEvent(msgspec.Struct):
    """One ``/dump`` event: a (worker, block) entry and its parent in that worker's chain."""

    worker_id: int
    dp_rank: int
    parent_hash: int | None
    block_hash: int
    tokens_hash: int


class Dump(msgspec.Struct):
    """One model's ``/dump``."""

    block_size: int | None
    events: list[DumpEvent]


def entry_depths(events: Sequence[DumpEvent]) -> tuple[dict[tuple[WorkerKey, int], int], int]:
    """The depth of every (worker, block hash) entry in its worker's chain (1: a root block) and
    the number of distinct tree nodes (a node is the path of content hashes from the root, so a
    prefix several workers cache counts once).

    Order does not matter. A parent the worker does not hold in the dump starts a chain of its
    own (its first block counts as depth 1, and its node is not shared with other workers).
    """
    by_worker: dict[tuple[WorkerKey, int], DumpEvent] = {}
    for e in events:
        by_worker[((e.worker_id, e.dp_rank), e.block_hash)] = e
    depth: dict[tuple[WorkerKey, int], int] = {}
    node: dict[tuple[WorkerKey, int], int] = {}
    nodes: dict[tuple[Any, int], int] = {}  # (parent node, content hash) -> node id
    for key in by_worker:
        chain: list[tuple[WorkerKey, int]] = []
        at: tuple[WorkerKey, int] | None = key
        while at is not None and at not in depth and at in by_worker and at not in chain:
            chain.append(at)
            parent = by_worker[at].parent_hash
            at = (at[0], parent) if parent is not None else None
        parent_node: int | None
        if at is not None and at in depth:
            base, parent_node = depth[at], node[at]
        else:  # the root, or a parent missing from the dump (or a cycle): a chain of its own
            base = 0
            parent_node = -1 if at is None else None
        for entry in reversed(chain):
            base += 1
            owner: Any = parent_node if parent_node is not None else ("orphan", entry)
            parent_node = nodes.setdefault((owner, by_worker[entry].tokens_hash), len(nodes))
            depth[entry], node[entry] = base, parent_node
    return depth, len(nodes)


def depth_buckets(depths: Iterable[int]) -> list[DepthBucket]:
    """Counts of ``depths`` in power-of-two buckets 1, 2-3, 4-7, ... (empty ones left out)."""
    counts = Counter(d.bit_length() for d in depths if d >= 1)
    return [DepthBucket(1 << (b - 1), (1 << b) - 1, counts[b]) for b in sorted(counts)]


def tree_stats(dump: Dump) -> tuple[TreeStats, dict[WorkerKey, int]]:
    """The tree's size and depth histogram, and each worker's deepest block."""
    depths, nodes = entry_depths(dump.events)
    deepest: dict[WorkerKey, int] = {}
    for (worker, _), d in depths.items():
        if d > deepest.get(worker, 0):
            deepest[worker] = d
    stats = TreeStats(
        nodes=nodes,
        entries=len(depths),
        max_depth=max(depths.values(), default=0),
        depth_histogram=depth_buckets(depths.values()),
    )
    return stats, deepest


# --------------------------------------------------------------------------- workers and overlap


class WorkerEntry(msgspec.Struct):
    """One ``/workers`` entry (``total_blocks`` only where the view knows it)."""

    instance_id: int
    dp_rank: int
    blocks: int
    endpoint: str | None = None
    total_blocks: int | None = None


def worker_caches(
    entries: Sequence[WorkerEntry], deepest: Mapping[WorkerKey, int] | None = None
) -> list[WorkerCache]:
    """Each listed worker's blocks and occupancy, with its deepest block when a dump was read."""
    out = []
    for e in sorted(entries, key=lambda e: (e.instance_id, e.dp_rank)):
        total = e.total_blocks if e.total_blocks else None
        out.append(
            WorkerCache(
                instance_id=e.instance_id,
                dp_rank=e.dp_rank,
                blocks=e.blocks,
                total_blocks=total,
                occupancy=e.blocks / total if total else None,
                max_depth=None if deepest is None else deepest.get((e.instance_id, e.dp_rank), 0),
                endpoint=e.endpoint,
            )
        )
    return out


def overlap(answer: Mapping[str, Any], prompt_tokens: int, workers: Sequence[WorkerCache]) -> Overlap:
    """Per worker, how much of a prompt of ``prompt_tokens`` tokens it has cached, from a
    ``/query`` answer (matched tokens per instance and rank); listed workers that matched nothing
    show 0."""
    block_size = int(answer.get("block_size") or 0)
    matched: dict[WorkerKey, int] = {(w.instance_id, w.dp_rank): 0 for w in workers}
    for instance, ranks in (answer.get("scores") or {}).items():
        for rank, tokens in ranks.items():
            matched[(int(instance), int(rank))] = int(tokens)
    rows = [
        WorkerOverlap(
            instance_id=k[0],
            dp_rank=k[1],
            matched_tokens=t,
            matched_blocks=t // block_size if block_size else 0,
            share=t / prompt_tokens if prompt_tokens else 0.0,
        )
        for k, t in matched.items()
    ]
    rows.sort(key=lambda r: (-r.matched_tokens, r.instance_id, r.dp_rank))
    return Overlap(
        prompt_tokens=prompt_tokens,
        prompt_blocks=prompt_tokens // block_size if block_size else 0,
        block_size=block_size,
        workers=rows,
    )


def snapshot_json(snapshot: KvSnapshot) -> str:
    """One line of JSON (the schema in the module docstring)."""
    return msgspec.json.encode(snapshot).decode()
