"""Benchmark: disaggregated prefill/decode against aggregated serving, dyn beside NVIDIA Dynamo 1.6.1.

Not a test. Needs the anchor installed (``../shared/anchor/install.sh``: venv and model in
$ANCHOR_DIR, default /tmp/dyn-anchor) for the Dynamo systems; ``--systems`` picks which run.

Systems, each a fresh stack of 4 mocker worker processes per round, all KV-routed (``--router-mode
kv``), with the same mocker settings (``--speedup``, block size 16, ``--num-gpu-blocks-override``,
``--kv-bytes-per-token``, ``--kv-transfer-bandwidth``):

- ``dyn-agg``: ``dyn serve --workers 4``;
- ``dyn-pd``: ``dyn serve --prefill-workers 2 --decode-workers 2``;
- ``dyn-cond``: the same with ``--router-conditional-disagg --router-conditional-disagg-config
  --cond-config`` (default ``{"eff_isl_threshold": 1024, "eff_isl_ratio_threshold": 1.0}``: both
  systems keep a prompt local when its uncached part on the best decode worker is under 1024 tokens
  and under the whole prompt, i.e. when that worker holds some of it; Dynamo refuses a ratio above 1);
- ``dyn-cond-short``: the same with ``--cond-config-all-short`` (ratio 1.01, which dyn accepts: every
  prompt under 1024 uncached tokens stays local, cached or not);
- ``dynamo-agg``, ``dynamo-pd``, ``dynamo-cond``: Dynamo's frontend and ``dynamo.mocker`` processes
  (``--disaggregation-mode prefill|decode`` for P/D; its frontend finds the prefill workers by
  itself), started as tests/perf/faults_vs_anchor.py's DynamoStack starts them: file discovery,
  TCP request plane, ZMQ event plane. Dynamo 1.6.1's P/D runs on this CPU install without
  ``--bootstrap-ports``; its decode mockers publish no KV events, so its frontend warns
  ``kv_event_publisher_disabled ... requirement="conditional_disagg_decode_cache"`` and its
  conditional disaggregation sees no decode-side cache (every prompt goes to a prefill worker).

Loads, both ``dyn bench --prefix`` closed loops run against every system in the same round (systems
alternate their order from round to round, so drift on this shared machine hits all of them):

- ``prefill-heavy``: long prompts, short outputs (``--pf-isl`` 3000 tokens, ``--pf-max-tokens`` 16);
- ``decode-heavy``: short prompts, long outputs (``--dc-isl`` 200, ``--dc-max-tokens`` 256);

both drawn from 16 groups of 16 prompts (shuffled) whose prompts share ``--pf-prefix-ratio`` /
``--dc-prefix-ratio`` (default 10 %) within their group; each load's seed differs per round.

Per system and load: TTFT and ITL p50/p99 (dyn bench's client-side figures), failed requests, and
for the conditional systems the share of requests whose prompt was prefilled on the decode worker
("kept local"): dyn's frontend counts them in ``dyn_router_disaggregated_requests_total{prefill=
"local"|"remote"}``; Dynamo's frontend counts requests its prefill router admitted
(``dynamo_frontend_router_admission_received_total{worker_type="prefill"}``) beside all requests
(``dynamo_frontend_requests_total``), so kept local = 1 - admitted / requests. Both are read as
deltas around the load. Prints one JSON object per measurement (a measurement that could not run
is a row with ``error``), then a markdown table of medians over rounds (min-max in brackets) and
dyn/Dynamo ratios per mode.

    python tests/perf/disagg_vs_agg.py --rounds 3
"""

from __future__ import annotations

import abc
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults_vs_anchor import Stack, dynamo_env

MODEL_NAME = "tiny-llama"
WORKERS = 4
LOADS = ("prefill-heavy", "decode-heavy")
METRICS = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
STALL_MS = 2000
"""A gap between two tokens this long is the shared machine starving the stack (every worker's
discovery lease lapses together), not the scheduler: the table names such measurements."""


