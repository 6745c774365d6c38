"""The ``dyn`` command: one Typer app, one module per subcommand, imported when it runs.

Each subcommand's module (``dyn.cli.<name>``, dashes as underscores) has ``register(app)``, which
adds the command to a Typer app; the root group (``dyn.cli.lazy``) calls it when the command is
looked up, so ``dyn frontend`` imports neither the bench nor the engines' flags.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import typer

from dyn.cli import completion
from dyn.cli.help_layout import install as install_help_layout
from dyn.cli.lazy import Loader, lazy_group, typer_loader
from dyn.cli.options import flag

install_help_layout()

SUBCOMMANDS = ("frontend", "serve", "router", "indexer", "inspect-kv", "keys", "worker", "bench")
"""In the order ``dyn --help`` lists them."""


@functools.cache  # one table per process: each loader builds its command once
def _loaders() -> dict[str, Loader]:
    return {name: typer_loader(name, _register_from(name)) for name in SUBCOMMANDS}


def _register_from(name: str) -> Callable[[typer.Typer], None]:
    def register(holder: typer.Typer) -> None:
        importlib.import_module(f"dyn.cli.{name.replace('-', '_')}").register(holder)

    return register


app = typer.Typer(
    name="dyn",
    help="Serve LLMs to agent fleets: an OpenAI-compatible frontend with nvext, a KV-cache-aware "
    "router, engine workers, a KV indexer, a benchmark client and a KV inspector.\n\n"
    "Every flag has an environment twin: --some-flag is also DYN_SOME_FLAG. Every command takes "
    "--config FILE.yaml: its flags as a YAML mapping (the command line and the twins beat it).",
    no_args_is_help=True,
    add_completion=True,
    cls=lazy_group(completion.CompletingGroup, _loaders),
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
    ctx: typer.Context,
    log_level: str = flag(
        "info",
        "--log-level",
        help="Log level: debug, info, warning, error.",
        autocompletion=completion.log_levels,
    ),
    log_format: str = flag(
        "rich",
        "--log-format",
        help="Log format: rich (for people) or json (one object per line).",
        autocompletion=completion.log_formats,
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Options that apply to every command."""
    from dyn.core.logs import configure_logging
    from dyn.core.parent import follow_parent

    follow_parent()
    try:
        configure_logging(log_level, log_format, process=ctx.invoked_subcommand or "dyn")
    except ValueError as exc:
        from dyn.cli.options import env_hint

        raise typer.BadParameter(env_hint(str(exc), ctx)) from None


def main() -> None:
    """Console-script entry point. With ``--log-format json`` (or ``DYN_LOG_FORMAT=json``) Click's
    own errors (a bad flag value, say) are JSON error records too."""
    import os
    import sys

    from dyn.cli.options import expand_dotted, expand_multi_value

    args = expand_multi_value(expand_dotted(sys.argv[1:]))
    if _log_format(args, os.environ.get("DYN_LOG_FORMAT")) != "json":
        app(args=args)
        return
    sys.exit(_main_json(args))


def _log_format(args: list[str], from_env: str | None) -> str | None:
    """The ``--log-format`` the main options will see: the last one given before the command,
    else the environment's."""
    found = from_env
    for i, arg in enumerate(args):
        if not arg.startswith("-") and not _is_value(args, i):
            break
        if arg == "--log-format" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--log-format="):
            found = arg.split("=", 1)[1]
    return found


def _main_json(args: list[str]) -> int:
    """Run the app without Click's standalone error printing; its errors become log records."""
    import logging

    from dyn.core.logs import configure_logging

    command = next((a for i, a in enumerate(args) if not a.startswith("-") and not _is_value(args, i)), "dyn")
    configure_logging("info", "json", process=command)  # the main options configure it again
    try:
        code = app(args=args, standalone_mode=False)
    except typer.Abort:
        logging.getLogger("dyn.cli").error("aborted")
        return 1
    except typer.TyperException as exc:  # Click's usage errors: a bad flag or value
        hint = f" (see: dyn {command} --help)" if command != "dyn" else ""
        logging.getLogger("dyn.cli").error("%s%s", exc.format_message(), hint)
        return exc.exit_code
    return code if isinstance(code, int) else 0


def _is_value(args: list[str], i: int) -> bool:
    """Whether ``args[i]`` is the value of the main option before it (``--log-level info``)."""
    return i > 0 and args[i - 1] in ("--log-level", "--log-format")
