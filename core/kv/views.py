"""Read-only HTTP views of a KV index: the standalone indexer's API (reference 2.6), as plain ASGI.

The views live beside the index they show, so every server that holds an index mounts them from
here: ``dyn indexer`` (``dyn.core.indexer.service``) at the root, a frontend and ``dyn router`` under
``/kv``. ``IndexerHttpApp`` serves any ``IndexView`` (the ``dyn indexer`` service, or a router's
``RadixIndexer`` wrapped in ``RadixIndexView``; ``router_index_view`` builds one for any KV
router, reading the router and its pool by duck typing, so this module imports neither); with
``prefix`` it answers under that path. Importing this module starts nothing and imports no server.

- ``GET /health`` -> ``{"status": "healthy", "workers": N}`` (N: listed (instance, dp_rank)
  pairs; ``dyn.core.health``): 503 "unhealthy" while the block size is not known (no token query
  can be answered), "degraded" while no worker is followed
- ``GET /live`` -> ``{"status": "live"}`` while the process serves (a liveness probe)
- ``GET /metrics`` -> the registry in the Prometheus text format
- ``GET /workers`` -> ``[{"instance_id", "dp_rank", "blocks", "endpoint", "total_blocks"?}]``;
  ``total_blocks`` (the rank's KV capacity in blocks, from its worker record) only where known
- ``POST /query {"token_ids": [...], "lora_name"?: str}`` and
  ``POST /query_by_hash {"block_hashes": [...]}`` -> Dynamo's shape
  ``{"scores": {inst: {dp: tokens}}, "instances": {inst: {"longest_matched": tokens, "dp":
  {rank: tokens}}}, "block_size": N}``; counts are matched tokens (blocks * block_size), keys
  are decimal strings, workers that matched nothing are absent. ``scores``, ``longest_matched``
  and ``dp`` count the device tier. A view that indexes lower tiers (``lower``: ``dyn indexer``,
  a router fed by KV events) adds ``"cpu"`` and ``"disk"`` to each instance, as Dynamo does:
  the most tokens one of its ranks holds through its host tier, and through its disk and
  external tiers, each cumulative with the tiers above it (an instance that holds the prompt in
  a lower tier only is listed, with ``longest_matched`` 0). An optional ``model_name`` must
  name the served model.
- ``GET /dump`` -> ``{model: {"block_size": N, "events": [{"worker_id", "dp_rank",
  "parent_hash", "block_hash", "tokens_hash"}]}}``, one stored block per event, parents first.

Errors are ``{"error": "<sentence>"}``: 400 for bad JSON or a wrong field (the message names the
field), 401 (with ``WWW-Authenticate: Bearer``) without the API key when the app has one (every
route but ``/health`` needs it, see ``dyn.core.api_key``), 404 for an unknown path, 405 for a
wrong method, 413 for an oversized body, 503 for a token query before the block size is known;
an unexpected exception is logged and answered 500.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Protocol

import msgspec
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from dyn.core import asgi
from dyn.core.api_key import CHALLENGE, REFUSAL, ApiKey, authorization, needs_key
from dyn.core.asgi import BodyTooLarge, Disconnected, http_request, read_body
from dyn.core.health import verdict
from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.core.kv.indexer import DumpedBlock, OverlapScores, RadixIndexer, WorkerKey
from dyn.core.kv.tiers import LowerTierIndexes, TieredScores

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
U64_MAX = (1 << 64) - 1
ENDPOINTS = ("health", "live", "metrics", "workers", "query", "query_by_hash", "dump", "zmq_query")
_JSON = (b"content-type", b"application/json")


class IndexView(Protocol):
    """What the HTTP views read; all calls happen on the index's own event loop (single writer)."""

    @property
    def model_name(self) -> str: ...

    @property
    def block_size(self) -> int | None:
        """The block size queries are hashed with; None while unknown."""

    def find_matches(
        self, local_hashes: Sequence[int], seq_hashes: Sequence[int] | None = None
    ) -> OverlapScores: ...

    def dump(self) -> list[DumpedBlock]: ...

    def blocks_per_worker(self) -> dict[WorkerKey, int]: ...

    def worker_endpoints(self) -> dict[WorkerKey, str | None]:
        """Every known (instance_id, dp_rank), blocks or not, with its KV-event endpoint."""

    def worker_total_blocks(self) -> dict[WorkerKey, int]:
        """Each (instance_id, dp_rank)'s KV capacity in blocks, where its worker record says."""

    def tier_hits(
        self, local_hashes: Sequence[int], seq_hashes: Sequence[int], scores: OverlapScores
    ) -> TieredScores | None:
        """The lower-tier blocks continuing ``scores`` (``find_matches``' answer) per rank, or
        None when the view indexes no lower tier."""


