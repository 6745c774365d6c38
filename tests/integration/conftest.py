"""Helpers for tests that start real ``dyn`` processes on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


class DynProcess:
    """A ``dyn`` subprocess whose output goes to a log file; always killed at teardown."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "dyn.cli", *args], stdout=self._log,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)

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
    env = {**os.environ, "DYN_DISCOVERY_DIR": str(tmp_path / "discovery"), "HF_HUB_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1"}

    def start(*args: str) -> DynProcess:
        p = DynProcess(list(args), tmp_path / f"proc{len(started)}.log", env)
        started.append(p)
        return p

    start.discovery_dir = tmp_path / "discovery"
    yield start
    for p in started:
        p.kill()


@pytest.fixture
def wait_for():
    """``wait_for(predicate, timeout, what)``: poll until truthy, else fail saying what was awaited."""
    return poll_until


def poll_until(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


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
        self.env = {**os.environ, "DYN_DISCOVERY_DIR": str(root / "discovery"),
                    "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        self.procs: list[DynProcess] = []
        self.frontend: DynProcess | None = None
        self.url = ""

    def start(self, *args: str) -> DynProcess:
        p = DynProcess(list(args), self.root / f"proc{len(self.procs)}.log", self.env)
        self.procs.append(p)
        return p

    def worker(self, *args: str, count: int = 1, log_level: str = "info") -> DynProcess:
        return self.start("--log-level", log_level, "worker", "mocker", "--namespace", self.namespace, "--num-workers",
                          str(count), "--speedup-ratio", "1000", *args)

    def start_frontend(self, *args: str, timeout: float = 60) -> str:
        self.frontend = self.start("frontend", "--http-port", "0", "--namespace", self.namespace, *args)

        def ready():
            for line in self.frontend.log().splitlines():
                if line.startswith(READY_PREFIX):
                    return line[len(READY_PREFIX):].strip()
            if self.frontend.proc.poll() is not None:
                raise AssertionError(f"frontend exited:\n{self.frontend.log()}")
            return None

        self.url = poll_until(ready, timeout, "the frontend to listen")
        return self.url

    def instances(self) -> list[int]:
        import httpx

        try:
            return httpx.get(self.url + "/health", timeout=5).json().get("instances", [])
        except httpx.HTTPError:
            return []

    def wait_instances(self, count: int, timeout: float = 60) -> list[int]:
        return poll_until(lambda: len(self.instances()) == count and self.instances(), timeout,
                          f"{count} routable workers:\n" + "\n".join(p.log()[-2000:] for p in self.procs))

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
    s = stack_factory("it")
    s.worker("--block-size", "16", count=2)
    s.start_frontend()
    s.wait_instances(2)
    return s
