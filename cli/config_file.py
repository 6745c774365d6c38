"""``--config FILE.yaml`` on every ``dyn`` command: its flags read from a YAML mapping.

The file maps a command's long flag names to values (``max-num-seqs: 4``; ``max_num_seqs`` and
``--max-num-seqs`` name the same flag, ``no-enable-prefix-caching: true`` sets the ``--no-`` half,
an argument is named by its metavar, ``directory: DIR``). A value is given to the flag as the command
line would give it: scalars as their text (booleans ``true``/``false``), a list to a repeatable flag
as one value each, a list or mapping to any other flag as JSON, ``null`` leaves the flag at its
default. The flag's own conversion and checks run on it; an error names the file and the key.

Precedence is Click's: the command line beats the ``DYN_*`` environment twin, which beats the file,
which beats the defaults (the file's values are the command's ``default_map``). An operator's
environment override of a shared file is what Dynamo deployments rely on. One file per command:
``--config`` given twice is refused (as vLLM refuses it); its own twin is scoped by the command
(``DYN_SERVE_CONFIG``, ``DYN_VLLM_CONFIG``), so a stack's file never reaches ``dyn serve``'s children.

A key that is no flag of the command is refused (with close matches), except by commands that take
flags they do not declare (``dyn worker vllm`` / ``sglang`` pass them to their engine, ``dyn serve``
to its children): there it becomes command-line flags placed before the real ones, in vLLM's
``--config`` form (``true``: ``--key``, ``false``: ``--no-key``, a list: ``--key a b``, a mapping:
``--key JSON``), unless the command line gives that flag itself or its ``DYN_*`` twin is set. So
``dyn serve --config stack.yaml`` reads its own keys and routes the frontend's and the workers' to
the child that defines them exactly like flags typed after it, and a vLLM user's config file works
with ``dyn worker vllm``.

The file is bounded: at most ``MAX_BYTES``, YAML's safe subset only (no tags or objects), and at
most ``MAX_NODES`` values once aliases are expanded, so a "billion laughs" file is refused before
anything is built from it.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

MAX_BYTES = 1 << 20
MAX_NODES = 10_000
OPTION = "--config"
META_KEY = "dyn.config_file"
"""``ctx.meta[META_KEY][command path]``: the ``Loaded`` file of that command."""

HELP = (
    "Read flags from a YAML file: a mapping of long flag names to values (max-num-seqs: 4). "
    "The command line and DYN_* variables beat it."
)
HELP_PASSING = HELP + " Keys this command does not define are passed on like such flags."


class ConfigFileError(ValueError):
    """A config file that cannot be used; the message names the file (and the key)."""


@dataclass
class Passed:
    """A key that is no flag of the command, as the command-line flags it stands for."""

    key: str
    names: frozenset[str]
    """Flags that, given on the command line, make the file's value moot."""
    argv: list[str]


@dataclass
class Loaded:
    """What one command took from its config file."""

    path: str
    own: dict[str, tuple[str, Any]] = field(default_factory=dict)
    """``{parameter name: (key as written, value as written)}``."""
    passed: list[Passed] = field(default_factory=list)


def read_config(path: str) -> dict[str, Any]:
    """The mapping in ``path``; ``ConfigFileError`` for a file that is missing, too large, not
    YAML's safe subset, too large once its aliases are expanded, or not a mapping with string keys.
    An empty file is an empty mapping."""
    import yaml

    try:
        with open(path, "rb") as file:
            data = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise ConfigFileError(f"{path}: larger than {MAX_BYTES // 1024} KiB")
    try:
        loader = yaml.SafeLoader(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return {}
        _check_size(node, path)
        value = loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path}: not a usable YAML file: {_one_line(exc)}") from None
    finally:
        loader.dispose()
    if not isinstance(value, dict):
        raise ConfigFileError(
            f"{path}: must be a YAML mapping of flag names to values (max-num-seqs: 4), "
            f"not a {_yaml_kind(value)}"
        )
    for key in value:
        if not isinstance(key, str):
            raise ConfigFileError(f"{path}: key {key!r} is not a flag name")
    return value


