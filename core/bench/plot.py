"""``--plot out.png``: TTFT CDF and output throughput over time (needs the ``plot`` extra)."""

from __future__ import annotations

import math
from pathlib import Path

from dyn.core.bench.metrics import RequestRecord
from dyn.core.bench.report import BenchResult
from dyn.core.errors import ConfigError


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'dyn[plot]'") from None


def token_arrivals(record: RequestRecord) -> list[tuple[float, float]]:
    """``(seconds into the run, tokens)`` of each output chunk of a request, as the client read
    them: the first at its TTFT, the next after each inter-chunk gap, the request's output tokens
    shared evenly among them; a request with no first chunk recorded, all at its end."""
    if record.ttft_s is None:
        return [(record.end_s, float(record.output_tokens))]
    at = record.start_s + record.ttft_s
    times = [at]
    for gap in record.itl_s:
        at += gap
        times.append(at)
    share = record.output_tokens / len(times)
    return [(t, share) for t in times]


def throughput_series(result: BenchResult, bin_s: float) -> tuple[list[float], list[float]]:
    """Output tokens per second in bins of ``bin_s`` seconds, by when the tokens arrived (a
    request's tokens counted at its end would show a long reply as one spike)."""
    arrivals = [a for r in result.requests if r.error is None for a in token_arrivals(r)]
    if not arrivals:
        return [], []
    bins = [0.0] * (math.floor(max(t for t, _ in arrivals) / bin_s) + 1)
    for t, tokens in arrivals:
        bins[math.floor(t / bin_s)] += tokens / bin_s
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
