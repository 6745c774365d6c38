#!/usr/bin/env python3
"""Where each API's requests spend CPU: rounds of ``agent_api_load.py`` against a running
``dyn serve``, the APIs alternating, each round printing req/s and the CPU per request of the
frontend, the mocker workers and the load client. Not a test.

On a machine whose cores the stack and the client share, req/s follows the sum of the three: a
client that reads more bytes and lines per response costs that API req/s the server did not lose.

    dyn serve --workers 2 --speedup-ratio 100 --router-mode kv --http-port 18804 &
    python tests/perf/agent_api_cpu.py --port 18804 --rounds 8 --apis chat,responses

CPU is utime + stime from ``/proc/PID/stat``: the frontend's process (found by its port), every
``worker mocker`` process, and the client's own (its children's rusage, its interpreter's start
included: about 0.5 s per round here).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

LOADER = Path(__file__).resolve().parent / "agent_api_load.py"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def pids(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def workers_cpu_s() -> float:
    total = 0.0
    for pid in pids("worker mocker"):
        try:
            total += cpu_s(pid)
        except FileNotFoundError:
            pass
    return total


def client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_round(args: argparse.Namespace, frontend: int, api: str) -> dict[str, float]:
    before = cpu_s(frontend), workers_cpu_s(), client_cpu_s()
    command = [args.python, str(LOADER), "--url", f"http://127.0.0.1:{args.port}", "--api", api]
    command += ["--concurrency", str(args.concurrency), "--requests", str(args.requests)]
    result = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    after = cpu_s(frontend), workers_cpu_s(), client_cpu_s()
    ok = result["requests_ok"]
    spent = [(b - a) / ok * 1000 for a, b in zip(before, after)]
    return {
        "req_per_s": result["req_per_s"],
        "frontend_ms": spent[0],
        "workers_ms": spent[1],
        "client_ms": spent[2],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True, help="the running stack's HTTP port (loopback)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--apis", default="chat,responses", help="comma-separated: chat, responses, messages")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument(
        "--python", default=sys.executable, help="the interpreter of the load client (it needs aiohttp)"
    )
    args = ap.parse_args()
    found = pids(f"frontend.*--http-port {args.port}")
    if not found:
        raise SystemExit(f"no dyn frontend serving on port {args.port}")
    apis = args.apis.split(",")
    rows: dict[str, list[dict[str, float]]] = {api: [] for api in apis}
    for r in range(args.rounds):
        for api in apis:
            row = one_round(args, found[0], api)
            rows[api].append(row)
            print(
                json.dumps({"round": r, "api": api, **{k: round(v, 3) for k, v in row.items()}}), flush=True
            )
    for api, got in rows.items():
        medians = {k: round(statistics.median(row[k] for row in got), 3) for k in got[0]}
        print(json.dumps({"api": api, "median": medians}))


if __name__ == "__main__":
    main()
