"""Benchmark: the frontend's CPU per request with 1 and N HTTP processes (issue 37 item 4).

    python tests/perf/bench_http_workers.py --http-workers 1 2 --rate 700 --rounds 2
    python tests/perf/bench_http_workers.py --http-workers 1 2 --router-mode round-robin --rate 700
    python tests/perf/bench_http_workers.py --http-workers 1 2 --side indexer --rate 700

For each round and each ``--http-workers`` value it starts ``dyn serve`` (2 mocker workers at
speedup 100, block size 16, 8192 KV blocks, the given router mode; ``--num-http-workers N``),
warms it up with 1,000 requests, then runs the anchor's ``load.py`` (streaming, max_tokens 16,
ignore_eos; closed loop at ``--concurrency``, or open loop at ``--rate`` requests/s) and reports
the frontend's CPU per request: utime + stime of the frontend and every HTTP process under it
(the supervisor included), plus a ``--side`` process when there is one (``indexer``: a ``dyn
indexer`` the frontends ask with ``--use-remote-indexer``; ``router``: a ``dyn router`` they ask
with ``--router-address``). Values alternate inside a round. Prints one JSON line per run, then
the medians. An equal open-loop rate compares processes at the same load; a closed loop lets one
process batch more work per event-loop pass than two half-loaded ones.

Needs the anchor's venv (``../shared/anchor/install.sh``) for ``load.py`` and its aiohttp.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ANCHOR_PYTHON = "/tmp/dyn-anchor/venv/bin/python"
LOAD = HERE.parents[1].parent / "shared" / "anchor" / "load.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def descendants(pid: int) -> list[int]:
    return [pid, *(d for c in children(pid) for d in descendants(c))]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def wait_ready(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1)
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"dyn serve did not answer on port {port} in {timeout} s")


def run(args: argparse.Namespace, n: int) -> dict:
    port = free_port()
    env = {**os.environ, "DYN_DISCOVERY_DIR": tempfile.mkdtemp(prefix="dyn-bench-http-")}
    serve_cmd = [
        sys.executable, "-m", "dyn.cli", "serve", "--http-port", str(port), "--router-mode", args.router_mode,
        "--speedup-ratio", "100", "--block-size", "16", "--num-gpu-blocks-override", "8192",
        *(["--num-http-workers", str(n)] if n > 1 else []),
    ]  # fmt: skip
    side = None
    if args.side:
        side_port = free_port()
        side_cmd = [sys.executable, "-m", "dyn.cli", args.side]
        if args.side == "indexer":
            side_cmd += ["--zmq-port", str(side_port), "--block-size", "16", "--http-port", "0"]
            serve_cmd += ["--use-remote-indexer", "--indexer-address", f"tcp://127.0.0.1:{side_port}"]
        else:
            side_cmd += ["--port", str(side_port)]
            serve_cmd += ["--router-address", f"tcp://127.0.0.1:{side_port}"]
        side = subprocess.Popen(
            side_cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        time.sleep(3)
    serve = subprocess.Popen(
        serve_cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        wait_ready(port)
        time.sleep(2)
        frontend = next(p for p in children(serve.pid) if "dyn.cli frontend" in cmdline(p))
        pids = [p for p in descendants(frontend) if "resource_tracker" not in cmdline(p)]
        pids += [side.pid] if side is not None else []
        load = [
            args.anchor_python, str(args.load), "--url", f"http://127.0.0.1:{port}", "--concurrency",
            str(args.concurrency), "--max-tokens", "16", "--ignore-eos",
            *(["--rate", str(args.rate)] if args.rate else []),
        ]  # fmt: skip
        subprocess.run([*load, "--requests", "1000"], stdout=subprocess.DEVNULL, check=True)
        before = cpu_s(pids)
        out = subprocess.run(
            [*load, "--requests", str(args.requests)], capture_output=True, text=True, check=True
        )
        cpu = cpu_s(pids) - before
        result = json.loads(out.stdout)
        return {
            "http_workers": n,
            "router_mode": args.router_mode,
            "side": args.side,
            "rate": args.rate,
            "cpu_ms_per_req": round(cpu * 1000 / args.requests, 3),
            "req_per_s": result["req_per_s"],
            "ttft_p50_ms": result["ttft_ms"]["p50"],
            "ttft_p99_ms": result["ttft_ms"]["p99"],
            "failed": result["requests_failed"],
        }
    finally:
        for proc in (serve, side):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http-workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--router-mode", default="kv")
    p.add_argument("--side", choices=["indexer", "router"], help="a standalone process the frontends ask")
    p.add_argument("--rate", type=float, help="open loop at this many requests/s (default: closed loop)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=8000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--anchor-python", default=ANCHOR_PYTHON)
    p.add_argument("--load", type=Path, default=LOAD, help="the anchor's load.py")
    args = p.parse_args()
    runs: dict[int, list[dict]] = {n: [] for n in args.http_workers}
    for _ in range(args.rounds):
        for n in args.http_workers:
            row = run(args, n)
            runs[n].append(row)
            print(json.dumps(row), flush=True)
    print("\n| HTTP processes | CPU ms/request | req/s | TTFT p50 ms | TTFT p99 ms |\n|---|---|---|---|---|")
    for n, rows in runs.items():
        med = {
            k: statistics.median(r[k] for r in rows)
            for k in ("cpu_ms_per_req", "req_per_s", "ttft_p50_ms", "ttft_p99_ms")
        }
        print(
            f"| {n} | {med['cpu_ms_per_req']:.3f} | {med['req_per_s']:.0f} | {med['ttft_p50_ms']:.1f} | {med['ttft_p99_ms']:.1f} |"
        )
    print("command: python tests/perf/bench_http_workers.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
