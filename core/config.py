"""Settings declared once: a config field carries its flag, help, range and environment twin.

A config class (a ``msgspec.Struct`` or a dataclass) annotates each field that a user can set
from the command line with ``Annotated[T, Flag(...)]`` and, for a range, ``msgspec.Meta(ge=...,
le=...)`` (on the number type of an optional field: ``Annotated[Annotated[float, Meta(ge=0.0)] |
None, Flag(...)]``). The field's name, type and default stay where they are; ``Flag`` adds what
only the command line needs (the flag names, the help text, the ``--help`` panel, a parser when the flag's
text is not the field's value). ``declared_flags`` reads the declarations back, in field order;
``dyn.cli.config_flags`` turns them into Typer options, and the environment twin follows from the
long flag name (``--block-size`` is ``DYN_BLOCK_SIZE``). Core stays free of Typer: this module
only describes.

``DiscoveryConfig`` is the one such class every process shares: where it finds its peers
(``--namespace``, ``--discovery-backend``, ``--discovery-dir``, ``--etcd-endpoints`` in every
command that registers or looks up instances; every service's settings hold one). It lives here, not in
``dyn.core.discovery``, so that building the command line never imports the discovery stores.

Contract of ``Flag``:
- ``names``: the long name first (``--block-size``; ``--x/--no-x`` for an on/off pair), aliases
  after it. The command parameter is named after the long flag (``--num-gpu-blocks-override`` is
  ``num_gpu_blocks_override``), whatever the field is called.
- ``parse``: turns the flag's value (of type ``cli_type``, the field's type when not given) into
  the field's value; it raises ``ValueError`` with a sentence naming the flag.
- ``default``: the flag's default when it is not the field's (a flag that reads ``16.0`` as text).
- A range on ``cli_type`` (``Annotated[int, Meta(ge=0)]``) is the flag's range when it differs from
  the field's (``--router-queue-limit 0`` means no limit, ``None``).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

if TYPE_CHECKING:
    from dyn.core.discovery.store import DiscoveryStore

_UNSET: Any = object()


@dataclass(frozen=True)
class Flag:
    """How a config field is set from the command line (see the module docstring)."""

    names: tuple[str, ...]
    help: str
    panel: str | None = None
    hidden: bool = False
    cli_type: Any = None
    parse: Callable[[Any], Any] | None = None
    default: Any = _UNSET
    scope: str | None = None
    """Scopes the flag's environment twin to one command (``--seed`` of ``dyn bench`` is
    ``DYN_BENCH_SEED``; ``dyn.cli.options.env_name``); None: ``DYN_`` plus the long name."""

    @property
    def long_name(self) -> str:
        """The first long name without its ``--no-`` half: ``--enable-prefix-caching``."""
        return next(n for n in self.names if n.startswith("--")).split("/")[0]

    @property
    def param(self) -> str:
        """The command parameter the flag fills: ``--max-num-seqs`` -> ``max_num_seqs``."""
        return self.long_name.lstrip("-").replace("-", "_")


def flag(
    *names: str,
    help: str,
    panel: str | None = None,
    hidden: bool = False,
    cli_type: Any = None,
    parse: Callable[[Any], Any] | None = None,
    default: Any = _UNSET,
    scope: str | None = None,
) -> Flag:
    """A ``Flag`` for ``Annotated[T, flag("--name", help=...)]``."""
    return Flag(names, help, panel, hidden, cli_type, parse, default, scope)


@dataclass(frozen=True)
class Setting:
    """One field's declaration read back: what the CLI needs to offer it."""

    field: str
    flag: Flag
    type: Any
    """The type the flag takes (``Flag.cli_type``, else the field's type)."""
    default: Any
    ge: float | None = None
    le: float | None = None

    def value(self, given: Any) -> Any:
        """The field's value for the flag's ``given`` value (``Flag.parse`` applied)."""
        return self.flag.parse(given) if self.flag.parse is not None else given


@functools.cache
def declared_flags(config_type: type) -> tuple[Setting, ...]:
    """Every field of ``config_type`` declared with a ``Flag``, in field order. Read once per type:
    resolving the string annotations compiles each of them, and the CLI asks for the same types
    about 60 times at start (250 ms of every ``dyn`` process's start, before this cache)."""
    hints = typing.get_type_hints(config_type, include_extras=True)
    settings = []
    for name, default in _fields(config_type):
        hint = hints[name]
        if typing.get_origin(hint) is not typing.Annotated:
            continue
        base, *extras = typing.get_args(hint)
        declared = next((e for e in extras if isinstance(e, Flag)), None)
        if declared is None:
            continue
        ranged = declared.cli_type if declared.cli_type is not None else hint
        ge, le = _range(ranged)
        settings.append(
            Setting(
                field=name,
                flag=declared,
                type=_plain(declared.cli_type or base),
                default=default if declared.default is _UNSET else declared.default,
                ge=ge,
                le=le,
            )
        )
    return tuple(settings)