Capacity = Mapping[WorkerKey, int] | Callable[[], Mapping[WorkerKey, int]]


class RadixIndexView:
    """An ``IndexView`` over a ``RadixIndexer`` owned by someone else (e.g. a frontend's router);
    ``capacity`` gives the ranks' KV capacity in blocks, where known; ``lower`` the lower tiers'
    indexes beside it, when there are any."""

    def __init__(
        self,
        indexer: RadixIndexer,
        model_name: str,
        block_size: int | None | Callable[[], int | None],
        endpoints: Mapping[WorkerKey, str | None]
        | Callable[[], Mapping[WorkerKey, str | None]]
        | None = None,
        capacity: Capacity | None = None,
        lower: LowerTierIndexes | None = None,
    ) -> None:
        self.indexer = indexer
        self.model_name = model_name
        self._block_size = block_size
        self.endpoints = endpoints if endpoints is not None else {}
        self.capacity = capacity if capacity is not None else {}
        self.lower = lower

    @property
    def block_size(self) -> int | None:
        """Fixed, or read from a callable (a router that learns it from its first worker)."""
        return self._block_size() if callable(self._block_size) else self._block_size

    def find_matches(
        self, local_hashes: Sequence[int], seq_hashes: Sequence[int] | None = None
    ) -> OverlapScores:
        return self.indexer.find_matches(local_hashes, seq_hashes)

    def dump(self) -> list[DumpedBlock]:
        return self.indexer.dump()

    def blocks_per_worker(self) -> dict[WorkerKey, int]:
        return self.indexer.blocks_per_worker()

    def worker_endpoints(self) -> dict[WorkerKey, str | None]:
        known = dict(self.endpoints() if callable(self.endpoints) else self.endpoints)
        for key in self.indexer.workers():
            known.setdefault(key, None)
        return known

    def worker_total_blocks(self) -> dict[WorkerKey, int]:
        return dict(self.capacity() if callable(self.capacity) else self.capacity)

    def tier_hits(
        self, local_hashes: Sequence[int], seq_hashes: Sequence[int], scores: OverlapScores
    ) -> TieredScores | None:
        if self.lower is None:
            return None
        if self.lower.empty():
            return {}
        return self.lower.hits(self.indexer, local_hashes, seq_hashes, scores)


def router_index_view(router: Any, pool: Any, model_name: str) -> RadixIndexView | None:
    """The view of a KV router's own index (a frontend's embedded ``KvRouter`` or a ``dyn
    router``'s): its event-fed ``RadixIndexer`` with its lower tiers, or in approximate mode the
    tree of its ``TtlIndexer``; None when it keeps none (another router mode,
    ``--use-remote-indexer``, an overlap credit of 0). Every live worker of ``pool`` is listed,
    with its KV capacity."""
    indexer = getattr(router, "indexer", None) or getattr(getattr(router, "approx", None), "tree", None)
    if indexer is None:
        return None

    def ranks(worker: Any) -> range:
        return range(max(worker.record.dp_size, 1))

    def endpoints() -> dict[WorkerKey, str | None]:
        return {
            (w.instance_id, rank): w.record.endpoints.kv_events for w in pool.workers() for rank in ranks(w)
        }

    def capacity() -> dict[WorkerKey, int]:
        return {
            (w.instance_id, rank): w.record.total_kv_blocks
            for w in pool.workers()
            for rank in ranks(w)
            if w.record.total_kv_blocks > 0
        }

    lower = getattr(router, "lower", None) if indexer is getattr(router, "indexer", None) else None
    return RadixIndexView(indexer, model_name, lambda: router.block_size, endpoints, capacity, lower)


