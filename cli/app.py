"""The ``dyn`` command: one Typer app, one module per subcommand."""

from __future__ import annotations

import typer

from dyn.cli import bench, frontend, indexer, inspect_kv, keys, router, serve, worker
from dyn.cli.options import flag

app = typer.Typer(
    name="dyn",
    help="Serve LLMs to agent fleets: an OpenAI-compatible frontend with nvext, a KV-cache-aware "
    "router, engine workers, a KV indexer, a benchmark client and a KV inspector.\n\n"
    "Every flag has an environment twin: --some-flag is also DYN_SOME_FLAG.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        import dyn.core

        typer.echo(f"dyn {dyn.core.__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    log_level: str = flag("info", "--log-level", help="Log level: debug, info, warning, error."),
    log_format: str = flag(
        "rich", "--log-format", help="Log format: rich (for people) or json (one object per line)."
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Options that apply to every command."""
    from dyn.core.logs import configure_logging
    from dyn.core.serve import follow_parent

    follow_parent()
    try:
        configure_logging(log_level, log_format)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


app.command("frontend")(frontend.frontend)
app.command("serve", context_settings=serve.CONTEXT_SETTINGS)(serve.serve)
app.command("router")(router.router)
app.add_typer(worker.app, name="worker")
app.command("indexer")(indexer.indexer)
app.add_typer(bench.app, name="bench")
app.command("inspect-kv")(inspect_kv.inspect_kv)
app.command("keys")(keys.keys)


def main() -> None:
    """Console-script entry point."""
    app()
