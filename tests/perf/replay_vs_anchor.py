"""Offline replay, ours against Dynamo's: the same synthetic Mooncake-style trace through
``dyn.core.bench.replay`` (over ``dyn.plugins.mocker.simulator``) and the anchor's
``dynamo._core.run_mocker_trace_replay``.

    /tmp/dynvenv/bin/python tests/perf/replay_vs_anchor.py --requests 2000 --duration 600 \
        --num-workers 4 --router-mode kv --router-mode round-robin

There is no network here to fetch the real Mooncake FAST'25 traces, so ``synth_trace`` writes one
with their shape: Poisson conversation starts, each conversation opening with one of ``--groups``
shared system prompts (Zipf popularity, 1-6 blocks) and growing turn by turn (the previous
turns, the answer and 1-4 new blocks; 512-token hash ids, ``len(hash_ids) = ceil(isl / 512)``),
a think time between turns, log-normal output lengths. By default every row is dated by
``timestamp`` (the public traces' form); ``--sessions`` writes later turns as the multi-turn
extension (``session_id`` + ``delay`` after the previous turn finished) instead.

Both simulators get the same mocker engine settings (block size, KV blocks, max_num_seqs,
max_num_batched_tokens, chunked prefill, prefix caching, speedup 1), worker count and router mode
(kv with default settings, or round-robin). The anchor runs in its own venv (``--anchor-python``)
in a child process. Prints one table per router mode, side by side, and with ``--json`` the rows.
``--rounds N`` runs both N times, alternating (the simulations are deterministic, so every metric
but ``real_s`` repeats), and reports the median ``real_s`` of each.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ANCHOR_PYTHON = "/tmp/dyn-anchor/venv/bin/python"
TRACE_BLOCK = 512

ANCHOR_PROGRAM = r"""
import json, sys, time
import dynamo._core as core
args = json.loads(sys.argv[1])
engine = {"block_size": args["block_size"], "num_gpu_blocks": args["num_gpu_blocks"],
          "max_num_seqs": args["max_num_seqs"], "max_num_batched_tokens": args["max_num_batched_tokens"],
          "enable_prefix_caching": True, "enable_chunked_prefill": True, "speedup_ratio": 1.0,
          "decode_speedup_ratio": 1.0, "preemption_mode": "lifo"}
start = time.perf_counter()
result = core.run_mocker_trace_replay(
    [args["trace"]], extra_engine_args={"engine": engine}, num_workers=args["num_workers"],
    router_mode=args["router_mode"], arrival_speedup_ratio=args["speedup"],
    trace_block_size=args["trace_block_size"], capture_per_request=True)
wall = time.perf_counter() - start
keep = ("arrival_time_ms", "first_admit_ms", "terminal_time_ms", "ttft_ms", "e2e_latency_ms",
        "input_length", "output_length", "reused_input_tokens", "decode_worker_idx", "terminal_status")