class IndexerMetrics:
    """The indexer's own series on ``registry`` (beside the KV-event ingestion counters):
    ``dynamo_kvindexer_requests_total{endpoint}``, ``dynamo_kvindexer_errors_total{endpoint}``,
    ``dynamo_kvindexer_request_duration_seconds{endpoint}``, and the gauges
    ``dynamo_kvindexer_workers`` and ``dynamo_kvindexer_blocks`` read from ``view`` at scrape."""

    def __init__(self, registry: CollectorRegistry, view: IndexView) -> None:
        self.registry = registry
        self.requests = Counter(
            "dynamo_kvindexer_requests", "Indexer requests, by endpoint", ["endpoint"], registry=registry
        )
        self.errors = Counter(
            "dynamo_kvindexer_errors",
            "Indexer requests refused or failed, by endpoint",
            ["endpoint"],
            registry=registry,
        )
        self.duration = Histogram(
            "dynamo_kvindexer_request_duration_seconds",
            "Time to answer an indexer request, by endpoint",
            ["endpoint"],
            buckets=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0),
            registry=registry,
        )
        for endpoint in ENDPOINTS:
            self.requests.labels(endpoint)
            self.errors.labels(endpoint)
        Gauge("dynamo_kvindexer_workers", "Known (instance, dp_rank) pairs", registry=registry).set_function(
            lambda: len(view.worker_endpoints())
        )
        Gauge("dynamo_kvindexer_blocks", "Indexed (worker, block) entries", registry=registry).set_function(
            lambda: sum(view.blocks_per_worker().values())
        )

    def observe(self, endpoint: str, seconds: float, failed: bool) -> None:
        self.requests.labels(endpoint).inc()
        self.duration.labels(endpoint).observe(seconds)
        if failed:
            self.errors.labels(endpoint).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


# --------------------------------------------------------------------------- request bodies


TokenId = Annotated[int, msgspec.Meta(ge=0, le=(1 << 32) - 1)]
BlockHash = Annotated[int, msgspec.Meta(ge=0)]


class TokenQuery(msgspec.Struct):
    token_ids: list[TokenId]
    lora_name: str | None = None
    model_name: str | None = None


class HashQuery(msgspec.Struct):
    block_hashes: list[BlockHash]
    model_name: str | None = None


class HttpError(Exception):
    """An answer other than 200: ``status`` and a sentence saying what to fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def decode_body(body: bytes, kind: type[msgspec.Struct]) -> Any:
    """Decode a JSON request body, or raise a 400 naming the offending field."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise HttpError(400, f"invalid request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise HttpError(
            400,
            f"the request body is not valid JSON ({exc}); send a JSON object "
            f"with the field{'s' if len(kind.__struct_fields__) > 1 else ''} "
            f"{', '.join(kind.__struct_fields__)}",
        ) from None


def overlap_body(scores: OverlapScores, block_size: int, tiers: TieredScores | None = None) -> dict[str, Any]:
    """Dynamo's query answer: matched tokens per instance and dp rank; with ``tiers`` (a view
    that indexes lower tiers), each instance's cumulative ``cpu`` and ``disk`` tokens too."""
    per_instance: dict[str, dict[str, int]] = {}
    for (instance, rank), blocks in sorted(scores.items()):
        if blocks > 0:
            per_instance.setdefault(str(instance), {})[str(rank)] = blocks * block_size
    instances: dict[str, dict[str, Any]] = {
        inst: {"longest_matched": max(ranks.values()), "dp": ranks} for inst, ranks in per_instance.items()
    }
    if tiers is not None:
        _add_tier_tokens(instances, scores, tiers, block_size)
    return {"scores": per_instance, "instances": instances, "block_size": block_size}


