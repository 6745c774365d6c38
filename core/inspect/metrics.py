"""Reading the few series ``dyn inspect-kv`` shows from a target's Prometheus text.

- ``dynamo_component_router_kv_hit_rate`` (histogram, a KV router's predicted hit rate per routed
  request): summed over its label sets into a ``HitRate``; absent on a bare ``dyn indexer``.
- ``dynamo_component_kv_cache_events_applied_total{status, event_type}`` (counter, registered
  wherever an index is fed by KV events): summed into ``EventCounts``; absent otherwise (a router
  in approximate mode).

``events_per_second`` turns two readings into a rate; a counter that went down (the target
restarted) gives no rate rather than a negative one.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from dyn.core.inspect.snapshot import EventCounts, HitRate

HIT_RATE = "dynamo_component_router_kv_hit_rate"
EVENTS_APPLIED = "dynamo_component_kv_cache_events_applied"


class MetricsError(ValueError):
    """The text is not in the Prometheus exposition format."""


def read_metrics(text: str) -> tuple[HitRate | None, EventCounts | None]:
    """The hit rate and applied-event counts in ``text`` (None for a series it lacks)."""
    hit_sum = hit_count = 0.0
    applied = failed = 0.0
    has_hits = has_events = False
    try:
        for family in text_string_to_metric_families(text):
            if family.name == HIT_RATE:
                has_hits = True
                for sample in family.samples:
                    if sample.name == HIT_RATE + "_sum":
                        hit_sum += sample.value
                    elif sample.name == HIT_RATE + "_count":
                        hit_count += sample.value
            elif family.name == EVENTS_APPLIED:
                has_events = True
                for sample in family.samples:
                    if sample.name == EVENTS_APPLIED + "_total":
                        applied += sample.value
                        if sample.labels.get("status", "ok") != "ok":
                            failed += sample.value
    except ValueError as exc:
        raise MetricsError(f"the metrics are not Prometheus text ({exc})") from None
    hit_rate = (
        HitRate(mean=hit_sum / hit_count if hit_count else None, requests=int(hit_count))
        if has_hits
        else None
    )
    events = EventCounts(applied=int(applied), failed=int(failed)) if has_events else None
    return hit_rate, events


def events_per_second(before: EventCounts | None, after: EventCounts | None, seconds: float) -> float | None:
    """The applied-event rate between two readings ``seconds`` apart (None when unknown)."""
    if before is None or after is None or seconds <= 0 or after.applied < before.applied:
        return None
    return (after.applied - before.applied) / seconds