@dataclass(frozen=True)
class System:
    """One stack shape: ``prefill`` 0 means ``WORKERS`` aggregated workers."""

    name: str
    engine: str
    prefill: int = 0
    decode: int = 0
    conditional: bool = False
    all_short_local: bool = False
    """Conditional, with ``--cond-config-all-short`` (dyn only: Dynamo refuses its ratio above 1)."""


SYSTEMS = {
    s.name: s
    for s in (
        System("dyn-agg", "dyn"),
        System("dyn-pd", "dyn", prefill=2, decode=2),
        System("dyn-cond", "dyn", prefill=2, decode=2, conditional=True),
        System("dyn-cond-short", "dyn", prefill=2, decode=2, conditional=True, all_short_local=True),
        System("dynamo-agg", "dynamo"),
        System("dynamo-pd", "dynamo", prefill=2, decode=2),
        System("dynamo-cond", "dynamo", prefill=2, decode=2, conditional=True),
    )
}


def mocker_flags(args) -> list[str]:
    """The mocker settings both systems' workers get, under the flag names both define."""
    return [
        "--model-path",
        args.model_path,
        "--model-name",
        MODEL_NAME,
        "--speedup-ratio",
        str(args.speedup),
        "--block-size",
        "16",
        "--num-gpu-blocks-override",
        str(args.num_gpu_blocks),
        "--kv-bytes-per-token",
        str(args.kv_bytes_per_token),
        "--kv-transfer-bandwidth",
        str(args.kv_transfer_bandwidth),
    ]


def conditional_flags(system: System, args) -> list[str]:
    if not system.conditional:
        return []
    config = args.cond_config_all_short if system.all_short_local else args.cond_config
    return ["--router-conditional-disagg", "--router-conditional-disagg-config", config]


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the Prometheus samples named ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


class BenchStack(Stack):
    """A stack of ``system``'s shape in a private folder; ``counters`` reads where its frontend sent
    the prompts (for the share conditional disaggregation kept on the decode workers)."""

    def __init__(self, system: System, args) -> None:
        self.name = system.name
        super().__init__(args, migration_limit=3)
        self.root.rmdir()  # the base class names its folder for the fault benchmark
        self.root = Path(tempfile.mkdtemp(prefix=f"disagg-{self.name}-"))
        self.system = system

    def routable_workers(self) -> int:
        """Not used: readiness is per system (``wait_ready``, ``workers_up``)."""
        return 0

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text

    def warm(self) -> bool:
        """A few short chat requests all answered (they reach every worker of a small pool)."""
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "warm"}], "max_tokens": 2}
        answers = [httpx.post(self.url + "/v1/chat/completions", json=body, timeout=30) for _ in range(8)]
        return all(a.status_code == 200 for a in answers)

    def check_alive(self) -> None:
        for label, proc in self._all:
            if proc.poll() is not None:
                raise RuntimeError(f"{self.name} {label} exited ({proc.returncode}):\n{self.logs_tail()}")

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if self.workers_up() and self.warm():
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.logs_tail()}")

    @abc.abstractmethod
    def workers_up(self) -> bool:
        """Whether every worker of the system serves."""

    @abc.abstractmethod
    def counters(self) -> tuple[float, float]:
        """(requests so far, of which prefilled on a prefill worker)."""


