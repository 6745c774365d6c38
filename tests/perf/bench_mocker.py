"""Benchmark: what one `dyn worker mocker` process sustains over the real request plane.

Not a test (timings on a shared 2-core machine are noisy): run it by hand and write the result
down in docs/benchmarks.md with the command.

    python tests/perf/bench_mocker.py --concurrency 64 --requests 2000 --max-tokens 64 \
        --prompt-tokens 512 --speedup-ratio 1e9 --num-workers 1

It starts the worker as a subprocess (own discovery dir, loopback, free ports), drives a closed
loop of `--concurrency` streams through WorkerClient, and reads the worker's cumulative
`num_passes` from its load-metrics PUB before and after. Prints one JSON object: forward passes
per second, requests/s, output tokens/s, mean batch size, wall time, the worker's CPU time, and
the request-plane replies (TokenChunk/Finish) and the reply messages that carried them, per pass
(a worker that sends no ``ReplyBatch`` sends one message per reply). ``--batches`` consumes with
``generate_batches`` (as the frontend does) instead of ``generate``.
A huge --speedup-ratio makes simulated time ~0, so the figures are the Python ceiling; the
default Dynamo timing with --speedup-ratio 100 shows the simulated-time-bound rate instead.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import anyio
import zmq
import zmq.asyncio

from dyn.core.discovery.file_store import FileDiscoveryStore
from dyn.core.messages import LOAD_METRICS_TOPIC, GenerateRequest, SamplingParams, StopConditions
from dyn.core.transport.event_plane import decode_load_metrics
from dyn.core.transport.request_plane import WorkerClient


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--shared-prefix", type=float, default=0.5, help="fraction of the prompt shared by all")
    p.add_argument("--speedup-ratio", type=float, default=1e9)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batches", action="store_true", help="consume with WorkerClient.generate_batches")
    return p.parse_args()


async def passes(sub: zmq.asyncio.Socket, instance_ids: set[int]) -> int:
    """Sum of the newest num_passes of every instance: drains what the SUB queued meanwhile and
    waits until each instance has reported at least once."""
    latest: dict[int, int] = {}
    with anyio.fail_after(10):
        while set(latest) != instance_ids or await sub.poll(0):
            _topic, payload = await sub.recv_multipart()
            m = decode_load_metrics(payload)
            latest[m.instance_id] = max(latest.get(m.instance_id, 0), m.num_passes)
    return sum(latest.values())


async def drive(args: argparse.Namespace, discovery: str) -> dict:
    store = FileDiscoveryStore(discovery, "bench")
    with anyio.fail_after(60):
        while len(records := await store.list()) < args.num_workers:
            await anyio.sleep(0.1)
    rng = random.Random(args.seed)
    shared = [rng.randrange(100, 4000) for _ in range(int(args.prompt_tokens * args.shared_prefix))]
    sub = zmq.asyncio.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, LOAD_METRICS_TOPIC)
    for r in records:
        sub.connect(r.endpoints.metrics)
    ids = {r.instance_id for r in records}
    await anyio.sleep(0.3)
    passes_before = await passes(sub, ids)
    counter = iter(range(args.requests))
    tokens = 0
    replies = 0
    async with WorkerClient(records[0].endpoints.request) as c0:
        clients = [c0]
        extra = [WorkerClient(r.endpoints.request) for r in records[1:]]
        for c in extra:
            clients.append(await c.__aenter__())

        async def stream(slot: int) -> None:
            nonlocal tokens, replies
            for i in counter:
                tail = [rng.randrange(100, 4000) for _ in range(args.prompt_tokens - len(shared))]
                req = GenerateRequest(
                    f"b{i}",
                    shared + tail,
                    SamplingParams(seed=i),
                    StopConditions(max_tokens=args.max_tokens, ignore_eos=True),
                )
                client = clients[i % len(clients)]
                if args.batches:
                    async for batch in client.generate_batches(req):
                        replies += len(batch)
                        for m in batch:
                            if hasattr(m, "token_ids"):
                                tokens += len(m.token_ids)
                else:
                    async for m in client.generate(req):
                        replies += 1
                        if hasattr(m, "token_ids"):
                            tokens += len(m.token_ids)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for slot in range(args.concurrency):
                tg.start_soon(stream, slot)
        wall = time.perf_counter() - start
        # clients without the counter (before ReplyBatch) got one message per reply
        messages = sum(getattr(c, "messages_received", 0) for c in clients) or replies
        for c in extra:
            await c.__aexit__(None, None, None)
    await anyio.sleep(1.2)  # idle workers still report at least once a second
    passes_after = await passes(sub, ids)
    sub.close()
    n_passes = passes_after - passes_before
    return {
        "forward_passes_per_s": round(n_passes / wall, 1),
        "requests_per_s": round(args.requests / wall, 1),
        "output_tokens_per_s": round(tokens / wall, 1),
        "mean_batch": round(tokens / n_passes, 1) if n_passes else None,
        "passes": n_passes,
        "wall_s": round(wall, 2),
        "replies_per_pass": round(replies / n_passes, 1) if n_passes else None,
        "reply_messages_per_pass": round(messages / n_passes, 2) if n_passes else None,
    }


def main() -> None:
    args = parse()
    with tempfile.TemporaryDirectory() as discovery:
        env = {**os.environ, "DYN_DISCOVERY_DIR": discovery}
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dyn.cli",
                "--log-level",
                "warning",
                "worker",
                "mocker",
                "--namespace",
                "bench",
                "--num-workers",
                str(args.num_workers),
                "--speedup-ratio",
                str(args.speedup_ratio),
                "--block-size",
                str(args.block_size),
            ],
            env=env,
        )
        try:
            result = anyio.run(drive, args, discovery)
            cpu = os.times()
            with open(f"/proc/{worker.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            tick = os.sysconf("SC_CLK_TCK")
            result["worker_cpu_s"] = round((int(fields[11]) + int(fields[12])) / tick, 2)
            result["client_cpu_s"] = round(cpu.user + cpu.system, 2)
            result["args"] = vars(args)
            print(json.dumps(result))
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                worker.kill()


if __name__ == "__main__":
    main()
