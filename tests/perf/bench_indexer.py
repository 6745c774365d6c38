"""Benchmark: dyn's RadixIndexer against Dynamo's Rust RadixTree, one workload, same run.

    python tests/perf/bench_indexer.py --workers 8 64 --blocks 1000000 --queries 2000
    python tests/perf/bench_indexer.py --workers 1000 --blocks 10000000 --trees c   # issue 37's size

For each worker count it generates one seeded workload (pure-python ``random``): engines that
serve conversations (64 shared system prompts of 32-512 blocks, each request 256-1,024 prompt
blocks plus 0-16 decoded blocks, 70 % of a prompt family's requests on its home worker) and emit
KV events as an engine with prefix caching would: a ``Stored`` event per prefill chunk of at most
128 new blocks, one single-block ``Stored`` per decoded block, and, once a worker holds more than
its share of ``--blocks``, ``Removed`` events (at most 128 hashes, tail first) for the blocks of
its least recently used sequences. Block hashes are uniform across workers, as with vLLM under a
fixed ``PYTHONHASHSEED``. Ingestion stops when 95 % of ``--blocks`` (worker, block) entries are
cached (or every worker has evicted three times). Then ``--queries`` prompts of 1,000 blocks:
40 % continue a cached sequence for a random number of blocks, 30 % share only a system prompt,
30 % miss entirely.

The workload goes to a temporary file; child processes replay it, one per implementation: each
of dyn's trees under this interpreter (``--trees``: the C tree, ``CRadixIndexer``, and the Python
one, ``PyRadixIndexer``), Dynamo's ``dynamo._core.RadixTree`` under ``--anchor-python``. Each
measures ingestion (all events, applied in order) and the latency of every ``find_matches`` call
(a warm-up pass first), and returns its answers, which must be identical (dyn's trees must agree
exactly; the count of Dynamo's identical answers is printed). dyn is measured three ways on
ingestion: from already-decoded lists (what the router's event loop hands it), from the same JSON
bytes Dynamo parses (decoded with msgspec), and from vLLM's msgpack batches through dyn's KV-event
decoder. dyn queries pass the prompt's sequence
hashes, which the router computes anyway; Dynamo takes the local hashes. Dynamo's Python
``RadixTree`` runs its tree on a background thread, so each of its calls includes a cross-thread
hop. The index's own memory is the growth of resident memory across ingestion (after a GC pass),
per cached (worker, block) entry; peak RSS also counts the workload and dyn's second index. Prints
one JSON line per worker count, then a table. About 25 s for the command above.
Without the anchor venv it measures dyn alone.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from typing import Any

import msgspec

ANCHOR_PYTHON = "/tmp/dyn-anchor/venv/bin/python"
MAX_EVENT_BLOCKS = 128
PROMPT_BLOCKS = 1000


# ------------------------------------------------------------------------------- workload


def build_workload(n_workers: int, target_blocks: int, n_queries: int, seed: int) -> dict[str, Any]:
    from dyn.core.kv.hashing import extend_sequence_hash, sequence_hashes

    rng = random.Random(seed)

    def fresh(n: int) -> list[int]:
        return [rng.getrandbits(64) for _ in range(n)]

    families = [fresh(rng.randint(32, 512)) for _ in range(64)]
    family_seqs = [sequence_hashes(f) for f in families]
    cap = target_blocks // n_workers
    held: list[dict[int, int]] = [{} for _ in range(n_workers)]  # seq hash -> refcount
    lru: list[deque[tuple[list[int], list[int]]]] = [deque() for _ in range(n_workers)]
    events: list[list[Any]] = []  # ["s", worker, parent, blocks, locals] | ["r", worker, hashes]
    evictions = [0] * n_workers
    total = 0
    # a full worker hovers up to a sequence below its share: stop at 95 % or once all have churned
    while total < 0.95 * target_blocks and min(evictions) < 3:
        family = rng.randrange(len(families))
        worker = family % n_workers if rng.random() < 0.7 else rng.randrange(n_workers)
        local = families[family] + fresh(rng.randint(256, 1024) - len(families[family]))
        seqs = list(family_seqs[family])
        for h in local[len(seqs) :]:
            seqs.append(extend_sequence_hash(seqs[-1], h))
        mine = held[worker]
        start = 0
        while start < len(seqs) and seqs[start] in mine:
            start += 1
        for i in range(start, len(seqs), MAX_EVENT_BLOCKS):
            end = min(i + MAX_EVENT_BLOCKS, len(seqs))
            events.append(["s", worker, seqs[i - 1] if i else None, seqs[i:end], local[i:end]])
        for _ in range(rng.randint(0, 16)):  # decode: one new full block at a time
            h = rng.getrandbits(64)
            events.append(["s", worker, seqs[-1], [extend_sequence_hash(seqs[-1], h)], [h]])
            local.append(h)
            seqs.append(events[-1][3][0])
        before = len(mine)
        for s in seqs:
            mine[s] = mine.get(s, 0) + 1
        lru[worker].append((local, seqs))
        while len(mine) > cap and len(lru[worker]) > 1:
            _, old = lru[worker].popleft()
            evictions[worker] += 1
            gone = []
            for s in reversed(old):
                left = mine[s] - 1
                if left:
                    mine[s] = left
                else:
                    del mine[s]
                    gone.append(s)
            for i in range(0, len(gone), MAX_EVENT_BLOCKS):
                events.append(["r", worker, gone[i : i + MAX_EVENT_BLOCKS]])
        total += len(mine) - before
    queries: list[tuple[list[int], list[int]]] = []
    for _ in range(n_queries):
        kind = rng.random()
        if kind < 0.4:
            local, seqs = rng.choice(lru[rng.choice([w for w in range(n_workers) if lru[w]])])
            k = min(rng.randint(1, len(local)), PROMPT_BLOCKS)
            local, seqs = local[:k], seqs[:k]
        elif kind < 0.7:
            f = rng.randrange(len(families))
            local, seqs = list(families[f]), list(family_seqs[f])
        else:
            local, seqs = [], []
        tail = fresh(PROMPT_BLOCKS - len(local))
        seqs = seqs + _chain(seqs[-1] if seqs else None, tail)
        queries.append((local + tail, seqs))
    return {"workers": n_workers, "events": events, "queries": queries, "cached": total}


def _chain(parent: int | None, local: list[int]) -> list[int]:
    from dyn.core.kv.hashing import extend_sequence_hash

    out = []
    for h in local:
        parent = extend_sequence_hash(parent, h)
        out.append(parent)
    return out


def dynamo_event_json(event: list[Any], event_id: int) -> bytes:
    if event[0] == "s":
        blocks = [{"block_hash": b, "tokens_hash": t} for b, t in zip(event[3], event[4])]
        data: Any = {"stored": {"parent_hash": event[2], "blocks": blocks}}
    else:
        data = {"removed": {"block_hashes": event[2]}}
    return json.dumps({"event_id": event_id, "data": data, "dp_rank": 0}).encode()


def vllm_event_batch(event: list[Any]) -> bytes:
    """One workload event as vLLM's ``ZmqEventPublisher`` payload (int hashes, block size 16,
    token ids of a realistic size; the benchmark indexes the workload's local hashes)."""
    if event[0] == "s":
        n = len(event[3])
        tokens = [100_000 + i for i in range(16 * n)]
        data: list[Any] = ["BlockStored", event[3], event[2], tokens, 16, None, "GPU", None]
    else:
        data = ["BlockRemoved", event[2], "GPU"]
    return msgspec.msgpack.encode([time.time(), [data], 0])


