"""``LocklessHistogram`` and ``LocklessHistogramFamily`` against prometheus_client's ``Histogram``:
the same observations give the same exposition text (but the creation time), and the registry
refuses a name twice."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from dyn.core.histogram import LocklessHistogram, LocklessHistogramFamily

BUCKETS = [0.001 * 2**i for i in range(15)]


def exposition(registry: CollectorRegistry) -> str:
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", generate_latest(registry).decode())


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(-1.0, 100.0) | st.sampled_from(BUCKETS), max_size=60))
def test_the_exposition_is_prometheus_clients(values):
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LocklessHistogram("x_ms", "Some phase (ms)", ["router_id"], ["r1"], BUCKETS, ours)
    reference = Histogram("x_ms", "Some phase (ms)", ["router_id"], buckets=BUCKETS, registry=theirs)
    child = reference.labels("r1")
    for v in values:
        mine.observe(v)
        child.observe(v)
    assert exposition(ours) == exposition(theirs)


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.floats(0.0, 50.0)), max_size=60))
def test_a_familys_series_are_exposed_as_prometheus_clients_labelled_histogram(values):
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LocklessHistogramFamily("t_seconds", "Time", ["model"], BUCKETS, ours)
    reference = Histogram("t_seconds", "Time", ["model"], buckets=BUCKETS, registry=theirs)
    for model, v in values:
        mine.labels(model).observe(v)
        reference.labels(model).observe(v)
    assert mine.labels("a") is mine.labels("a")  # made once; the library's child too:
    reference.labels("a")
    assert exposition(ours) == exposition(theirs)
    with pytest.raises(ValueError, match="Duplicated"):
        LocklessHistogramFamily("t_seconds", "Time", ["model"], BUCKETS, ours)


def test_a_name_is_registered_once_and_labels_must_match():
    registry = CollectorRegistry()
    LocklessHistogram("y_ms", "doc", ["a"], ["1"], BUCKETS, registry)
    with pytest.raises(ValueError, match="Duplicated"):
        LocklessHistogram("y_ms", "doc", ["a"], ["2"], BUCKETS, registry)
    with pytest.raises(ValueError, match="label"):
        LocklessHistogram("z_ms", "doc", ["a", "b"], ["1"], BUCKETS, registry)
    with pytest.raises(ValueError, match="increase"):
        LocklessHistogram("w_ms", "doc", [], [], [2.0, 1.0], registry)
