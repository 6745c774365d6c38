"""Commands whose feature is not built yet: they say so in one line and exit with status 2."""

from __future__ import annotations

import typer

_ACCEPT_ANYTHING = {"allow_extra_args": True, "ignore_unknown_options": True}


def register(app: typer.Typer, name: str, summary: str, planned: str) -> None:
    """Add command ``name`` that prints ``"dyn NAME is not built yet: PLANNED"`` and exits 2."""

    def command(ctx: typer.Context) -> None:
        typer.echo(f"{ctx.command_path} is not built yet: {planned}", err=True)
        raise typer.Exit(2)

    command.__doc__ = f"{summary} (not built yet)"
    app.command(name, context_settings=_ACCEPT_ANYTHING, add_help_option=False)(command)