# ----------------------------------------------------------------------------- the sides


class _Block(msgspec.Struct):
    block_hash: int
    tokens_hash: int


class _Stored(msgspec.Struct):
    parent_hash: int | None
    blocks: list[_Block]


class _Removed(msgspec.Struct):
    block_hashes: list[int]


class _Data(msgspec.Struct):
    stored: _Stored | None = None
    removed: _Removed | None = None


class _Event(msgspec.Struct):
    """Dynamo's ``KvCacheEvent`` JSON, the part the benchmark sends."""

    event_id: int
    data: _Data
    dp_rank: int = 0


def _load(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        return msgspec.msgpack.decode(f.read())


def _percentiles(samples_ns: list[int]) -> dict[str, float]:
    qs = statistics.quantiles(samples_ns, n=100, method="inclusive")
    return {
        "p50_us": round(qs[49] / 1e3, 1),
        "p99_us": round(qs[98] / 1e3, 1),
        "mean_us": round(statistics.fmean(samples_ns) / 1e3, 1),
    }


def _time_queries(call, queries) -> dict[str, float]:
    for q in queries[: min(200, len(queries))]:
        call(q)
    samples = []
    clock = time.perf_counter_ns
    for q in queries:
        t0 = clock()
        call(q)
        samples.append(clock() - t0)
    return _percentiles(samples)


def _rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0)


