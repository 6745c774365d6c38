"""``dyn indexer``: the standalone KV indexer of one model, queried over ZMQ and HTTP (reference 2.6).

``IndexerService`` keeps one ``RadixIndexer`` with a fixed block size, and the lower tiers' indexes
beside it (host, disk, external: ``dyn.core.kv.tiers``), fed by a ``KvEventIngestor`` from the
workers' KV-event PUB sockets. Workers come from one of two places:

- discovery (default): the workers of ``model_name`` in the namespace, followed as they come and
  go; workers of other models are ignored, and a worker that leaves has its blocks dropped. With
  no ``block_size`` given, the first discovered worker's is used; a worker with another block size
  is followed but warned about (its blocks cannot be matched).
- a static list (``--workers "id[:dp]=tcp://host:port[|replay_endpoint],..."``, parsed by
  ``parse_workers``; needs a block size). Each entry is its own subscription, so ranks of one
  instance may publish on separate sockets. Blocks are indexed under the entry's
  ``(instance_id, dp_rank)``; a batch that names a nonzero ``data_parallel_rank`` overrides the rank.

The service is its own ``IndexView`` (``dyn.core.kv.views``). Its ZMQ ROUTER answers the
indexer plane of ``dyn.core.messages``: ``OverlapQuery`` (``token_ids`` hashed with the block size
and ``lora_name``, or local ``block_hashes``; exactly one) -> ``OverlapAnswer`` with
``(instance_id, dp_rank, blocks)`` per worker that matched in device memory and ``(instance_id,
dp_rank, host_blocks, disk_blocks)`` per worker whose match continues in its lower tiers (the
blocks after the device match in host memory, then on disk or in an external pool); the HTTP
``/query`` answers add Dynamo's ``cpu`` and ``disk`` tokens. Anything malformed -> ``OverlapRefused``
with the reason (the query id when it can be read, else -1), and frames that cannot be decoded are
counted and logged at most every few seconds (``RpcServer``). Nothing a client sends stops it.

Everything (ingestion, queries, HTTP) runs on one event loop, so the index has a single writer.
``serve_indexer`` is the process: it serves HTTP with uvicorn on the same loop, registers the
service in ``{namespace}.indexers`` (``dyn.core.indexer.client``), prints
``dyn indexer ready: http=URL zmq=ENDPOINT`` and stops cleanly on SIGINT/SIGTERM, deregistering.
The ZMQ port binds through ``dyn.core.transport.sockets.bind``: under ``--plane-keys`` only holders
of the keys get in, and without them it may listen on loopback only, where every local user can
query it: with ``--api-key`` (which guards HTTP) the process warns so at start.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import msgspec
from prometheus_client import CollectorRegistry

from dyn.core.config import DiscoveryConfig
from dyn.core.discovery.services import new_instance_id
from dyn.core.discovery.store import (
    DEFAULT_TTL_S,
    DiscoveryStore,
    Lease,
    WorkerAdded,
    WorkerRemoved,
)
from dyn.core.errors import ConfigError
from dyn.core.indexer.client import (
    indexer_record,
    indexers_store,
)
from dyn.core.kv.convert import KvEventMetrics, KvIndexWriter
from dyn.core.kv.events import StorageTier
from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.core.kv.indexer import ApplyStatus, WorkerKey, radix_indexer
from dyn.core.kv.ingest import DEFAULT_EVENT_THREADS, KvEventIngestor
from dyn.core.kv.tiers import LowerTierIndexes
from dyn.core.kv.views import U64_MAX, IndexerHttpApp, IndexerMetrics, RadixIndexView
from dyn.core.logs import status
from dyn.core.messages import (
    OverlapAnswer,
    OverlapQuery,
    OverlapRefused,
    WorkerEndpoints,
    WorkerRecord,
)
from dyn.core.service import LoopHttpServer, bind_http, bind_zmq, model_and_store, run_service
from dyn.core.transport.codec import decode_indexer_message
from dyn.core.transport.rpc import RpcServer
from dyn.core.transport.sockets import warn_open_plane

log = logging.getLogger("dyn.indexer")

READY_PREFIX = "dyn indexer ready: "

# --------------------------------------------------------------------------- --workers


@dataclass(frozen=True, slots=True)
class StaticWorker:
    """One ``--workers`` entry: whose KV events, on which PUB socket (and replay socket)."""

    instance_id: int
    dp_rank: int
    endpoint: str
    replay_endpoint: str | None = None


_ENTRY = re.compile(r"(?P<id>[0-9]+)(?::(?P<dp>[0-9]+))?=(?P<endpoint>[^|]+)(?:\|(?P<replay>.+))?")
_ZMQ_SCHEMES = ("tcp://", "ipc://", "inproc://")


def parse_workers(text: str) -> list[StaticWorker]:
    """Parse ``"id[:dp]=tcp://host:port[|replay_endpoint],..."``; ``ValueError`` says what is wrong."""
    entries: list[StaticWorker] = []
    seen: set[WorkerKey] = set()
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        match = _ENTRY.fullmatch(item)
        if match is None:
            raise ValueError(
                f"--workers entry {item!r} is not ID[:DP_RANK]=tcp://HOST:PORT"
                "[|REPLAY_ENDPOINT] (ID and DP_RANK are non-negative integers)"
            )
        endpoint = match["endpoint"].strip()
        replay = match["replay"].strip() if match["replay"] else None
        for what, address in (("endpoint", endpoint), ("replay endpoint", replay)):
            if address is not None and not (
                address.startswith(_ZMQ_SCHEMES) and len(address) > address.index("//") + 2
            ):
                raise ValueError(
                    f"--workers entry {item!r}: the {what} {address!r} is not a ZMQ "
                    "address like tcp://127.0.0.1:5557"
                )
        worker = StaticWorker(int(match["id"]), int(match["dp"] or 0), endpoint, replay)
        if worker.instance_id > U64_MAX:
            raise ValueError(f"--workers entry {item!r}: the instance id is over 2**64 - 1")
        key = (worker.instance_id, worker.dp_rank)
        if key in seen:
            raise ValueError(
                f"--workers names instance {key[0]} dp rank {key[1]} twice; give "
                "each (id, dp rank) one endpoint"
            )
        seen.add(key)
        entries.append(worker)
    if not entries:
        raise ValueError("--workers is empty; give at least one ID[:DP_RANK]=tcp://HOST:PORT")
    return entries


class _StaticRanks:
    """The ingestor's writer (one per tier) for ``--workers`` entries. The ingestor follows entry
    ``i`` under the internal instance id ``i``; this maps ``(i, rank)`` to ``(instance_id, rank or
    dp_rank)``."""

    def __init__(self, indexer: KvIndexWriter, entries: Sequence[StaticWorker]) -> None:
        self._indexer = indexer
        self._entries = list(entries)

    def key(self, worker: WorkerKey) -> WorkerKey:
        entry = self._entries[worker[0]]
        return entry.instance_id, worker[1] or entry.dp_rank

    def store(
        self,
        worker: WorkerKey,
        parent_hash: int | None,
        block_hashes: Sequence[int],
        local_hashes: Sequence[int],
    ) -> ApplyStatus:
        return self._indexer.store(self.key(worker), parent_hash, block_hashes, local_hashes)

    def remove(self, worker: WorkerKey, block_hashes: Sequence[int]) -> ApplyStatus:
        return self._indexer.remove(self.key(worker), block_hashes)

    def clear(self, worker: WorkerKey) -> None:
        self._indexer.clear(self.key(worker))

    def remove_worker(self, instance_id: int) -> None:
        self._indexer.clear(self.key((instance_id, 0)))

    def blocks_held(self, worker: WorkerKey) -> int:
        """The tier's count of the rank's blocks (what the ingestor bounds)."""
        held = getattr(self._indexer, "blocks_held", None)
        return 0 if held is None else int(held(self.key(worker)))


# --------------------------------------------------------------------------- the service


class IndexerService(RadixIndexView):
    """One model's KV index, fed by KV events and answering overlap queries (module docstring).

    Construction binds the ZMQ query socket on ``host`` (``zmq_port`` 0: a free one; ``endpoint``
    is where routers connect: the advertised address) and raises ``ConfigError`` for settings
    that cannot work.
    """

    _block_size: int | None
    """Never a callable here: the given block size, else the first discovered worker's."""

    def __init__(
        self,
        store: DiscoveryStore,
        model_name: str,
        *,
        block_size: int | None = None,
        static_workers: Sequence[StaticWorker] | None = None,
        event_threads: int = DEFAULT_EVENT_THREADS,
        host: str = "127.0.0.1",
        zmq_port: int = 0,
        registry: CollectorRegistry | None = None,
        lease_ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        if block_size is not None and block_size <= 0:
            raise ConfigError(f"--block-size must be positive, got {block_size}")
        if static_workers is not None and block_size is None:
            raise ConfigError(
                "--workers needs --block-size: the engines' KV block size, so "
                "queries hash tokens the way the engines do"
            )
        self.store = store
        self.model_name = model_name
        self.lease_ttl_s = lease_ttl_s
        try:
            self.registry_store = indexers_store(store)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.registry = registry if registry is not None else CollectorRegistry()
        self.kv_metrics = KvEventMetrics(self.registry)
        self.metrics = IndexerMetrics(self.registry, self)
        super().__init__(
            radix_indexer(), model_name, block_size, lower=LowerTierIndexes()
        )  # sets _block_size
        assert self.lower is not None
        self.static_workers = list(static_workers) if static_workers is not None else None
        self._records: dict[int, WorkerRecord] = {}
        self._static_endpoints: dict[WorkerKey, str] = {}
        self._skipped_models: set[str] = set()
        self._mismatched: set[int] = set()
        self._lease: Lease | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        writer: Any = self.indexer
        lower_writers: dict[StorageTier, Any] = dict(self.lower.writers())
        if self.static_workers is not None:
            writer = _StaticRanks(self.indexer, self.static_workers)
            lower_writers = {t: _StaticRanks(w, self.static_workers) for t, w in lower_writers.items()}
        try:
            self.ingestor = KvEventIngestor(
                writer,
                self.kv_metrics,
                lower_tiers=lower_writers,
                block_size=block_size,
                event_threads=event_threads,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.static_workers is not None:
            for i, entry in enumerate(self.static_workers):
                self._static_endpoints[(entry.instance_id, entry.dp_rank)] = entry.endpoint
                self.ingestor.add_worker(self._static_record(i, entry, block_size or 0))
        self._rpc = RpcServer(decode_indexer_message, logger=log)
        self._rpc.handle(OverlapQuery, self._on_query)
        self._rpc.fallback = self._refuse_unexpected
        self._rpc.on_malformed = self._on_malformed
        self._socket = self._rpc.socket
        self.endpoint = bind_zmq(self._socket, host, zmq_port, "--zmq-port")

    def _static_record(self, index: int, entry: StaticWorker, block_size: int) -> WorkerRecord:
        return WorkerRecord(
            instance_id=index,
            namespace=self.store.namespace,
            model_name=self.model_name,
            engine="static",
            endpoints=WorkerEndpoints(request="", kv_events=entry.endpoint, kv_replay=entry.replay_endpoint),
            block_size=block_size,
            total_kv_blocks=0,
            max_num_batched_tokens=0,
        )

    # ----------------------------------------------------------------- IndexView (the rest is RadixIndexView's)

    def worker_endpoints(self) -> dict[WorkerKey, str | None]:
        known: dict[WorkerKey, str | None] = dict(self._static_endpoints)
        by_instance: dict[int, str | None] = {k[0]: e for k, e in self._static_endpoints.items()}
        for record in self._records.values():
            by_instance[record.instance_id] = record.endpoints.kv_events
            for rank in range(max(record.dp_size, 1)):
                known[(record.instance_id, rank)] = record.endpoints.kv_events
        for key in self.indexer.workers():
            if key not in known and key[0] in by_instance:
                known[key] = by_instance[key[0]]
        return known

    def worker_total_blocks(self) -> dict[WorkerKey, int]:
        """KV capacity per (instance, dp_rank) from the workers' records, where they state one."""
        return {
            (r.instance_id, rank): r.total_kv_blocks
            for r in self._records.values()
            for rank in range(max(r.dp_size, 1))
            if r.total_kv_blocks > 0
        }

    # ----------------------------------------------------------------- running

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Ingest, follow membership and answer queries until cancelled; ``started(endpoint)``
        once all three run. Closes the query socket on the way out."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                await tg.start(self.ingestor.run)
                if self.static_workers is None:
                    await tg.start(self._follow_discovery)
                tg.start_soon(self._rpc.serve)
                task_status.started(self.endpoint)
        finally:
            self._tg = None
            self._socket.close(linger=0)

    @contextlib.asynccontextmanager
    async def announce(self, http_url: str) -> AsyncIterator[WorkerRecord]:
        """Hold this indexer's record in ``{namespace}.indexers`` while open (heartbeats, deleted
        on exit); a block size learnt later is put into the record."""
        record = indexer_record(
            self.registry_store.namespace,
            self.model_name,
            new_instance_id(),
            zmq_endpoint=self.endpoint,
            http_url=http_url,
            block_size=self._block_size or 0,
        )
        async with self.registry_store.lease(record, self.lease_ttl_s) as lease:
            self._lease = lease
            try:
                yield record
            finally:
                self._lease = None

    async def _reannounce(self) -> None:
        lease = self._lease
        if lease is None or self._block_size is None:
            return
        lease.record = msgspec.structs.replace(lease.record, block_size=self._block_size)
        try:
            await self.registry_store.put(lease.record, lease.ttl_s)
        except Exception as exc:
            log.warning("could not update this indexer's discovery record: %s", exc)

    # ----------------------------------------------------------------- membership

    async def _follow_discovery(self, *, task_status: Any) -> None:
        for record in await self.store.list():
            self._on_added(record)
        task_status.started()
        async with aclosing(self.store.watch()) as events:
            async for event in events:
                if isinstance(event, WorkerAdded):
                    self._on_added(event.record)
                elif isinstance(event, WorkerRemoved):
                    self._on_removed(event.instance_id)

    def _on_added(self, record: WorkerRecord) -> None:
        if record.model_name != self.model_name:
            if record.model_name not in self._skipped_models:
                self._skipped_models.add(record.model_name)
                log.warning(
                    "ignoring worker %d: it serves model %r, this indexer indexes %r",
                    record.instance_id,
                    record.model_name,
                    self.model_name,
                )
            return
        if self._block_size is None:
            self._block_size = self.ingestor.block_size = record.block_size
            log.info("KV block size %d (from worker %d)", record.block_size, record.instance_id)
            if self._lease is not None and self._tg is not None:
                self._tg.start_soon(self._reannounce)
        elif record.block_size != self._block_size and record.instance_id not in self._mismatched:
            self._mismatched.add(record.instance_id)
            log.warning(
                "worker %d uses KV block size %d but this indexer hashes blocks of %d; "
                "its cache cannot be matched (start the indexer with --block-size %d for "
                "it)",
                record.instance_id,
                record.block_size,
                self._block_size,
                record.block_size,
            )
        if record.instance_id not in self._records:
            log.info("following worker %d (KV events %s)", record.instance_id, record.endpoints.kv_events)
        self._records[record.instance_id] = record
        self.ingestor.add_worker(record)

    def _on_removed(self, instance_id: int) -> None:
        if self._records.pop(instance_id, None) is None:
            return
        self._mismatched.discard(instance_id)
        self.ingestor.remove_worker(instance_id)
        log.info("worker %d left; its blocks are dropped", instance_id)

    # ----------------------------------------------------------------- queries

    def answer(self, query: OverlapQuery) -> OverlapAnswer | OverlapRefused:
        """The answer to one query; a refusal says what the client must fix."""
        qid = query.query_id
        if (query.token_ids is None) == (query.block_hashes is None):
            return OverlapRefused(qid, "give exactly one of token_ids or block_hashes")
        block_size = self._block_size
        if query.token_ids is not None:
            if block_size is None:
                return OverlapRefused(
                    qid,
                    "the block size is not known yet: no worker has been "
                    "discovered; query by block_hashes or retry later",
                )
            try:
                local = block_hashes(query.token_ids, block_size, query.lora_name)
            except (OverflowError, ValueError, TypeError):
                return OverlapRefused(qid, "token_ids must be integers in [0, 2**32)")
        else:
            assert query.block_hashes is not None  # exactly one of the two is given (checked above)
            local = query.block_hashes
            if any(not 0 <= h <= U64_MAX for h in local):
                return OverlapRefused(qid, "block_hashes must be integers in [0, 2**64)")
        seq = sequence_hashes(local)
        scores = self.find_matches(local, seq) if local else {}
        tiers = self.tier_hits(local, seq, scores) or {}
        return OverlapAnswer(
            qid,
            block_size or 0,
            [(inst, dp, blocks) for (inst, dp), blocks in sorted(scores.items())],
            [(inst, dp, hits.host, hits.disk) for (inst, dp), hits in sorted(tiers.items())],
        )

    def _on_query(self, identity: bytes, query: OverlapQuery) -> None:
        started = anyio.current_time()
        try:
            reply = self.answer(query)
        except Exception as exc:  # a bug must not take the service down
            log.exception("answering query %d failed", query.query_id)
            reply = OverlapRefused(query.query_id, f"the indexer failed: {type(exc).__name__}: {exc}")
        self._observed(identity, reply, started)

    def _on_malformed(self, identity: bytes, body: list[bytes], exc: Exception) -> None:
        started = anyio.current_time()
        self._observed(identity, OverlapRefused(_query_id_of(body), _name_fields(str(exc))), started)

    def _refuse_unexpected(self, identity: bytes, message: Any) -> None:
        started = anyio.current_time()
        self._observed(
            identity,
            OverlapRefused(-1, f"a dyn indexer takes OverlapQuery, not {type(message).__name__}"),
            started,
        )

    def _observed(self, identity: bytes, reply: OverlapAnswer | OverlapRefused, started: float) -> None:
        """Count the query's time and outcome in the metrics, then send ``reply`` (never waits;
        a ROUTER drops messages to a client that went away)."""
        self.metrics.observe("zmq_query", anyio.current_time() - started, isinstance(reply, OverlapRefused))
        self._rpc.send(identity, reply)


def _query_id_of(body: list[bytes]) -> int:
    """The query id of a malformed query when its payload is at least a msgpack array of an
    int first, else -1."""
    if len(body) != 2:
        return -1
    try:
        value = msgspec.msgpack.decode(body[1])
    except msgspec.DecodeError:
        return -1
    if isinstance(value, list) and value and type(value[0]) is int:
        return value[0]
    return -1


_POSITION = re.compile(r"`\$\[(\d+)\]")


def _name_fields(message: str) -> str:
    """Name the field of an array-like ``OverlapQuery`` that msgspec reports by position."""
    fields = OverlapQuery.__struct_fields__

    def name(match: re.Match[str]) -> str:
        i = int(match[1])
        return f"`{fields[i]}" if i < len(fields) else match[0]

    return _POSITION.sub(name, message)


# --------------------------------------------------------------------------- the process


@dataclass(slots=True)
class IndexerSettings:
    host: str = "127.0.0.1"
    http_port: int = 8090
    zmq_port: int = 0
    block_size: int | None = None
    workers: list[StaticWorker] | None = None
    model_name: str | None = None
    model_path: str | None = None
    event_threads: int = DEFAULT_EVENT_THREADS
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    api_key: str | None = None
    """Required as 'Authorization: Bearer KEY' on the HTTP routes but /live and /health."""


def build_service(settings: IndexerSettings) -> IndexerService:
    """The service ``settings`` describe; ``ConfigError`` says what to fix."""
    model_name, store = model_and_store(settings.model_path, settings.model_name, settings.discovery)
    return IndexerService(
        store,
        model_name,
        block_size=settings.block_size,
        static_workers=settings.workers,
        event_threads=settings.event_threads,
        host=settings.host,
        zmq_port=settings.zmq_port,
    )


async def serve_indexer(settings: IndexerSettings) -> None:
    """Serve until SIGINT/SIGTERM (see the module docstring)."""
    service = build_service(settings)
    warn_open_plane(log, settings.api_key, service.endpoint)
    try:
        sock = bind_http(settings.host, settings.http_port)
    except ConfigError:
        service._socket.close(linger=0)
        raise
    server = LoopHttpServer(
        IndexerHttpApp(service, service.metrics, api_key=settings.api_key), sock, settings.host
    )
    stop = anyio.Event()

    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

            async def on_signal() -> None:
                async for signum in signals:
                    log.info("received %s; stopping", signal.Signals(signum).name)
                    stop.set()
                    return

            async def until_served() -> None:
                await server.served.wait()
                stop.set()

            tg.start_soon(on_signal)
            await tg.start(service.run)
            if await server.start(tg):
                tg.start_soon(until_served)
                async with service.announce(server.url):
                    status(
                        f"{READY_PREFIX}http={server.url} zmq={service.endpoint}",
                        http=server.url,
                        zmq=service.endpoint,
                    )
                    log.info(
                        "indexing model %r (%s, block size %s)",
                        service.model_name,
                        "static --workers"
                        if service.static_workers is not None
                        else f"workers of namespace {settings.discovery.namespace!r}",
                        service.block_size or "from the first worker",
                    )
                    await stop.wait()
            await server.stop()
            tg.cancel_scope.cancel()
    sock.close()


def run_indexer(settings: IndexerSettings) -> None:
    """Run ``dyn indexer`` until SIGINT/SIGTERM; ``ConfigError`` for anything to fix first."""
    run_service(serve_indexer, settings)
