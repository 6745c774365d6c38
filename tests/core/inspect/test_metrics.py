"""Reading the hit rate and KV-event counts from real registries' Prometheus text."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dyn.core.inspect.metrics import MetricsError, events_per_second, read_metrics
from dyn.core.inspect.snapshot import EventCounts
from dyn.core.kv.convert import EventType, KvEventMetrics
from dyn.core.router.metrics import RouterMetrics
from tests.core.inspect.index_state import kv_app


def text(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_a_router_registry_gives_the_mean_predicted_hit_rate_and_applied_events():
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    events = KvEventMetrics(registry)
    for rate in (0.25, 1.0, 0.5):
        metrics.kv_hit_rate.observe(rate)
    for _ in range(4):
        events.count_applied("ok", EventType.STORED)
    events.count_applied("ok", EventType.REMOVED)
    events.count_applied("parent_block_not_found", EventType.STORED)
    hit_rate, counts = read_metrics(text(registry))
    assert hit_rate is not None and hit_rate.requests == 3
    assert hit_rate.mean == pytest.approx(1.75 / 3)
    assert counts == EventCounts(applied=6, failed=1)


def test_no_routed_request_yet_has_no_mean():
    registry = CollectorRegistry()
    RouterMetrics(registry)
    hit_rate, counts = read_metrics(text(registry))
    assert hit_rate is not None and (hit_rate.mean, hit_rate.requests) == (None, 0)
    assert counts is None  # not fed by KV events (approximate mode)


def test_a_bare_indexer_has_no_hit_rate():
    registry = CollectorRegistry()
    KvEventMetrics(registry)
    kv_app(registry)  # the indexer's own series beside the ingestion counters
    hit_rate, counts = read_metrics(text(registry))
    assert hit_rate is None and counts == EventCounts(applied=0, failed=0)


def test_text_that_is_not_prometheus_is_an_error():
    with pytest.raises(MetricsError, match="not Prometheus text"):
        read_metrics("<html>oops</html>\n")


@pytest.mark.parametrize(
    ("before", "after", "seconds", "rate"),
    [
        (10, 40, 2.0, 15.0),
        (10, 10, 1.0, 0.0),
        (40, 10, 1.0, None),  # the target restarted
        (10, 40, 0.0, None),
    ],
)
def test_events_per_second_from_two_readings(before, after, seconds, rate):
    assert (
        events_per_second(
            EventCounts(applied=before, failed=0), EventCounts(applied=after, failed=0), seconds
        )
        == rate
    )
    assert events_per_second(None, EventCounts(applied=after, failed=0), seconds) is None
