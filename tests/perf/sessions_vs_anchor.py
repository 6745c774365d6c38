"""Sessions that stay where their cache is: dyn against NVIDIA Dynamo 1.6.1 on multi-turn shapes.

Not a test. Needs the anchor installed (``../shared/anchor/install.sh``, venv in $ANCHOR_DIR,
default /tmp/dyn-anchor). For each workload shape (sessions x turns x private system prompt x
workers) it writes Mooncake-style session traces (one per seed): each session opens with its own
system prompt (no prefix shared between sessions), then every turn adds 192-320 new tokens
(12-20 blocks of 16) after the previous turn's reply (2 blocks), asks for 32 tokens, and waits
200-800 ms after the previous turn finished; sessions start within the first 200 ms. Both stacks
run the given number of mocker workers (KV router, default settings, block 16, 8192 KV blocks,
``--speedup-ratio 10``, no session hints), started fresh for each shape, and replay every trace
live with ``dyn bench --trace`` (token-id prompts on ``/v1/completions``), the two stacks
alternating trace by trace so drift on this shared machine hits both.

Reported per run: the history cached ratio (of the prompt tokens a previous turn of the session
already sent, the share served from cache), the history moves (later turns served by another
worker than the turn before: each re-prefills the history) and the whole cached-token ratio;
then per shape the medians and dyn minus Dynamo.

    python tests/perf/sessions_vs_anchor.py --seeds 1 2 3
    python tests/perf/sessions_vs_anchor.py --shape 8x6x2048x4 --shape 16x8x1024x4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from bench_vs_anchor import DEFAULT_ANCHOR_SCRIPTS, wait_ready

BLOCK = 16
SHAPES = ("8x6x2048x4", "16x6x2048x4", "8x10x4096x8", "32x4x1024x4")


def session_trace(path: Path, seed: int, sessions: int, turns: int, system_tokens: int) -> None:
    """Write the module docstring's trace: ``sessions`` x ``turns`` rows, private system prompts."""
    rng, next_id = random.Random(seed), 10_000
    with path.open("w") as out:
        for s in range(sessions):
            ids = list(range(next_id, next_id + system_tokens // BLOCK))
            next_id += len(ids)
            for turn in range(turns):
                grow = rng.randint(12, 20)
                ids += range(next_id, next_id + grow)
                next_id += grow
                row: dict = {"input_length": BLOCK * len(ids), "output_length": 32, "hash_ids": ids[:]}
                row["session_id"] = f"s{s}"
                if turn == 0:
                    row["timestamp"] = round(rng.uniform(0, 200), 1)
                else:
                    row["delay"] = round(rng.uniform(200, 800), 1)
                out.write(json.dumps(row) + "\n")
                ids += range(next_id, next_id + 2)
                next_id += 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DynStack:
    name = "dyn"

    def __init__(self, workers: int) -> None:
        self.workers, self.port = workers, free_port()
        self.tmp = tempfile.TemporaryDirectory(prefix="dyn-sessions-")
        self.proc: subprocess.Popen | None = None

    def start(self) -> str:
        argv = [sys.executable, "-m", "dyn.cli", "serve", "--http-port", str(self.port)]
        argv += ["--num-workers", str(self.workers), "--router-mode", "kv", "--block-size", str(BLOCK)]
        argv += ["--num-gpu-blocks-override", "8192", "--speedup-ratio", "10"]
        self.proc = subprocess.Popen(
            argv,
            env={**os.environ, "DYN_DISCOVERY_DIR": self.tmp.name},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{self.port}"
        wait_ready(url, self.workers)
        return url

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


class DynamoStack:
    name = "dynamo"

    def __init__(self, workers: int, args) -> None:
        self.port, self.scripts = free_port(), Path(args.anchor_scripts)
        self.env = {**os.environ, "ANCHOR_DIR": args.anchor_dir, "HTTP_PORT": str(self.port)}
        self.env |= {
            "NUM_WORKERS": str(workers),
            "SPEEDUP": "10",
            "BLOCK_SIZE": str(BLOCK),
            "GPU_BLOCKS": "8192",
        }

    def start(self) -> str:
        subprocess.run(
            [str(self.scripts / "run.sh"), "start"], env=self.env, check=True, stdout=subprocess.DEVNULL
        )
        url = f"http://127.0.0.1:{self.port}"
        wait_ready(url, 0)
        return url

    def stop(self) -> None:
        subprocess.run(
            [str(self.scripts / "run.sh"), "stop"], env=self.env, check=False, stdout=subprocess.DEVNULL
        )


def replay(url: str, trace: Path, out: Path) -> dict:
    """One live ``dyn bench --trace`` run; its summary's cache figures."""
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    argv = [sys.executable, "-m", "dyn.cli", "bench", "--url", url, "--model", model, "--trace", str(trace)]
    argv += ["--trace-block-size", str(BLOCK), "--no-progress", "-o", str(out)]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, timeout=600)
    summary = json.loads(out.read_text())["summary"]
    return {
        "failed": summary["failed"],
        "history_cached_ratio": summary["history_cached_ratio"],
        "history_moves": summary["history_moves"],
        "cached_token_ratio": summary["cached_token_ratio"],
        "e2e_p50_ms": summary["e2e_s"]["p50"] * 1000,
    }


def run_shape(shape: str, args, tmp: Path) -> list[dict]:
    sessions, turns, system_tokens, workers = (int(x) for x in shape.split("x"))
    traces = []
    for seed in args.seeds:
        traces.append(tmp / f"{shape}-{seed}.jsonl")
        session_trace(traces[-1], seed, sessions, turns, system_tokens)
    rows = []
    stacks = [DynStack(workers), DynamoStack(workers, args)]
    urls = {}
    try:
        for stack in stacks:
            urls[stack.name] = stack.start()
        for seed, trace in zip(args.seeds, traces, strict=True):
            for stack in stacks if seed % 2 else stacks[::-1]:
                row = {"shape": shape, "seed": seed, "system": stack.name}
                row |= replay(urls[stack.name], trace, tmp / f"{shape}-{seed}-{stack.name}.json")
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        for stack in stacks:
            stack.stop()
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"\n{'shape':<14}{'system':<8}{'history cached':>16}{'moves':>14}{'cached':>9}{'e2e p50':>10}")
    for shape in dict.fromkeys(r["shape"] for r in rows):
        medians = {}
        for system in ("dyn", "dynamo"):
            mine = [r for r in rows if r["shape"] == shape and r["system"] == system]
            hist = statistics.median(r["history_cached_ratio"] for r in mine)
            medians[system] = hist
            moves = "/".join(str(r["history_moves"]) for r in mine)
            cached = statistics.median(r["cached_token_ratio"] for r in mine)
            e2e = statistics.median(r["e2e_p50_ms"] for r in mine)
            print(f"{shape:<14}{system:<8}{hist:>16.3f}{moves:>14}{cached:>9.3f}{e2e:>8.1f}ms")
        print(f"{'':<14}{'dyn-Dyn':<8}{medians['dyn'] - medians['dynamo']:>+16.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shape", action="append", help=f"SESSIONSxTURNSxSYSTEM_TOKENSxWORKERS (default {SHAPES})"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--anchor-dir", default=os.environ.get("ANCHOR_DIR", "/tmp/dyn-anchor"))
    parser.add_argument("--anchor-scripts", default=str(DEFAULT_ANCHOR_SCRIPTS))
    parser.add_argument("--json", help="also write every run's row here")
    args = parser.parse_args()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="sessions-vs-anchor-") as tmp:
        for shape in args.shape or SHAPES:
            rows += run_shape(shape, args, Path(tmp))
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
