"""``dyn indexer``: the standalone KV indexer of one model, queried over ZMQ and HTTP (reference 2.6).

``IndexerService`` keeps one ``RadixIndexer`` with a fixed block size, and the lower tiers' indexes
beside it (host, disk, external: ``dyn.core.kv.tiers``), fed by a ``KvEventIngestor`` from the
workers' KV-event PUB sockets. Workers come from one of two places:

- discovery (default): the workers of ``model_name`` in the namespace, followed as they come and
  go; workers of other models are ignored, and a worker that leaves has its blocks dropped. With
  no ``block_size`` given, the first discovered worker's is used; a worker with another block size
  is followed but warned about (its blocks cannot be matched).
- a static list (``--workers "id[:dp]=tcp://host:port[|replay_endpoint],..."``, parsed by
  ``parse_workers``; needs a block size) and, at any time, ``POST /register`` (``register``;
  ``POST /unregister`` drops an entry and its blocks, ``dyn.core.indexer.registration``), as
  Dynamo's standalone indexer takes them. Each entry is its own subscription, so ranks of one
  instance may publish on separate sockets. Blocks are indexed under the entry's
  ``(instance_id, dp_rank)``; a batch that names a nonzero ``data_parallel_rank`` overrides the rank.
  An instance is followed one way: discovery's workers cannot be registered, and a discovered
  worker whose id is registered is ignored (with a warning). At most ``MAX_REGISTERED`` entries
  (each holds a ZMQ socket open).

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
from dyn.core.indexer.peers import SETTLE_S, PeerList, recover
from dyn.core.indexer.registration import RegisteringHttpApp
from dyn.core.indexer.workers import MAX_REGISTERED, StaticWorker, address_problem
from dyn.core.kv.convert import KvEventMetrics
from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.core.kv.indexer import WorkerKey, radix_indexer
from dyn.core.kv.ingest import DEFAULT_EVENT_THREADS, KvEventIngestor
from dyn.core.kv.tiers import LowerTierIndexes
from dyn.core.kv.views import U64_MAX, HttpError, IndexerMetrics, RadixIndexView
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
        peers: Sequence[str] = (),
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
        try:
            self.peers = PeerList(list(peers))
        except ValueError as exc:
            raise ConfigError(f"--peers: {exc}") from None
        self._records: dict[int, WorkerRecord] = {}
        self._registered: dict[WorkerKey, StaticWorker] = {}
        """``--workers`` entries and ``/register`` calls, by ``(instance_id, dp_rank)``."""
        self._skipped_models: set[str] = set()
        self._mismatched: set[int] = set()
        self._lease: Lease | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        try:
            self.ingestor = KvEventIngestor(
                self.indexer,
                self.kv_metrics,
                lower_tiers=dict(self.lower.writers()),
                block_size=block_size,
                event_threads=event_threads,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if len(self.static_workers or ()) > MAX_REGISTERED:
            raise ConfigError(f"--workers names over {MAX_REGISTERED} sockets; run several indexers")
        for entry in self.static_workers or ():
            self._follow(entry)
        self._rpc = RpcServer(decode_indexer_message, logger=log)
        self._rpc.handle(OverlapQuery, self._on_query)
        self._rpc.fallback = self._refuse_unexpected
        self._rpc.on_malformed = self._on_malformed
        self._socket = self._rpc.socket
        self.endpoint = bind_zmq(self._socket, host, zmq_port, "--zmq-port")

    def _follow(self, entry: StaticWorker) -> None:
        """Subscribe to an entry's socket (its rank's events)."""
        self._registered[(entry.instance_id, entry.dp_rank)] = entry
        record = WorkerRecord(
            instance_id=entry.instance_id,
            namespace=self.store.namespace,
            model_name=self.model_name,
            engine="static",
            endpoints=WorkerEndpoints(request="", kv_events=entry.endpoint, kv_replay=entry.replay_endpoint),
            block_size=self._block_size or 0,
            total_kv_blocks=0,
            max_num_batched_tokens=0,
        )
        self.ingestor.add_worker(record, dp_rank=entry.dp_rank)

    # ----------------------------------------------------------------- /register, /unregister

    def register(
        self, entry: StaticWorker, *, model_name: str | None = None, block_size: int | None = None
    ) -> None:
        """Follow ``entry`` from now on (``POST /register``); ``HttpError`` 409 says why not: another
        model, a block size other than the index's (the first registration gives an index without
        one its block size), an entry already registered, an instance discovery follows, or
        ``MAX_REGISTERED`` entries."""
        key = (entry.instance_id, entry.dp_rank)
        self._check_model(model_name, 409)
        for what, address in (("endpoint", entry.endpoint), ("replay_endpoint", entry.replay_endpoint)):
            problem = address_problem(address) if address is not None else None
            if problem is not None:
                raise HttpError(409, f"the {what} {problem}")
        if self._block_size is None and block_size is None:
            raise HttpError(
                409, "the block size is not known yet: give block_size, the engine's KV block size"
            )
        if block_size is not None and self._block_size is not None and block_size != self._block_size:
            raise HttpError(
                409,
                f"block_size {block_size} differs from this index's {self._block_size}; run one indexer per block size",
            )
        if key in self._registered:
            raise HttpError(
                409,
                f"instance {key[0]} dp_rank {key[1]} is already registered "
                f"({self._registered[key].endpoint}); unregister it first",
            )
        if entry.instance_id in self._records:
            raise HttpError(
                409, f"instance {entry.instance_id} is followed through discovery; it cannot be registered"
            )
        if len(self._registered) >= MAX_REGISTERED:
            raise HttpError(
                409, f"{MAX_REGISTERED} sockets are followed already; unregister one or run another indexer"
            )
        if self._block_size is None:
            assert block_size is not None  # refused above
            self.learn_block_size(block_size, f"registered instance {entry.instance_id}")
        self._follow(entry)
        log.info("following instance %d dp rank %d (KV events %s)", *key, entry.endpoint)

    def unregister(
        self, instance_id: int, dp_rank: int | None = None, *, model_name: str | None = None
    ) -> None:
        """Stop following a registered instance (every rank, or ``dp_rank``) and drop its blocks
        (``POST /unregister``); ``HttpError`` 404 when it is not registered here."""
        self._check_model(model_name, 404)
        keys = [k for k in self._registered if k[0] == instance_id and dp_rank in (None, k[1])]
        if not keys:
            rank = "" if dp_rank is None else f" dp_rank {dp_rank}"
            raise HttpError(404, f"instance {instance_id}{rank} is not registered")
        for key in keys:
            del self._registered[key]
        if dp_rank is None:
            self.ingestor.remove_worker(instance_id)
        else:
            self.ingestor.remove_rank(instance_id, dp_rank)
        log.info(
            "stopped following instance %d%s; its blocks are dropped",
            instance_id,
            "" if dp_rank is None else f" dp rank {dp_rank}",
        )

    def _check_model(self, model_name: str | None, status: int) -> None:
        if model_name is not None and model_name != self.model_name:
            raise HttpError(
                status,
                f"model_name {model_name!r} is not indexed here; this indexer indexes {self.model_name!r}",
            )

    def learn_block_size(self, block_size: int, source: str) -> None:
        """Take ``block_size`` (from ``source``, for the log) as the index's, unknown until now."""
        self._block_size = self.ingestor.block_size = block_size
        log.info("KV block size %d (from %s)", block_size, source)
        if self._lease is not None and self._tg is not None:
            self._tg.start_soon(self._reannounce)

    # ----------------------------------------------------------------- IndexView (the rest is RadixIndexView's)

    def worker_endpoints(self) -> dict[WorkerKey, str | None]:
        known: dict[WorkerKey, str | None] = {k: e.endpoint for k, e in self._registered.items()}
        by_instance: dict[int, str | None] = {k[0]: e for k, e in known.items()}
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

    async def recover_from_peers(self, api_key: str | None = None) -> None:
        """Start from the first usable peer's index (``dyn.core.indexer.peers``); call once the
        subscriptions run, before announcing. Nothing when there are no peers."""
        urls = self.peers.urls()
        if not urls:
            return
        await anyio.sleep(SETTLE_S)
        recovered = await recover(self.indexer, self.model_name, self._block_size, urls, api_key=api_key)
        if recovered is None:
            log.warning(
                "no peer could be recovered from (%s); starting from the engines' events alone",
                ", ".join(urls),
            )
        elif self._block_size is None:
            self.learn_block_size(recovered[1], f"peer {recovered[0]}")

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
        if any(key[0] == record.instance_id for key in self._registered):
            log.warning(
                "ignoring discovered worker %d: the instance is registered (POST /unregister it to "
                "follow it through discovery)",
                record.instance_id,
            )
            return
        if self._block_size is None:
            self.learn_block_size(record.block_size, f"worker {record.instance_id}")
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
    peers: list[str] = field(default_factory=list)
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
        peers=settings.peers,
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
    server = LoopHttpServer(RegisteringHttpApp(service, api_key=settings.api_key), sock, settings.host)
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
            await service.recover_from_peers(settings.api_key)
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
