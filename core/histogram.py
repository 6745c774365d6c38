"""One Prometheus histogram series observed without a lock, for the router's per-decision
histograms (seven observations a routing decision).

prometheus_client's ``Histogram.observe`` takes a lock twice (the sum, then the bucket) and
walks the buckets in Python: 0.67 µs an observation here, about a tenth of a 1,024-worker
decision (docs/architecture.md, "Written by hand, and why"). ``LocklessHistogram.observe`` is a
bisection and two additions (0.15 µs). The price is the lock: observations and scrapes must
come from one thread, which they do in dyn's services (the router observes on its event loop,
and ``/metrics`` renders the registry on the same loop).

A ``LocklessHistogram`` is one series with fixed label values, registered on ``registry`` as a
collector and exposed as prometheus_client exposes a histogram's series: cumulative ``_bucket``
samples up to ``le="+Inf"``, ``_count``, ``_sum`` and ``_created``. Bucket ``i`` counts the
observations ``v <= buckets[i]`` above the previous bound, the library's rule. A
``LocklessHistogramFamily`` is a histogram whose series are made by ``labels(...)`` as the
library's are (the frontend's per-model histograms, six observations a request), exposed as one
family.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import INF, floatToGoString


class LocklessHistogram:
    """A histogram series ``name{labelnames=labelvalues}`` (see the module docstring)."""

    __slots__ = ("_name", "_documentation", "_labels", "_bounds", "_counts", "_sum", "_created")

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        labelvalues: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry | None,
    ) -> None:
        """``registry``: where the series is a collector of its own; None for a family's series."""
        if len(labelnames) != len(labelvalues):
            raise ValueError(f"{name}: {len(labelnames)} label names but {len(labelvalues)} values")
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: buckets must increase")
        if not bounds or bounds[-1] != INF:
            bounds.append(INF)
        self._name = name
        self._documentation = documentation
        self._labels = dict(zip(labelnames, (str(v) for v in labelvalues), strict=True))
        self._bounds = bounds
        self._counts = [0] * len(bounds)
        self._sum = 0.0
        self._created = time.time()
        if registry is not None:
            registry.register(self)

    def observe(self, amount: float) -> None:
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._sum += amount

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self._name, self._documentation, labels=list(self._labels))]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=list(self._labels))
        self.add_to(family)
        yield family

    def add_to(self, family: HistogramMetricFamily) -> None:
        """Append this series' samples to ``family`` (its name and labels)."""
        cumulative = 0
        buckets = []
        for bound, count in zip(self._bounds, self._counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        family.add_metric(list(self._labels.values()), buckets, self._sum)
        family.samples.append(Sample(f"{self._name}_created", dict(self._labels), self._created))


class LocklessHistogramFamily:
    """A histogram ``name`` labelled by ``labelnames``, one ``LocklessHistogram`` series per label
    values (``labels``), registered on ``registry`` as one collector."""

    __slots__ = ("_name", "_documentation", "_labelnames", "_buckets", "_series")

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = list(labelnames)
        self._buckets = list(buckets)
        self._series: dict[tuple[str, ...], LocklessHistogram] = {}
        registry.register(self)

    def labels(self, *values: str) -> LocklessHistogram:
        """The series of these label values, made at the first call."""
        key = tuple(str(v) for v in values)
        series = self._series.get(key)
        if series is None:
            series = LocklessHistogram(
                self._name, self._documentation, self._labelnames, key, self._buckets, None
            )
            self._series[key] = series
        return series

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for series in self._series.values():
            series.add_to(family)
        yield family
