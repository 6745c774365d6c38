"""A known index state for the inspector's tests, and a sync HTTP client over any ASGI app."""

from __future__ import annotations

import anyio
import httpx
from prometheus_client import CollectorRegistry

from dyn.core.kv.hashing import block_hashes
from dyn.core.kv.indexer import RadixIndexer, radix_indexer
from dyn.core.kv.views import IndexerHttpApp, IndexerMetrics, RadixIndexView

BS = 4
MODEL = "tiny"
TOKENS = list(range(100, 124))  # 6 blocks
OTHER = list(range(500, 512))  # 3 blocks
A, B, B1, C, D = (11, 0), (22, 0), (22, 1), (33, 0), (44, 0)
CAPACITY = {A: 100, B: 8, D: 50}  # B1 and C: unknown
ENDPOINTS = {D: "tcp://d:4"}  # D is known and holds nothing

# entries: A 6, B 2 and B1 4 (sharing A's path), C 3 (a path of its own) -> 15 entries, 9 nodes;
# entries by depth: 1: 4, 2: 4, 3: 3, 4: 2, 5: 1, 6: 1
NODES, ENTRIES = 9, 15
BUCKETS = [(1, 1, 4), (2, 3, 7), (4, 7, 4)]


def filled() -> RadixIndexer:
    index = radix_indexer()
    local = block_hashes(TOKENS, BS)
    index.store(A, None, [1000 + i for i in range(6)], local)
    index.store(B, None, [2000, 2001], local[:2])
    index.store(B1, None, [3000 + i for i in range(4)], local[:4])
    index.store(C, None, [4000, 4001, 4002], block_hashes(OTHER, BS))
    return index


def view(index: RadixIndexer | None = None) -> RadixIndexView:
    return RadixIndexView(index if index is not None else filled(), MODEL, BS, ENDPOINTS, CAPACITY)


def kv_app(registry: CollectorRegistry | None = None, *, prefix: str = "") -> IndexerHttpApp:
    v = view()
    return IndexerHttpApp(v, IndexerMetrics(registry or CollectorRegistry(), v), prefix=prefix)


def asgi_client(app) -> httpx.Client:
    """A sync ``httpx.Client`` whose requests ``app`` answers (each in an event loop of its own)."""

    def handle(request: httpx.Request) -> httpx.Response:
        async def call() -> httpx.Response:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://test"
            ) as client:
                r = await client.request(
                    request.method, str(request.url), content=request.content, headers=request.headers
                )
                return httpx.Response(r.status_code, headers=r.headers, content=r.content)

        return anyio.run(call)

    return httpx.Client(transport=httpx.MockTransport(handle))