class DynServe(BenchStack):
    """``dyn serve`` in one process group; ready once it printed its URL."""

    def start(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        s = self.system
        shape = (
            ["--prefill-workers", str(s.prefill), "--decode-workers", str(s.decode)]
            if s.prefill
            else ["--workers", str(WORKERS)]
        )
        self.frontend = self.spawn(
            "serve",
            [
                sys.executable,
                "-m",
                "dyn.cli",
                "--log-level",
                "warning",
                "serve",
                *shape,
                "--http-port",
                str(self.port),
                "--namespace",
                "disagg-bench",
                "--discovery-dir",
                str(self.root / "discovery"),
                "--router-mode",
                "kv",
                *conditional_flags(s, self.args),
                *mocker_flags(self.args),
            ],
            env,
        )

    def workers_up(self) -> bool:
        return "dyn serve: ready at" in (self.root / "serve.log").read_text(errors="replace")

    def counters(self) -> tuple[float, float]:
        text = self.metrics()
        name = "dyn_router_disaggregated_requests_total"
        remote = metric_sum(text, name, prefill="remote")
        return remote + metric_sum(text, name, prefill="local"), remote


class DynamoServe(BenchStack):
    """Dynamo's frontend and one ``dynamo.mocker`` process per worker, as faults_vs_anchor's
    DynamoStack starts them (the workers' system HTTP server stays off)."""

    def start(self) -> None:
        python = str(Path(self.args.anchor_dir, "venv", "bin", "python"))
        env = dynamo_env(self.root / "kvstore")
        (self.root / "kvstore").mkdir()
        s = self.system
        self.frontend = self.spawn(
            "frontend",
            [
                python,
                "-m",
                "dynamo.frontend",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(self.port),
                "--router-mode",
                "kv",
                *conditional_flags(s, self.args),
            ],
            env,
        )
        roles = ["prefill"] * s.prefill + ["decode"] * s.decode if s.prefill else ["agg"] * WORKERS
        for i, role in enumerate(roles):
            self.workers.append(
                self.spawn(
                    f"{role}{i}",
                    [python, "-m", "dynamo.mocker", *mocker_flags(self.args), "--disaggregation-mode", role],
                    env,
                )
            )

    def workers_up(self) -> bool:
        """Every worker registered with the frontend's router(s), by type (its
        ``dynamo_component_router_worker_registered`` gauge, one series per worker and router)."""
        if MODEL_NAME not in httpx.get(self.url + "/v1/models", timeout=5).text:
            return False
        ids: dict[str, set[str]] = {}
        for line in self.metrics().splitlines():
            m = re.match(r"dynamo_component_router_worker_registered\{(.*)\} (\S+)$", line)
            if m and float(m[2]) > 0:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m[1]))
                ids.setdefault(labels.get("worker_type", ""), set()).add(labels.get("router_worker_id", ""))
        s = self.system
        if s.prefill:
            return len(ids.get("prefill", ())) >= s.prefill and len(ids.get("decode", ())) >= s.decode
        return len(set().union(*ids.values())) >= WORKERS

    def counters(self) -> tuple[float, float]:
        text = self.metrics()
        requests = metric_sum(text, "dynamo_frontend_requests_total", model=MODEL_NAME)
        admitted = metric_sum(text, "dynamo_frontend_router_admission_received_total", worker_type="prefill")
        return requests, admitted


def bench_argv(load: str, rnd: int, url: str, out: Path, args) -> list[str]:
    if load == "prefill-heavy":
        shape = ["--isl", str(args.pf_isl), "--max-tokens", str(args.pf_max_tokens)]
        shape += ["--prefix-ratio", str(args.pf_prefix_ratio)]
        shape += ["--num-requests", str(args.pf_requests), "--concurrency", str(args.pf_concurrency)]
    else:
        shape = ["--isl", str(args.dc_isl), "--max-tokens", str(args.dc_max_tokens)]
        shape += ["--prefix-ratio", str(args.dc_prefix_ratio)]
        shape += ["--num-requests", str(args.dc_requests), "--concurrency", str(args.dc_concurrency)]
    return [
        sys.executable,
        "-m",
        "dyn.cli",
        "bench",
        "--url",
        url,
        "--model",
        MODEL_NAME,
        "--prefix",
        "--groups",
        "16",
        "--per-group",
        "16",
        "--block-size",
        "16",
        "--seed",
        str(100 * LOADS.index(load) + rnd),
        *shape,
        "--no-progress",
        "-o",
        str(out),
    ]


