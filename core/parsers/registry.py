"""Parsers by name: one registry per kind, filled by the modules of its package.

``Registry.register("hermes", "qwen25")`` is a class decorator; every module of the registry's
package is imported the first time a name is looked up, so a parser module needs no entry
anywhere else. ``load_plugin(path)`` imports a user's Python file (``--tool-parser-plugin``)
whose classes register themselves the same way.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar


class UnknownParserError(ValueError):
    """A parser name nobody registered; the message lists the known ones."""


class ParserUnavailable(RuntimeError):
    """A registered parser cannot run here (a package it needs is missing); the message says what
    to install. Parsers raise it from their ``check()`` classmethod, which servers call at start."""


class RegisteredParser(Protocol):
    """What a registry needs of a parser class: the name it is registered under and ``check()``."""

    name: ClassVar[str]

    @classmethod
    def check(cls) -> None: ...


P = TypeVar("P", bound=RegisteredParser)


class Registry(Generic[P]):
    """Parser classes of one kind by name (names compare case-insensitively, ``-`` as ``_``)."""

    def __init__(self, kind: str, package: str) -> None:
        self.kind = kind
        self.package = package
        self._classes: dict[str, type[P]] = {}
        self._loaded = False

    @staticmethod
    def _key(name: str) -> str:
        return name.strip().lower().replace("-", "_")

    def register(self, *names: str) -> Callable[[type[P]], type[P]]:
        """Register the decorated class under ``names`` (its first name is its ``name``)."""
        if not names:
            raise TypeError("register() needs at least one name")

        def decorate(cls: type[P]) -> type[P]:
            cls.name = names[0]
            for name in names:
                self._classes[self._key(name)] = cls
            return cls

        return decorate

    def _load(self) -> None:
        if self._loaded:
            return
        package = importlib.import_module(self.package)
        for module in pkgutil.iter_modules(package.__path__):
            if not module.name.startswith("_"):
                importlib.import_module(f"{self.package}.{module.name}")
        self._loaded = True

    def get(self, name: str) -> type[P]:
        """The class registered as ``name``; ``UnknownParserError`` names the known ones."""
        self._load()
        cls = self._classes.get(self._key(name))
        if cls is None:
            raise UnknownParserError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return cls

    def usable(self, name: str) -> type[P]:
        """``get(name)``, then the class's ``check()``: what a server calls at start, so a parser
        it cannot run is refused before the first request (``UnknownParserError`` or
        ``ParserUnavailable``, each with a message saying what to do)."""
        cls = self.get(name)
        cls.check()
        return cls

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        self._load()
        return sorted(self._classes)


def load_plugin(path: str | Path) -> None:
    """Import the Python file at ``path`` so the parsers it defines register themselves.
    ``ValueError`` says what went wrong (missing file, an error while importing it)."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"parser plugin {str(file)!r} is not a file")
    name = f"dyn_parser_plugin_{abs(hash(str(file.resolve()))):x}"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ValueError(f"parser plugin {str(file)!r} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ValueError(
            f"parser plugin {str(file)!r} failed to import: {type(exc).__name__}: {exc}"
        ) from None
