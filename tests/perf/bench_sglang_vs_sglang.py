"""Benchmark: ``dyn serve --engine sglang`` against SGLang's own server on the same engine, on this CPU.

Not a test. What dyn's layer (its frontend, router and worker around SGLang's ``Engine``) costs
against ``python -m sglang.launch_server`` (SGLang's HTTP server and tokenizer manager around
the same engine). Each round starts one stack, warms it, runs ``shared/anchor/load.py`` (closed
loop, streaming, the anchor's prompts, ``--ignore-eos`` so each reply is ``--max-tokens`` long) at each concurrency, stops it (every process of its
session), then does the same with the other; the order alternates from round to round so drift
on this shared machine hits both. Never two stacks at once. Prints one JSON line per run, then
the medians per (stack, concurrency) and dyn/SGLang ratios taken within each round (the median
and range over rounds: this machine drifts by more than the difference between the stacks). Stack CPU is every process of the
stack (``utime + stime``, the session's leader and its descendants) around one load run, per
request: on these two shared cores it is what the layer costs.

Both stacks: one SGLang 0.5.23 engine from the venv of ``scripts/provision_sglang_cpu.sh``
(``--venv``), its CPU engine (``--device cpu``, ``SGLANG_USE_CPU_ENGINE=1``), the venv's tiny
random Llama, the same engine flags (``ENGINE``), ``OMP_NUM_THREADS=1``, loopback, free ports.

    python tests/perf/bench_sglang_vs_sglang.py --rounds 3 --concurrency 8 32 --requests 400
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm_vs_anchor import Stack, free_port
from bench_vs_anchor import cpu_seconds, family

REPO = Path(__file__).resolve().parents[2]
LOAD = REPO.parent / "shared" / "anchor" / "load.py"
ENGINE = ["--device", "cpu", "--page-size", "16", "--max-total-tokens", "16384"]
ENV = {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "SGLANG_USE_CPU_ENGINE": "1"}


class Dyn(Stack):
    name = "dyn"

    def start(self) -> str:
        port = free_port()
        self.spawn(
            [
                str(self.args.python),
                "-m",
                "dyn.cli",
                "serve",
                "--engine",
                "sglang",
                "--workers",
                "1",
                "--model-path",
                str(self.args.model),
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(port),
                "--discovery-dir",
                str(self.tmp / "discovery"),
                *ENGINE,
            ],
            {**os.environ, **ENV},
            "serve.log",
        )
        return f"http://127.0.0.1:{port}"


class Sglang(Stack):
    name = "sglang"

    def start(self) -> str:
        port = free_port()
        self.spawn(
            [
                str(self.args.python),
                "-m",
                "sglang.launch_server",
                "--model-path",
                str(self.args.model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *ENGINE,
            ],
            {**os.environ, **ENV},
            "sglang.log",
        )
        return f"http://127.0.0.1:{port}"


def wait_ready(stack: Stack, url: str, timeout: float = 400) -> str:
    """The served model's id, once a one-token chat completes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive()
        try:
            model = httpx.get(url + "/v1/models", timeout=5).json()["data"][0]["id"]
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
            if httpx.post(url + "/v1/chat/completions", json=body, timeout=30).status_code == 200:
                return model
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            pass
        time.sleep(1)
    raise RuntimeError(f"{stack.name} not ready in {timeout} s:\n{stack.log_tail()}")


def load(args: argparse.Namespace, url: str, concurrency: int, requests: int, seed: int) -> dict:
    argv = [str(args.python), str(LOAD), "--url", url, "--concurrency", str(concurrency)]
    argv += ["--requests", str(requests), "--max-tokens", str(args.max_tokens), "--seed", str(seed)]
    out = subprocess.run([*argv, "--ignore-eos"], capture_output=True, text=True, check=True, timeout=900)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_venv = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "dyn", "sglang-cpu-0.5.23")
    ap.add_argument("--venv", type=Path, default=Path(os.environ.get("DYN_SGLANG_VENV", default_venv)))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    args.python = args.venv / "bin" / "python"
    args.model = args.venv / "models" / "dyn-tiny-llama"
    rows: list[dict] = []
    for rnd in range(args.rounds):
        order = [Dyn, Sglang] if rnd % 2 == 0 else [Sglang, Dyn]
        for kind in order:
            with tempfile.TemporaryDirectory(prefix=f"bench-{kind.name}-") as tmp:
                stack = kind(args, Path(tmp))
                try:
                    url = stack.start()
                    wait_ready(stack, url)
                    load(args, url, 8, 32, seed=1000 + rnd)  # warm-up, not counted
                    pids = [pid for proc in stack.procs for pid in family(proc.pid)]
                    for c in args.concurrency:
                        cpu0 = sum(map(cpu_seconds, pids))
                        result = load(args, url, c, args.requests, seed=rnd)
                        cpu = sum(map(cpu_seconds, pids)) - cpu0
                        row = {
                            "stack": kind.name,
                            "round": rnd,
                            "concurrency": c,
                            "req_per_s": result["req_per_s"],
                            "ttft_p50_ms": result["ttft_ms"]["p50"],
                            "ttft_p99_ms": result["ttft_ms"]["p99"],
                            "mean_output_tokens": result["mean_output_tokens"],
                            "stack_cpu_ms_per_req": round(1000 * cpu / max(result["requests_ok"], 1), 3),
                            "failed": result["requests_failed"],
                        }
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                finally:
                    stack.stop()
    print()
    table(rows, args.concurrency, args.rounds)


def table(rows: list[dict], concurrencies: list[int], rounds: int) -> None:
    """The medians per (concurrency, stack) of ``rows``, and dyn's ratios to SGLang within rounds."""
    print(
        "| concurrency | stack | req/s | TTFT p50 ms | TTFT p99 ms | stack CPU ms/req | "
        "dyn / SGLang req/s, paired | dyn / SGLang TTFT p50, paired |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for c in concurrencies:

        def med(stack: str, key: str, c: int = c) -> float:
            return statistics.median(r[key] for r in rows if r["stack"] == stack and r["concurrency"] == c)

        def paired(key: str, c: int = c) -> str:
            """The median and range of dyn's figure over SGLang's in the same round."""
            by = {(r["stack"], r["round"]): r[key] for r in rows if r["concurrency"] == c}
            ratios = sorted(by["dyn", n] / by["sglang", n] for n in range(rounds))
            return f"{statistics.median(ratios):.3f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"

        for name in ("dyn", "sglang"):
            ratio_rps, ratio_ttft = (
                (paired("req_per_s"), paired("ttft_p50_ms")) if name == "dyn" else ("", "")
            )
            print(
                f"| {c} | {name} | {med(name, 'req_per_s'):.1f} | {med(name, 'ttft_p50_ms'):.1f} | "
                f"{med(name, 'ttft_p99_ms'):.1f} | {med(name, 'stack_cpu_ms_per_req'):.2f} | "
                f"{ratio_rps} | {ratio_ttft} |"
            )


if __name__ == "__main__":
    main()
