"""Benchmark: `dyn serve` against NVIDIA Dynamo 1.6.1 (the anchor), same machine, same run.

Not a test. Needs the anchor installed (``../shared/anchor/install.sh``, venv in $ANCHOR_DIR,
default /tmp/dyn-anchor). For each round and each system it starts the stack (2 mocker workers,
speedup 100, block size 16, 8192 KV blocks, the given router mode), runs the anchor's ``load.py``
(streaming, max_tokens 16, ignore_eos so both engines emit exactly 16 tokens) at each
concurrency, and records req/s, TTFT p50/p99, end-to-end latency p50, the frontend's CPU seconds
per request
(utime+stime of the frontend process around the load run), its peak RSS (VmHWM), and the
mocker workers' CPU seconds per request (summed over the worker processes: issue 21's "the
mocker's own CPU per request", measured beside Dynamo's mocker). Systems
alternate inside a round so drift on this shared machine hits both. Prints one JSON object per
measurement, then a table of medians and dyn/Dynamo ratios.

``--dyn-http-workers 1 2`` runs dyn once per value (``dyn-1``, ``dyn-2``: ``--num-http-workers``);
with several HTTP worker processes the frontend's CPU and peak RSS are summed over them.
``--standalone-router`` (with ``--router-mode kv``) routes dyn's frontends through one ``dyn
router`` process (``--router-address``) instead of a router embedded in each; the router's CPU is
reported apart (``router_cpu_ms_per_req``).

``--rate 400 600`` adds open-loop runs (Poisson arrivals at that many requests/s, each timed from
its scheduled start, at most ``--rate-cap`` in flight) after the closed-loop ones; the table then
has a row per load, ``c32`` for a concurrency and ``r400`` for a rate. ``--floor`` adds a third
system, ``floor``: ``tests/perf/floor_server.py``, a bare uvicorn app streaming 16 canned chunks
with no work at all, the CPU per request no Python front can go below.

    python tests/perf/bench_vs_anchor.py --rounds 3 --requests 3000 --concurrency 32 128
    python tests/perf/bench_vs_anchor.py --rounds 2 --concurrency 32 128 --rate 400 600 --floor
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

DEFAULT_ANCHOR_SCRIPTS = Path(__file__).resolve().parents[3] / "shared" / "anchor"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def family(pid: int) -> list[int]:
    """``pid`` and its descendants (a frontend's HTTP worker processes)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid, *(p for child in map(int, out) for p in family(child))]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wait_ready(url: str, workers: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                r = httpx.post(
                    url + "/v1/chat/completions",
                    timeout=10,
                    json={
                        "model": httpx.get(url + "/v1/models").json()["data"][0]["id"],
                        "messages": [{"role": "user", "content": "warm"}],
                        "max_tokens": 1,
                    },
                )
                if r.status_code == 200:
                    return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout}s")


