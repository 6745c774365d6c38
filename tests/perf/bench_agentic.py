"""Benchmark: the issue-6 agentic workloads with ``dyn bench`` on ``dyn serve`` and on the anchor.

Not a test. For each round it starts each stack (4 mocker workers, block size 16, 8192 KV blocks,
speedup 1: the mocker's real-time H100 timing model), runs ``dyn bench`` with ``--output`` and
collects the summaries; systems and settings alternate inside a round so drift on this shared
machine hits all of them. Prints one JSON line per run, then a table of medians.

Parallel sampling (16 problems x 4 samples, a 1024-token system prompt, 256-token problems, 32
output tokens, 2 bursts in flight): dyn round-robin, dyn kv, dyn kv + --router-predicted-ttl-secs 5,
and the anchor (Dynamo 1.6.1) in round-robin and kv. Multi-turn (8 agent runs, 4 lead turns, 2
subagents in sessions, 4 runs in flight) on dyn kv with and without --speculative-prefill; lead
agents only (6 turns, no sessions: Dynamo 1.6.1 refuses nvext.session_control) with and without
--speculative-prefill on both. Both stacks serve the anchor's tiny-llama model directory
so prompts tokenize identically.

    python tests/perf/bench_agentic.py --rounds 3
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
from pathlib import Path

import httpx

DEFAULT_ANCHOR_SCRIPTS = Path(__file__).resolve().parents[3] / "shared" / "anchor"
PARALLEL = [
    "--parallel-sampling",
    "--problems",
    "16",
    "--samples",
    "4",
    "--system-tokens",
    "1024",
    "--problem-tokens",
    "256",
    "--max-tokens",
    "32",
    "--concurrency",
    "2",
]
MULTI = [
    "--multi-turn",
    "--agents",
    "8",
    "--lead-turns",
    "4",
    "--subagents",
    "2",
    "--subagent-turns",
    "3",
    "--system-tokens",
    "1024",
    "--turn-tokens",
    "128",
    "--max-tokens",
    "32",
    "--tool-pause",
    "0.2",
    "--concurrency",
    "4",
]
# Dynamo 1.6.1 refuses nvext.session_control (a 400), so the comparison with it runs lead agents only
LEADS = [
    "--multi-turn",
    "--agents",
    "8",
    "--lead-turns",
    "6",
    "--subagents",
    "0",
    "--system-tokens",
    "1024",
    "--turn-tokens",
    "128",
    "--max-tokens",
    "32",
    "--tool-pause",
    "0.2",
    "--concurrency",
    "4",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, workers: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = httpx.post(
                url + "/v1/completions",
                json={"model": models(url)[0], "prompt": "hi", "max_tokens": 1},
                timeout=5,
            )
            if (
                r.status_code == 200
                and len(httpx.get(url + "/health", timeout=5).json().get("instances", [])) >= workers
            ):
                return
        except (httpx.HTTPError, IndexError, ValueError):
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} not ready after {timeout}s")


def models(url: str) -> list[str]:
    return [m["id"] for m in httpx.get(url + "/v1/models", timeout=5).json().get("data", [])]


class Dyn:
    def __init__(self, args, mode: str, extra: list[str]) -> None:
        self.args, self.mode, self.extra = args, mode, extra
        self.proc: subprocess.Popen | None = None
        self.tmp = tempfile.TemporaryDirectory(prefix="dyn-agentic-")

    def start(self) -> str:
        port = free_port()
        env = {**os.environ, "DYN_DISCOVERY_DIR": self.tmp.name}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dyn.cli",
                "serve",
                "--workers",
                "4",
                "--http-port",
                str(port),
                "--router-mode",
                self.mode,
                *self.extra,
                "--speedup-ratio",
                "1",
                "--block-size",
                "16",
                "--num-gpu-blocks-override",
                "8192",
                "--model-path",
                str(Path(self.args.anchor_dir, "model")),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, 4)
        return url

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


class Dynamo:
    def __init__(self, args, mode: str) -> None:
        self.args, self.mode = args, mode
        self.port = free_port()
        self.env = {
            **os.environ,
            "ANCHOR_DIR": args.anchor_dir,
            "HTTP_PORT": str(self.port),
            "ROUTER_MODE": mode,
            "NUM_WORKERS": "4",
            "SPEEDUP": "1",
            "BLOCK_SIZE": "16",
            "GPU_BLOCKS": "8192",
        }

    def start(self) -> str:
        subprocess.run(
            [str(Path(self.args.anchor_scripts) / "run.sh"), "start"],
            env=self.env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{self.port}"
        wait_ready(url, 4)
        return url

    def stop(self) -> None:
        subprocess.run(
            [str(Path(self.args.anchor_scripts) / "run.sh"), "stop"],
            env=self.env,
            check=False,
            stdout=subprocess.DEVNULL,
        )


def bench(url: str, workload: list[str], extra: list[str], out: Path) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dyn.cli",
            "bench",
            "--url",
            url,
            "--block-size",
            "16",
            "--no-progress",
            "--output",
            str(out),
            *workload,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if not out.exists():
        raise RuntimeError(f"dyn bench failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return json.loads(out.read_text())["summary"]


def row(name: str, s: dict) -> dict:
    return {
        "run": name,
        "req_s": s["request_throughput"],
        "ttft_p50_ms": s["ttft_s"]["p50"] * 1000,
        "ttft_p99_ms": s["ttft_s"]["p99"] * 1000,
        "e2e_p50_ms": s["e2e_s"]["p50"] * 1000,
        "cached_ratio": s["cached_token_ratio"],
        "dup_prefills": s["duplicate_prefills"],
        "failed": s["failed"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchor-dir", default=os.environ.get("ANCHOR_DIR", "/tmp/dyn-anchor"))
    ap.add_argument("--anchor-scripts", default=str(DEFAULT_ANCHOR_SCRIPTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-anchor", action="store_true", help="dyn only")
    args = ap.parse_args()
    runs = [
        ("dyn rr / parallel", lambda: Dyn(args, "round-robin", []), PARALLEL, []),
        ("dyn kv / parallel", lambda: Dyn(args, "kv", []), PARALLEL, []),
        (
            "dyn kv+pttl5 / parallel",
            lambda: Dyn(args, "kv", ["--router-predicted-ttl-secs", "5"]),
            PARALLEL,
            [],
        ),
        ("dyn kv / multi-turn", lambda: Dyn(args, "kv", []), MULTI, []),
        ("dyn kv / multi-turn +spec", lambda: Dyn(args, "kv", []), MULTI, ["--speculative-prefill"]),
        ("dyn kv / leads", lambda: Dyn(args, "kv", []), LEADS, []),
        ("dyn kv / leads +spec", lambda: Dyn(args, "kv", []), LEADS, ["--speculative-prefill"]),
    ]
    if not args.no_anchor:
        runs += [
            ("dynamo rr / parallel", lambda: Dynamo(args, "round-robin"), PARALLEL, []),
            ("dynamo kv / parallel", lambda: Dynamo(args, "kv"), PARALLEL, []),
            ("dynamo kv / leads", lambda: Dynamo(args, "kv"), LEADS, []),
            ("dynamo kv / leads +spec", lambda: Dynamo(args, "kv"), LEADS, ["--speculative-prefill"]),
        ]
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, make, workload, extra in runs:
                system = make()
                try:
                    url = system.start()
                    summary = bench(url, workload, [*extra, "--seed", str(r)], Path(tmp, "out.json"))
                except (RuntimeError, subprocess.SubprocessError) as exc:
                    print(json.dumps({"run": name, "round": r, "error": str(exc)[:300]}), flush=True)
                    continue
                finally:
                    system.stop()
                if summary["succeeded"] == 0:
                    print(
                        json.dumps(
                            {
                                "run": name,
                                "round": r,
                                "error": "every request failed",
                                "errors": summary["errors"],
                            }
                        ),
                        flush=True,
                    )
                    continue
                line = row(name, summary)
                print(json.dumps({**line, "round": r}), flush=True)
                results.setdefault(name, []).append(line)
    keys = ["req_s", "ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "cached_ratio", "dup_prefills", "failed"]
    print("\n| run | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, lines in results.items():
        cells = []
        for k in keys:
            values = [line[k] for line in lines if line[k] is not None]
            cells.append("-" if not values else f"{statistics.median(values):.3g}")
        print(f"| {name} ({len(lines)}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