rows = [{k: r.get(k) for k in keep} for r in result.per_request or []]
json.dump({"wall_s": wall, "summary": dict(result.summary), "requests": rows}, sys.stdout)
"""


# --------------------------------------------------------------------------- the trace


def synth_trace(
    requests: int,
    duration_s: float,
    *,
    seed: int = 0,
    groups: int = 20,
    mean_turns: float = 3.0,
    think_s: float = 20.0,
    sessions: bool = False,
    max_blocks: int = 64,
) -> list[dict[str, Any]]:
    """A Mooncake-style trace of about ``requests`` rows over ``duration_s`` (see the docstring)."""
    rng = random.Random(seed)
    ids = itertools.count()
    roots = [[next(ids) for _ in range(rng.randint(1, 6))] for _ in range(groups)]
    weights = [1.0 / (i + 1) for i in range(groups)]
    rate = requests / mean_turns / (duration_s * 0.85)  # conversation starts per second
    rows: list[dict[str, Any]] = []
    t = 0.0
    conversation = 0
    while len(rows) < requests:
        t += rng.expovariate(rate)
        history = list(rng.choices(roots, weights)[0])
        turns = 1 + min(int(rng.expovariate(1.0 / (mean_turns - 1))), 12)
        when = t
        for turn in range(turns):
            history.extend(next(ids) for _ in range(rng.randint(1, 4)))
            history = history[:max_blocks]
            isl = len(history) * TRACE_BLOCK - rng.randrange(TRACE_BLOCK)
            osl = max(1, min(2000, int(rng.lognormvariate(5.0, 0.8))))
            row: dict[str, Any] = {"input_length": isl, "output_length": osl, "hash_ids": list(history)}
            think = rng.expovariate(1.0 / think_s)
            if sessions:
                row["session_id"] = f"c{conversation}"
                if turn == 0:
                    row["timestamp"] = round(when * 1000.0, 3)
                else:
                    row["delay"] = round(think * 1000.0, 3)
            else:
                row["timestamp"] = round(when * 1000.0, 3)
            rows.append(row)
            when += think + osl * 0.02  # the answer's rough duration, then the think time
            history.extend(next(ids) for _ in range(-(-osl // TRACE_BLOCK)))  # the answer
        conversation += 1
    if not sessions:
        rows.sort(key=lambda r: r["timestamp"])
        return rows[:requests]
    # keep whole conversations in file order (first turns sorted by their start)
    by_session: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_session.setdefault(row["session_id"], []).append(row)
    ordered = sorted(by_session.values(), key=lambda turns: turns[0]["timestamp"])
    return [row for turns in ordered for row in turns][:requests]


def write_trace(rows: list[dict[str, Any]], path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# --------------------------------------------------------------------------- the two runs


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def metrics(rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """One side's row of the table from per-request dicts (ms, tokens, worker)."""
    ok = [r for r in rows if r["ok"]]
    ttft = [r["ttft_ms"] for r in ok]
    e2e = [r["e2e_ms"] for r in ok]
    start = min(r["arrival_ms"] for r in rows)
    end = max(r["end_ms"] for r in ok)
    per_worker: dict[str, int] = {}
    for r in ok:
        per_worker[str(r["worker"])] = per_worker.get(str(r["worker"]), 0) + 1
    prompt = sum(r["prompt"] for r in ok)
    return {
        "requests": len(ok),
        "failed": len(rows) - len(ok),
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p99_ms": pct(ttft, 99),
        "ttft_mean_ms": sum(ttft) / len(ttft),
        "e2e_p50_ms": pct(e2e, 50),
        "e2e_p99_ms": pct(e2e, 99),
        "req_per_s": len(ok) / ((end - start) / 1000.0),
        "out_tok_per_s": sum(r["output"] for r in ok) / ((end - start) / 1000.0),
        "cache_hit": sum(r["cached"] for r in ok) / prompt if prompt else 0.0,
        "worker_max_share": max(per_worker.values()) / len(ok),
        "worker_min_share": min(per_worker.values()) / len(ok),
        "sim_s": (end - start) / 1000.0,
        "real_s": wall_s,
    }


