"""Router overhead per request: block hashing, sequence hashing, find_matches, scheduling, total.

    python tests/perf/bench_router.py [--workers 8] [--prompt-tokens 4096] [--block-size 16]
                                      [--requests 2000] [--cached-prompts 400] [--inflight 32]
                                      [--system-prompts 4]

The real ``KvRouter`` (real indexer, load model, cost, queue off) over a stand-in pool of
``--workers`` workers. Before measuring, every worker caches ``--cached-prompts`` prompts (a few
shared system prompts plus distinct bodies, stored through the indexer as KV events would) and
carries ``--inflight`` booked requests. Each measured request shares a system prompt and a
cached body prefix with what is there, so find_matches walks deep; its route is finished right
away so the load stays steady. Prints p50/p99 in microseconds per phase. With the default 4
system prompts every worker holds every one (a fleet-wide agent prompt: each request's prefix is
on all workers); with ``--system-prompts`` near the worker count each is held by a few workers
(per-tenant or per-session prompts).

``find_matches`` is timed as the router asks it: from ``BULK_SCORING_MIN`` workers on, as the
index's pieces (``match_pieces``, read over arrays), below that as the dict of every holder. The
setup prints the index's size and the process's resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from prometheus_client import CollectorRegistry

from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.core.messages import WorkerEndpoints, WorkerRecord
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.kv import BULK_SCORING_MIN, KvRouter
from dyn.core.router.metrics import RouterMetrics
from dyn.core.router.policy import RouteRequest
from dyn.core.router.pool import Worker


class _Pool:
    model_name = "bench"

    def __init__(self, n: int, block_size: int) -> None:
        self._workers = [
            Worker(
                WorkerRecord(
                    i, "b", "bench", "mocker", WorkerEndpoints(f"tcp://w{i}"), block_size, 1_000_000, 8192
                ),
                None,
            )
            for i in range(n)
        ]

    def workers(self):
        return self._workers

    def get(self, instance_id):
        return self._workers[instance_id] if 0 <= instance_id < len(self._workers) else None

    def add_listener(self, listener):
        for w in self._workers:
            listener(w, True)


class _NoIngest:
    def __init__(self, indexer) -> None:
        pass

    def follow(self, pool) -> None:
        pass


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


async def main(args: argparse.Namespace) -> None:
    rng = random.Random(1)
    bs = args.block_size
    router = KvRouter(
        _Pool(args.workers, bs),
        KvRouterConfig(queue_threshold=None),
        RouterMetrics(CollectorRegistry()),
        ingest=_NoIngest,
        rng=rng,
    )
    systems = [
        [rng.randrange(50_000) for _ in range(args.prompt_tokens // 4)] for _ in range(args.system_prompts)
    ]

    def prompt(body_seed: int, tail: int) -> list[int]:
        body_rng = random.Random(body_seed)
        sys_part = systems[body_seed % len(systems)]
        body = [body_rng.randrange(50_000) for _ in range(args.prompt_tokens - len(sys_part) - tail)]
        return sys_part + body + [rng.randrange(50_000) for _ in range(tail)]

    for w in range(args.workers):
        for j in range(args.cached_prompts):
            tokens = prompt(w * 100_000 + j, 0)
            local = block_hashes(tokens, bs)
            router.indexer.store((w, 0), None, sequence_hashes(local), local)
    for i in range(args.workers * args.inflight):
        await router.route(RouteRequest(request_id=f"warm{i}", token_ids=prompt(rng.randrange(10**9), 0)))
    print(
        f"indexer: {router.indexer.size:,} cached (worker, block) entries; "
        f"{len(router.load)} requests in flight; RSS {_rss_mib():,.0f} MiB"
    )
    index = router.indexer
    if args.workers >= BULK_SCORING_MIN:

        def match(local: list[int], seq: list[int]) -> object:
            return index.match_pieces(seq)
    else:
        match = index.find_matches

    phases: dict[str, list[float]] = {
        k: [] for k in ("block_hashing", "seq_hashing", "find_matches", "route_total")
    }
    for i in range(args.requests):
        w, j = rng.randrange(args.workers), rng.randrange(args.cached_prompts)
        tokens = prompt(w * 100_000 + j, tail=rng.randrange(bs, 8 * bs))[: args.prompt_tokens]
        t0 = time.perf_counter()
        local = block_hashes(tokens, bs)
        t1 = time.perf_counter()
        seq = sequence_hashes(local)
        t2 = time.perf_counter()
        match(local, seq)
        t3 = time.perf_counter()
        route = await router.route(RouteRequest(request_id=f"r{i}", token_ids=tokens))
        t4 = time.perf_counter()
        route.finished()
        phases["block_hashing"].append((t1 - t0) * 1e6)
        phases["seq_hashing"].append((t2 - t1) * 1e6)
        phases["find_matches"].append((t3 - t2) * 1e6)
        phases["route_total"].append((t4 - t3) * 1e6)
    # scheduling = what route() spends beyond hashing and matching (it repeats them inside)
    phases["scheduling"] = [
        t - a - b - c
        for t, a, b, c in zip(
            phases["route_total"], phases["block_hashing"], phases["seq_hashing"], phases["find_matches"]
        )
    ]
    print(f"{args.workers} workers, {args.prompt_tokens}-token prompts, block {bs}, {args.requests} requests")
    print(f"{'phase':<16}{'p50 µs':>10}{'p99 µs':>10}")
    for name in ("block_hashing", "seq_hashing", "find_matches", "scheduling", "route_total"):
        values = phases[name]
        print(f"{name:<16}{statistics.median(values):>10.1f}{_pct(values, 99):>10.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--cached-prompts", type=int, default=400)
    parser.add_argument("--inflight", type=int, default=32)
    parser.add_argument("--system-prompts", type=int, default=4)
    asyncio.run(main(parser.parse_args()))