def _add_tier_tokens(
    instances: dict[str, dict[str, Any]], scores: OverlapScores, tiers: TieredScores, block_size: int
) -> None:
    """Give every instance (one with lower-tier hits only, too) its best rank's tokens through
    the host tier (``cpu``) and through the disk tiers (``disk``), device blocks included."""
    for rank in sorted({*scores, *tiers}):
        device = scores.get(rank, 0)
        host, disk = tiers.get(rank, (0, 0))
        if not device + host + disk:
            continue
        entry = instances.setdefault(str(rank[0]), {"longest_matched": 0, "dp": {}})
        entry["cpu"] = max(entry.get("cpu", 0), (device + host) * block_size)
        entry["disk"] = max(entry.get("disk", 0), (device + host + disk) * block_size)


def dump_body(view: IndexView) -> dict[str, Any]:
    events = [
        {
            "worker_id": b.worker[0],
            "dp_rank": b.worker[1],
            "parent_hash": b.parent_hash,
            "block_hash": b.block_hash,
            "tokens_hash": b.local_hash,
        }
        for b in view.dump()
    ]
    return {view.model_name: {"block_size": view.block_size, "events": events}}


def workers_body(view: IndexView) -> list[dict[str, Any]]:
    blocks = view.blocks_per_worker()
    capacity = view.worker_total_blocks()
    out: list[dict[str, Any]] = []
    for key, endpoint in sorted(view.worker_endpoints().items()):
        entry = {"instance_id": key[0], "dp_rank": key[1], "blocks": blocks.get(key, 0), "endpoint": endpoint}
        if capacity.get(key):
            entry["total_blocks"] = capacity[key]
        out.append(entry)
    return out


# --------------------------------------------------------------------------- the app