def run_ours(trace: Path, args: argparse.Namespace, mode: str) -> tuple[dict[str, Any], list]:
    from dyn.core.bench.replay import ReplaySettings, replay
    from dyn.core.bench.trace import read_trace
    from dyn.plugins.mocker.config import MockerConfig
    from dyn.plugins.mocker.simulator import MockerSimulator

    mocker = MockerConfig(
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    settings = ReplaySettings(
        num_workers=args.num_workers,
        simulator=MockerSimulator(mocker),
        router_mode=mode,
        speedup=args.speedup,
        trace_block_size=TRACE_BLOCK,
        seed=args.seed,
    )
    start = time.perf_counter()
    result = replay(read_trace(trace), settings)
    wall = time.perf_counter() - start
    rows = [
        {
            "ok": r.error is None,
            "arrival_ms": r.start_s * 1e3,
            "end_ms": r.end_s * 1e3,
            "ttft_ms": (r.ttft_s or 0.0) * 1e3,
            "e2e_ms": r.e2e_s * 1e3,
            "prompt": r.prompt_tokens or 0,
            "cached": r.cached_tokens or 0,
            "output": r.output_tokens,
            "worker": r.worker,
        }
        for r in result.records
    ]
    return metrics(rows, wall), rows


def run_anchor(trace: Path, args: argparse.Namespace, mode: str) -> tuple[dict[str, Any], list]:
    spec = {
        "trace": str(trace),
        "block_size": args.block_size,
        "num_gpu_blocks": args.num_gpu_blocks,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "num_workers": args.num_workers,
        "speedup": args.speedup,
        "trace_block_size": TRACE_BLOCK,
        "router_mode": "kv_router" if mode == "kv" else "round_robin",
    }
    start = time.perf_counter()
    proc = subprocess.run(
        [args.anchor_python, "-c", ANCHOR_PROGRAM, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=3600,
        env={"RUST_LOG": "error", "DYN_LOG": "error", "PATH": "/usr/bin:/bin"},
    )
    if proc.returncode:
        sys.exit(f"the anchor failed:\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout)
    rows = [
        {
            "ok": r["terminal_status"] == "completed",
            "arrival_ms": r["arrival_time_ms"],
            "end_ms": r["terminal_time_ms"],
            "ttft_ms": r["ttft_ms"],
            "e2e_ms": r["e2e_latency_ms"],
            "prompt": r["input_length"],
            "cached": r["reused_input_tokens"],
            "output": r["output_length"],
            "worker": r["decode_worker_idx"],
        }
        for r in out["requests"]
    ]
    m = metrics(rows, out["wall_s"])
    m["real_s_process"] = time.perf_counter() - start
    return m, rows


# --------------------------------------------------------------------------- the report


ROWS = (
    ("requests", "{:.0f}"),
    ("failed", "{:.0f}"),
    ("ttft_p50_ms", "{:.1f}"),
    ("ttft_p99_ms", "{:.1f}"),
    ("ttft_mean_ms", "{:.1f}"),
    ("e2e_p50_ms", "{:.1f}"),
    ("e2e_p99_ms", "{:.1f}"),
    ("req_per_s", "{:.3f}"),
    ("out_tok_per_s", "{:.1f}"),
    ("cache_hit", "{:.3f}"),
    ("worker_max_share", "{:.3f}"),
    ("worker_min_share", "{:.3f}"),
    ("sim_s", "{:.1f}"),
    ("real_s", "{:.2f}"),
)


def table(mode: str, ours: dict[str, Any], anchor: dict[str, Any]) -> str:
    lines = [f"router {mode}", f"{'metric':<18}{'dyn':>12}{'anchor':>12}{'dyn/anchor':>12}"]
    for key, fmt in ROWS:
        a, b = ours.get(key), anchor.get(key)
        ratio = f"{a / b:.3f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-"
        lines.append(f"{key:<18}{fmt.format(a):>12}{fmt.format(b):>12}{ratio:>12}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", help="Replay this trace instead of generating one.")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--duration", type=float, default=600.0, help="Span of the generated trace, s.")
    p.add_argument("--sessions", action="store_true", help="Later turns as session_id + delay.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-workers", type=int, default=4)
    p.add_argument("--router-mode", action="append", choices=("kv", "round-robin"))
    p.add_argument("--speedup", type=float, default=1.0)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--num-gpu-blocks", type=int, default=16384)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--anchor-python", default=ANCHOR_PYTHON)
    p.add_argument("--no-anchor", action="store_true", help="Run only ours (timing it).")
    p.add_argument("--json", action="store_true", help="Also print the rows as JSON.")
    p.add_argument(
        "--rounds", type=int, default=1, help="Run both this many times, alternating; real_s is the median."
    )
    args = p.parse_args()
    modes = args.router_mode or ["kv", "round-robin"]
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(args.trace) if args.trace else Path(tmp) / "trace.jsonl"
        if not args.trace:
            write_trace(
                synth_trace(args.requests, args.duration, seed=args.seed, sessions=args.sessions), trace
            )
        from dyn.core.bench.trace import read_trace, theoretical_hit_rate

        rows = read_trace(trace)
        print(
            f"trace: {len(rows)} requests, mean ISL {sum(r.input_length for r in rows) / len(rows):.0f}, "
            f"mean OSL {sum(r.output_length for r in rows) / len(rows):.0f}, theoretical hit rate "
            f"{theoretical_hit_rate(r.hash_ids for r in rows):.3f}, "
            f"{args.num_workers} workers"
        )
        report = {}
        for mode in modes:
            walls: dict[str, list[float]] = {"dyn": [], "anchor": []}
            for _ in range(args.rounds):  # the two alternate round by round, never at once
                ours, _ = run_ours(trace, args, mode)
                walls["dyn"].append(ours["real_s"])
                if not args.no_anchor:
                    anchor, _ = run_anchor(trace, args, mode)
                    walls["anchor"].append(anchor["real_s"])
            ours["real_s"] = statistics.median(walls["dyn"])
            if args.no_anchor:
                print(f"router {mode}: " + json.dumps(ours))
                report[mode] = {"dyn": ours}
                continue
            anchor["real_s"] = statistics.median(walls["anchor"])
            print(table(mode, ours, anchor))
            if args.rounds > 1:
                for side, values in walls.items():
                    print(f"real_s {side}: " + " ".join(f"{v:.2f}" for v in values))
            report[mode] = {"dyn": ours, "anchor": anchor, "real_s_rounds": walls}
        if args.json:
            print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
