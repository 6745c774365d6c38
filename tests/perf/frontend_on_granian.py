"""Benchmark harness: the dyn frontend app served by granian's embedded server instead of uvicorn.

Not a test, and not how dyn runs: it exists to repeat the server comparison in
docs/benchmarks.md. Granian's embedded server is the only granian mode that shares one event loop
with the frontend's ZMQ sockets (its normal mode imports the app in worker processes it spawns).

    pip install granian
    DYN_DISCOVERY_DIR=... python tests/perf/frontend_on_granian.py --port 8002   # workers from discovery
"""

from __future__ import annotations

import argparse

import anyio

from dyn.core.config import DiscoveryConfig
from dyn.core.frontend.server import FrontendSettings, build_app


async def serve(port: int, namespace: str) -> None:
    from granian.constants import Interfaces
    from granian.server.embed import Server

    app, _ = build_app(FrontendSettings(http_port=port, discovery=DiscoveryConfig(namespace=namespace)))
    async with anyio.create_task_group() as tg:
        await tg.start(app.models.run)
        server = Server(
            app, address="127.0.0.1", port=port, interface=Interfaces.ASGINL, backlog=2048, log_enabled=False
        )
        print(f"granian frontend on http://127.0.0.1:{port}", flush=True)
        await server.serve()
        tg.cancel_scope.cancel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=8002)
    ap.add_argument("--namespace", default="default")
    args = ap.parse_args()
    anyio.run(serve, args.port, args.namespace, backend="asyncio", backend_options={"use_uvloop": True})


if __name__ == "__main__":
    main()
