"""Subcommands imported when they are first used, so a ``dyn`` process imports only its own.

Every ``dyn`` process is a command line: ``dyn serve`` starts ``dyn frontend`` and ``dyn worker
mocker`` children, and each used to import every command's module (the bench, the replay and
every engine's flag declarations) before running its own. A group made by ``lazy_group`` knows its
subcommands by name and builds one from its loader when Click asks for it by name; listing the
names (``list_commands``, iterating ``commands``) builds nothing, and only help and completion, which
show every subcommand's description, build them all.

A loader returns the Click command of one name, built once (``typer_loader`` caches it): Typer
converts an app afresh on every ``typer.main.get_command`` call, and there is no need to build a
command again for each.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, ItemsView, Iterator, MutableMapping, ValuesView
from typing import Any

import typer
from typer.core import TyperGroup

Loader = Callable[[], Any]
"""Builds one subcommand's Click command."""


class LazyCommands(MutableMapping[str, Any]):
    """A group's ``commands``: names in their listed order, each command built at its first lookup."""

    def __init__(self, built: MutableMapping[str, Any], loaders: dict[str, Loader]) -> None:
        self._built = dict(built)
        self._loaders = loaders
        self._order = list(loaders) + [name for name in built if name not in loaders]

    def __getitem__(self, name: str) -> Any:
        command = self._built.get(name)
        if command is None:
            loader = self._loaders.get(name)
            if loader is None:
                raise KeyError(name)
            command = loader()
            if command is None:  # the loader could not build it (a broken plugin): no such command
                del self._loaders[name]
                self._order.remove(name)
                raise KeyError(name)
            self._built[name] = command
        return command

    def items(self) -> ItemsView[str, Any]:
        self._build_all()
        return super().items()

    def values(self) -> ValuesView[Any]:
        self._build_all()
        return super().values()

    def _build_all(self) -> None:
        """Build every command, so that those that cannot be built leave the listing first."""
        for name in list(self._order):
            self.get(name)

    def __setitem__(self, name: str, command: Any) -> None:
        if name not in self._built and name not in self._loaders:
            self._order.append(name)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._built.pop(name, None)
        self._loaders.pop(name, None)
        self._order.remove(name)

    def __contains__(self, name: object) -> bool:
        return name in self._built or name in self._loaders

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)


def lazy_group(base: type[TyperGroup], loaders: Callable[[], dict[str, Loader]]) -> type[TyperGroup]:
    """A subclass of the Click group class ``base`` whose instances get their subcommands from
    ``loaders()`` (called once per instance: it may read entry points)."""

    class LazyGroup(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.commands: MutableMapping[str, Any] = LazyCommands(self.commands, dict(loaders()))

    LazyGroup.__name__ = LazyGroup.__qualname__ = f"Lazy{base.__name__}"
    return LazyGroup


def typer_loader(name: str, register: Callable[[typer.Typer], None]) -> Loader:
    """The loader of subcommand ``name`` that ``register`` adds to a Typer app (a command or a
    sub-app), converted as Typer converts it under dyn's root: rich help, ``--config``. A
    ``register`` that adds nothing (it warned why) makes the loader return None: no such command."""

    @functools.cache
    def load() -> Any:
        from dyn.cli import config_file

        holder = typer.Typer(rich_markup_mode="rich")
        holder.callback()(_no_options)  # a group, so the command keeps its name
        register(holder)
        config_file.install(holder)
        return typer.main.get_command(holder).commands.get(name)  # type: ignore[attr-defined]

    return load


def _no_options() -> None:
    """The holder's callback: never run (the command is run from dyn's root group)."""
