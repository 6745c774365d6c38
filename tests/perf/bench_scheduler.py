"""Benchmark: mocker Scheduler.step() calls per second, in-process, no sockets, no sleeping.

    python tests/perf/bench_scheduler.py --running 64 --prompt-tokens 1000 --block-size 64

Admits --running requests with --prompt-tokens each (and effectively unlimited max_tokens),
runs passes until all are decoding, then times --steps decode passes. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from dyn.core.messages import StopConditions
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--running", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=1000)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=5000)
    args = p.parse_args()
    sched = Scheduler(
        MockerConfig(block_size=args.block_size), SimModel(vocab_size=4096, context_length=1 << 20)
    )
    rng = random.Random(0)
    for i in range(args.running):
        sched.add(
            SimRequest(
                i,
                [rng.randrange(4096) for _ in range(args.prompt_tokens)],
                StopConditions(max_tokens=1 << 19, ignore_eos=True),
                seed=i,
            )
        )
    while sched.num_waiting or any(not r.decoding for r in sched.running()):
        sched.step()
    start = time.perf_counter()
    for _ in range(args.steps):
        sched.step()
    wall = time.perf_counter() - start
    print(
        json.dumps(
            {
                "steps_per_s": round(args.steps / wall),
                "tokens_per_s": round(args.steps * args.running / wall),
                "args": vars(args),
            }
        )
    )


if __name__ == "__main__":
    main()
