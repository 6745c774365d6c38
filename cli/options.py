"""The environment-twin scheme and the options shared by several commands.

Every flag ``--some-flag`` can also be set with ``DYN_SOME_FLAG`` (``DYN_`` + the long flag name
in upper case, dashes as underscores; booleans take true/false/1/0). The flag wins over the
environment. An environment name means one thing in every command, so one environment
configures a whole stack (Dynamo's ``DYN_ROUTER_*`` names follow the same scheme). Where a
command's flag means something else than the flag of that name elsewhere, its twin is scoped
by the command (``flag(..., scope="indexer")``: ``dyn indexer --http-port`` is
``DYN_INDEXER_HTTP_PORT``, while ``DYN_HTTP_PORT`` stays the frontend's, which ``dyn serve``
passes on); ``tests/cli/test_help_and_env.py`` finds any name two meanings share. A bad value
from the environment is reported with the variable's name (``env_hint``).

Settings that belong to a config class are declared on it (``dyn.core.config``) and offered by
``dyn.cli.config_flags``: the discovery flags (``DiscoveryConfig``), the router's
(``KvRouterConfig``), each engine's. The options below are the ones no config class holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import typer

from dyn.core.config import (  # noqa: F401  (the panels' one home)
    ENGINE_PANEL,
    MODEL_PANEL,
    PARSERS_PANEL,
    SECURITY_PANEL,
    WORKER_PANEL,
)

ENV_PREFIX = "DYN_"


def env_name(flag: str, scope: str | None = None) -> str:
    """``--max-num-seqs`` -> ``DYN_MAX_NUM_SEQS``; scoped by ``indexer``: ``--http-port`` ->
    ``DYN_INDEXER_HTTP_PORT``."""
    name = flag.lstrip("-").split("/")[0]
    if scope:
        name = f"{scope}-{name}"
    return ENV_PREFIX + name.upper().replace("-", "_")


def flag(
    default: Any, *names: str, help: str, panel: str | None = None, scope: str | None = None, **kwargs: Any
) -> Any:
    """A Typer option with its environment twin (``env_name(long name, scope)``), shown in
    ``--help`` under ``panel``."""
    long_name = next(n for n in names if n.startswith("--"))
    return typer.Option(
        default,
        *names,
        help=help,
        envvar=env_name(long_name, scope),
        show_envvar=True,
        rich_help_panel=panel,
        **kwargs,
    )


HOST = flag(
    "127.0.0.1",
    "--host",
    panel=WORKER_PANEL,
    help="Address every ZMQ socket of this process binds to: a loopback address, an interface "
    "address, or 0.0.0.0 (every interface); beyond loopback it needs --plane-keys.",
)
ADVERTISE_HOST = flag(
    None,
    "--advertise-host",
    panel=WORKER_PANEL,
    help="Address (or host name) other processes connect to for this process's sockets, put in "
    "discovery (default: --host; with --host 0.0.0.0, this host's primary address, the source "
    "address of its default route).",
)
DISAGGREGATION_MODE = flag(
    "agg",
    "--disaggregation-mode",
    panel=WORKER_PANEL,
    help="The worker's role, advertised in discovery: agg does both phases of a request; "
    "prefill computes prompts' KV and hands it to decode workers, which generate. A model with "
    "prefill or decode workers is served disaggregated by the frontend's router.",
)
DRAIN_TIMEOUT = flag(
    10.0,
    "--drain-timeout",
    min=0.0,
    panel=WORKER_PANEL,
    help="On SIGTERM the worker leaves discovery at once, then lets its in-flight requests "
    "finish for this many seconds; those still running are handed back to their "
    "frontends (which migrate them with --migration-limit) and it exits.",
)
SYSTEM_PORT = flag(
    None,
    "--system-port",
    min=0,
    max=65535,
    panel=WORKER_PANEL,
    help="Serve the worker's HTTP status API on this port of --host: the engine's own Prometheus "
    "metrics at /metrics (SGLang's with --enable-metrics), /health and /live. 0: a free port, "
    "logged at start. Off by default.",
)
MODEL_PATH = flag(
    None,
    "--model-path",
    panel=MODEL_PANEL,
    help="Local Hugging Face-style model directory with tokenizer.json and "
    "tokenizer_config.json (default: the embedded dyn-tiny).",
)
TOKENIZER = flag(
    None,
    "--tokenizer",
    panel=MODEL_PANEL,
    help="Local directory with the tokenizer files (tokenizer.json, tokenizer_config.json, the chat "
    "template) when they are not in --model-path (vLLM's flag; default: --model-path's).",
)
MODEL_NAME = flag(
    None, "--model-name", panel=MODEL_PANEL, help="Served model name (default: the model directory's name)."
)
SERVED_MODEL_NAME = flag(
    [],
    "--served-model-name",
    panel=MODEL_PANEL,
    help="Names requests may use for the model (vLLM's flag): the first is its name, as "
    "--model-name; the others are aliases. Several as vLLM takes them (--served-model-name a b) "
    "or with the flag repeated.",
)

MULTI_VALUE_FLAGS = frozenset({"--served-model-name", "--lora-modules", "--allowed-media-domains"})
"""Flags that take several values after one flag, as vLLM's argparse ``nargs='+'`` does."""