def _rss_now() -> int:
    """Resident bytes now (Linux): the index's own memory is the growth across its ingestion."""
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def dyn_side(path: str, tree: str) -> dict[str, Any]:
    from dyn.core.kv.events import BlockStored, decode_known_events
    from dyn.core.kv.indexer_c import CRadixIndexer
    from dyn.core.kv.indexer_py import PyRadixIndexer

    tree_class = {"c": CRadixIndexer, "python": PyRadixIndexer}[tree]

    wl = _load(path)
    events, queries = wl["events"], wl["queries"]
    wire = [dynamo_event_json(e, i) for i, e in enumerate(events)]
    blocks = sum(len(e[3]) if e[0] == "s" else len(e[2]) for e in events)
    out: dict[str, Any] = {}

    before = _rss_now()
    index = tree_class()
    t0 = time.perf_counter()
    for e in events:
        if e[0] == "s":
            index.store((e[1], 0), e[2], e[3], e[4])
        else:
            index.remove((e[1], 0), e[2])
    wall = time.perf_counter() - t0
    out["ingest"] = {
        "events_per_s": round(len(events) / wall),
        "blocks_per_s": round(blocks / wall),
        "wall_s": round(wall, 2),
    }
    out["size"] = index.size
    out["rss_mib"] = _rss_mib()
    out["index_bytes_per_block"] = round((_rss_now() - before) / wl["cached"])

    decoder = msgspec.json.Decoder(_Event)
    index2 = tree_class()
    t0 = time.perf_counter()
    for e, raw in zip(events, wire):
        ev = decoder.decode(raw)
        key = (e[1], ev.dp_rank)
        if ev.data.stored is not None:
            s = ev.data.stored
            index2.store(
                key, s.parent_hash, [b.block_hash for b in s.blocks], [b.tokens_hash for b in s.blocks]
            )
        elif ev.data.removed is not None:
            index2.remove(key, ev.data.removed.block_hashes)
    wall = time.perf_counter() - t0
    out["ingest_json"] = {
        "events_per_s": round(len(events) / wall),
        "blocks_per_s": round(blocks / wall),
        "wall_s": round(wall, 2),
    }
    del index2, wire
    gc.collect()

    # the router's own path: vLLM msgpack batches through dyn's KV-event decoder, then the index
    vllm_wire = [vllm_event_batch(e) for e in events]
    index3 = tree_class()
    t0 = time.perf_counter()
    for e, raw in zip(events, vllm_wire):
        batch, _ = decode_known_events(raw)
        ev = batch.events[0]
        key = (e[1], batch.data_parallel_rank)
        if ev.__class__ is BlockStored:
            index3.store(key, ev.parent_block_hash, ev.block_hashes, e[4])
        else:
            index3.remove(key, ev.block_hashes)
    wall = time.perf_counter() - t0
    out["ingest_vllm_msgpack"] = {
        "events_per_s": round(len(events) / wall),
        "blocks_per_s": round(blocks / wall),
        "wall_s": round(wall, 2),
    }
    del index3, vllm_wire
    gc.collect()

    out["find"] = _time_queries(lambda q: index.find_matches(q[0], q[1]), queries)
    out["find_walk"] = _time_queries(lambda q: index.find_matches(q[0]), queries)
    out["answers"] = [
        sorted([w[0], w[1], s] for w, s in index.find_matches(q[0], q[1]).items()) for q in queries
    ]
    return out


def anchor_side(path: str) -> dict[str, Any]:
    from dynamo._core import RadixTree

    wl = _load(path)
    events, queries = wl["events"], wl["queries"]
    wire = [(e[1], dynamo_event_json(e, i)) for i, e in enumerate(events)]
    blocks = sum(len(e[3]) if e[0] == "s" else len(e[2]) for e in events)
    locals_only = [q[0] for q in queries]
    out: dict[str, Any] = {}
    before = _rss_now()
    tree = RadixTree()
    failed = 0
    t0 = time.perf_counter()
    for worker, raw in wire:
        try:
            tree.apply_event(worker, raw)
        except Exception:
            failed += 1
    tree.find_matches([0])  # the tree runs on its own thread: wait until it applied everything
    wall = time.perf_counter() - t0
    out["ingest"] = {
        "events_per_s": round(len(events) / wall),
        "blocks_per_s": round(blocks / wall),
        "wall_s": round(wall, 2),
        "failed": failed,
    }
    out["rss_mib"] = _rss_mib()
    out["index_bytes_per_block"] = round((_rss_now() - before) / wl["cached"])
    out["find"] = _time_queries(lambda q: tree.find_matches(q), locals_only)
    out["find_with_scores"] = _time_queries(lambda q: tree.find_matches(q).scores, locals_only)
    out["answers"] = [
        sorted([w[0], w[1], s] for w, s in tree.find_matches(q).scores.items()) for q in locals_only
    ]
    return out


