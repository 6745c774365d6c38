"""``dyn indexer``'s peers: other indexers of the same model whose index a new one starts from,
as Dynamo's standalone indexer recovers (reference 2.6, "P2P recovery").

``PeerList`` holds the peers' HTTP base URLs (``--peers``, ``POST /register_peer``, ``POST
/deregister_peer``, ``GET /peers``), at most ``MAX_PEERS``. ``recover`` runs once at start, after
the KV-event subscriptions are connected and before the indexer says it is ready: it reads
``GET {peer}/dump`` from the first peer that answers with this model's index (a ``dyn indexer``,
or a frontend's or ``dyn router``'s ``/kv``) and stores every block it lists, so queries see the
fleet's cache at once rather than only what the engines publish (or replay) from then on. Blocks
a worker evicted while the dump travelled are removed by its next events, as any stale entry is.

Bounded: a dump larger than ``MAX_DUMP_BYTES`` is not read (the peer is skipped with a warning);
each peer gets ``timeout_s``; a peer that fails, answers for another model or another block size
is skipped with a warning naming why. Recovery never stops the indexer from starting: with no peer
usable it starts empty, as without peers.
"""

from __future__ import annotations

import logging
from typing import Annotated

import httpx
import msgspec

from dyn.core.kv.indexer import ApplyStatus, RadixIndexer
from dyn.core.kv.views import U64_MAX

log = logging.getLogger("dyn.indexer")

MAX_PEERS = 64
MAX_DUMP_BYTES = 1 << 30
"""About 9M blocks in the dump's JSON; larger indexes recover from their engines' replay."""
DEFAULT_TIMEOUT_S = 60.0
SETTLE_S = 1.0
"""How long the subscriptions run before the dump is read (Dynamo waits the same): events
published meanwhile are then both in the dump and live, never in neither."""

Url = Annotated[str, msgspec.Meta(max_length=2048)]
Hash = Annotated[int, msgspec.Meta(ge=0)]


class PeerBody(msgspec.Struct):
    url: Url


class _DumpedEvent(msgspec.Struct):
    worker_id: Hash
    dp_rank: Annotated[int, msgspec.Meta(ge=0)]
    parent_hash: Hash | None
    block_hash: Hash
    tokens_hash: Hash


class _DumpedModel(msgspec.Struct):
    block_size: int | None
    events: list[_DumpedEvent]


def peer_problem(url: str) -> str | None:
    """Why ``url`` is not a peer's HTTP base URL, or None."""
    if url.startswith(("http://", "https://")) and len(url) > url.index("//") + 2:
        return None
    return f"{url!r} is not an indexer's HTTP base URL like http://10.0.0.2:8090"


class PeerList:
    """The peers' base URLs, in the order they were given (without a trailing slash)."""

    def __init__(self, urls: list[str] | None = None) -> None:
        self._urls: dict[str, None] = {}
        for url in urls or ():
            self.add(url)

    def add(self, url: str) -> None:
        """Add a peer (again: nothing); ``ValueError`` says what is wrong."""
        problem = peer_problem(url)
        if problem is not None:
            raise ValueError(problem)
        url = url.rstrip("/")
        if url not in self._urls and len(self._urls) >= MAX_PEERS:
            raise ValueError(f"{MAX_PEERS} peers are known already; deregister one first")
        self._urls[url] = None

    def remove(self, url: str) -> bool:
        """Forget a peer; whether it was known."""
        return self._urls.pop(url.rstrip("/"), "absent") is None

    def urls(self) -> list[str]:
        return list(self._urls)


async def recover(
    index: RadixIndexer,
    model_name: str,
    block_size: int | None,
    peers: list[str],
    *,
    api_key: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[str, int, int] | None:
    """Store the blocks of the first usable peer's dump of ``model_name`` into ``index``: that
    peer, the dump's block size and the blocks stored; None when no peer was usable.
    ``block_size`` None takes the dump's (the caller learns it from the answer)."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=timeout_s, headers=headers, transport=transport) as client:
        for url in peers:
            try:
                dumped = await _read_dump(client, url, model_name)
            except (httpx.HTTPError, _Unusable, msgspec.DecodeError) as exc:
                log.warning("peer %s: not recovered from: %s", url, exc)
                continue
            if dumped.block_size is None or (block_size is not None and dumped.block_size != block_size):
                log.warning(
                    "peer %s: not recovered from: its block size is %s, this indexer's %s",
                    url,
                    dumped.block_size,
                    block_size,
                )
                continue
            stored = _store(index, dumped.events)
            log.info("recovered %d blocks of model %r from peer %s", stored, model_name, url)
            return url, dumped.block_size, stored
    return None


class _Unusable(Exception):
    """A peer answered, but not with a dump this indexer can use."""


async def _read_dump(client: httpx.AsyncClient, url: str, model_name: str) -> _DumpedModel:
    async with client.stream("GET", url + "/dump") as response:
        if response.status_code != 200:
            raise _Unusable(f"GET /dump answered {response.status_code}")
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_DUMP_BYTES:
            raise _Unusable(f"its dump is {declared} bytes, over {MAX_DUMP_BYTES}")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_DUMP_BYTES:
                raise _Unusable(f"its dump is over {MAX_DUMP_BYTES} bytes")
    models = msgspec.json.decode(body, type=dict[str, _DumpedModel])
    if model_name not in models:
        raise _Unusable(f"it indexes {sorted(models)}, not {model_name!r}")
    return models[model_name]


def _store(index: RadixIndexer, events: list[_DumpedEvent]) -> int:
    """Store each dumped block as a one-block event (parents come first in a dump); blocks whose
    parent is missing or whose hashes are out of range are skipped."""
    stored = 0
    for e in events:
        if max(e.worker_id, e.block_hash, e.tokens_hash, e.parent_hash or 0) > U64_MAX:
            continue
        status = index.store((e.worker_id, e.dp_rank), e.parent_hash, [e.block_hash], [e.tokens_hash])
        stored += status is ApplyStatus.OK
    return stored
