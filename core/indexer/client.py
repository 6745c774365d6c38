"""Finding and asking a ``dyn indexer``: its discovery records and the ``RemoteIndexer`` client.

Indexers announce themselves like routers do (``dyn.core.router.registry``): a ``WorkerRecord`` in
the ``{namespace}.indexers`` discovery namespace, held with a lease, where ``engine`` is
``"dyn-indexer"``, ``model_name`` the model it indexes, ``endpoints.request`` its ZMQ query socket,
``endpoints.metrics`` its HTTP base URL and ``block_size`` the block size it hashes with.

``RemoteIndexer`` is what a KV router with ``--use-remote-indexer`` keeps instead of a local index.
Contract:

- ``find_matches(local_hashes, seq_hashes=None)`` sends an ``OverlapQuery`` with the local block
  hashes on a DEALER and returns the answer's scores as ``{(instance_id, dp_rank): blocks}``
  (``seq_hashes`` is accepted for ``RadixIndexer`` compatibility and not sent: the indexer chains
  them itself). ``find_tiered_matches(local_hashes)`` returns those scores and the answer's
  lower-tier hits, ``{(instance_id, dp_rank): TierHits(host, disk)}`` (empty from an indexer that
  predates tiers). ``find_matches_for_tokens`` lets the indexer hash the tokens with its own block
  size.
- Each query has its own ``query_id``; answers for unknown (abandoned) queries are dropped. No
  answer within ``timeout_s`` (default 1 s) raises ``TimeoutError``; an ``OverlapRefused`` raises
  ``IndexerQueryError``; querying a client that is not running raises ``IndexerQueryError``.
- ``reachable`` says whether the indexer answers (``RpcClient``: ZMTP heartbeats and a socket
  monitor; a dead indexer is seen within milliseconds, a frozen one within a second), and
  ``outage()`` since when and why not. While it is unreachable a query raises
  ``IndexerUnavailable`` at once (queries waiting when it was lost too), so a KV router can route
  on load alone without paying the timeout; ZeroMQ reconnects by itself. The loss and the return
  are logged once each.
- ``block_size`` is the indexer's block size as its last answer reported it (None before one).
- ``run`` owns the socket and the receive loop until cancelled; ``async with RemoteIndexer(...)``
  runs it in a task group of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from dyn.core.discovery.backends import open_store
from dyn.core.discovery.services import service_namespace, service_record, service_store
from dyn.core.discovery.store import DiscoveryStore
from dyn.core.kv.indexer import OverlapScores
from dyn.core.kv.tiers import TieredScores, TierHits
from dyn.core.messages import (
    OverlapAnswer,
    OverlapQuery,
    OverlapRefused,
    WorkerRecord,
)
from dyn.core.transport.codec import decode_indexer_message
from dyn.core.transport.rpc import RpcClient, RpcUnavailable

log = logging.getLogger("dyn.indexer.client")

INDEXER_ENGINE = "dyn-indexer"
DEFAULT_TIMEOUT_S = 1.0
SEND_HWM = 10_000

# ------------------------------------------------------------------------------- discovery


def indexers_namespace(namespace: str) -> str:
    """The namespace indexers of ``namespace`` register in."""
    return service_namespace(namespace, "indexers")


def indexers_store(store: DiscoveryStore) -> DiscoveryStore:
    """A store on the same backend as the workers' ``store``, for its indexers' namespace."""
    return service_store(store, "indexers")


def indexer_record(
    namespace: str, model_name: str, instance_id: int, *, zmq_endpoint: str, http_url: str, block_size: int
) -> WorkerRecord:
    """The record a ``dyn indexer`` registers in ``namespace`` (an ``indexers_namespace``)."""
    return service_record(
        namespace,
        INDEXER_ENGINE,
        model_name,
        instance_id,
        request=zmq_endpoint,
        metrics=http_url,
        block_size=block_size,
    )


def serves_model(record: WorkerRecord, model_name: str | None) -> bool:
    """Whether ``record`` is a live-query ``dyn indexer`` for ``model_name`` (None: any model)."""
    return (
        record.engine == INDEXER_ENGINE
        and bool(record.endpoints.request)
        and (model_name is None or record.model_name == model_name)
    )


async def live_indexer_address(store: DiscoveryStore, model: str | None) -> str | None:
    """The ZMQ query address of the most recently started live ``dyn indexer`` of ``model`` in
    ``store`` (an ``indexers_store``), or None when there is none."""
    records = [r for r in await store.list() if serves_model(r, model)]
    if not records:
        return None
    return max(records, key=lambda r: (r.started_at, r.instance_id)).endpoints.request


async def resolve_indexer_address(
    store_namespace: str, backend: str, dir: str | None, model: str | None, etcd_endpoints: str | None = None
) -> str | None:
    """``live_indexer_address`` for the workers' namespace ``store_namespace``."""
    store = open_store(backend, indexers_namespace(store_namespace), dir, etcd_endpoints=etcd_endpoints)
    try:
        return await live_indexer_address(store, model)
    finally:
        await store.aclose()


