"""``dyn bench compare A.json B.json``: the change from run A to run B, metric by metric.

``compare_rows`` lists ``(metric, a, b, delta, relative)`` for throughput, latency percentiles,
the cached-token and history cached ratios, duplicate prefills and failures; ``relative`` is ``(b - a) / a`` (None
when ``a`` is 0 or a value is missing). ``better`` says which direction is an improvement.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from dyn.core.bench.metrics import Summary
from dyn.core.bench.report import BenchResult

RATIOS = {"cached_token_ratio", "history_cached_ratio"}
HIGHER_IS_BETTER = {"request_throughput", "output_throughput", *RATIOS}


def _metrics(summary: Summary) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        "request_throughput": summary.request_throughput,
        "output_throughput": summary.output_throughput,
    }
    for name in ("ttft_s", "itl_s", "tpot_s", "e2e_s", "queue_s"):
        dist = getattr(summary, name)
        for q in ("mean", "p50", "p90", "p99"):
            out[f"{name[:-2]}_{q}_ms"] = None if getattr(dist, q) is None else getattr(dist, q) * 1000
    out["cached_token_ratio"] = summary.cached_token_ratio
    out["history_cached_ratio"] = summary.history_cached_ratio
    out["duplicate_prefills"] = (
        None if summary.duplicate_prefills is None else float(summary.duplicate_prefills)
    )
    out["failed"] = float(summary.failed)
    return out


def compare_rows(a: BenchResult, b: BenchResult) -> list[dict[str, Any]]:
    ma, mb = _metrics(a.summary), _metrics(b.summary)
    rows = []
    for name, va in ma.items():
        vb = mb[name]
        delta = None if va is None or vb is None else vb - va
        relative = None if delta is None or not va else delta / va
        better = None
        if delta:
            better = (delta > 0) == (name in HIGHER_IS_BETTER)
        rows.append(
            {"metric": name, "a": va, "b": vb, "delta": delta, "relative": relative, "better": better}
        )
    return rows


def _fmt(value: float | None, name: str) -> str:
    if value is None:
        return "-"
    if name in RATIOS:
        return f"{value:.1%}"
    return f"{value:.2f}"


def compare_table(rows: list[dict[str, Any]], a_name: str, b_name: str) -> Table:
    table = Table(title=f"{a_name} -> {b_name}", title_justify="left")
    for column in ("metric", "A", "B", "delta", "change"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for row in rows:
        name = row["metric"]
        delta = row["delta"]
        if delta is None:
            delta_text = "-"
        elif name in RATIOS:
            delta_text = f"{delta * 100:+.1f} pt"
        else:
            delta_text = f"{delta:+.2f}"
        change = "-" if row["relative"] is None else f"{row['relative']:+.1%}"
        style = {True: "green", False: "red"}.get(row["better"], "")
        table.add_row(
            name,
            _fmt(row["a"], name),
            _fmt(row["b"], name),
            f"[{style}]{delta_text}[/]" if style else delta_text,
            change,
        )
    return table