def build_from_flags(config_type: type, values: dict[str, Any], **fixed: Any) -> Any:
    """``config_type`` built from flag values keyed by ``Flag.param``, plus ``fixed`` fields."""
    return config_type(**fields_from_flags(config_type, values), **fixed)


def fields_from_flags(config_type: type, values: dict[str, Any]) -> dict[str, Any]:
    """``{field: value}`` for the declared flags of ``config_type`` found in ``values``."""
    return {
        s.field: s.value(values[s.flag.param]) for s in declared_flags(config_type) if s.flag.param in values
    }


def _range(annotation: Any) -> tuple[Any, Any]:
    """The ``msgspec.Meta`` bounds on ``annotation``, on it or on a member of its union."""
    if typing.get_origin(annotation) is typing.Annotated:
        for extra in typing.get_args(annotation)[1:]:
            if isinstance(extra, msgspec.Meta) and (extra.ge is not None or extra.le is not None):
                return extra.ge, extra.le
        return _range(typing.get_args(annotation)[0])
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        for member in typing.get_args(annotation):
            bounds = _range(member)
            if bounds != (None, None):
                return bounds
    return None, None


def _plain(annotation: Any) -> Any:
    """``annotation`` without its ``Annotated`` layers (what Typer reads)."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _plain(typing.get_args(annotation)[0])
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return functools.reduce(operator.or_, (_plain(a) for a in typing.get_args(annotation)))
    return annotation


def _fields(config_type: type) -> Iterator[tuple[str, Any]]:
    if isinstance(config_type, type) and issubclass(config_type, msgspec.Struct):
        for info in msgspec.structs.fields(config_type):
            default = info.default
            if default is msgspec.NODEFAULT:
                default = ... if info.default_factory is msgspec.NODEFAULT else info.default_factory()
            yield info.name, default
        return
    if not dataclasses.is_dataclass(config_type):
        raise TypeError(f"{config_type!r} is neither a msgspec Struct nor a dataclass")
    for field in dataclasses.fields(config_type):
        if field.default is not dataclasses.MISSING:
            yield field.name, field.default
        elif field.default_factory is not dataclasses.MISSING:
            yield field.name, field.default_factory()
        else:
            yield field.name, ...


ENGINE_PANEL = "Engine"
"""The ``--help`` panel of an engine's own flags."""
MODEL_PANEL = "Model"
"""The ``--help`` panel of the model flags."""
WORKER_PANEL = "Worker and discovery"
"""The ``--help`` panel of where a process lives and how it registers."""
SECURITY_PANEL = "Security"
"""The ``--help`` panel of the API key, the plane keys and TLS."""
PARSERS_PANEL = "Tools and reasoning"
"""The ``--help`` panel of the tool-call and reasoning parsers and what they shape."""


class DiscoveryConfig(msgspec.Struct, kw_only=True, frozen=True):
    """The discovery store a process uses: ``backend`` for ``namespace``, rooted at ``dir``."""

    namespace: Annotated[
        str,
        flag(
            "--namespace",
            panel=WORKER_PANEL,
            help="Namespace that isolates one stack from another on this machine.",
        ),
    ] = "default"
    backend: Annotated[
        str,
        flag(
            "--discovery-backend",
            panel=WORKER_PANEL,
            help="Discovery store: file (workers on one machine) or etcd (any machines; see --etcd-endpoints).",
        ),
    ] = "file"
    dir: Annotated[
        str | None,
        flag(
            "--discovery-dir",
            panel=WORKER_PANEL,
            help="Root directory of the file discovery store "
            "(default: $XDG_RUNTIME_DIR/dyn, else /tmp/dyn-$UID).",
        ),
    ] = None
    etcd_endpoints: Annotated[
        str | None,
        flag(
            "--etcd-endpoints",
            panel=WORKER_PANEL,
            help="etcd client URLs of the etcd discovery backend, comma-separated "
            "(default: http://127.0.0.1:2379).",
        ),
    ] = None

    def open(self) -> DiscoveryStore:
        """The store (``open_store``); ``ValueError`` for an unknown backend, a bad namespace,
        malformed etcd endpoints, or (``ConfigError``) an etcd that does not answer."""
        from dyn.core.discovery.backends import open_store

        return open_store(self.backend, self.namespace, self.dir, etcd_endpoints=self.etcd_endpoints)