def run_load(stack: BenchStack, load: str, rnd: int, args) -> dict:
    out = stack.root / f"{load}.json"
    before = stack.counters()
    started = time.monotonic()
    bench = subprocess.run(
        bench_argv(load, rnd, stack.url, out, args), capture_output=True, text=True, timeout=args.load_timeout
    )
    wall = time.monotonic() - started
    (stack.root / f"bench-{load}.log").write_text(bench.stdout + bench.stderr)
    if bench.returncode != 0 or not out.exists():
        raise RuntimeError(f"dyn bench exited {bench.returncode}: {(bench.stdout + bench.stderr)[-2000:]}")
    after = stack.counters()
    summary = json.loads(out.read_text())["summary"]
    requests, remote = after[0] - before[0], after[1] - before[1]
    row = {
        "ok": summary["succeeded"],
        "failed": summary["failed"],
        "output_tok_s": round(summary["output_throughput"]),
        "wall_s": round(wall, 2),
        "ttft_p50_ms": ms(summary["ttft_s"].get("p50")),
        "ttft_p99_ms": ms(summary["ttft_s"].get("p99")),
        "itl_p50_ms": ms(summary["itl_s"].get("p50")),
        "itl_p99_ms": ms(summary["itl_s"].get("p99")),
        "itl_max_ms": ms(summary["itl_s"].get("max")),
        "kept_local": round(1 - remote / requests, 3) if stack.system.prefill and requests else None,
        "counted_requests": requests,
        "workers_seen": len(summary["workers"]["requests"]),
        "worker_share_max": summary["workers"]["max_share"],
    }
    return row


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def measure(system: System, rnd: int, args) -> list[dict]:
    stack = (DynServe if system.engine == "dyn" else DynamoServe)(system, args)
    rows = []
    try:
        stack.start()
        stack.wait_ready()
        for load in args.loads:
            base = {"system": system.name, "load": load, "round": rnd}
            try:
                row = {**base, **run_load(stack, load, rnd, args)}
            except (RuntimeError, OSError, httpx.HTTPError, subprocess.TimeoutExpired) as exc:
                row = {**base, "error": str(exc)[-3000:]}
            row["load_avg_1m"] = round(os.getloadavg()[0], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    except (RuntimeError, OSError, httpx.HTTPError) as exc:
        for load in args.loads[len(rows) :]:
            row = {"system": system.name, "load": load, "round": rnd, "error": str(exc)[-3000:]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        stack.close()
    return rows


def values(rows: list[dict], system: str, load: str, key: str) -> list[float]:
    return [r[key] for r in rows if r["system"] == system and r["load"] == load and r.get(key) is not None]


def cell(xs: list[float], pct: bool = False) -> str:
    if not xs:
        return "-"
    fmt = (lambda v: f"{100 * v:.0f}%") if pct else (lambda v: f"{v:.0f}" if v >= 100 else f"{v:.3g}")
    med = statistics.median(xs)
    return fmt(med) if min(xs) == max(xs) else f"{fmt(med)} ({fmt(min(xs))}-{fmt(max(xs))})"


def print_table(rows: list[dict], args) -> None:
    names = list(args.systems)
    ratio_modes = [m for m in ("agg", "pd", "cond") if f"dyn-{m}" in names and f"dynamo-{m}" in names]
    print()
    print(
        f"4 mocker workers per system (speedup {args.speedup}, block 16, {args.num_gpu_blocks} blocks, "
        f"{args.kv_bytes_per_token} KV bytes/token, {args.kv_transfer_bandwidth} GB/s), KV routing; "
        f"conditional config {args.cond_config} (dyn-cond-short: {args.cond_config_all_short}); medians over {args.rounds} rounds (min-max); ms"
    )
    print()
    header = ["load", "metric", *names, *(f"dyn/Dynamo {m}" for m in ratio_modes)]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for load in args.loads:
        for key in (*METRICS, "output_tok_s", "kept_local", "failed"):
            got = {n: values(rows, n, load, key) for n in names}
            if key == "kept_local":
                got = {n: xs if SYSTEMS[n].conditional else [] for n, xs in got.items()}
            cells = [cell(got[n], pct=key == "kept_local") for n in names]
            ratios = []
            for m in ratio_modes:
                a, b = got[f"dyn-{m}"], got[f"dynamo-{m}"]
                ok = key in (*METRICS, "output_tok_s") and a and b and statistics.median(b) > 0
                ratios.append(f"{statistics.median(a) / statistics.median(b):.2f}x" if ok else "-")
            print("| " + " | ".join([load, key, *cells, *ratios]) + " |")
    print()
    broken = [r for r in rows if "error" in r]
    stalled = [r for r in rows if (r.get("itl_max_ms") or 0) > STALL_MS]
    print(
        f"{len(rows)} measurements, {len(broken)} that could not run, {len(stalled)} with a stream stalled "
        f"over {STALL_MS / 1000:g} s: "
        + (", ".join(f"{r['system']} {r['load']} round {r['round']}" for r in stalled) or "none")
    )
    for r in broken:
        print(f"- {r['system']} {r['load']} round {r['round']}: {r['error'][-400:]!r}")


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchor-dir", default=os.environ.get("ANCHOR_DIR", "/tmp/dyn-anchor"))
    ap.add_argument("--model-path", help="model directory both stacks serve (default: ANCHOR_DIR/model)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--systems", nargs="+", choices=tuple(SYSTEMS), default=list(SYSTEMS))
    ap.add_argument("--loads", nargs="+", choices=LOADS, default=list(LOADS))
    ap.add_argument("--speedup", type=float, default=1)
    ap.add_argument("--num-gpu-blocks", type=int, default=16384)
    ap.add_argument("--kv-bytes-per-token", type=int, default=131072, help="Llama-3-8B's, bf16")
    ap.add_argument("--kv-transfer-bandwidth", type=float, default=64, help="GB/s (Dynamo's default)")
    ap.add_argument("--cond-config", default='{"eff_isl_threshold": 1024, "eff_isl_ratio_threshold": 1.0}')
    ap.add_argument(
        "--cond-config-all-short",
        default='{"eff_isl_threshold": 1024, "eff_isl_ratio_threshold": 1.01}',
        help="dyn-cond-short's config: every prompt under 1024 uncached tokens stays local",
    )
    ap.add_argument("--pf-isl", type=int, default=3000)
    ap.add_argument("--pf-max-tokens", type=int, default=16)
    ap.add_argument("--pf-prefix-ratio", type=float, default=0.1)
    ap.add_argument("--pf-requests", type=int, default=96)
    ap.add_argument("--pf-concurrency", type=int, default=16)
    ap.add_argument("--dc-isl", type=int, default=200)
    ap.add_argument("--dc-max-tokens", type=int, default=256)
    ap.add_argument("--dc-prefix-ratio", type=float, default=0.1)
    ap.add_argument("--dc-requests", type=int, default=64)
    ap.add_argument("--dc-concurrency", type=int, default=16)
    ap.add_argument("--load-timeout", type=float, default=300, help="seconds one dyn bench run may take")
    ap.add_argument("--keep-logs", action="store_true")
    args = ap.parse_args()
    args.model_path = args.model_path or str(Path(args.anchor_dir, "model"))
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so every stack's clean-up still runs
    print(json.dumps({"uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}))
    print(json.dumps({"argv": sys.argv[1:]}), flush=True)
    rows: list[dict] = []
    for rnd in range(args.rounds):
        order = args.systems if rnd % 2 == 0 else args.systems[::-1]
        for name in order:
            rows += measure(SYSTEMS[name], rnd, args)
    print_table(rows, args)
    print(json.dumps({"uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}))


if __name__ == "__main__":
    main()
