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
