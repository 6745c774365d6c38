"""The frontend's Prometheus metrics, named as Dynamo names them (``dynamo_frontend_*``).

One ``FrontendMetrics`` per app, on its own registry, rendered in the Prometheus text format at
``GET /metrics``. Observations happen once per request (and once per request for the mean
inter-token latency), never per token, to keep the streaming path cheap.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from dyn.core.histogram import LocklessHistogramFamily

PREFIX = "dynamo_frontend"
CONTENT_TYPE = CONTENT_TYPE_LATEST


def log_buckets(low: float, high: float, per_decade: int = 4) -> list[float]:
    """Buckets spaced evenly in log scale from ``low`` to at least ``high``."""
    buckets, value, step = [], low, 10 ** (1 / per_decade)
    while value < high * 1.0001:
        buckets.append(float(f"{value:.4g}"))
        value *= step
    return buckets


_SECONDS = log_buckets(0.001, 300.0)
_TOKENS = log_buckets(1, 1_000_000, per_decade=3)


class FrontendMetrics:
    """Request metrics of one frontend; labels: ``model``, and for requests_total also
    ``endpoint`` (chat_completions | completions | responses | messages), ``request_type`` (stream | unary) and
    ``status`` (success | error)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = LocklessHistogramFamily(
            f"{PREFIX}_time_to_first_token_seconds",
            "Time to first token",
            ["model"],
            _SECONDS,
            r,
        )
        self.itl = LocklessHistogramFamily(
            f"{PREFIX}_inter_token_latency_seconds",
            "Mean inter-token latency of a request",
            ["model"],
            _SECONDS,
            r,
        )
        self.duration = LocklessHistogramFamily(
            f"{PREFIX}_request_duration_seconds", "Request duration", ["model"], _SECONDS, r
        )
        self.isl = LocklessHistogramFamily(
            f"{PREFIX}_input_sequence_tokens",
            "Prompt tokens per request",
            ["model"],
            _TOKENS,
            r,
        )
        self.osl = LocklessHistogramFamily(
            f"{PREFIX}_output_sequence_tokens",
            "Output tokens per request",
            ["model"],
            _TOKENS,
            r,
        )
        self.cached = LocklessHistogramFamily(
            f"{PREFIX}_cached_tokens",
            "Prompt tokens served from the KV cache",
            ["model"],
            _TOKENS,
            r,
        )
        self.output_tokens = Counter(
            f"{PREFIX}_output_tokens", "Output tokens generated", ["model"], registry=r
        )
        self.requests = Counter(
            f"{PREFIX}_requests",
            "Requests handled",
            ["model", "endpoint", "request_type", "status"],
            registry=r,
        )
        self.active = Gauge(f"{PREFIX}_active_requests", "Requests being served now", ["model"], registry=r)
        self.migrations = Counter(
            f"{PREFIX}_model_migration",
            "Requests moved to another worker after theirs failed (migration_type: "
            "new_request before the first token, ongoing_request after)",
            ["model", "migration_type"],
            registry=r,
        )
        self.rejected = Counter(
            f"{PREFIX}_requests_rejected",
            "Requests refused before their body was read (reason: max_inflight)",
            ["model", "reason"],
            registry=r,
        )
        self.disconnects = Counter(
            f"{PREFIX}_client_disconnects",
            "Requests whose client went away before the end",
            ["model"],
            registry=r,
        )

        self._models: dict[str, ModelMetrics] = {}

    def for_model(self, model: str) -> ModelMetrics:
        """The metrics of ``model``, with their label values bound once (the same for every
        caller): a request's observations then skip ``labels()``, a microsecond or two each."""
        bound = self._models.get(model)
        if bound is None:
            bound = self._models[model] = ModelMetrics(self, model)
        return bound

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelMetrics:
    """``FrontendMetrics`` of one model: the per-request series, labelled already."""

    def __init__(self, metrics: FrontendMetrics, model: str) -> None:
        self._metrics = metrics
        self.model = model
        self.ttft = metrics.ttft.labels(model)
        self.itl = metrics.itl.labels(model)
        self.duration = metrics.duration.labels(model)
        self.isl = metrics.isl.labels(model)
        self.osl = metrics.osl.labels(model)
        self.cached = metrics.cached.labels(model)
        self.output_tokens = metrics.output_tokens.labels(model)
        self.active = metrics.active.labels(model)
        self.disconnects = metrics.disconnects.labels(model)
        self._requests: dict[tuple[str, str, str], Any] = {}

    def requests(self, endpoint: str, request_type: str, status: str) -> Any:
        """The ``requests_total`` counter of one (endpoint, request_type, status)."""
        key = (endpoint, request_type, status)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = self._metrics.requests.labels(self.model, *key)
        return counter
