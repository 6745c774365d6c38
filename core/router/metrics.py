"""The KV router's Prometheus metrics, with Dynamo's names (reference section 8).

- ``dynamo_component_router_*``: per-request routing outcomes (requests, predicted KV hit rate,
  TTFT and ITL seen through the router, sequence lengths), labelled like Dynamo's component
  metrics (``dynamo_namespace``, ``dynamo_component``, ``dynamo_endpoint``). A frontend registers
  them in every router mode; they stay zero outside ``kv``.
- ``dynamo_router_overhead_*_ms``: where a routing decision's time goes (block hashing,
  sequence hashing, find_matches, scheduling, total), labelled ``router_id``.

The histograms are ``LocklessHistogram`` series (``dyn.core.histogram``): the router observes
them on its event loop, seven times a decision, and the client library's lock cost 0.6 µs each.
- ``dynamo_frontend_worker_active_decode_blocks`` / ``_active_prefill_tokens``: the router's view
  of each (worker, dp_rank)'s load, read from every watching router's load view when scraped
  (``watch_load``), not set at each of a request's three booking changes.
- ``dynamo_frontend_router_queue_pending_requests`` / ``_pending_isl_tokens``: the router queue.

The KV-event counters (``dynamo_component_kv_cache_events_applied``) live with the ingestion code
(``dyn.core.kv.ingest``) and are registered on the same registry.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from dyn.core.histogram import LocklessHistogram

_COMPONENT = ("dynamo_namespace", "dynamo_component", "dynamo_endpoint")
_WORKER = ("worker_id", "dp_rank", "worker_type")

WorkerLoad = tuple[tuple[int, int], str, float, float]
"""((worker, dp_rank), worker_type, active decode blocks, active prefill tokens)."""


def _exponential(start: float, factor: float, count: int) -> list[float]:
    return [start * factor**i for i in range(count)]


# Dynamo's buckets: compute phases exponential(0.001 ms, x2, 15); async phases (0.01 ms, x3, 17).
_COMPUTE_MS = _exponential(0.001, 2.0, 15)
_ASYNC_MS = _exponential(0.01, 3.0, 17)
_SECONDS = _exponential(0.001, 2.0, 20)
_TOKENS = _exponential(1.0, 2.0, 22)
_RATIO = [i / 20 for i in range(21)]


class RouterMetrics:
    """Router metrics on ``registry``; ``namespace`` and ``router_id`` fill the fixed labels."""

    def __init__(
        self,
        registry: CollectorRegistry,
        namespace: str = "default",
        router_id: str = "0",
        component: str = "router",
    ) -> None:
        r = registry
        labels = (namespace, component, "generate")

        def component_histogram(name: str, documentation: str, buckets: list[float]) -> LocklessHistogram:
            """The series of histogram ``name`` for this router's component labels."""
            return LocklessHistogram(name, documentation, _COMPONENT, labels, buckets, r)

        def worker_gauge(name: str, documentation: str) -> Gauge:
            """Gauge ``name`` labelled by (worker, dp_rank, worker_type)."""
            return Gauge(name, documentation, _WORKER, registry=r)

        self.requests = Counter(
            "dynamo_component_router_requests", "Requests routed", _COMPONENT, registry=r
        ).labels(*labels)
        self.ttft = component_histogram(
            "dynamo_component_router_time_to_first_token_seconds",
            "Time from routing to the first token",
            _SECONDS,
        )
        self.itl = component_histogram(
            "dynamo_component_router_inter_token_latency_seconds",
            "Mean inter-token latency per request",
            _SECONDS,
        )
        self.isl = component_histogram(
            "dynamo_component_router_input_sequence_tokens", "Prompt tokens per routed request", _TOKENS
        )
        self.osl = component_histogram(
            "dynamo_component_router_output_sequence_tokens", "Output tokens per routed request", _TOKENS
        )
        self.kv_hit_rate = component_histogram(
            "dynamo_component_router_kv_hit_rate",
            "Predicted fraction of the prompt cached on the chosen worker",
            _RATIO,
        )
        overhead = {
            phase: LocklessHistogram(
                f"dynamo_router_overhead_{phase}_ms",
                f"Routing overhead: {phase.replace('_', ' ')} (ms)",
                ["router_id"],
                [router_id],
                buckets,
                r,
            )
            for phase, buckets in (
                ("block_hashing", _COMPUTE_MS),
                ("seq_hashing", _COMPUTE_MS),
                ("indexer_find_matches", _ASYNC_MS),
                ("scheduling", _COMPUTE_MS),
                ("total", _ASYNC_MS),
            )
        }
        self.block_hashing_ms = overhead["block_hashing"]
        self.seq_hashing_ms = overhead["seq_hashing"]
        self.find_matches_ms = overhead["indexer_find_matches"]
        self.scheduling_ms = overhead["scheduling"]
        self.total_ms = overhead["total"]
        self._loads = _WorkerLoads(r)
        self._last_gauges: dict[tuple[tuple[int, int], str], tuple[Gauge, Gauge, Gauge]] = {}
        self._last_ttft = worker_gauge(
            "dynamo_frontend_worker_last_time_to_first_token_seconds",
            "TTFT of the last request a worker started",
        )
        self._last_isl = worker_gauge(
            "dynamo_frontend_worker_last_input_sequence_tokens",
            "Prompt tokens of the last request a worker started",
        )
        self._last_itl = worker_gauge(
            "dynamo_frontend_worker_last_inter_token_latency_seconds",
            "Mean ITL of the last request a worker finished",
        )
        self.queue_pending = Gauge(
            "dynamo_frontend_router_queue_pending_requests",
            "Requests held in the router queue",
            ["worker_type"],
            registry=r,
        ).labels("decode")
        self.queue_isl = Gauge(
            "dynamo_frontend_router_queue_pending_isl_tokens",
            "Prompt tokens of the requests held in the router queue",
            ["worker_type"],
            registry=r,
        ).labels("decode")
        self.rejected = Counter(
            "dynamo_frontend_router_queue_backpressure",
            "Requests refused by the router",
            ["worker_type", "reason"],
            registry=r,
        )
        self.disaggregated = Counter(
            "dyn_router_disaggregated_requests",
            "Requests of disaggregated models, by where their prompt was prefilled: remote (a "
            "prefill worker) or local (its decode worker, by conditional disaggregation)",
            ["prefill"],
            registry=r,
        )

    def watch_load(self, source: Callable[[], Iterable[WorkerLoad]]) -> None:
        """Report what the bound method ``source`` returns as the per-worker load gauges at every
        scrape, for as long as its object lives (a router that is dropped stops reporting)."""
        self._loads.sources.append(weakref.WeakMethod(source))

    def _last(self, worker: tuple[int, int], worker_type: str) -> tuple[Gauge, Gauge, Gauge]:
        """The worker's last-request gauges (TTFT, ISL, ITL), labelled once."""
        gauges = self._last_gauges.get((worker, worker_type))
        if gauges is None:
            key = (str(worker[0]), str(worker[1]), worker_type)
            gauges = self._last_gauges[(worker, worker_type)] = (
                self._last_ttft.labels(*key),
                self._last_isl.labels(*key),
                self._last_itl.labels(*key),
            )
        return gauges

    def first_token(
        self, worker: tuple[int, int], ttft_s: float, isl: int, worker_type: str = "decode"
    ) -> None:
        last = self._last(worker, worker_type)
        last[0].set(ttft_s)
        last[1].set(isl)
        self.ttft.observe(ttft_s)

    def finished(
        self, worker: tuple[int, int], output_tokens: int, itl_s: float | None, worker_type: str = "decode"
    ) -> None:
        if output_tokens:
            self.osl.observe(output_tokens)
        if itl_s is not None:
            self._last(worker, worker_type)[2].set(itl_s)
            self.itl.observe(itl_s)

    def forget_worker(self, worker: tuple[int, int], worker_type: str = "decode") -> None:
        self._last_gauges.pop((worker, worker_type), None)
        key = (str(worker[0]), str(worker[1]), worker_type)
        for gauge in (
            self._last_ttft,
            self._last_isl,
            self._last_itl,
        ):
            try:
                gauge.remove(*key)
            except KeyError:
                pass


