"""``--help`` panels that never cut a flag's name, at any terminal width.

Typer lays each panel out as one table with a column per name kind (long, short, ``--no-``
twin), the value type and the help; at 80 columns the router's long flags are cut into
ambiguous stubs (``--router-kv-over…``). ``install()`` replaces that one step of Typer's rich
help (``typer.rich_utils._print_options_panel``, same arguments) with ``options_panel``: every
name of a flag in full (``--x / --no-x``), the value type only for flags that take a value (no
``<bool>``), and the help (with its env var and default, as Typer renders it) beside the names
when a panel's names fit in a third of the width, else below them, indented. If a later Typer
lays its help out differently, ``install()`` leaves it alone (``tests/cli/test_help_and_env.py``
then fails).
"""

from __future__ import annotations

from typing import Any

_INDENT = 4
_NAMES_SHARE = 0.4
"""Beside-the-names layout only while the names column takes at most this share of the width."""


def install() -> None:
    """Use ``options_panel`` for every command's ``--help`` (idempotent). Typer's rich help
    modules are patched when the first help is rendered: importing them costs a tenth of a
    second, which every ``dyn`` process that prints no help (every worker, frontend and test
    process) would pay at start."""
    from typer.core import TyperCommand, TyperGroup

    for cls in (TyperCommand, TyperGroup):
        if getattr(cls.format_help, "_dyn_layout", False):
            continue
        cls.format_help = _laid_out(cls.format_help)  # type: ignore[method-assign]


def _laid_out(format_help: Any) -> Any:
    def laid_out(self: Any, ctx: Any, formatter: Any) -> Any:
        _patch_rich_utils()
        return format_help(self, ctx, formatter)

    laid_out._dyn_layout = True  # type: ignore[attr-defined]
    return laid_out


def _patch_rich_utils() -> None:
    try:
        from typer import rich_utils
    except ImportError:  # pragma: no cover - rich is a dependency of typer
        return
    needed = ("_print_options_panel", "_get_parameter_help", "highlighter", "negative_highlighter")
    if all(hasattr(rich_utils, name) for name in needed):
        rich_utils._print_options_panel = options_panel


def option_names(param: Any) -> str:
    """``--a, -a / --no-a``: every name a parameter answers to, its negative half after ``/``."""
    names = ", ".join(param.opts)
    if getattr(param, "secondary_opts", None):
        names += " / " + ", ".join(param.secondary_opts)
    return names


def value_type(param: Any, ctx: Any) -> str:
    """What the flag's value looks like (``<int range> [0<=x<=65535]``); empty for an on/off flag."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    shown = param.display_type_rich(ctx=ctx) if hasattr(param, "display_type_rich") else None
    text = str(shown) if shown else ""
    range_help = getattr(param, "_get_number_range_help_str", None)
    described = range_help() if range_help is not None else None
    return f"{text} [{described}]" if described else text


def options_panel(*, name: str, params: list[Any], ctx: Any, markup_mode: Any, console: Any) -> None:
    """One ``--help`` panel titled ``name`` (the signature of Typer's ``_print_options_panel``)."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text
    from typer import rich_utils

    if not params:
        return
    rows = []
    for param in params:
        heading = Text(overflow="fold")
        if getattr(param, "param_type_name", "") == "argument":
            heading.append(str(getattr(param, "display_name_raw", None) or param.human_readable_name))
        else:
            heading.append_text(rich_utils.highlighter(", ".join(param.opts)))
        if getattr(param, "secondary_opts", None):
            heading.append(" / ")
            heading.append_text(rich_utils.negative_highlighter(", ".join(param.secondary_opts)))
        kind = value_type(param, ctx)
        if kind:
            heading.append(" ")
            heading.append_text(rich_utils.types_highlighter(Text(kind, style=rich_utils.STYLE_TYPES)))
        described = rich_utils._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)
        rows.append((heading, described))

    inner = max(20, (console.width or 80) - 4)
    widest = max(h.cell_len for h, _ in rows)
    if widest <= inner * _NAMES_SHARE:
        body: Any = Table(
            show_header=False, expand=True, box=None, pad_edge=False, padding=(0, 2, 0, 0), highlight=True
        )
        body.add_column(no_wrap=True, width=widest)
        body.add_column(ratio=1)
        for heading, described in rows:
            body.add_row(heading, described)
    else:
        body = Group(
            *(
                part
                for heading, described in rows
                for part in (heading, Padding(described, (0, 0, 0, _INDENT)))
            )
        )
    console.print(
        Panel(
            body,
            border_style=rich_utils.STYLE_OPTIONS_PANEL_BORDER,
            title=name,
            title_align=rich_utils.ALIGN_OPTIONS_PANEL,
        )
    )
