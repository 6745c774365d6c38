"""``dyn bench``: build the workload, print its shape (``--dry-run``) or run it and report.

``run_bench`` is the whole command: it validates everything before sending anything, finds the
served model at ``/v1/models`` when none is named, shows a rich progress bar while the load runs,
prints the summary tables, and writes ``--output`` (a ``BenchResult``) and ``--plot``. It returns
the process exit status: 0 when every request succeeded, 1 when some failed or the run was
interrupted, 2 for a usage error (raised as ``ConfigError``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dyn.core.bench.client import ClientOptions
from dyn.core.bench.metrics import RequestRecord, summarize
from dyn.core.bench.report import BenchResult, print_summary, writable, write_result
from dyn.core.bench.runner import LoadSettings, RunOutcome, run_load
from dyn.core.bench.spec import WorkloadSpec
from dyn.core.bench.trace import TraceError
from dyn.core.bench.workloads import Workload, shape
from dyn.core.errors import ConfigError


@dataclass(frozen=True)
class BenchSettings:
    spec: WorkloadSpec
    load: LoadSettings
    url: str | None = None
    model: str | None = None
    api_key: str | None = None
    nvext: bool = True
    agent_ids: bool = False
    ignore_eos: bool = True
    timeout_s: float = 600.0
    output: str | None = None
    plot: str | None = None
    dry_run: bool = False
    progress: bool = True


def shape_table(info: dict[str, Any]) -> Table:
    table = Table(title="Workload", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    for key, value in info.items():
        if isinstance(value, float):
            value = f"{value:.1%}" if key == "theoretical_hit_rate" else f"{value:.2f}"
        table.add_row(key.replace("_", " "), "-" if value is None else str(value))
    return table


def prepare(settings: BenchSettings) -> Workload:
    """The workload, after checking every setting; ``ConfigError`` names what to fix."""
    try:
        settings.load.validate()
        workload = settings.spec.build()
    except (ValueError, TraceError) as exc:
        raise ConfigError(str(exc)) from None
    if not settings.dry_run and not settings.url:
        raise ConfigError(
            "--url is required (the server's base URL, e.g. http://127.0.0.1:8000), unless --dry-run"
        )
    if settings.url and not settings.url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {settings.url!r} must start with http:// or https://")
    for flag, path in (("--output", settings.output), ("--plot", settings.plot)):
        if path and not settings.dry_run:
            writable(flag, path)
    if settings.plot and not settings.dry_run:
        from dyn.core.bench.plot import require_matplotlib

        require_matplotlib()
    return workload


async def served_model(url: str, api_key: str | None) -> str:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else None
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            response = await client.get(url.rstrip("/") + "/v1/models", headers=headers)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach {url}: {exc or type(exc).__name__}") from None
    if response.status_code in (401, 403):
        raise ConfigError(f"{url}/v1/models answered {response.status_code}; pass the server's --api-key")
    if response.status_code != 200:
        raise ConfigError(f"{url}/v1/models answered {response.status_code}; name the model with --model")
    try:
        models = [m["id"] for m in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(
            f"{url}/v1/models did not answer like an OpenAI server; "
            "check --url or name the model with --model"
        ) from None
    if not models:
        raise ConfigError(f"{url} serves no model yet; start a worker or name one with --model")
    return models[0]


def run_bench(settings: BenchSettings, console: Console) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    workload = prepare(settings)
    info = shape(workload)
    console.print(shape_table(info))
    if settings.dry_run:
        return 0
    assert settings.url is not None
    model = settings.model or anyio.run(served_model, settings.url, settings.api_key)
    options = ClientOptions(
        model=model,
        nvext=settings.nvext,
        ignore_eos=settings.ignore_eos,
        timeout_s=settings.timeout_s,
        api_key=settings.api_key,
        agent_ids=settings.agent_ids,
    )
    outcome = _run_with_progress(workload, settings.url, settings, options, console)
    summary = summarize(outcome.records, grouped=workload.grouped, block_size=workload.block_size)
    config = {
        **dataclasses.asdict(settings.load),
        "url": settings.url,
        "model": model,
        "nvext": settings.nvext,
        "ignore_eos": settings.ignore_eos,
        "interrupted": outcome.interrupted,
    }
    result = BenchResult(kind="live", workload=info, config=config, summary=summary, requests=outcome.records)
    print_summary(result, console)
    try:
        if settings.output:
            write_result(settings.output, result)
            console.print(f"results written to {settings.output}")
        if settings.plot:
            from dyn.core.bench.plot import plot_result

            plot_result(result, settings.plot)
            console.print(f"plot written to {settings.plot}")
    except OSError as exc:
        raise ConfigError(f"cannot write {exc.filename}: {exc.strerror}") from None
    return 0 if summary.failed == 0 and not outcome.interrupted else 1


def _run_with_progress(
    workload: Workload, url: str, settings: BenchSettings, options: ClientOptions, console: Console
) -> RunOutcome:
    total = 0  # whole units start until the bound is reached, as the runner does
    for unit in workload.units:
        if settings.load.max_requests is not None and total >= settings.load.max_requests:
            break
        total += unit.num_requests
    progress = Progress(
        TextColumn("[bold]requests"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
        console=console,
        disable=not settings.progress,
        transient=False,
    )
    task = progress.add_task("requests", total=total, failed=0)
    failed = 0

    def on_record(record: RequestRecord) -> None:
        nonlocal failed, total
        failed += record.error is not None
        total += record.tool_round > 0  # tool rounds are known only once a reply asks for them
        progress.update(task, advance=1, failed=failed, total=total)

    with progress:
        return anyio.run(run_load, workload, url, options, settings.load, on_record)
