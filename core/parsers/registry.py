"""Parsers by name: one registry per kind, filled by the modules of its package.

``Registry.register("hermes", "qwen25")`` is a class decorator, and a parser module needs no entry
anywhere else: the first lookup scans the source of every module of the registry's package (not
importing them) for its ``@...register("name", ...)`` decorators, and ``get(name)`` then imports
only the module that registers ``name``, as vLLM's lazy registries do. ``names()`` lists the names
the scan found. A module whose registrations the scan cannot read (a ``register(...)`` call that
is not such a decorator with string names) is imported whenever a name is not found otherwise,
and by ``names()``, so every name is still found. ``load_plugin(path)`` imports a user's Python
file (``--tool-parser-plugin``) whose classes register themselves the same way, or with vLLM's
``ToolParserManager`` (adapted to dyn's parsers where vLLM is installed).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Generic, NamedTuple, Protocol, TypeVar


class UnknownParserError(ValueError):
    """A parser name nobody registered; the message lists the known ones."""


class ParserUnavailable(RuntimeError):
    """A registered parser cannot run here (a package it needs is missing); the message says what
    to install. Parsers raise it from their ``check()`` classmethod, which servers call at start."""


class ParserModelError(ValueError):
    """A parser cannot read the served model's output: the model lacks what the format needs (a
    ``response_template`` in its tokenizer_config.json, say); the message says what to fix.
    Parsers raise it from their ``check_tokenizer(tokenizer)`` classmethod, which the frontend
    calls when it knows the model (at start for its flags, per request for a worker's)."""


class RegisteredParser(Protocol):
    """What a registry needs of a parser class: the name it is registered under and ``check()``."""

    name: ClassVar[str]

    @classmethod
    def check(cls) -> None: ...


P = TypeVar("P", bound=RegisteredParser)

_DECORATOR = re.compile(r"^[ \t]*@[\w.]+\.register\(([^()]*)\)", re.MULTILINE)
"""A registration the scan reads: a decorator line ``@X.register("a", "b")`` (the arguments may
span lines). Such a line inside a string would be read as one too; the registry's tests compare
the scan of dyn's packages with what importing every module registers."""
_ANY_REGISTER = re.compile(r"\.register\(")


class Scan(NamedTuple):
    """What the sources of a package's modules register, read without importing them."""

    modules: dict[str, str]
    """Each registered name (compared as ``Registry`` compares them) -> the module that registers
    it (a name registered twice: the module imported last by an import of every module)."""
    opaque: tuple[str, ...]
    """Modules whose registrations the scan could not read: they must be imported to know them."""


def _decorated_names(source: str) -> list[str] | None:
    """The names ``source`` registers with ``@...register("a", ...)`` decorators, or None when it
    calls ``register(`` in any other way (or with anything but string literals)."""
    names: list[str] = []
    found = 0
    for match in _DECORATOR.finditer(source):
        found += 1
        try:
            args = ast.literal_eval(f"[{match.group(1)}]")
        except (ValueError, SyntaxError):
            return None
        if not args or not all(isinstance(a, str) for a in args):
            return None
        names.extend(args)
    if len(_ANY_REGISTER.findall(source)) != found:
        return None
    return names


def scan_package(paths: list[str], key: Callable[[str], str] = str) -> Scan:
    """Read which of the modules found on ``paths`` (a package's ``__path__``) registers which
    names; modules whose names start with ``_`` are skipped, as a registry's lookups skip them."""
    modules: dict[str, str] = {}
    opaque: list[str] = []
    for info in pkgutil.iter_modules(paths):
        if info.name.startswith("_"):
            continue
        names = None
        base = Path(getattr(info.module_finder, "path", ""))
        source = base / info.name / "__init__.py" if info.ispkg else base / f"{info.name}.py"
        try:
            names = _decorated_names(source.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            pass  # compiled only, or unreadable: importing it is the way to know
        if names is None:
            opaque.append(info.name)
            continue
        for name in names:
            modules[key(name)] = info.name
    return Scan(modules, tuple(opaque))


class Registry(Generic[P]):
    """Parser classes of one kind by name (names compare case-insensitively, ``-`` as ``_``)."""

    def __init__(self, kind: str, package: str) -> None:
        self.kind = kind
        self.package = package
        self._classes: dict[str, type[P]] = {}
        self._scan: Scan | None = None
        self._imported: set[str] = set()
        self._ready: set[str] = set()
        """Names whose module has been imported (or that no module registers): ``get`` answers
        them from ``_classes`` at once."""

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

    def scan(self) -> Scan:
        """Which module of the package registers which name (read once, from the sources)."""
        if self._scan is None:
            package = importlib.import_module(self.package)
            self._scan = scan_package(list(package.__path__), self._key)
        return self._scan

    def _import(self, module: str) -> None:
        if module not in self._imported:
            importlib.import_module(f"{self.package}.{module}")
            self._imported.add(module)

    def _find(self, key: str) -> None:
        """Import what may register ``key``: its module, else the modules the scan could not read."""
        scan = self.scan()
        module = scan.modules.get(key)
        if module is not None:
            self._import(module)
        if key not in self._classes:
            for other in scan.opaque:
                self._import(other)
        if key in self._classes:
            self._ready.add(key)

    def get(self, name: str) -> type[P]:
        """The class registered as ``name``; ``UnknownParserError`` names the known ones."""
        key = self._key(name)
        if key not in self._ready:
            self._find(key)
        cls = self._classes.get(key)
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

    def provides(self, name: str) -> bool:
        """Whether a module of the registry's package registers ``name`` (a plugin's parser
        registered under it gives way to that module's, see ``get``)."""
        return self._key(name) in self.scan().modules

    def names(self) -> list[str]:
        """Every registered name, sorted (the scan's, and those registered by plugins or by the
        modules the scan could not read, which this imports)."""
        scan = self.scan()
        for module in scan.opaque:
            self._import(module)
        return sorted(set(scan.modules) | set(self._classes))


def load_plugin(path: str | Path) -> None:
    """Import the Python file at ``path`` so the parsers it defines register themselves: dyn's
    (``@TOOL_PARSERS.register``), or vLLM's (``@ToolParserManager.register_module``) when vLLM's
    parser classes are importable here, each adapted by ``dyn.core.parsers.tool._vllm_plugin``.
    ``ValueError`` says what went wrong (missing file, an error while importing it, a vLLM plugin
    where vLLM is not installed or one that cannot be adapted)."""
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
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "vllm":
            raise ValueError(_vllm_missing(file, exc.name or "vllm")) from None
        raise ValueError(
            f"parser plugin {str(file)!r} failed to import: {type(exc).__name__}: {exc}"
        ) from None
    from dyn.core.parsers.tool import _vllm_plugin

    if _vllm_plugin.imports_vllm_parsers():
        try:
            _vllm_plugin.register_vllm_parsers(module, file)
        except ValueError:
            del sys.modules[name]
            raise
        except Exception as exc:
            del sys.modules[name]
            raise ValueError(
                f"parser plugin {str(file)!r}: its vLLM tool parsers could not be adapted: "
                f"{type(exc).__name__}: {exc}"
            ) from None


def _vllm_missing(file: Path, module: str) -> str:
    """Why a plugin importing the missing vLLM module ``module`` cannot load, and what to do."""
    dyn_api = (
        "a dyn.core.parsers.tool.ToolParser subclass (feed, finish, render) decorated with "
        '@TOOL_PARSERS.register("name"), as the README\'s "Tool-call parsers" says'
    )
    if importlib.util.find_spec("vllm") is None:
        return (
            f"parser plugin {str(file)!r} is written for vLLM (it imports {module}), which is not "
            "installed in the frontend's environment: install vLLM there to run the plugin as it "
            f"is, or write it against dyn's parser API instead, {dyn_api}"
        )
    return (
        f"parser plugin {str(file)!r} imports {module}, which the vLLM installed here does not "
        "have (vLLM 0.32 keeps ToolParser and ToolParserManager in vllm.tool_parsers); import "
        f"them from there, or write the plugin against dyn's parser API, {dyn_api}"
    )
