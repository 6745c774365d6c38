"""A benchmark run's result: the ``--output`` JSON file, the summary table, ``compare``.

``BenchResult`` is what ``dyn bench`` (live) and ``dyn bench replay --offline`` write with
``--output``: ``{"schema": "dyn-bench/1", "kind": "live"|"offline", "workload": {...shape},
"config": {...settings}, "summary": Summary, "requests": [RequestRecord, ...]}`` (see
``dyn.core.bench.metrics`` for the fields; times in seconds). ``read_result`` refuses a file
with another schema with a sentence saying so.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from dyn.core.bench.metrics import Distribution, RequestRecord, Summary
from dyn.core.errors import ConfigError

SCHEMA = "dyn-bench/1"


class ResultError(ValueError):
    """A results file that cannot be read; the message says which and why."""


class BenchResult(msgspec.Struct, kw_only=True):
    schema: str = SCHEMA
    kind: str
    workload: dict[str, Any]
    config: dict[str, Any]
    summary: Summary
    requests: list[RequestRecord]


def writable(flag: str, path: str) -> None:
    """Refuse, before the run, an output path whose folder does not exist or cannot be written."""
    folder = Path(path).expanduser().resolve().parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ConfigError(f"{flag} {path}: cannot write into {folder}; choose an existing, writable folder")


def write_result(path: str | Path, result: BenchResult) -> None:
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=1))


def read_result(path: str | Path) -> BenchResult:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ResultError(f"cannot read {path}: {exc.strerror}") from None
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ResultError(f"{path} is not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise ResultError(
            f'{path} is not a dyn bench result (expected "schema": "{SCHEMA}"); '
            "write one with dyn bench --output FILE"
        )
    try:
        return msgspec.json.decode(data, type=BenchResult)
    except msgspec.ValidationError as exc:
        raise ResultError(f"{path} is not a valid dyn bench result: {exc}") from None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


LATENCIES = (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s"), ("Queue", "queue_s"))
QUANTILES = ("mean", "p50", "p90", "p99", "max")


def latency_table(summary: Summary) -> Table:
    table = Table(title="Latency (ms)", title_justify="left")
    table.add_column("metric")
    table.add_column("n", justify="right")
    for q in QUANTILES:
        table.add_column(q, justify="right")
    for label, name in LATENCIES:
        dist: Distribution = getattr(summary, name)
        table.add_row(label, str(dist.count), *(_ms(getattr(dist, q)) for q in QUANTILES))
    for cls, dist in summary.ttft_by_class.items():
        table.add_row(f"TTFT {cls}", str(dist.count), *(_ms(getattr(dist, q)) for q in QUANTILES))
    return table


def totals_table(summary: Summary) -> Table:
    table = Table(title="Totals", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    ratio = summary.cached_token_ratio
    rows = [
        ("requests (ok / failed)", f"{summary.succeeded} / {summary.failed}"),
        ("duration", f"{summary.duration_s:.2f} s"),
        ("request throughput", f"{summary.request_throughput:.2f} req/s"),
        ("output throughput", f"{summary.output_throughput:.1f} tok/s"),
        ("prompt / cached tokens", f"{summary.prompt_tokens} / {summary.cached_tokens}"),
        ("cached-token ratio", "-" if ratio is None else f"{ratio:.1%}"),
    ]
    if summary.history_cached_ratio is not None:
        moves = summary.history_moves
        moved = "" if moves is None else f" ({moves} turn(s) on another worker)"
        rows.append(("history cached ratio", f"{summary.history_cached_ratio:.1%}{moved}"))
    if summary.duplicate_prefills is not None:
        rows.append(("duplicate prefills", str(summary.duplicate_prefills)))
    spread = summary.workers
    if spread.requests:
        rows.append(("workers (requests)", ", ".join(f"{w}: {n}" for w, n in spread.requests.items())))
        rows.append(("worker share max / min", f"{spread.max_share:.1%} / {spread.min_share:.1%}"))
    if summary.tool_calls or summary.tool_rounds:
        rows.append(("tool calls (invalid)", f"{summary.tool_calls} ({summary.invalid_tool_calls})"))
        rows.append(("tool rounds", str(summary.tool_rounds)))
    for kind, count in sorted(summary.errors.items()):
        rows.append((f"errors: {kind}", str(count)))
    for row in rows:
        table.add_row(*row)
    return table


def print_summary(result: BenchResult, console: Console) -> None:
    """The summary tables of a run, for people."""
    console.print(totals_table(result.summary))
    console.print(latency_table(result.summary))
