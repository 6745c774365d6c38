"""Soak: mixed agent traffic against ``dyn serve`` with migration while a worker is killed again and
again; nothing may be lost, duplicated or leaked.

Not a test (it runs for ``--minutes``). It starts ``dyn serve`` (``--workers`` mocker processes, KV
router, ``--migration-limit 3``, free port, private discovery directory), then ``--clients``
client loops, each sending one request after another drawn from this mix:

- ``stream``: a streamed chat (``ignore_eos``, ``logprobs``, 32-200 tokens): the stream must end
  with ``[DONE]``, ``finish_reason`` "length", and exactly ``max_tokens`` tokens, counted by their
  logprob entries (a token lost or sent twice across a migration changes the count) and by
  ``usage.completion_tokens``;
- ``completion``: the same as a streamed text completion;
- ``n4``: a non-streaming chat with ``n=4``: four choices of exactly ``max_tokens`` tokens each;
- ``cancel``: a streamed chat the client closes after a few events;
- ``tool``: a named tool choice (the arguments are generated under the tool's schema): the call's
  arguments parse and hold the required field;
- ``structured``: ``response_format`` json_schema: the content parses and holds the required field.

Every ``--kill-every`` seconds one worker process (the youngest: always the same slot, so the
others live through the whole run) is SIGKILLed; ``dyn serve`` restarts it. Every 10 s the resident memory and
open file descriptors of the supervisor, the frontend and every worker are sampled.

A plain request (``stream``, ``completion``, ``n4``) that fails or miscounts is **lost**. A
structured one (``tool``, ``structured``) whose worker died after its output began cannot migrate
(the new worker's grammar would start over; docs/reliability.md), so a 503 or an error event
saying the worker went away is counted as ``not_migratable``, anything else as lost. At the end
the frontend's ``dynamo_frontend_active_requests`` must be back to 0, and the report gives, per
long-lived process, its memory at the end of the warm-up (``--warmup`` seconds) and its largest
change after it, the same over the second half of the run, and the most descriptors it held in
the first and in the last quarter after the warm-up.

    python tests/perf/soak.py --minutes 20 --kill-every 120 --clients 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.*
from tests.sse import sse_lines

MODEL = "dyn-tiny"
MIX = {"stream": 35, "completion": 10, "n4": 15, "cancel": 10, "tool": 15, "structured": 15}
SAMPLE_EVERY_S = 10.0
TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file of the repository",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["path"],
        },
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["pass", "fail"]}, "score": {"type": "number"}},
    "required": ["verdict", "score"],
}
_GONE = re.compile(r"went away|worker_unavailable|worker.*(died|failed|shut down)|migrat", re.I)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def rss_mib(pid: int) -> float | None:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return None


def fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


class Tally:
    """Outcomes per request kind."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {kind: {} for kind in MIX}
        self.lost: list[str] = []

    def add(self, kind: str, outcome: str, detail: str = "") -> None:
        self.counts[kind][outcome] = self.counts[kind].get(outcome, 0) + 1
        if outcome == "lost" and len(self.lost) < 20:
            self.lost.append(f"{kind}: {detail}"[:400])


async def _stream(client: httpx.AsyncClient, path: str, body: dict, cancel_after: int | None = None) -> dict:
    """A streamed request: tokens counted by logprob entries, usage, finish, error, done."""
    out: dict = {"tokens": 0, "usage": None, "finish": None, "error": None, "done": False, "events": 0}
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            out["error"] = f"{r.status_code} {(await r.aread())[:200]!r}"
            return out
        async for line in sse_lines(r):
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out["done"] = True
                break
            event = json.loads(line[6:])
            out["events"] += 1
            if "error" in event:
                out["error"] = json.dumps(event["error"])[:300]
                continue
            if event.get("usage"):
                out["usage"] = event["usage"]
            for choice in event.get("choices", []):
                lps = choice.get("logprobs")
                if lps:
                    out["tokens"] += len(lps["content"]) if "content" in lps else len(lps["tokens"])
                out["finish"] = choice.get("finish_reason") or out["finish"]
            if cancel_after is not None and out["events"] >= cancel_after:
                return out
    return out


