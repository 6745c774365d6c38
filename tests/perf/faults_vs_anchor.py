"""Benchmark: worker faults under load, `dyn` against NVIDIA Dynamo 1.6.1 (the anchor), same machine.

Not a test. Needs the anchor installed (``../shared/anchor/install.sh``, venv and model in $ANCHOR_DIR,
default /tmp/dyn-anchor). For each round and each system (dyn first in even rounds, Dynamo first in
odd ones, so drift on this shared machine hits both) it starts, per fault, a fresh stack: 3 mocker
worker processes (same speedup and block size for both, the anchor's tiny model) behind a KV-routing
frontend, all on loopback and free ports, discovery in a private directory. Then it opens
``--streams`` concurrent streaming chat completions (ignore_eos, ``--max-tokens``,
``stream_options.include_usage``), and once three quarters of them have their first content (at
the latest ``--fault-by`` seconds after they opened, so the fault never lands after the early
streams ended), hits one worker (the second started) and at once sends ``--after`` short requests.
Faults:

- ``none``: no fault (the baseline: the gaps and durations this loaded machine gives anyway);
- ``kill9``: SIGKILL one of the 3 workers, frontend migration limit 3;
- ``sigstop``: SIGSTOP one worker (a frozen worker: its connections stay open), migration limit 3;
  SIGCONT once every stream has ended or hit ``--stream-deadline``;
- ``kill9_nomig``: SIGKILL one worker, migration limit 0.

Measured per fault: streams that ended with ``[DONE]`` and no error event, streams whose usage
``completion_tokens`` equals max_tokens, the longest gap between two events of any stream, or
between its last event and its end (the stall), how many of the requests sent right after the fault
failed, and for streams that failed with an error how long after the fault it arrived (median,
max). A stream still open at ``--stream-deadline`` counts as failed (``client_timeout``), not as an
error time. The client is raw asyncio HTTP/1.1 (one connection per stream) that counts plain content
events in bulk and parses JSON only for events that may carry an error, usage or the end, so it
keeps up with Dynamo's one event per token (``client_cpu_per_wall`` says how busy it was); events
are timed per socket read. Prints one JSON object per measurement (a measurement that could not run
is a row with ``error``), then a table of medians over rounds (min-max in brackets).

    python tests/perf/faults_vs_anchor.py --rounds 3
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

MODEL_NAME = "tiny-llama"
WORKERS = 3
FAULTS = ("none", "kill9", "sigstop", "kill9_nomig")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


class Stack(abc.ABC):
    """Processes of one system, each in its own session (so a fault or clean-up reaches the whole
    process group), logging to files in a private directory that ``close()`` removes."""

    name = ""

    def __init__(self, args, migration_limit: int) -> None:
        self.args = args
        self.migration_limit = migration_limit
        self.root = Path(tempfile.mkdtemp(prefix=f"faults-{self.name}-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.frontend: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self._all: list[tuple[str, subprocess.Popen]] = []

    def spawn(self, label: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.root / f"{label}.log", "wb")
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self._all.append((label, proc))
        return proc

    def logs_tail(self, chars: int = 1500) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in sorted(self.root.glob("*.log"))
        )

    @abc.abstractmethod
    def start(self) -> None:
        """Start the stack's processes and wait until it serves."""

    @abc.abstractmethod
    def routable_workers(self) -> int:
        """How many workers the frontend routes to now."""

    def wait_ready(self, timeout: float = 120) -> None:
        """Until the frontend lists the model, routes to all 3 workers and answers a chat request."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for label, proc in self._all:
                if proc.poll() is not None:
                    raise RuntimeError(f"{self.name} {label} exited ({proc.returncode}):\n{self.logs_tail()}")
            try:
                if self.routable_workers() >= WORKERS:
                    body = {
                        "model": MODEL_NAME,
                        "messages": [{"role": "user", "content": "warm"}],
                        "max_tokens": 2,
                    }
                    url = self.url + "/v1/chat/completions"
                    answers = [httpx.post(url, json=body, timeout=10) for _ in range(2 * WORKERS)]
                    if all(a.status_code == 200 for a in answers):
                        return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.logs_tail()}")

    def close(self) -> None:
        for _, proc in self._all:
            kill_group(proc, signal.SIGCONT)
            kill_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _, proc in self._all:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
            kill_group(proc, signal.SIGKILL)  # the group may hold children even if the leader is gone
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if self.args.keep_logs:
            print(f"# {self.name} logs kept in {self.root}", file=sys.stderr)
        else:
            shutil.rmtree(self.root, ignore_errors=True)


class DynStack(Stack):
    name = "dyn"

    def start(self) -> None:
        env = {
            **os.environ,
            "DYN_DISCOVERY_DIR": str(self.root / "discovery"),
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        base = [sys.executable, "-m", "dyn.cli", "--log-level", "warning"]
        for i in range(WORKERS):
            self.workers.append(
                self.spawn(
                    f"worker{i}",
                    [
                        *base,
                        "worker",
                        "mocker",
                        "--namespace",
                        "faults",
                        "--model-path",
                        self.args.model_path,
                        "--model-name",
                        MODEL_NAME,
                        "--speedup-ratio",
                        str(self.args.speedup),
                        "--block-size",
                        "16",
                        "--num-gpu-blocks-override",
                        "8192",
                    ],
                    env,
                )
            )
        self.frontend = self.spawn(
            "frontend",
            [
                *base,
                "frontend",
                "--http-port",
                str(self.port),
                "--namespace",
                "faults",
                "--model-path",
                self.args.model_path,
                "--model-name",
                MODEL_NAME,
                "--router-mode",
                "kv",
                "--migration-limit",
                str(self.migration_limit),
            ],
            env,
        )

    def routable_workers(self) -> int:
        return len(httpx.get(self.url + "/health", timeout=5).json().get("instances", []))


def dynamo_env(kvstore: Path) -> dict[str, str]:
    """Dynamo's environment as the anchor's run.sh sets it: file discovery under ``kvstore``, TCP
    request plane, ZMQ event plane, everything on loopback, warnings only, no downloads."""
    return {
        **os.environ,
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(kvstore),
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "zmq",
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_SYSTEM_HOST": "127.0.0.1",
        "DYN_LOG": "warn",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


class DynamoStack(Stack):
    """As the anchor's run.sh starts it (file discovery, TCP request plane, ZMQ event plane), with
    ``--migration-limit`` on the frontend (Dynamo's flag; env twin DYN_MIGRATION_LIMIT). The
    workers' system HTTP server (metrics, health) stays off: nothing here reads it, and it would
    need a port below 32768."""

    name = "dynamo"

    def start(self) -> None:
        python = str(Path(self.args.anchor_dir, "venv", "bin", "python"))
        env = dynamo_env(self.root / "kvstore")
        env.pop("DYN_MIGRATION_LIMIT", None)
        (self.root / "kvstore").mkdir()
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
                "--migration-limit",
                str(self.migration_limit),
            ],
            env,
        )
        for i in range(WORKERS):
            self.workers.append(
                self.spawn(
                    f"worker{i}",
                    [
                        python,
                        "-m",
                        "dynamo.mocker",
                        "--model-path",
                        self.args.model_path,
                        "--model-name",
                        MODEL_NAME,
                        "--speedup-ratio",
                        str(self.args.speedup),
                        "--block-size",
                        "16",
                        "--num-gpu-blocks-override",
                        "8192",
                    ],
                    env,
                )
            )

    def routable_workers(self) -> int:
        if MODEL_NAME not in httpx.get(self.url + "/v1/models", timeout=5).text:
            return 0
        metrics = httpx.get(self.url + "/metrics", timeout=5).text
        return sum(
            1
            for line in metrics.splitlines()
            if line.startswith("dynamo_component_router_worker_registered")
            and float(line.rsplit(" ", 1)[1]) > 0
        )


@dataclass
class Stream:
    """What one client saw of one streamed chat completion (times: ``time.monotonic()``)."""

    status: int = 0
    done: bool = False
    error: str | None = None
    completion_tokens: int | None = None
    content_events: int = 0
    started: float = 0.0
    first_content: float | None = None
    ended: float | None = None
    failed_at: float | None = None
    max_gap: float = 0.0
    last_event: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done and self.error is None


class ChunkedBody:
    """Incremental decoder of a chunked HTTP/1.1 body: ``feed(bytes)`` returns the payload bytes
    those complete; ``finished`` once the last (empty) chunk arrived."""

    def __init__(self) -> None:
        self.buf = b""
        self.left = 0
        self.crlf = False
        self.finished = False

    def feed(self, data: bytes) -> bytes:
        self.buf += data
        out = []
        while not self.finished:
            if self.left:
                take = self.buf[: self.left]
                out.append(take)
                self.buf = self.buf[len(take) :]
                self.left -= len(take)
                if self.left:
                    break
                self.crlf = True
            if self.crlf:
                if len(self.buf) < 2:
                    break
                self.buf, self.crlf = self.buf[2:], False
            end = self.buf.find(b"\r\n")
            if end < 0:
                break
            size = int(self.buf[:end].split(b";")[0], 16)
            self.buf = self.buf[end + 2 :]
            if size == 0:
                self.finished = True
            self.left = size
        return b"".join(out)


async def stream_chat(port: int, prompt: str, max_tokens: int, out: Stream, on_content=None) -> None:
    """POST one streaming chat completion over a fresh connection and record what comes back in
    ``out``: an SSE ``error`` event, a data object with an ``error`` key, or an end without
    ``[DONE]`` is an error; ``failed_at`` is when it was seen. Events are timed per socket read."""
    body = json.dumps(
        {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    out.started = time.monotonic()
    writer = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        await writer.drain()
        status_line = await reader.readline()
        out.status = int(status_line.split()[1]) if status_line else 0
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip().lower()
        if out.status != 200:
            out.error = f"HTTP {out.status}: {(await reader.read(400)).decode(errors='replace')}"
            return
        chunked = ChunkedBody() if "chunked" in headers.get("transfer-encoding", "") else None
        buf = b""
        while data := await reader.read(65536):
            now = time.monotonic()
            buf += (chunked.feed(data) if chunked else data).replace(b"\r\n", b"\n")
            cut = buf.rfind(b"\n\n")
            if cut >= 0:
                block, buf = buf[:cut], buf[cut + 2 :]
                _sse_block(block, now, out, on_content)
                if out.done:
                    return
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        out.error = out.error or f"{type(exc).__name__}: {exc}"
    except asyncio.CancelledError:
        out.error = out.error or "client_timeout"
        raise
    finally:
        out.ended = time.monotonic()
        if out.last_event is not None:  # a stream cut off or given up on stalled since its last event
            out.max_gap = max(out.max_gap, out.ended - out.last_event)
        if not out.ok and out.failed_at is None:
            out.failed_at = out.ended
        if not out.done and out.error is None:
            out.error = "stream ended without [DONE]"
        if writer is not None:
            writer.close()


NON_EMPTY_CONTENT = re.compile(rb'"content":\s*"[^"]')
SPECIAL = re.compile(rb'event:|"error"|"completion_tokens"|\[DONE\]')


def _sse_block(block: bytes, now: float, out: Stream, on_content) -> None:
    """The complete SSE events that one socket read finished (they share its arrival time). Plain
    content events are only counted, in C (the client must keep up with ~100 streams of one event
    per token on a shared 2-core machine); a block that may hold an error, usage or the end is
    taken event by event."""
    if SPECIAL.search(block):
        for raw in block.split(b"\n\n"):
            _sse_event(raw, now, out, on_content)
            if out.done:
                return
        return
    if b"data:" not in block:
        return
    if out.last_event is not None:
        out.max_gap = max(out.max_gap, now - out.last_event)
    out.last_event = now
    contents = len(NON_EMPTY_CONTENT.findall(block))
    out.content_events += contents
    if contents and out.first_content is None:
        out.first_content = now
        if on_content is not None:
            on_content()


def _sse_event(raw: bytes, now: float, out: Stream, on_content) -> None:
    """One SSE event; parsed as JSON only when it may carry an error or usage."""
    kind, data = b"message", []
    for line in raw.split(b"\n"):
        if line.startswith(b"data:"):
            data.append(line[5:].strip())
        elif line.startswith(b"event:"):
            kind = line[6:].strip()
    if not data and kind == b"message":
        return
    if out.last_event is not None:
        out.max_gap = max(out.max_gap, now - out.last_event)
    out.last_event = now
    payload = b"\n".join(data)
    if payload == b"[DONE]":
        out.done = True
        return
    if kind == b"error" or b'"error"' in payload or b'"completion_tokens"' in payload:
        try:
            event = json.loads(payload)
        except ValueError:
            event = None
        if kind == b"error" or not isinstance(event, dict) or "error" in event:
            if out.error is None:
                out.error, out.failed_at = f"{kind.decode()}: {payload.decode(errors='replace')}"[:300], now
            return
        if event.get("usage"):
            out.completion_tokens = event["usage"].get("completion_tokens")
    if NON_EMPTY_CONTENT.search(payload):
        out.content_events += 1
        if out.first_content is None:
            out.first_content = now
            if on_content is not None:
                on_content()


async def bounded(coro, deadline_s: float) -> None:
    """``coro`` (a ``stream_chat``), given up after ``deadline_s``: it then records ``client_timeout``."""
    try:
        await asyncio.wait_for(coro, deadline_s)
    except TimeoutError:
        pass


def median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def prompt(i: int) -> str:
    """The reliability test's prompts; each chat prompt (~20 tokens with the anchor model's template)
    differs within its first 16-token KV block, so no stream shares a cached prefix with another."""
    return f"tell me about number {i}"


class Strike:
    """The fault, struck once: by the event loop when enough streams flow, or by a timer thread at
    the deadline, so that a client loop lagging behind ~100k events cannot delay it past the
    streams' end. Records when it struck and what the client had seen by then."""

    def __init__(self, victim: subprocess.Popen | None, sig: int | None, streams: list[Stream]) -> None:
        self.victim, self.sig, self.streams = victim, sig, streams
        self.loop = asyncio.get_running_loop()
        self.struck = asyncio.Event()
        self.lock = threading.Lock()
        self.at: float | None = None
        self.with_content = 0
        self.ended = 0

    def __call__(self) -> None:
        with self.lock:
            if self.at is not None:
                return
            if self.sig is not None:
                kill_group(self.victim, self.sig)
            self.at = time.monotonic()
            self.with_content = sum(s.first_content is not None for s in self.streams)
            self.ended = sum(s.ended is not None for s in self.streams)
        self.loop.call_soon_threadsafe(self.struck.set)


