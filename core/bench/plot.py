"""``--plot out.png``: TTFT CDF and output throughput over time (needs the ``plot`` extra)."""

from __future__ import annotations

import math
from pathlib import Path

from dyn.core.bench.report import BenchResult
from dyn.core.errors import ConfigError


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'dyn[plot]'") from None


def throughput_series(result: BenchResult, bin_s: float) -> tuple[list[float], list[float]]:
    """Output tokens per second in bins of ``bin_s`` seconds, by request end time."""
    ok = [r for r in result.requests if r.error is None]
    if not ok:
        return [], []
    bins = [0.0] * (math.floor(max(r.end_s for r in ok) / bin_s) + 1)
    for r in ok:
        bins[math.floor(r.end_s / bin_s)] += r.output_tokens / bin_s
    return [i * bin_s for i in range(len(bins))], bins


def plot_result(result: BenchResult, path: str | Path) -> None:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ttfts = sorted(r.ttft_s * 1000 for r in result.requests if r.error is None and r.ttft_s is not None)
    fig, (cdf, tput) = plt.subplots(1, 2, figsize=(11, 4))
    if ttfts:
        cdf.plot(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))])
    cdf.set_xlabel("TTFT (ms)")
    cdf.set_ylabel("fraction of requests")
    cdf.set_title("TTFT CDF")
    cdf.grid(alpha=0.3)
    span = result.summary.duration_s
    bin_s = max(span / 50, 0.01)
    times, rates = throughput_series(result, bin_s)
    if rates:
        tput.stairs(rates, [*times, times[-1] + bin_s])
    tput.set_xlabel("time (s)")
    tput.set_ylabel("output tokens/s")
    tput.set_title("Output throughput")
    tput.grid(alpha=0.3)
    fig.suptitle(f"dyn bench: {result.workload.get('workload', '')} ({result.kind})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