async def one_request(client: httpx.AsyncClient, kind: str, rng: random.Random, tally: Tally) -> None:
    max_tokens = rng.randint(32, 200)
    messages = [{"role": "user", "content": f"soak request {rng.random()}: tell me something"}]
    chat = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "ignore_eos": True}
    try:
        if kind in ("stream", "completion"):
            if kind == "stream":
                path, body = "/v1/chat/completions", {**chat, "logprobs": True}
            else:
                path = "/v1/completions"
                body = {"model": MODEL, "prompt": messages[0]["content"], "max_tokens": max_tokens}
                body |= {"ignore_eos": True, "logprobs": 0}
            body |= {"stream": True, "stream_options": {"include_usage": True}}
            got = await _stream(client, path, body)
            ok = (
                got["done"]
                and not got["error"]
                and got["finish"] == "length"
                and got["tokens"] == max_tokens
                and got["usage"] is not None
                and got["usage"]["completion_tokens"] == max_tokens
            )
            detail = {k: got[k] for k in ("tokens", "finish", "error", "done")}
            tally.add(kind, "ok" if ok else "lost", f"max_tokens {max_tokens}: {detail}")
        elif kind == "n4":
            r = await client.post("/v1/chat/completions", json={**chat, "n": 4, "logprobs": True})
            if r.status_code != 200:
                tally.add(kind, "lost", f"{r.status_code} {r.text[:200]}")
                return
            counts = [len(c["logprobs"]["content"]) for c in r.json()["choices"]]
            ok = counts == [max_tokens] * 4 and r.json()["usage"]["completion_tokens"] == 4 * max_tokens
            tally.add(kind, "ok" if ok else "lost", f"max_tokens {max_tokens}: {counts}")
        elif kind == "cancel":
            body = {**chat, "stream": True, "max_tokens": 200}
            got = await _stream(client, "/v1/chat/completions", body, cancel_after=rng.randint(2, 12))
            tally.add(kind, "lost" if got["error"] else "ok", str(got["error"]))
        else:
            if kind == "tool":
                body = {
                    **chat,
                    "tools": [TOOL],
                    "tool_choice": {"type": "function", "function": {"name": "read_file"}},
                }
            else:
                body = {
                    **chat,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "v", "schema": SCHEMA},
                    },
                }
            body["ignore_eos"] = False
            r = await client.post("/v1/chat/completions", json=body)
            if r.status_code != 200:
                outcome = "not_migratable" if r.status_code == 503 and _GONE.search(r.text) else "lost"
                tally.add(kind, outcome, f"{r.status_code} {r.text[:200]}")
                return
            message = r.json()["choices"][0]["message"]
            if kind == "tool":
                args = json.loads(message["tool_calls"][0]["function"]["arguments"])
                ok = isinstance(args.get("path"), str)
            else:
                content = json.loads(message["content"])
                ok = content.get("verdict") in ("pass", "fail") and isinstance(
                    content.get("score"), (int, float)
                )
            tally.add(kind, "ok" if ok else "lost", json.dumps(message)[:200])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        tally.add(kind, "lost", f"{type(exc).__name__}: {exc}")


async def client_loop(url: str, seed: int, until: float, tally: Tally) -> None:
    rng = random.Random(seed)
    kinds, weights = list(MIX), list(MIX.values())
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        while time.monotonic() < until:
            await one_request(client, rng.choices(kinds, weights)[0], rng, tally)


def worker_pids(serve_pid: int) -> list[int]:
    return sorted(p for p in children(serve_pid) if " worker " in cmdline(p))


def frontend_pid(serve_pid: int) -> int:
    return next(p for p in children(serve_pid) if " frontend " in cmdline(p))