async def run_fault(stack: Stack, fault: str, args) -> dict:
    """``args.streams`` streams; the fault once 3/4 have content (or at ``args.fault_by`` seconds, so
    that it lands mid-stream even when some first tokens come late); ``args.after`` requests right
    after it."""
    victim = stack.workers[1]
    streams = [Stream() for _ in range(args.streams)]
    sig = {"none": None, "sigstop": signal.SIGSTOP}.get(fault, signal.SIGKILL)
    strike = Strike(victim, sig, streams)
    with_content = [0]

    def on_content() -> None:
        with_content[0] += 1
        if with_content[0] >= args.streams * 3 // 4:
            strike()

    deadline = threading.Timer(args.fault_by, strike)
    deadline.start()
    tasks = [
        asyncio.create_task(
            bounded(stream_chat(stack.port, prompt(i), args.max_tokens, s, on_content), args.stream_deadline)
        )
        for i, s in enumerate(streams)
    ]
    try:
        await strike.struck.wait()
    finally:
        deadline.cancel()
    t_fault, with_content_at_fault, ended_before_fault = strike.at, strike.with_content, strike.ended
    after = [Stream() for _ in range(args.after)]
    tasks += [
        asyncio.create_task(
            bounded(
                stream_chat(stack.port, f"right after the fault {i}", args.after_tokens, s),
                args.stream_deadline,
            )
        )
        for i, s in enumerate(after)
    ]
    await asyncio.gather(*tasks)
    if fault == "sigstop":
        kill_group(victim, signal.SIGCONT)
    failed = [s for s in streams if not s.ok]
    error_after = [s.failed_at - t_fault for s in failed if s.error != "client_timeout"]
    durations = [s.ended - s.started for s in streams if s.ok]
    return {
        "streams": len(streams),
        "completed": sum(s.ok for s in streams),
        "usage_correct": sum(s.completion_tokens == args.max_tokens for s in streams),
        "max_gap_s": round(max(s.max_gap for s in streams), 3),
        "streams_gap_over_1s": sum(s.max_gap > 1.0 for s in streams),
        "failed": len(failed),
        "client_timeouts": sum(s.error == "client_timeout" for s in streams),
        "error_after_fault_median_s": median(error_after),
        "error_after_fault_max_s": round(max(error_after), 3) if error_after else None,
        "after_failed": sum(not (s.ok and s.completion_tokens == args.after_tokens) for s in after),
        "after_latency_max_s": round(max(s.ended - s.started for s in after), 3),
        "fault_at_s": round(t_fault - min(s.started for s in streams), 3),
        "with_content_at_fault": with_content_at_fault,
        "ended_before_fault": ended_before_fault,
        "stream_duration_median_s": median(durations),
        "content_events_median": median([s.content_events for s in streams]),
        "sample_error": next((s.error for s in failed), None),
        "after_errors": sorted({s.error for s in after if s.error}),
        "after_latencies_s": [round(s.ended - s.started, 3) for s in after],
    }