# ------------------------------------------------------------------------------- client


class IndexerQueryError(RuntimeError):
    """The indexer refused a query, or the client cannot ask (not running)."""


class IndexerUnavailable(IndexerQueryError):
    """The indexer is unreachable, or was lost while a query waited for it."""


class RemoteIndexer:
    """Asks the ``dyn indexer`` at ``address`` for overlap scores (see the module docstring)."""

    def __init__(self, address: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not address.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(
                f"indexer address {address!r} is not a ZMQ address: give the "
                "tcp://HOST:PORT that 'dyn indexer' printed as zmq="
            )
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self.address = address
        self.timeout_s = timeout_s
        self.block_size: int | None = None
        self._rpc = RpcClient(
            decode_indexer_message,
            (OverlapAnswer, OverlapRefused),
            peer=f"the indexer at {address}",
            hwm=SEND_HWM,
            logger=log,
        )
        self._rpc.on_unmatched = self._on_unmatched
        self._rpc.on_reachable = self._on_reachable
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def reachable(self) -> bool:
        """Whether the indexer answers (see the module docstring)."""
        return self._rpc.reachable

    def outage(self) -> str | None:
        """``unreachable for 1.2 s: WHY``, or None while it is reachable."""
        return self._rpc.outage()

    # ----------------------------------------------------------------- lifetime

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Own the DEALER and receive answers until cancelled; ``started()`` once connected."""
        async with anyio.create_task_group() as tg:
            await tg.start(self._rpc.run)
            self._rpc.connect(self.address)
            task_status.started()

    async def __aenter__(self) -> RemoteIndexer:
        tg = anyio.create_task_group()
        await tg.__aenter__()
        try:
            await tg.start(self.run)
        except BaseException:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
            raise
        self._tg = tg
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        tg, self._tg = self._tg, None
        assert tg is not None
        tg.cancel_scope.cancel()
        await tg.__aexit__(None, None, None)

    def _on_reachable(self, reachable: bool, reason: str) -> None:
        if reachable:
            log.info("the dyn indexer at %s answers again", self.address)
        else:
            log.warning(
                "the dyn indexer at %s is unreachable (%s); routing on load alone until it answers",
                self.address,
                reason,
            )

    def _on_unmatched(self, reply: OverlapAnswer | OverlapRefused) -> None:
        """An answer to an abandoned query is dropped; a refusal of a message it could not read
        (query id -1) is logged."""
        if isinstance(reply, OverlapRefused) and reply.query_id < 0:
            log.warning("the indexer at %s refused a message: %s", self.address, reply.message)

    # ----------------------------------------------------------------- queries

    async def find_matches(
        self, local_hashes: Sequence[int], seq_hashes: Sequence[int] | None = None
    ) -> OverlapScores:
        """Matched prefix blocks per ``(instance_id, dp_rank)`` for these local block hashes."""
        return (await self.find_tiered_matches(local_hashes))[0]

    async def find_tiered_matches(self, local_hashes: Sequence[int]) -> tuple[OverlapScores, TieredScores]:
        """Matched device blocks per rank, and the host and disk blocks continuing them."""
        if not local_hashes:
            return {}, {}
        reply = await self._ask(lambda qid: OverlapQuery(qid, block_hashes=list(local_hashes)))
        return _scores(reply), {(inst, dp): TierHits(host, disk) for inst, dp, host, disk in reply.tiers}

    async def find_matches_for_tokens(
        self, token_ids: Sequence[int], lora_name: str | None = None
    ) -> OverlapScores:
        """Matched prefix blocks of a prompt, hashed by the indexer with its block size."""
        reply = await self._ask(lambda qid: OverlapQuery(qid, token_ids=list(token_ids), lora_name=lora_name))
        return _scores(reply)

    async def _ask(self, build: Any) -> OverlapAnswer:
        try:
            reply = await self._rpc.call(build(self._rpc.new_id()), self.timeout_s)
        except RpcUnavailable as exc:
            raise IndexerUnavailable(str(exc)) from None
        if isinstance(reply, OverlapRefused):
            raise IndexerQueryError(f"the indexer at {self.address} refused the query: {reply.message}")
        self.block_size = reply.block_size or None
        return reply


def _scores(reply: OverlapAnswer) -> OverlapScores:
    return {(inst, dp): blocks for inst, dp, blocks in reply.scores}
