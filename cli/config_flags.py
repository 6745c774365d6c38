"""``config_flags``: turn a table of Typer options into one typed config parameter.

An engine has many flags; its commands take them as one validated config object instead of a
dozen loose values. ``config_flags(param, flags, build)`` makes a decorator that puts every option
of ``flags`` where the command's ``param`` parameter is (so ``--help`` keeps the command's own
order), and calls the command with ``param=build(values)``. ``build`` raises ``ValueError`` with a
sentence naming the flag; the command then exits with status 2 and that sentence.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import typer

Flags = Mapping[str, tuple[Any, Any]]
"""``{parameter name: (annotation, typer option)}``."""


def config_flags(param: str, flags: Flags,
                 build: Callable[[dict[str, Any]], Any]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A decorator replacing ``param`` of a command by ``flags``, handing it ``build(values)``."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command)
        params = list(signature.parameters.values())
        names = [p.name for p in params]
        if param not in names:
            raise TypeError(f"{command.__name__} needs a {param} parameter for its flags")
        at = names.index(param)
        kind = inspect.Parameter.KEYWORD_ONLY if params[at].kind == inspect.Parameter.KEYWORD_ONLY \
            else inspect.Parameter.POSITIONAL_OR_KEYWORD
        added = [inspect.Parameter(name, kind, default=option, annotation=annotation)
                 for name, (annotation, option) in flags.items()]
        own = params[:at] + params[at + 1:]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> None:
            values = {name: kwargs.pop(name) for name in flags}
            try:
                kwargs[param] = build(values)
            except ValueError as exc:
                raise typer.BadParameter(str(exc)) from None
            command(**kwargs)

        wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=params[:at] + added + params[at + 1:])
        wrapper.__annotations__ = {**{p.name: p.annotation for p in own},
                                   **{p.name: p.annotation for p in added}}
        return wrapper

    return decorate