SYSTEMS = {"dyn": DynStack, "dynamo": DynamoStack}


def measure(system: str, fault: str, rnd: int, args) -> dict:
    stack = SYSTEMS[system](args, migration_limit=0 if fault == "kill9_nomig" else 3)
    try:
        stack.start()
        stack.wait_ready()
        time.sleep(1)
        usage0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        result = asyncio.run(run_fault(stack, fault, args))
        usage1, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - wall0
    finally:
        stack.close()
    client_cpu = usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime
    return {
        "system": system,
        "fault": fault,
        "round": rnd,
        **result,
        "client_cpu_per_wall": round(client_cpu / wall, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


ROWS = {
    "none": (
        "completed",
        "usage_correct",
        "max_gap_s",
        "streams_gap_over_1s",
        "after_failed",
        "stream_duration_median_s",
    ),
    "kill9": ("completed", "usage_correct", "max_gap_s", "streams_gap_over_1s", "after_failed"),
    "sigstop": (
        "completed",
        "usage_correct",
        "max_gap_s",
        "streams_gap_over_1s",
        "client_timeouts",
        "after_failed",
    ),
    "kill9_nomig": ("failed", "error_after_fault_median_s", "error_after_fault_max_s", "after_failed"),
}


def cell(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    text = f"{med:g}" if isinstance(med, int) or float(med).is_integer() else f"{med:.2f}"
    return text if min(values) == max(values) else f"{text} ({min(values):g}-{max(values):g})"


def print_table(rows: list[dict], args) -> None:
    print()
    print(
        f"{args.streams} streams x {args.max_tokens} tokens, 3 mocker workers (speedup {args.speedup}, "
        f"block 16), KV routing; {args.after} requests x {args.after_tokens} tokens right after the fault; "
        f"medians over {args.rounds} rounds (min-max)"
    )
    print()
    print("| fault | metric | dyn | Dynamo 1.6.1 |")
    print("|---|---|---|---|")
    for fault in args.faults:
        for key in ROWS[fault]:
            got = {s: [r.get(key) for r in rows if r["system"] == s and r["fault"] == fault] for s in SYSTEMS}
            print(f"| {fault} | {key} | {cell(got['dyn'])} | {cell(got['dynamo'])} |")
    print()
    for system in SYSTEMS:
        mine = [r for r in rows if r["system"] == system]
        late = sum(r.get("ended_before_fault", 0) > 0 for r in mine)
        broken = sum("error" in r for r in mine)
        print(
            f"{system}: {len(mine)} measurements, {late} where the fault struck after some streams "
            f"had ended, {broken} that could not run"
        )


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchor-dir", default=os.environ.get("ANCHOR_DIR", "/tmp/dyn-anchor"))
    ap.add_argument("--model-path", help="model directory both stacks serve (default: ANCHOR_DIR/model)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    ap.add_argument("--systems", nargs="+", choices=tuple(SYSTEMS), default=list(SYSTEMS))
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=1000, help="per stream; sized so a stream lasts ~2-4 s")
    ap.add_argument("--speedup", type=float, default=10)
    ap.add_argument(
        "--fault-by",
        type=float,
        default=1.0,
        help="seconds after the streams open by which the fault strikes even if < 3/4 flow",
    )
    ap.add_argument("--after", type=int, default=10, help="requests sent right after the fault")
    ap.add_argument("--after-tokens", type=int, default=16)
    ap.add_argument("--stream-deadline", type=float, default=30, help="seconds a client waits for one stream")
    ap.add_argument("--keep-logs", action="store_true")
    args = ap.parse_args()
    args.model_path = args.model_path or str(Path(args.anchor_dir, "model"))
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so every stack's clean-up still runs
    rows: list[dict] = []
    print(
        json.dumps({"uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}),
        flush=True,
    )
    for rnd in range(args.rounds):
        order = args.systems if rnd % 2 == 0 else args.systems[::-1]
        for fault in args.faults:
            for system in order:
                try:
                    row = measure(system, fault, rnd, args)
                except (RuntimeError, OSError, httpx.HTTPError) as exc:
                    row = {"system": system, "fault": fault, "round": rnd, "error": str(exc)[-3000:]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print_table(rows, args)
    print(json.dumps({"uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}))


if __name__ == "__main__":
    main()