def _check_size(root: Any, path: str) -> None:
    """Refuse a node graph that expands to more than ``MAX_NODES`` values, or refers to itself."""
    import yaml

    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: Any) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in open_nodes:
            raise ConfigFileError(f"{path}: an alias refers to the value that contains it")
        open_nodes.add(id(node))
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children: Iterable[Any] = node.value
        elif isinstance(node, yaml.MappingNode):
            children = (part for pair in node.value for part in pair)
        else:
            children = ()
        for child in children:
            total += size(child)
            if total > MAX_NODES:
                raise ConfigFileError(f"{path}: more than {MAX_NODES} values once its aliases are expanded")
        open_nodes.discard(id(node))
        sizes[id(node)] = total
        return total

    size(root)


def _one_line(exc: Exception) -> str:
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def _yaml_kind(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    return "single value" if value is not None else "null"


def flag_name(key: str) -> str:
    """``max_num_seqs``, ``--max-num-seqs`` -> ``max-num-seqs`` (underscores before the first dot,
    as vLLM reads ``--compilation_config.level``)."""
    name = key.strip().lstrip("-")
    head, dot, tail = name.partition(".")
    return head.replace("_", "-") + dot + tail


def _text(value: Any) -> str:
    """A YAML value as the command line would carry it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def _options(command: Any) -> list[Any]:
    return [p for p in command.params if getattr(p, "param_type_name", "") == "option"]


def _own_names(command: Any) -> dict[str, tuple[Any, bool]]:
    """``{flag name: (parameter, whether it is the --no- half)}`` of the keys ``command`` takes."""
    names: dict[str, tuple[Any, bool]] = {}
    for param in command.params:
        if param.name == "config" or not param.expose_value:
            continue
        if getattr(param, "param_type_name", "") == "argument":
            names[param.name.replace("_", "-")] = (param, False)
            continue
        for opt in param.opts:
            if opt.startswith("--"):
                names[opt[2:]] = (param, False)
        for opt in param.secondary_opts:
            if opt.startswith("--"):
                names[opt[2:]] = (param, True)
    return names


def _own_value(param: Any, negated: bool, value: Any, where: str) -> Any:
    """The ``default_map`` value of ``param`` for the file's ``value``."""
    if getattr(param, "is_flag", False):
        if negated:
            if not isinstance(value, bool):
                raise ConfigFileError(f"{where}: must be true or false, got {_text(value)!r}")
            return not value
        return value if isinstance(value, bool) else _text(value)
    if param.multiple:
        items = value if isinstance(value, list) else [value]
        return [_text(v) for v in items]
    if param.nargs != 1 and isinstance(value, list):
        return tuple(_text(v) for v in value)
    return _text(value)


def _all_flags(root: Any) -> dict[str, list[Any]]:
    """``{--flag: [parameters]}`` over every command under ``root``."""
    table: dict[str, list[Any]] = {}

    def walk(command: Any) -> None:
        for param in _options(command):
            for opt in (*param.opts, *param.secondary_opts):
                table.setdefault(opt, []).append(param)
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(root)
    return table


def _dyn_root(ctx: Any) -> Any:
    root = ctx.find_root().command
    if getattr(root, "commands", None):
        return root
    import typer.main

    from dyn.cli.app import app

    return typer.main.get_command(app)


def _passed(key: str, value: Any, dyn_flags: dict[str, list[Any]], where: str) -> Passed | None:
    """The flags a key the command does not define stands for; None: nothing to pass (a null, a
    false on/off flag, an empty list, a flag whose ``DYN_*`` twin is set)."""
    name = flag_name(key)
    flag = f"--{name}"
    if value is None:
        return None
    params = dyn_flags.get(flag)
    if params:
        param = params[0]
        twin = "DYN_" + name.upper().replace("-", "_")
        if os.environ.get(twin) and any(p.envvar == twin for p in params):
            return None  # the child reads its twin itself, and the twin beats the file
        names = frozenset((*param.opts, *param.secondary_opts))
        if getattr(param, "is_flag", False):
            if not isinstance(value, bool):
                raise ConfigFileError(f"{where}: must be true or false, got {_text(value)!r}")
            on = value != (flag in param.secondary_opts)
            positive = next((o for o in param.opts if o.startswith("--")), flag)
            negative = next((o for o in param.secondary_opts if o.startswith("--")), None)
            chosen = positive if on else negative
            return Passed(key, names, [chosen]) if chosen else None
        if param.multiple:
            items = value if isinstance(value, list) else [value]
            return Passed(key, names, [f"{flag}={_text(item)}" for item in items])
        return Passed(key, names, [f"{flag}={_text(value)}"])
    names = frozenset((flag, f"--no-{name}"))
    if isinstance(value, bool):
        return Passed(key, names, [flag if value else f"--no-{name}"])
    if isinstance(value, list):
        return Passed(key, names, [flag, *(_text(v) for v in value)]) if value else None
    return Passed(key, names, [f"{flag}={_text(value)}"])


def load(ctx: Any, path: str) -> None:
    """Read ``path`` for ``ctx``'s command: its own keys become the context's ``default_map``, the
    others (on a command that passes flags on) wait in ``ctx.meta`` for ``with_config_file``."""
    command = ctx.command
    display = ctx.command_path
    values = read_config(path)
    own = _own_names(command)
    passes_on = bool(ctx.allow_extra_args and ctx.ignore_unknown_options)
    loaded = Loaded(path)
    defaults: dict[str, Any] = {}
    dyn_flags: dict[str, list[Any]] | None = None
    for key, value in values.items():
        name = flag_name(key)
        where = f"{path}: {key}"
        if name == "config":
            raise ConfigFileError(f"{where}: a config file cannot name another one")
        if name in own:
            param, negated = own[name]
            if param.name in loaded.own:
                raise ConfigFileError(f"{where}: {loaded.own[param.name][0]} already sets the same flag")
            loaded.own[param.name] = (key, value)
            if value is None:
                continue
            converted = _own_value(param, negated, value, where)
            _check(ctx, param, converted, where)
            defaults[param.name] = converted
            continue
        if not passes_on:
            close = difflib.get_close_matches(name, list(own), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else f" (see: {display} --help)"
            raise ConfigFileError(f"{where}: {display} has no flag --{name}{hint}")
        if dyn_flags is None:
            dyn_flags = _all_flags(_dyn_root(ctx))
        passed = _passed(key, value, dyn_flags, where)
        if passed is not None:
            loaded.passed.append(passed)
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    ctx.meta.setdefault(META_KEY, {})[display] = loaded


def _check(ctx: Any, param: Any, value: Any, where: str) -> None:
    """Run the flag's own conversion on a file value, so its error names the file and the key."""
    try:
        param.process_value(ctx, value)
    except typer.BadParameter as exc:
        raise ConfigFileError(f"{where}: {exc.message}") from None


def _on_config(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> None:
    paths = [str(v) for v in value or ()]
    if not paths or ctx.resilient_parsing:
        return
    if getattr(ctx.get_parameter_source(param.name), "name", "") == "ENVIRONMENT":
        paths = [os.environ.get(str(param.envvar), "")]  # one path, spaces and all
    # no param=: click attaches the option being processed to a BadParameter its callback raises
    # (augment_usage_errors), and typer types BadParameter's param as its own parameter class
    if len(paths) > 1:
        raise typer.BadParameter(
            f"given {len(paths)} times ({', '.join(paths)}); one file holds the flags", ctx=ctx
        )
    try:
        load(ctx, paths[0])
    except ConfigFileError as exc:
        raise typer.BadParameter(str(exc), ctx=ctx) from None


def config_option(passes_on: bool, scope: str) -> Any:
    """The ``--config`` option (eager: the file is read before any other flag is resolved); its
    twin is scoped by the command (``DYN_FRONTEND_CONFIG``), so it never reaches another one."""
    from dyn.cli.options import flag

    return flag(
        None,
        OPTION,
        scope=scope,
        metavar="FILE",
        dir_okay=False,
        is_eager=True,
        expose_value=False,
        callback=_on_config,
        help=HELP_PASSING if passes_on else HELP,
    )


def with_config_file(callback: Callable[..., Any], scope: str, passes_on: bool = False) -> Callable[..., Any]:
    """``callback`` (the Typer command or group callback named ``scope``) with a ``--config``
    parameter; a command that ``passes_on`` flags it does not declare sees the file's other keys in
    ``ctx.args`` first."""
    if getattr(callback, "__dyn_config_file__", False):
        return callback
    signature = inspect.signature(callback)
    if "config" in signature.parameters:
        raise TypeError(f"{callback.__name__} has its own config parameter")

    @functools.wraps(callback)
    def wrapper(**kwargs: Any) -> Any:
        kwargs.pop("config", None)  # Typer hands every declared parameter over, exposed or not
        if passes_on:
            _prepend_passed(_context())
        return callback(**kwargs)

    added = inspect.Parameter(
        "config",
        inspect.Parameter.KEYWORD_ONLY,
        default=config_option(passes_on, scope),
        annotation=list[Path] | None,
    )
    params = list(signature.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind == inspect.Parameter.VAR_KEYWORD), len(params))
    params.insert(at, added)
    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__dyn_config_file__ = True  # type: ignore[attr-defined]
    return wrapper


def _context() -> Any:
    from dyn.cli.options import _current_context

    return _current_context()


def _prepend_passed(ctx: Any) -> None:
    """Put the file's passed-on flags before the command line's in ``ctx.args`` (a later flag wins
    in Click and argparse alike), leaving out those the command line gives itself."""
    loaded = ctx.meta.get(META_KEY, {}).get(ctx.command_path) if ctx is not None else None
    if loaded is None or not loaded.passed:
        return
    given = {flag_name(arg.split("=", 1)[0]) for arg in ctx.args if arg.startswith("--")}
    extra = [arg for p in loaded.passed if not {n[2:] for n in p.names} & given for arg in p.argv]
    ctx.args = [*extra, *ctx.args]


def file_notes(message: str, ctx: Any) -> list[str]:
    """``set by KEY in FILE`` for each config-file value of ``ctx``'s commands that ``message``
    names (by flag, or by quoting the value)."""
    notes: list[str] = []
    while ctx is not None:
        loaded = ctx.meta.get(META_KEY, {}).get(ctx.command_path)
        if loaded is not None:
            params = {p.name: p for p in ctx.command.params}
            for name, (key, value) in loaded.own.items():
                param = params.get(name)
                if param is None or getattr(ctx.get_parameter_source(name), "name", "") != "DEFAULT_MAP":
                    continue
                opts = (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ()))
                if _names_any(message, opts) or repr(_text(value)) in message:
                    notes.append(f"set by {key} in {loaded.path}")
            for passed in loaded.passed:
                if _names_any(message, passed.names):
                    notes.append(f"set by {passed.key} in {loaded.path}")
        ctx = ctx.parent
    return notes


def _names_any(message: str, flags: Iterable[str]) -> bool:
    """Whether ``message`` names one of ``flags`` whole (``--x`` is not named by ``--x-y``)."""
    return any(re.search(re.escape(flag) + r"(?![\w-])", message) for flag in flags)


def install(app: typer.Typer, *, name: str | None = None) -> None:
    """Give every command of ``app`` and of its sub-apps ``--config``, and each sub-app's group
    callback that has options (``dyn bench``, named ``name``); a command whose context settings take
    unknown options passes the file's other keys on. ``dyn``'s own options (``--log-level``) take
    none."""
    for info in app.registered_commands:
        if info.callback is None:
            continue
        settings = info.context_settings or {}
        passes_on = bool(settings.get("allow_extra_args") and settings.get("ignore_unknown_options"))
        scope = info.name or info.callback.__name__.replace("_", "-")
        info.callback = with_config_file(info.callback, scope, passes_on)
    own = app.registered_callback
    if name and own is not None and own.callback is not None and _has_options(own.callback):
        own.callback = with_config_file(own.callback, name)
    for sub in app.registered_groups:
        if sub.typer_instance is not None:
            install(sub.typer_instance, name=sub.name or sub.typer_instance.info.name)


def _has_options(callback: Callable[..., Any]) -> bool:
    from typer.models import OptionInfo

    return any(isinstance(p.default, OptionInfo) for p in inspect.signature(callback).parameters.values())