DOTTED_FLAGS = frozenset({"--limit-mm-per-prompt"})
"""JSON-object flags vLLM also takes one key at a time (``--limit-mm-per-prompt.image 4``)."""


def expand_dotted(args: list[str]) -> list[str]:
    """``--limit-mm-per-prompt.image 4 --limit-mm-per-prompt.video.count=0`` as the one JSON flag
    vLLM's parser makes of them, where the first was: ``--limit-mm-per-prompt '{"image": 4,
    "video": {"count": 0}}'``. A value that is JSON (``4``) is read as JSON, any other as text;
    everything after ``--`` is left as it is."""
    import json

    out: list[str] = []
    merged: dict[str, tuple[int, dict[str, Any]]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out += args[i:]
            break
        name, eq, value = arg.partition("=")
        flag, _, path = name.partition(".")
        if flag not in DOTTED_FLAGS or not path or (not eq and i + 1 >= len(args)):
            out.append(arg)
            i += 1
            continue
        if not eq:
            i += 1
            value = args[i]
        if flag not in merged:
            merged[flag] = (len(out) + 1, {})
            out += [flag, ""]
        *parents, key = path.split(".")
        node = merged[flag][1]
        for parent in parents:
            if not isinstance(node.get(parent), dict):
                node[parent] = {}
            node = node[parent]
        try:
            node[key] = json.loads(value)
        except json.JSONDecodeError:
            node[key] = value
        i += 1
    for at, tree in merged.values():
        out[at] = json.dumps(tree)
    return out


def expand_multi_value(args: list[str]) -> list[str]:
    """``--served-model-name a b --x`` as Click reads a repeated option:
    ``--served-model-name a --served-model-name b --x``. Values run until the next argument that
    starts with ``-``; ``--flag=value`` and everything after ``--`` are left as they are."""
    out: list[str] = []
    current: str | None = None
    for at, arg in enumerate(args):
        if arg == "--":
            return out + args[at:]
        if arg.startswith("-"):
            current = arg if arg in MULTI_VALUE_FLAGS else None
            out.append(arg)
        elif current is not None and out[-1] != current:
            out += [current, arg]
        else:
            out.append(arg)
    return out


API_KEY = flag(
    None,
    "--api-key",
    panel=SECURITY_PANEL,
    help="Require 'Authorization: Bearer KEY' on every HTTP route but /live and /health.",
)
PLANE_KEYS = flag(
    None,
    "--plane-keys",
    panel=SECURITY_PANEL,
    help="Directory of CurveZMQ keys (made by 'dyn keys'): every ZMQ plane is encrypted and "
    "only holders of the keys may connect. Required to bind beyond loopback.",
)


def env_hint(message: str, ctx: Any = None) -> str:
    """``message`` about a bad setting, plus the environment variables it came from: an option of
    the running command (or of ``dyn`` itself) whose value was read from its twin, and which the
    message names by flag or quotes by value. ``DYN_ROUTER_MODE=bogus`` makes "unknown router
    mode 'bogus'" end in "(set by DYN_ROUTER_MODE in the environment)"; a value from ``--config``
    adds "(set by router-mode in FILE)" (``dyn.cli.config_file.file_notes``). Values are not
    repeated (one may be a key)."""
    ctx = start = ctx if ctx is not None else _current_context()
    names: list[str] = []
    while ctx is not None:
        for param in getattr(ctx.command, "params", ()):
            envvar = getattr(param, "envvar", None)
            if getattr(param, "param_type_name", "") != "option" or not isinstance(envvar, str):
                continue
            source = ctx.get_parameter_source(param.name) if param.name else None
            if getattr(source, "name", "") != "ENVIRONMENT" or envvar in message:
                continue
            value = os.environ.get(envvar, "")
            if any(opt in message for opt in param.opts) or (value and repr(value) in message):
                names.append(envvar)
        ctx = ctx.parent
    from dyn.cli.config_file import file_notes

    notes = [f"set by {', '.join(names)} in the environment"] if names else []
    notes += file_notes(message, start)
    return message + "".join(f" ({note})" for note in notes)


def _current_context() -> Any:
    """The Click context of the running command, or None (Typer vendors its own Click)."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover - a Typer that uses Click itself
        try:
            from click import get_current_context as click_current_context
        except ImportError:
            return None
        return click_current_context(silent=True)
    return get_current_context(silent=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Exit with ``code`` after ``error: message`` on stderr (with --log-format json, an error
    record instead, so every line stays JSON)."""
    from dyn.core.logs import is_json

    message = env_hint(message)
    if is_json():
        import logging

        logging.getLogger("dyn.cli").error(message)
    else:
        typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


S = TypeVar("S")


def run_service(run: Callable[[S], None], settings: S) -> None:
    """Run a long-lived service (``run_frontend``, ``run_router_service``, ...) until it stops; a
    ``ConfigError`` it raises while starting is the command's error (exit 2)."""
    from dyn.core.errors import ConfigError

    try:
        run(settings)
    except ConfigError as exc:
        fail(str(exc))


def use_sockets(plane_keys: str | None, advertise_host: str | None) -> None:
    """Apply ``--plane-keys`` and ``--advertise-host`` (``use_plane_keys``, ``use_advertise_host``)."""
    use_plane_keys(plane_keys)
    use_advertise_host(advertise_host)


def use_plane_keys(directory: str | None) -> None:
    """Apply ``--plane-keys`` to every ZMQ socket this process makes; a bad directory exits 2."""
    from dyn.core.transport.sockets import PlaneKeyError
    from dyn.core.transport.sockets import use_plane_keys as apply

    try:
        apply(directory)
    except PlaneKeyError as exc:
        raise typer.BadParameter(str(exc), param_hint="--plane-keys") from None


def use_advertise_host(host: str | None) -> None:
    """Apply ``--advertise-host`` to every socket this process binds; a wildcard or a value that
    is not a host exits 2."""
    from dyn.core.transport.sockets import AdvertiseHostError
    from dyn.core.transport.sockets import use_advertise_host as apply

    try:
        apply(host)
    except AdvertiseHostError as exc:
        raise typer.BadParameter(env_hint(str(exc)), param_hint="--advertise-host") from None


DYN_TOOL_CALL_PARSER = flag(
    None,
    "--dyn-tool-call-parser",
    panel=PARSERS_PANEL,
    help="How the served model writes tool calls (hermes, llama3_json, mistral, "
    "...; `dyn frontend --help` lists them): advertised in discovery, so "
    "frontends parse this worker's calls and accept tool_choice auto "
    "(default for the embedded dyn-tiny: hermes).",
)
DYN_REASONING_PARSER = flag(
    None,
    "--dyn-reasoning-parser",
    panel=PARSERS_PANEL,
    help="How the served model writes its reasoning (deepseek_r1, qwen3, ...): "
    "advertised in discovery, so frontends return it as reasoning_content.",
)
