"""Benchmark: what the agent APIs cost. `dyn serve`'s /v1/responses and /v1/messages against its
/v1/chat/completions, and against NVIDIA Dynamo 1.6.1's /v1/responses (the anchor), same machine,
same run.

Not a test. Needs the anchor installed (``../shared/anchor/install.sh``, venv in $ANCHOR_DIR,
default /tmp/dyn-anchor). Each round starts each stack (``bench_vs_anchor.py``'s: 2 mocker
workers, speedup 100, block size 16, 8192 KV blocks, the given router mode) and runs
``agent_api_load.py`` (streaming, 16 output tokens, the anchor's prompt shape) once per API at
each concurrency: dyn on chat, responses and messages; Dynamo on chat and responses (its
/v1/messages needs ``--enable-anthropic-api``, which the anchor's run.sh does not pass). Stacks
alternate inside a round. Prints one JSON object per measurement, then a table of medians and
each API's req/s and the frontend's CPU per request (its process, utime + stime around the load) as a
ratio of dyn's chat (the adapters' cost) and req/s against Dynamo's same API. The load client runs
on the same two cores: an API with more events per response costs the client more too, so its CPU
per request is printed beside the frontend's.

    python tests/perf/bench_agent_apis.py --rounds 3 --requests 2000 --concurrency 32 128
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_anchor import DEFAULT_ANCHOR_SCRIPTS, Dyn, Dynamo, cpu_seconds, family

LOADER = Path(__file__).resolve().parent / "agent_api_load.py"
APIS = {"dyn": ("chat", "responses", "messages"), "dynamo": ("chat", "responses")}


def load(args, api: str, concurrency: int) -> dict:
    """The load client's JSON result, with its own CPU seconds (``client_cpu_s``)."""
    python = str(Path(args.anchor_dir, "venv", "bin", "python"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [
            python,
            str(LOADER),
            "--url",
            f"http://127.0.0.1:{args.port}",
            "--api",
            api,
            "--concurrency",
            str(concurrency),
            "--requests",
            str(args.requests),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {**json.loads(out), "client_cpu_s": spent}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchor-dir", default=os.environ.get("ANCHOR_DIR", "/tmp/dyn-anchor"))
    ap.add_argument("--anchor-scripts", default=str(DEFAULT_ANCHOR_SCRIPTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--router-mode", default="kv")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args()
    args.dyn_http_workers = [1]
    args.standalone_router = False
    rows: list[dict] = []
    for rnd in range(args.rounds):
        systems = [Dynamo(args), Dyn(args)]
        for system in systems if rnd % 2 == 0 else systems[::-1]:
            pid = system.start()
            try:
                for c in args.concurrency:
                    for api in APIS[system.name]:
                        pids = family(pid)
                        cpu0 = sum(map(cpu_seconds, pids))
                        result = load(args, api, c)
                        cpu = sum(map(cpu_seconds, pids)) - cpu0
                        row = {
                            "system": system.name,
                            "round": rnd,
                            "api": api,
                            "concurrency": c,
                            "req_per_s": result["req_per_s"],
                            "ttft_p50_ms": result["ttft_ms"]["p50"],
                            "ttft_p99_ms": result["ttft_ms"]["p99"],
                            "output_tokens": result["output_tokens_mean"],
                            "frontend_cpu_ms_per_req": round(1000 * cpu / max(result["requests_ok"], 1), 3),
                            "client_cpu_ms_per_req": round(
                                1000 * result["client_cpu_s"] / max(result["requests_ok"], 1), 3
                            ),
                            "failed": result["requests_failed"],
                        }
                        rows.append(row)
                        print(json.dumps(row), flush=True)
            finally:
                system.stop()
    print()
    print(
        "| concurrency | stack | API | req/s | TTFT p50 ms | TTFT p99 ms | frontend CPU ms/req | "
        "client CPU ms/req | req/s / dyn chat | CPU / dyn chat | req/s / Dynamo same API |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in args.concurrency:

        def med(system: str, api: str, key: str, c: int = c) -> float:
            return statistics.median(
                r[key] for r in rows if r["system"] == system and r["api"] == api and r["concurrency"] == c
            )

        for system, apis in APIS.items():
            for api in apis:
                keys = (
                    "req_per_s",
                    "ttft_p50_ms",
                    "ttft_p99_ms",
                    "frontend_cpu_ms_per_req",
                    "client_cpu_ms_per_req",
                )
                rps, p50, p99, cpu, client = (med(system, api, k) for k in keys)
                vs_chat = vs_cpu = vs_dynamo = ""
                if system == "dyn":
                    vs_chat = f"{rps / med('dyn', 'chat', 'req_per_s'):.3f}"
                    vs_cpu = f"{cpu / med('dyn', 'chat', 'frontend_cpu_ms_per_req'):.3f}"
                    if api in APIS["dynamo"]:
                        vs_dynamo = f"{rps / med('dynamo', api, 'req_per_s'):.2f}x"
                print(
                    f"| {c} | {system} | {api} | {rps:.1f} | {p50:.1f} | {p99:.1f} | {cpu:.3f} | {client:.3f} | "
                    f"{vs_chat} | {vs_cpu} | {vs_dynamo} |"
                )


if __name__ == "__main__":
    main()