class _WorkerLoads:
    """The per-worker load gauges as a collector: each scrape asks the watching routers."""

    DECODE = (
        "dynamo_frontend_worker_active_decode_blocks",
        "Active decode blocks the router books on a worker",
    )
    PREFILL = (
        "dynamo_frontend_worker_active_prefill_tokens",
        "Active prefill tokens the router books on a worker",
    )

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sources: list[weakref.WeakMethod[Callable[[], Iterable[WorkerLoad]]]] = []
        registry.register(self)

    def describe(self) -> list[Metric]:
        return [
            GaugeMetricFamily(*self.DECODE, labels=_WORKER),
            GaugeMetricFamily(*self.PREFILL, labels=_WORKER),
        ]

    def collect(self) -> Iterator[Metric]:
        loads: dict[tuple[str, str, str], tuple[float, float]] = {}
        live = []
        for ref in self.sources:
            source = ref()
            if source is None:
                continue
            live.append(ref)
            for (worker, rank), worker_type, blocks, tokens in source():
                loads[(str(worker), str(rank), worker_type)] = (blocks, tokens)
        self.sources[:] = live
        decode = GaugeMetricFamily(*self.DECODE, labels=_WORKER)
        prefill = GaugeMetricFamily(*self.PREFILL, labels=_WORKER)
        for labels, (blocks, tokens) in loads.items():
            decode.add_metric(labels, blocks)
            prefill.add_metric(labels, tokens)
        yield decode
        yield prefill