# ---------------------------------------------------------------------------------- driver


def _run_side(python: str, flag: str, path: str, *extra: str) -> dict[str, Any]:
    result = subprocess.run(
        [python, os.path.abspath(__file__), flag, path, *extra],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{flag} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[8, 64])
    p.add_argument("--blocks", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--anchor-python", default=ANCHOR_PYTHON)
    p.add_argument(
        "--trees", nargs="+", choices=["c", "python"], default=["c", "python"], help="dyn's trees to measure"
    )
    p.add_argument("--dyn-side", help=argparse.SUPPRESS)
    p.add_argument("--tree", default="c", help=argparse.SUPPRESS)
    p.add_argument("--anchor-side", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.dyn_side:
        print(json.dumps(dyn_side(args.dyn_side, args.tree)))
        return
    if args.anchor_side:
        print(json.dumps(anchor_side(args.anchor_side)))
        return

    have_anchor = os.path.exists(args.anchor_python)
    rows = []
    for n_workers in args.workers:
        t0 = time.perf_counter()
        wl = build_workload(n_workers, args.blocks, args.queries, args.seed)
        gen_s = time.perf_counter() - t0
        with tempfile.NamedTemporaryFile(suffix=".msgpack", delete=False) as f:
            f.write(msgspec.msgpack.encode(wl))
            path = f.name
        n_events = len(wl["events"])
        del wl
        try:
            dyn = {tree: _run_side(sys.executable, "--dyn-side", path, "--tree", tree) for tree in args.trees}
            anchor = _run_side(args.anchor_python, "--anchor-side", path) if have_anchor else None
        finally:
            os.unlink(path)
        first = dyn[args.trees[0]]["answers"]
        # every dyn tree must answer as the first; Dynamo's answers are counted against them
        assert all(d["answers"] == first for d in dyn.values()), "dyn's trees disagree"
        same = None
        if anchor is not None:
            same = sum(a == b for a, b in zip(first, anchor["answers"]))
        hits = sum(1 for a in first if a)
        row = {
            "workers": n_workers,
            "events": n_events,
            "cached_blocks": dyn[args.trees[0]]["size"],
            "generate_s": round(gen_s, 1),
            "queries": args.queries,
            "queries_with_a_match": hits,
            "dyn": {tree: {k: v for k, v in d.items() if k != "answers"} for tree, d in dyn.items()},
            "dynamo": None if anchor is None else {k: v for k, v in anchor.items() if k != "answers"},
            "identical_answers": same,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)

    print()
    print(
        "| workers | cached blocks | events | implementation | events/s | blocks/s | "
        "find_matches p50 (µs) | p99 (µs) | peak RSS (MiB) | index RSS per cached block (B) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        a = r["dynamo"]
        lead = f"| {r['workers']} | {r['cached_blocks']:,} | {r['events']:,} |"
        for tree, d in r["dyn"].items():
            print(
                f"{lead} dyn {tree} tree (decoded lists; seq hashes) | {d['ingest']['events_per_s']:,} | "
                f"{d['ingest']['blocks_per_s']:,} | {d['find']['p50_us']} | {d['find']['p99_us']} | "
                f"{d['rss_mib']:.0f} | {d['index_bytes_per_block']} |"
            )
            print(
                f"{lead} dyn {tree} tree (JSON bytes; local-hash walk) | {d['ingest_json']['events_per_s']:,} | "
                f"{d['ingest_json']['blocks_per_s']:,} | {d['find_walk']['p50_us']} | "
                f"{d['find_walk']['p99_us']} | | |"
            )
            print(
                f"{lead} dyn {tree} tree (vLLM msgpack through decode_known_events) | "
                f"{d['ingest_vllm_msgpack']['events_per_s']:,} | {d['ingest_vllm_msgpack']['blocks_per_s']:,} | | | | |"
            )
        if a is not None:
            print(
                f"{lead} Dynamo RadixTree (JSON bytes) | {a['ingest']['events_per_s']:,} | "
                f"{a['ingest']['blocks_per_s']:,} | {a['find']['p50_us']} | {a['find']['p99_us']} | "
                f"{a['rss_mib']:.0f} | {a['index_bytes_per_block']} |"
            )
    for r in rows:
        print(
            f"workers={r['workers']}: identical answers {r['identical_answers']}/{r['queries']} "
            f"({r['queries_with_a_match']} queries match somewhere)"
        )
    print("command: python tests/perf/bench_indexer.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
