"""``dyn bench``: agentic load against any OpenAI-compatible server; ``compare``; ``replay``."""

from __future__ import annotations

import sys

import typer

from dyn.cli import bench_replay
from dyn.cli.config_flags import FROM_FLAGS, config_flags, flag_table
from dyn.cli.options import flag
from dyn.core.bench.config import BenchConfig
from dyn.core.config import build_from_flags

app = typer.Typer(
    help="Agentic load client and trace replay for any OpenAI-compatible server.",
    no_args_is_help=True,
    invoke_without_command=True,
)


@app.callback()
@config_flags(
    "config",
    BenchConfig,
    build=lambda values: build_from_flags(BenchConfig, values),
    flags=flag_table(BenchConfig),
)
def bench(ctx: typer.Context, config: BenchConfig = FROM_FLAGS) -> None:
    """Agentic load against any OpenAI-compatible server (dyn or not): pick one workload, then
    --concurrency or --request-rate. Subcommands: compare two results, replay a trace offline."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.console import Console

    from dyn.core.bench.live import run_bench
    from dyn.core.errors import ConfigError

    try:
        status = run_bench(config.settings(), Console())
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(status)


@app.command("compare")
def compare(
    a: str = typer.Argument(..., help="Results of the baseline run (dyn bench --output)."),
    b: str = typer.Argument(..., help="Results of the run to compare with it."),
    json_out: bool = flag(False, "--json", help="Print the rows as JSON instead of a table."),
) -> None:
    """Compare two results files: each metric's change from A to B (green: better)."""
    import orjson
    from rich.console import Console

    from dyn.core.bench.compare import compare_rows, compare_table
    from dyn.core.bench.report import ResultError, read_result

    try:
        rows = compare_rows(read_result(a), read_result(b))
    except ResultError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if json_out:
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        Console().print(compare_table(rows, a, b))


app.command("replay")(bench_replay.replay)


def register(root: typer.Typer) -> None:
    """Add ``dyn bench`` to ``root`` (``dyn.cli.app``'s loaders)."""
    root.add_typer(app, name="bench")
