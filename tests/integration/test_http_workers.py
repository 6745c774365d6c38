"""``dyn frontend --num-http-workers 2`` with real processes: two frontend processes accept on one
port (``SO_REUSEPORT``), both serve, their KV routers share one view (replica sync), the requests of
both are in one agent trace, a killed one is restarted, and SIGTERM stops them all."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import httpx
import pytest

from tests.waiting import poll_until

pytestmark = pytest.mark.integration

PROMPT = "An agent's long context, resent every turn: " + "the tool returned a result. " * 40


@pytest.fixture(scope="module")
def two_http_workers(stack_factory):
    stack = stack_factory("httpworkers")
    stack.worker("--block-size", "16", count=2)
    stack.start_frontend(
        "--router-mode",
        "kv",
        "--num-http-workers",
        "2",
        "--agent-trace-file",
        str(stack.root / "trace.jsonl"),
    )
    _until_every_process_sees(stack.url, 2)
    return stack


def _until_every_process_sees(url: str, workers: int) -> None:
    """Wait until /health on 10 fresh connections in a row (so, surely, on both processes) lists
    ``workers`` instances: each process follows discovery on its own."""

    def seen() -> bool:
        return all(
            len(_fresh(url, "GET", "/health").json().get("instances", [])) == workers for _ in range(10)
        )

    poll_until(seen, 30, f"both HTTP workers to see {workers} workers")


def _pids(stack) -> set[int]:
    return {int(p) for p in re.findall(r"Started server process \[(\d+)\]", stack.frontend.log())}


def _listening(url: str) -> set[str]:
    """The inodes of the sockets that listen on ``url``'s port, from the kernel's tables."""
    port = f":{httpx.URL(url).port:04X}"
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = [row.split() for row in Path(table).read_text().splitlines()[1:]]
        except FileNotFoundError:
            continue
        inodes |= {row[9] for row in rows if row[1].endswith(port) and row[3] == "0A"}
    return inodes


def _sockets(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds."""
    links = (os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir())
    return {link[len("socket:[") : -1] for link in links if link.startswith("socket:[")}


def _fresh(url: str, method: str, path: str, **kwargs) -> httpx.Response:
    """One request on a new connection (the kernel picks the process per connection)."""
    with httpx.Client(timeout=30) as client:
        return client.request(method, url + path, **kwargs)


def _served(text: str) -> tuple[float, float]:
    """``(requests served, their TTFT sum)`` from one process's /metrics: two processes that
    served the same count still differ in the sum of their first-token times."""

    def total(name: str) -> float:
        return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(name))

    return total("dynamo_frontend_requests_total{"), total("dynamo_frontend_time_to_first_token_seconds_sum")


def test_both_processes_serve_with_one_kv_view(two_http_workers):
    url = two_http_workers.url
    cached = []
    for _ in range(40):
        r = _fresh(url, "POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert r.status_code == 200, r.text
        cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    # each process's router indexes the workers' KV events: after the first, every request
    # lands where the prompt is cached, whichever process took it
    assert cached[0] == 0 and min(cached[5:]) > 0, cached
    processes = {_served(_fresh(url, "GET", "/metrics").text) for _ in range(40)}
    assert len(processes) == 2, processes  # /metrics is per process
    assert sum(count for count, _ in processes) >= 40, processes


def test_one_agent_trace_holds_the_requests_of_both_processes_on_one_clock(two_http_workers):
    """Each request of an agent session on a connection of its own (the kernel spreads them over
    both processes): every one is a line of the one trace file that the supervising process
    writes; dated on one clock, the turns' timestamps follow their order, and every turn but
    the first written has its delay since the session's previous one."""
    url, trace = two_http_workers.url, two_http_workers.root / "trace.jsonl"
    headers = {"x-dynamo-session-id": "agent-1"}
    sent = []
    for turn in range(16):
        r = _fresh(
            url, "POST", "/v1/completions", json={"prompt": f"turn {turn}", "max_tokens": 2}, headers=headers
        )
        assert r.status_code == 200, r.text
        sent.append(r.headers["x-request-id"])

    def written() -> dict[str, dict] | None:
        whole = trace.read_text().split("\n")[:-1]  # a line being written is not read yet
        rows = {row["request_id"]: row for row in map(json.loads, whole)}
        return rows if set(sent) <= rows.keys() else None

    rows = poll_until(written, 10, "every turn in the agent trace")
    turns = [rows[rid] for rid in sent]
    assert {row["session_id"] for row in turns} == {"agent-1"}
    stamps = [row["timestamp"] for row in turns]
    assert stamps == sorted(stamps), stamps
    assert sum("delay_ms" not in row for row in turns) == 1
    assert all(row.get("delay_ms", 0) >= 0 for row in turns)
    processes = {_served(_fresh(url, "GET", "/metrics").text) for _ in range(20)}
    assert len(processes) == 2, processes  # both served some of them


def test_a_killed_http_worker_is_restarted_and_the_other_serves_meanwhile(two_http_workers):
    stack = two_http_workers
    pids = _pids(stack)
    assert len(pids) == 2
    victim = min(pids)
    listener = _listening(stack.url) & _sockets(victim)
    assert len(listener) == 1, listener
    os.kill(victim, signal.SIGKILL)
    # its listening socket closes when the last of its threads has exited, which may be after its
    # leader is a zombie: a connection the kernel queued on it before then is lost with it, which
    # is no one's fault (CI saw it twice on a loaded machine)
    poll_until(lambda: not listener & _listening(stack.url), 10, f"HTTP worker {victim}'s socket to close")
    for _ in range(10):
        try:
            r = _fresh(stack.url, "POST", "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        except httpx.TransportError as exc:
            pytest.fail(f"{exc!r} with one HTTP worker killed; the frontend's log:\n{stack.frontend.log()}")
        assert r.status_code == 200, r.text
    poll_until(lambda: len(_pids(stack) - {victim}) == 2, 30, "the killed HTTP worker to be replaced")
    assert "HTTP worker" in stack.frontend.log() and "restarting it" in stack.frontend.log()
    # what keeps queued connections through such a kill is said at start, where it is not set
    migrate = Path("/proc/sys/net/ipv4/tcp_migrate_req")
    unset = migrate.exists() and migrate.read_text().strip() == "0"
    said = " ".join(stack.frontend.log().split())  # the console wraps long lines
    assert ("sysctl -w net.ipv4.tcp_migrate_req=1" in said) == unset


def test_sigterm_stops_every_http_worker(stack_factory):
    stack = stack_factory("httpworkers-stop")
    stack.worker("--block-size", "16")
    stack.start_frontend("--num-http-workers", "2")
    _until_every_process_sees(stack.url, 1)
    pids = poll_until(lambda: len(_pids(stack)) == 2 and _pids(stack), 30, "both HTTP workers")
    stack.frontend.proc.send_signal(signal.SIGTERM)
    assert stack.frontend.proc.wait(30) == 0
    for pid in pids:
        poll_until(lambda pid=pid: not os.path.exists(f"/proc/{pid}"), 10, f"HTTP worker {pid} to exit")
