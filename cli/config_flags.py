"""``config_flags``: a config class's declared flags as one typed parameter of a command.

A config class declares its flags once (``dyn.core.config``: ``Annotated[T, Flag(...)]`` on its
fields). ``flag_table(config_type)`` turns those declarations into Typer options with their
environment twins; ``config_flags(param, config_type)`` makes a decorator that puts every one of
them where the command's ``param`` parameter is (so ``--help`` keeps the command's own order), and
calls the command with ``param`` set to the config built from the values (``Flag.parse`` applied,
then ``validate()`` when the class has one). A ``ValueError`` from parsing, building or validating
(a sentence naming the flag) makes the command exit with status 2 and that sentence. A flag two
config classes of one command declare is offered once: the decorator of the other class declares
it, and this one only reads its value (``reads``), so it must be applied above that one.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any

import typer

from dyn.cli.options import env_hint, flag
from dyn.core.config import build_from_flags, declared_flags

Flags = Mapping[str, tuple[Any, Any]]
"""``{parameter name: (annotation, typer option)}``."""

FROM_FLAGS: Any = None
"""The default of the parameter a ``config_flags`` decorator replaces (``discovery: DiscoveryConfig
= FROM_FLAGS``): Python wants one after the command's defaulted options, but the decorator always
passes the config built from the flags, never this. ``Any``, as Typer's option defaults are, so that
the parameter keeps the config's type."""


def flag_table(
    config_type: type, completers: Mapping[str, Callable[..., Any]] | None = None
) -> dict[str, tuple[Any, Any]]:
    """The Typer options of every flag ``config_type`` declares, by parameter name, in field order;
    ``completers``: the shell completer of the flags whose values are known names, by parameter."""
    table: dict[str, tuple[Any, Any]] = {}
    for setting in declared_flags(config_type):
        declared = setting.flag
        table[declared.param] = (
            setting.type,
            flag(
                setting.default,
                *declared.names,
                help=declared.help,
                panel=declared.panel,
                scope=declared.scope,
                hidden=declared.hidden,
                min=setting.ge,
                max=setting.le,
            ),
        )
    for name, complete in (completers or {}).items():
        table[name][1].autocompletion = complete
    return table


def validated(config_type: type) -> Callable[[dict[str, Any]], Any]:
    """The default builder: ``config_type`` from the flag values, then its ``validate()``."""

    def build(values: dict[str, Any]) -> Any:
        config = build_from_flags(config_type, values)
        check = getattr(config, "validate", None)
        if check is not None:
            check()
        return config

    return build


def config_flags(
    param: str,
    config_type: type,
    build: Callable[[dict[str, Any]], Any] | None = None,
    flags: Flags | None = None,
    reads: Collection[str] = (),
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A decorator replacing ``param`` of a command by the flags of ``config_type`` (or ``flags``),
    handing it ``build(values)`` (default: ``validated(config_type)``). ``reads``: parameters of
    ``config_type``'s flags that the command already has (another decorator, applied first,
    declared them): their values go into ``values`` too and stay the command's. ``TypeError``
    when one is missing."""
    table = dict(flags if flags is not None else flag_table(config_type))
    table = {name: option for name, option in table.items() if name not in reads}
    make = build or validated(config_type)

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command)
        params = list(signature.parameters.values())
        names = [p.name for p in params]
        if param not in names:
            raise TypeError(f"{command.__name__} needs a {param} parameter for its flags")
        absent = [name for name in reads if name not in names]
        if absent:
            raise TypeError(f"{command.__name__} has no {', '.join(absent)} for {param} to read")
        at = names.index(param)
        kind = (
            inspect.Parameter.KEYWORD_ONLY
            if params[at].kind == inspect.Parameter.KEYWORD_ONLY
            else inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        added = [
            inspect.Parameter(name, kind, default=option, annotation=annotation)
            for name, (annotation, option) in table.items()
        ]
        own = params[:at] + params[at + 1 :]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> None:
            values = {name: kwargs.pop(name) for name in table}
            values.update((name, kwargs[name]) for name in reads)
            try:
                kwargs[param] = make(values)
            except ValueError as exc:
                raise typer.BadParameter(env_hint(str(exc))) from None
            command(**kwargs)

        wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=params[:at] + added + params[at + 1 :]
        )
        wrapper.__annotations__ = {
            **{p.name: p.annotation for p in own},
            **{p.name: p.annotation for p in added},
        }
        return wrapper

    return decorate


def discovery_flags(command: Callable[..., None]) -> Callable[..., None]:
    """Put ``--namespace``, ``--discovery-backend`` and ``--discovery-dir`` where the command's
    ``discovery`` parameter is; the command receives one ``DiscoveryConfig``."""
    from dyn.core.config import DiscoveryConfig

    return config_flags("discovery", DiscoveryConfig)(command)