class IndexerHttpApp:
    """ASGI app serving ``view`` (see the module docstring); ``prefix`` mounts it under a path;
    ``api_key`` guards every route but ``/health`` (an app mounted behind a guard of its own, as
    in a frontend, takes none)."""

    _GET: ClassVar[dict[str, str]] = {
        "/health": "health",
        "/live": "live",
        "/metrics": "metrics",
        "/workers": "workers",
        "/dump": "dump",
    }
    _POST: ClassVar[dict[str, str]] = {"/query": "query", "/query_by_hash": "query_by_hash"}

    @staticmethod
    async def _body(receive: Any) -> bytes:
        try:
            return await read_body(receive, MAX_BODY_BYTES)
        except BodyTooLarge as exc:
            raise HttpError(413, f"{exc}; query fewer tokens") from None

    def __init__(
        self, view: IndexView, metrics: IndexerMetrics, *, prefix: str = "", api_key: str | None = None
    ) -> None:
        self.view = view
        self.metrics = metrics
        self.prefix = prefix.rstrip("/")
        self.api_key = ApiKey(api_key) if api_key else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not await http_request(scope, receive, send):
            return
        if not self.authorized(scope):
            await respond(send, 401, error_body(REFUSAL), _JSON[1], [CHALLENGE])
            return
        started = time.perf_counter()
        endpoint: str | None = None
        status = 500
        try:
            endpoint, method = self._route(scope["path"], scope["method"])
            body = await self._body(receive) if method == "POST" else b""
            status, payload, content_type = self._answer(endpoint, body)
        except HttpError as exc:
            status, payload, content_type = exc.status, error_body(exc.message), _JSON[1]
        except Disconnected:
            return
        except Exception:
            log.exception("unexpected error serving %s %s", scope["method"], scope["path"])
            status, payload, content_type = 500, error_body("internal error; see the indexer log"), _JSON[1]
        if endpoint is not None:
            self.metrics.observe(endpoint, time.perf_counter() - started, status >= 400)
        await respond(send, status, payload, content_type)

    def _health(self) -> tuple[int, bytes, bytes]:
        """503 while no token query can be answered (the block size is not known), degraded while
        no worker is followed (every answer is empty)."""
        view = self.view
        workers = len(view.worker_endpoints())
        down: dict[str, str] = {}
        degraded: list[str] = []
        if view.block_size is None:
            down[view.model_name] = (
                "the block size is not known yet: no worker has been discovered; start a worker "
                "or pass --block-size"
            )
        elif not workers:
            degraded.append("no worker's KV events are followed: every answer is empty")
        status, body = verdict(down, degraded, 1)
        body["workers"] = workers
        return status, msgspec.json.encode(body), _JSON[1]

    def authorized(self, scope: dict[str, Any]) -> bool:
        """Whether the request may be served: no key, an open path, or the key sent."""
        return not needs_key(self.api_key, scope["path"]) or self.api_key.allows(
            authorization(scope["headers"])
        )

    def _route(self, path: str, method: str) -> tuple[str, str]:
        if self.prefix:
            if not path.startswith(self.prefix + "/"):
                raise HttpError(404, f"no route for {method} {path}")
            path = path[len(self.prefix) :]
        if path in self._GET:
            if method not in ("GET", "HEAD"):
                raise HttpError(405, f"{self.prefix}{path} accepts GET only")
            return self._GET[path], "GET"
        if path in self._POST:
            if method != "POST":
                raise HttpError(405, f"{self.prefix}{path} accepts POST only")
            return self._POST[path], "POST"
        known = (
            ", ".join(f"GET {self.prefix}{p}" for p in self._GET)
            + ", "
            + ", ".join(f"POST {self.prefix}{p}" for p in self._POST)
        )
        raise HttpError(404, f"no route for {method} {path}; the indexer serves {known}")

    def _answer(self, endpoint: str, body: bytes) -> tuple[int, bytes, bytes]:
        view = self.view
        if endpoint == "metrics":
            return 200, self.metrics.render(), CONTENT_TYPE_LATEST.encode()
        if endpoint == "health":
            return self._health()
        if endpoint == "live":
            return 200, b'{"status":"live"}', _JSON[1]
        result: Any
        if endpoint == "workers":
            result = workers_body(view)
        elif endpoint == "dump":
            result = dump_body(view)
        elif endpoint == "query":
            query = decode_body(body, TokenQuery)
            self._check_model(query.model_name)
            block_size = view.block_size
            if block_size is None:
                raise HttpError(
                    503,
                    "the block size is not known yet: no worker has been "
                    "discovered; start a worker, pass --block-size, or retry",
                )
            local = block_hashes(query.token_ids, block_size, query.lora_name)
            scores, tiers = self._matches(local)
            result = overlap_body(scores, block_size, tiers)
        else:
            query = decode_body(body, HashQuery)
            self._check_model(query.model_name)
            for i, h in enumerate(query.block_hashes):
                if h > U64_MAX:
                    raise HttpError(
                        400, f"invalid request body: block_hashes[{i}] is {h}, over the largest 64-bit hash"
                    )
            scores, tiers = self._matches(query.block_hashes)
            result = overlap_body(scores, view.block_size or 0, tiers)
        return 200, msgspec.json.encode(result), _JSON[1]

    def _matches(self, local: list[int]) -> tuple[OverlapScores, TieredScores | None]:
        """Device scores, and lower-tier hits where the view indexes lower tiers."""
        seq = sequence_hashes(local)
        scores = self.view.find_matches(local, seq) if local else {}
        return scores, self.view.tier_hits(local, seq, scores)

    def _check_model(self, model_name: str | None) -> None:
        if model_name is not None and model_name != self.view.model_name:
            raise HttpError(
                400,
                f"invalid request body: model_name {model_name!r} is not "
                f"indexed here; this indexer serves {self.view.model_name!r}",
            )


def error_body(message: str) -> bytes:
    """``{"error": message}`` as JSON: the views' error answer."""
    return msgspec.json.encode({"error": message})


async def respond(
    send: Any, status: int, body: bytes, content_type: bytes, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Send a whole response."""
    await asgi.respond(send, status, body, [(b"content-type", content_type), *headers])
