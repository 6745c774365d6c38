"""Shell completion for ``dyn``: the group class that answers it, and the values of ``str`` flags.

The generated ``completions/`` scripts (bash, zsh, fish) call back into ``dyn`` with
``_DYN_COMPLETE`` set; Typer then completes commands, flags and the values of ``Choice`` / ``Enum``
/ ``bool`` / ``Path`` options. Two things are dyn's own:

- ``CompletingGroup`` (the root group's class) answers zsh and fish with each description on one
  line. Typer renders a description through rich, which wraps it at the terminal width, and both
  shells read each line of the answer as a candidate: a long flag help would offer its second line
  as a value.
- A flag whose values live in a registry keeps its ``str`` type (its error names the registry) and
  passes one of the functions below as ``autocompletion=``: each takes the word typed so far and
  returns the values (with a description) that start with it. They run on every TAB, so they
  import little.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from typer import _completion_classes as typer_shells
from typer.core import TyperCommand, TyperGroup


def one_line(text: str) -> str:
    """A description without its rich markup (``dyn\\[plot]`` reads ``dyn[plot]``), on one line."""
    from rich.errors import MarkupError
    from rich.text import Text

    try:
        text = Text.from_markup(text).plain
    except MarkupError:
        pass
    return " ".join(text.split())


def _register(cls: type, shell: str) -> None:
    # newer Typers vendor click and re-export its registry setter here; older ones use click's own
    register = getattr(typer_shells, "add_completion_class", None)
    if register is None:
        from click.shell_completion import add_completion_class

        register = add_completion_class
    register(cls, shell)


class _ZshOneLine(typer_shells.ZshComplete):
    def format_completion(self, item: Any) -> str:
        def quoted(text: str) -> str:  # inside _arguments '...(("value":"help"))'
            return (
                text.replace('"', '""')
                .replace("'", "''")
                .replace("$", "\\$")
                .replace("`", "\\`")
                .replace(":", r"\\:")
            )

        if item.help:
            return f'"{quoted(item.value)}":"{quoted(one_line(item.help))}"'
        return f'"{quoted(item.value)}"'


class _FishOneLine(typer_shells.FishComplete):
    def format_completion(self, item: Any) -> str:
        return f"{item.value}\t{one_line(item.help)}" if item.help else f"{item.value}"


class CompletingGroup(TyperGroup):
    """Typer's group, completing zsh and fish with one-line descriptions (bash shows none)."""

    def _main_shell_completion(
        self, ctx_args: MutableMapping[str, Any], prog_name: str, complete_var: str | None = None
    ) -> None:
        _register(_ZshOneLine, "zsh")
        _register(_FishOneLine, "fish")
        super()._main_shell_completion(ctx_args, prog_name, complete_var)


class ChildFlagsCommand(TyperCommand):
    """A command that hands the flags it does not declare to child commands (``dyn serve``):
    completion offers the children's flags beside its own, and a child flag's values.
    ``children(ctx)`` returns the child commands (set by the subclass)."""

    children: Callable[[Any], list[Any]] = staticmethod(lambda ctx: [])

    def shell_complete(self, ctx: Any, incomplete: str) -> list[Any]:
        children = type(self).children(ctx)
        typed = ctx.args  # the words this command did not parse: the children's
        if typed and not incomplete.startswith("-"):
            option = _option_named(children, ctx, typed[-1])
            if option is not None and not option.is_flag and option.nargs == 1:
                return option.shell_complete(ctx, incomplete)
        items = super().shell_complete(ctx, incomplete)
        if incomplete.startswith("-"):
            seen = {item.value for item in items}
            seen.update(name for param in self.get_params(ctx) for name in param.opts + param.secondary_opts)
            item = _completion_item_class()
            for child in children:
                for param in child.get_params(ctx):
                    if param.param_type_name != "option" or param.hidden:
                        continue
                    for name in param.opts + param.secondary_opts:
                        if name.startswith(incomplete) and name not in seen:
                            seen.add(name)
                            items.append(item(name, help=param.help))
        return items


def _option_named(commands: list[Any], ctx: Any, name: str) -> Any:
    """The option called ``name`` of the first of ``commands`` that declares one, or None."""
    for command in commands:
        for param in command.get_params(ctx):
            if param.param_type_name == "option" and name in param.opts:
                return param
    return None


def _completion_item_class() -> Any:
    """Click's ``CompletionItem``, from the Click that Typer runs (it vendors its own)."""
    try:
        from typer._click.shell_completion import CompletionItem
    except ImportError:  # pragma: no cover - a Typer that uses Click itself
        from click.shell_completion import CompletionItem as ClickCompletionItem

        return ClickCompletionItem
    return CompletionItem


def router_modes(incomplete: str) -> list[tuple[str, str]]:
    """Every ``--router-mode`` (built-in first, then registered ones) starting with ``incomplete``."""
    from dyn.core.router.modes import BUILTIN_MODES, mode_names

    return [
        (name, BUILTIN_MODES[name].summary if name in BUILTIN_MODES else "registered mode")
        for name in mode_names()
        if name.startswith(incomplete)
    ]


def offline_router_modes(incomplete: str) -> list[tuple[str, str]]:
    """The ``--router-mode`` values the offline replay can use, starting with ``incomplete``."""
    from dyn.core.router.modes import mode_names

    offline = set(mode_names(offline=True))
    return [item for item in router_modes(incomplete) if item[0] in offline]


def log_levels(incomplete: str) -> list[str]:
    """``--log-level`` values starting with ``incomplete``."""
    from dyn.core.logs import LOG_LEVELS

    return [level for level in LOG_LEVELS if level.startswith(incomplete)]


def log_formats(incomplete: str) -> list[str]:
    """``--log-format`` values starting with ``incomplete``."""
    from dyn.core.logs import LOG_FORMATS

    return [fmt for fmt in LOG_FORMATS if fmt.startswith(incomplete)]