def started(pid: int) -> int:
    """When ``pid`` started, in clock ticks since boot."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


async def killer(serve_pid: int, every: float, until: float, log: list[dict]) -> None:
    """SIGKILL the youngest worker process every ``every`` seconds: after the first kill that is
    the one ``dyn serve`` restarted, so one slot dies again and again and the others live."""
    while time.monotonic() + every < until:
        await asyncio.sleep(every)
        pids = worker_pids(serve_pid)
        if not pids:
            continue
        victim = max(pids, key=started)
        os.kill(victim, signal.SIGKILL)
        log.append({"t": round(time.monotonic() - START, 1), "killed": victim})


async def sampler(serve_pid: int, until: float, samples: list[dict]) -> None:
    while time.monotonic() < until:
        row: dict = {"t": round(time.monotonic() - START, 1), "procs": {}}
        named = {"serve": serve_pid, "frontend": frontend_pid(serve_pid)}
        named |= {f"worker-{p}": p for p in worker_pids(serve_pid)}
        for name, pid in named.items():
            row["procs"][name] = {"rss_mib": rss_mib(pid), "fds": fds(pid)}
        samples.append(row)
        await asyncio.sleep(SAMPLE_EVERY_S)


def drift(samples: list[dict], since: float) -> dict[str, dict]:
    """Per process alive from ``since`` (seconds into the run) to its end: its RSS then and at the
    end, the largest relative change from it, and its descriptors then and their most (a worker
    slot's process down at a sample takes its connection's descriptors with it: compare the most,
    not the first)."""
    after = [s for s in samples if s["t"] >= since]
    out: dict[str, dict] = {}
    if not after:
        return out
    for name in after[0]["procs"]:
        series = [s["procs"][name] for s in after if name in s["procs"] and s["procs"][name]["rss_mib"]]
        if len(series) < len(after):  # died (the killed slot) or started late: not long-lived
            continue
        base = series[0]
        quarter = max(1, len(series) // 4)
        out[name] = {
            "rss_mib_from": round(base["rss_mib"], 1),
            "rss_mib_end": round(series[-1]["rss_mib"], 1),
            "rss_max_change_pct": round(
                100 * max(abs(s["rss_mib"] / base["rss_mib"] - 1) for s in series), 1
            ),
            "fds_most_first_quarter": max(s["fds"] for s in series[:quarter]),
            "fds_most_last_quarter": max(s["fds"] for s in series[-quarter:]),
        }
    return out


def active_requests(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("dynamo_frontend_active_requests")
    )


async def soak(args: argparse.Namespace, url: str, serve_pid: int) -> dict:
    until = time.monotonic() + args.minutes * 60
    tally, kills, samples = Tally(), [], []
    tasks = [asyncio.create_task(client_loop(url, i, until, tally)) for i in range(args.clients)]
    tasks.append(asyncio.create_task(killer(serve_pid, args.kill_every, until, kills)))
    tasks.append(asyncio.create_task(sampler(serve_pid, until, samples)))
    await asyncio.gather(*tasks)
    await asyncio.sleep(2)
    return {"tally": tally.counts, "lost_examples": tally.lost, "kills": kills, "samples": samples}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--kill-every", type=float, default=120, help="seconds between worker kills")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=120, help="seconds before memory must be flat")
    parser.add_argument("--speedup-ratio", type=float, default=10)
    parser.add_argument("--out", type=Path, help="write the whole report (with every sample) as JSON here")
    args = parser.parse_args()

    port = free_port()
    discovery = tempfile.mkdtemp(prefix="dyn-soak-")
    os.chmod(discovery, 0o700)
    log_path = Path(discovery) / "serve.log"
    argv = [
        sys.executable,
        "-m",
        "dyn.cli",
        "serve",
        "--http-port",
        str(port),
        "--workers",
        str(args.workers),
    ]
    argv += ["--router-mode", "kv", "--migration-limit", "3", "--discovery-dir", discovery]
    argv += ["--speedup-ratio", str(args.speedup_ratio)]
    with open(log_path, "w") as log:
        serve = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while "dyn serve: ready" not in log_path.read_text(errors="replace"):
            if serve.poll() is not None or time.monotonic() > deadline:
                print(log_path.read_text(errors="replace")[-3000:], file=sys.stderr)
                return 1
            time.sleep(0.2)
        global START
        START = time.monotonic()
        report = asyncio.run(soak(args, url, serve.pid))
        report["inflight_at_end"] = active_requests(url)
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()
    report["drift"] = drift(report["samples"], args.warmup)
    report["drift_second_half"] = drift(report["samples"], args.minutes * 30)
    report["args"] = {k: str(v) for k, v in vars(args).items()}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    lost = sum(c.get("lost", 0) for c in report["tally"].values())
    shown = ("tally", "kills", "inflight_at_end", "drift", "drift_second_half")
    print(json.dumps({k: report[k] for k in shown}, indent=1))
    if report["lost_examples"]:
        print("lost:", *report["lost_examples"], sep="\n  ")
    total = sum(sum(c.values()) for c in report["tally"].values())
    worst = max((d["rss_max_change_pct"] for d in report["drift"].values()), default=0.0)
    late = max((d["rss_max_change_pct"] for d in report["drift_second_half"].values()), default=0.0)
    fd_growth = max(
        (d["fds_most_last_quarter"] - d["fds_most_first_quarter"] for d in report["drift"].values()),
        default=0,
    )
    print(
        f"{total} requests, {lost} lost, {len(report['kills'])} kills, in-flight at end "
        f"{report['inflight_at_end']:.0f}, largest RSS change after warm-up {worst}% (over the second "
        f"half {late}%), fd growth {fd_growth}"
    )
    return 0 if lost == 0 and report["inflight_at_end"] == 0 else 1


START = time.monotonic()

if __name__ == "__main__":
    sys.exit(main())
