"""Helpers for tests that start real ``dyn`` processes on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.waiting import poll_until


class DynProcess:
    """A ``dyn`` subprocess whose output goes to a log file; always killed at teardown.
    ``python``: the interpreter it runs on (another venv's, e.g. the vLLM venv's)."""

    def __init__(
        self, args: list[str], log_path: Path, env: dict[str, str], python: str = sys.executable
    ) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [python, "-m", "dyn.cli", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self._log.close()


@pytest.fixture
def dyn_process(tmp_path):
    """Start ``dyn ARGS...``; the discovery root is private to the test."""
    started: list[DynProcess] = []
    env = {
        **os.environ,
        "DYN_DISCOVERY_DIR": str(tmp_path / "discovery"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }

    def start(*args: str) -> DynProcess:
        p = DynProcess(list(args), tmp_path / f"proc{len(started)}.log", env)
        started.append(p)
        return p

    start.discovery_dir = tmp_path / "discovery"
    yield start
    for p in started:
        p.kill()


def stop_process_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM ``proc`` (started with ``start_new_session``), wait ``grace_s``, then SIGKILL its
    whole process group: nothing it started outlives the test."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


READY_PREFIX = "dyn frontend listening on "


class Stack:
    """A frontend plus worker processes in a private discovery directory; ``url`` is the
    frontend's base URL. Stop with ``close()`` (kills whatever is left)."""

    def __init__(self, root: Path, namespace: str = "it") -> None:
        self.root = root
        self.namespace = namespace
        self.env = {
            **os.environ,
            "DYN_DISCOVERY_DIR": str(root / "discovery"),
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.procs: list[DynProcess] = []
        self.frontend: DynProcess | None = None
        self.url = ""
        self.api_key: str | None = None

    def start(self, *args: str, python: str = sys.executable) -> DynProcess:
        p = DynProcess(list(args), self.root / f"proc{len(self.procs)}.log", self.env, python)
        self.procs.append(p)
        return p

    def worker(self, *args: str, count: int = 1, log_level: str = "info") -> DynProcess:
        return self.start(
            "--log-level",
            log_level,
            "worker",
            "mocker",
            "--namespace",
            self.namespace,
            "--num-workers",
            str(count),
            "--speedup-ratio",
            "1000",
            *args,
        )

    def up(
        self,
        *frontend_args: str,
        workers: int = 2,
        worker_args: tuple[str, ...] = ("--block-size", "16"),
        log_level: str = "info",
    ) -> Stack:
        """The usual stack: ``workers`` mocker workers in one process (``worker_args``) behind a
        frontend (``frontend_args``); returns once every worker is routable."""
        self.worker(*worker_args, count=workers)
        self.start_frontend(*frontend_args, log_level=log_level)
        self.wait_instances(workers)
        return self

    def start_frontend(
        self, *args: str, timeout: float = 60, log_level: str = "info", python: str = sys.executable
    ) -> str:
        own = ("--log-level", log_level, "frontend", "--http-port", "0", "--namespace", self.namespace)
        self.frontend = self.start(*own, *args, python=python)
        if "--api-key" in args:  # /health shows instance ids to holders of the key only
            self.api_key = args[args.index("--api-key") + 1]

        def ready():
            for line in self.frontend.log().splitlines():
                if line.startswith(READY_PREFIX):
                    return line[len(READY_PREFIX) :].strip()
            if self.frontend.proc.poll() is not None:
                raise AssertionError(f"frontend exited:\n{self.frontend.log()}")
            return None

        self.url = poll_until(ready, timeout, "the frontend to listen")
        return self.url

    def instances(self) -> list[int]:
        import httpx

        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            return httpx.get(self.url + "/health", headers=headers, timeout=5).json().get("instances", [])
        except httpx.HTTPError:
            return []

    def metric(self, name: str, labels: str = "") -> float:
        """The frontend's ``/metrics``: the sum of the samples of ``name`` whose labels contain
        ``labels`` (0 when there is none)."""
        import httpx

        total = 0.0
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample.split("{", 1)[0] == name and labels in sample:
                total += float(value)
        return total

    def wait_instances(self, count: int, timeout: float = 60) -> list[int]:
        return poll_until(
            lambda: len(self.instances()) == count and self.instances(),
            timeout,
            f"{count} routable workers:\n" + "\n".join(p.log()[-2000:] for p in self.procs),
        )

    def close(self) -> None:
        for p in reversed(self.procs):
            try:
                p.terminate(timeout=10)
            except subprocess.TimeoutExpired:  # killed by terminate; stop the others all the same
                pass


@pytest.fixture(scope="module")
def stack_factory(tmp_path_factory):
    """``stack_factory(namespace)``: a new empty ``Stack``, closed when the module ends."""
    made: list[Stack] = []

    def make(namespace: str = "it") -> Stack:
        s = Stack(tmp_path_factory.mktemp(namespace), namespace=namespace)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.fixture(scope="module")
def stack(stack_factory):
    """A module's shared stack: 2 mocker workers (one process) behind a round-robin frontend."""
    return stack_factory("it").up()


SERVE_STARTUP_S = 90


def serve_ready_url(proc: DynProcess, timeout_s: float = SERVE_STARTUP_S) -> str:
    """Wait for ``dyn serve``'s ready line and return its URL; fail with the log if the process
    exits or ``timeout_s`` passes."""
    from dyn.core.serve import parse_ready_url

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in proc.log().splitlines():
            url = parse_ready_url(line)
            if url:
                return url
        if proc.proc.poll() is not None:
            raise AssertionError(f"dyn serve exited with {proc.proc.returncode}:\n{proc.log()}")
        time.sleep(0.1)
    raise AssertionError(f"no ready line after {timeout_s}s:\n{proc.log()}")


def first_tokens_behind_a_blocker(
    client, model: str, classes: tuple[tuple[str, int], ...], tries: int = 4
) -> dict[str, float]:
    """When each request got its first token (``time.monotonic``) on a one-slot worker: a long
    ``blocker`` holds the slot, then three rounds of short streamed completions, one per
    ``(name, priority)`` class, arrive interleaved and queue behind it (``{name}{round}``).

    The short ones queued only if all were sent well before the blocker's last token; a try where
    they were not (a starved machine sends them late) proves nothing and is repeated, up to
    ``tries`` times."""
    attempts = []
    for _ in range(tries):
        first_token, last_sent, blocker_done = _behind_a_blocker(client, model, classes)
        if last_sent + 0.05 < blocker_done:
            return first_token
        attempts.append({"last short sent": last_sent, "blocker's last token": blocker_done})
    raise AssertionError(f"the short requests never queued behind the blocker: {attempts}")


def _behind_a_blocker(
    client, model: str, classes: tuple[tuple[str, int], ...]
) -> tuple[dict[str, float], float, float]:
    """One try: ``(first token of each request, when the last short one was sent, when the
    blocker's last token came)``."""
    first_token: dict[str, float] = {}
    sent: dict[str, float] = {}
    last_token: dict[str, float] = {}

    def stream(name: str, max_tokens: int, priority: int | None) -> None:
        body = {"nvext": {"agent_hints": {"priority": priority}}} if priority is not None else None
        sent[name] = time.monotonic()
        for _chunk in client.completions.create(
            model=model, prompt=f"{name} asks", stream=True, max_tokens=max_tokens, extra_body=body
        ):
            first_token.setdefault(name, time.monotonic())
            last_token[name] = time.monotonic()

    blocker = threading.Thread(target=stream, args=("blocker", 300, None), daemon=True)
    blocker.start()
    poll_until(lambda: "blocker" in first_token, 20, "the blocker to run")
    threads = []
    for i in range(3):
        for name, priority in classes:
            t = threading.Thread(target=stream, args=(f"{name}{i}", 2, priority), daemon=True)
            t.start()
            threads.append(t)
            time.sleep(0.02)
    for t in [blocker, *threads]:
        t.join(60)
    assert not blocker.is_alive() and len(first_token) == 1 + 3 * len(classes), first_token
    last_sent = max(at for name, at in sent.items() if name != "blocker")
    return first_token, last_sent, last_token["blocker"]