class Floor:
    """``floor_server.py``: the same load answered with no work (see the module docstring)."""

    name = "floor"

    def __init__(self, args) -> None:
        self.args = args
        self.proc: subprocess.Popen | None = None

    def start(self) -> int:
        server = Path(__file__).resolve().parent / "floor_server.py"
        self.proc = subprocess.Popen(
            [sys.executable, str(server), "--port", str(self.args.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_ready(f"http://127.0.0.1:{self.args.port}", 0)
        return self.proc.pid

    def workers(self) -> list[int]:
        return []

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)


class Dynamo:
    name = "dynamo"

    def __init__(self, args) -> None:
        self.args = args
        self.env = {
            **os.environ,
            "ANCHOR_DIR": args.anchor_dir,
            "HTTP_PORT": str(args.port),
            "ROUTER_MODE": args.router_mode,
            "NUM_WORKERS": "2",
            "SPEEDUP": "100",
        }

    def start(self) -> int:
        subprocess.run(
            [str(Path(self.args.anchor_scripts) / "run.sh"), "start"],
            env=self.env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wait_ready(f"http://127.0.0.1:{self.args.port}", 2)
        return int(Path(self.args.anchor_dir, "logs", "frontend.pid").read_text())

    def workers(self) -> list[int]:
        logs = Path(self.args.anchor_dir, "logs")
        return [int(p.read_text()) for p in sorted(logs.glob("mocker*.pid"))]

    def stop(self) -> None:
        subprocess.run(
            [str(Path(self.args.anchor_scripts) / "run.sh"), "stop"],
            env=self.env,
            check=False,
            stdout=subprocess.DEVNULL,
        )


class Dyn:
    def __init__(self, args, http_workers: int = 1) -> None:
        self.args = args
        self.http_workers = http_workers
        self.name = "dyn" if args.dyn_http_workers == [1] else f"dyn-{http_workers}"
        self.proc: subprocess.Popen | None = None
        self.router: subprocess.Popen | None = None
        self.tmp = tempfile.TemporaryDirectory(prefix="dyn-bench-")

    def start(self) -> int:
        env = {**os.environ, "DYN_DISCOVERY_DIR": self.tmp.name}
        routed: list[str] = []
        if self.args.standalone_router:
            port = self.args.port + 1
            self.router = subprocess.Popen(
                [sys.executable, "-m", "dyn.cli", "router", "--port", str(port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            routed = ["--router-address", f"tcp://127.0.0.1:{port}"]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dyn.cli",
                "serve",
                "--http-port",
                str(self.args.port),
                "--router-mode",
                self.args.router_mode,
                "--speedup-ratio",
                "100",
                "--block-size",
                "16",
                "--num-gpu-blocks-override",
                "8192",
                *(["--num-http-workers", str(self.http_workers)] if self.http_workers > 1 else []),
                *routed,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_ready(f"http://127.0.0.1:{self.args.port}", 2)
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid), "-f", "dyn.cli frontend"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        return int(out[0])

    def workers(self) -> list[int]:
        assert self.proc is not None
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid), "-f", "dyn.cli worker"], capture_output=True, text=True
        ).stdout.split()
        return [int(p) for p in out]

    def stop(self) -> None:
        for proc in (self.proc, self.router):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)


def load(args, concurrency: int, rate: float | None = None) -> dict:
    python = str(Path(args.anchor_dir, "venv", "bin", "python"))
    out = subprocess.run(
        [
            python,
            str(Path(args.anchor_scripts) / "load.py"),
            "--url",
            f"http://127.0.0.1:{args.port}",
            "--concurrency",
            str(concurrency),
            "--requests",
            str(args.requests),
            "--max-tokens",
            "16",
            "--ignore-eos",
            *(["--rate", str(rate)] if rate else []),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchor-dir", default=os.environ.get("ANCHOR_DIR", "/tmp/dyn-anchor"))
    ap.add_argument(
        "--anchor-scripts",
        default=str(DEFAULT_ANCHOR_SCRIPTS),
        help="folder with the anchor's run.sh and load.py",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--rate", type=float, nargs="*", default=[], help="open-loop runs at these requests/s")
    ap.add_argument("--rate-cap", type=int, default=512, help="most requests in flight in an open-loop run")
    ap.add_argument("--floor", action="store_true", help="also run floor_server.py (no work at all)")
    ap.add_argument("--router-mode", default="round-robin")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--dyn-http-workers", type=int, nargs="+", default=[1])
    ap.add_argument("--standalone-router", action="store_true")
    args = ap.parse_args()
    rows: list[dict] = []
    loads = [(f"c{c}", c, None) for c in args.concurrency]
    loads += [(f"r{rate:g}", args.rate_cap, rate) for rate in args.rate]
    for rnd in range(args.rounds):
        systems = [
            Dynamo(args),
            *(Dyn(args, n) for n in args.dyn_http_workers),
            *([Floor(args)] if args.floor else []),
        ]
        for system in systems if rnd % 2 == 0 else systems[::-1]:
            pid = system.start()
            try:
                for label, c, rate in loads:
                    pids = family(pid)
                    workers = system.workers()
                    router = getattr(system, "router", None)
                    cpu0 = sum(map(cpu_seconds, pids))
                    workers0 = sum(map(cpu_seconds, workers))
                    router0 = cpu_seconds(router.pid) if router is not None else 0.0
                    result = load(args, c, rate)
                    cpu = sum(map(cpu_seconds, pids)) - cpu0
                    workers_cpu = sum(map(cpu_seconds, workers)) - workers0
                    ok = max(result["requests_ok"], 1)
                    router_cpu = cpu_seconds(router.pid) - router0 if router is not None else 0.0
                    row = {
                        "system": system.name,
                        "round": rnd,
                        "load": label,
                        "req_per_s": result["req_per_s"],
                        "ttft_p50_ms": result["ttft_ms"]["p50"],
                        "ttft_p99_ms": result["ttft_ms"]["p99"],
                        "e2e_p50_ms": result["e2e_ms"]["p50"],
                        "failed": result["requests_failed"],
                        "frontend_cpu_ms_per_req": round(1000 * cpu / ok, 3),
                        "frontend_peak_rss_mib": round(sum(map(peak_rss_mib, pids)), 1),
                        "router_cpu_ms_per_req": round(1000 * router_cpu / ok, 3),
                        "workers_cpu_ms_per_req": round(1000 * workers_cpu / ok, 3),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                system.stop()
    print()
    keys = (
        "req_per_s",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "e2e_p50_ms",
        "frontend_cpu_ms_per_req",
        "frontend_peak_rss_mib",
        "workers_cpu_ms_per_req",
    )
    names = [system.name for system in systems[1:]]
    print("| load | metric | Dynamo 1.6.1 | " + " | ".join(f"{n} | {n} / Dynamo" for n in names) + " |")
    print("|---|---|---|" + "---|---|" * len(names))
    for label, _, _ in loads:
        for key in keys:
            med = {
                s: statistics.median(r[key] for r in rows if r["system"] == s and r["load"] == label)
                for s in ("dynamo", *names)
            }
            cells = " | ".join(f"{med[n]:.2f} | {med[n] / med['dynamo']:.2f}x" for n in names)
            print(f"| {label} | {key} | {med['dynamo']:.2f} | {cells} |")


if __name__ == "__main__":
    main()
