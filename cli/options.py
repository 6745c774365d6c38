"""The environment-twin scheme and the options shared by several commands.

Every flag ``--some-flag`` can also be set with ``DYN_SOME_FLAG`` (``DYN_`` + the long flag name
in upper case, dashes as underscores; booleans take true/false/1/0). The flag wins over the
environment. The same flag name means the same thing in every command, so one environment
configures a whole stack (Dynamo's ``DYN_ROUTER_*`` names follow the same scheme).

Settings that belong to a config class are declared on it (``dyn.core.config``) and offered by
``dyn.cli.config_flags``: the discovery flags (``DiscoveryConfig``), the router's
(``KvRouterConfig``), each engine's. The options below are the ones no config class holds.
"""

from __future__ import annotations

from typing import Any

import typer

from dyn.core.config import ENGINE_PANEL, MODEL_PANEL, WORKER_PANEL  # noqa: F401  (the panels' one home)

ENV_PREFIX = "DYN_"


def env_name(flag: str) -> str:
    """``--max-num-seqs`` -> ``DYN_MAX_NUM_SEQS``."""
    return ENV_PREFIX + flag.lstrip("-").split("/")[0].upper().replace("-", "_")


def flag(default: Any, *names: str, help: str, panel: str | None = None, **kwargs: Any) -> Any:
    """A Typer option with its environment twin, shown in ``--help`` under ``panel``."""
    long_name = next(n for n in names if n.startswith("--"))
    return typer.Option(
        default,
        *names,
        help=help,
        envvar=env_name(long_name),
        show_envvar=True,
        rich_help_panel=panel,
        **kwargs,
    )


HOST = flag(
    "127.0.0.1",
    "--host",
    panel=WORKER_PANEL,
    help="Address every socket of this process binds to and advertises.",
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
MODEL_PATH = flag(
    None,
    "--model-path",
    panel=MODEL_PANEL,
    help="Local Hugging Face-style model directory with tokenizer.json and "
    "tokenizer_config.json (default: the embedded dyn-tiny).",
)
MODEL_NAME = flag(
    None, "--model-name", panel=MODEL_PANEL, help="Served model name (default: the model directory's name)."
)

SECURITY_PANEL = "Security"
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


def use_plane_keys(directory: str | None) -> None:
    """Apply ``--plane-keys`` to every ZMQ socket this process makes; a bad directory exits 2."""
    from dyn.core.transport.sockets import PlaneKeyError
    from dyn.core.transport.sockets import use_plane_keys as apply

    try:
        apply(directory)
    except PlaneKeyError as exc:
        raise typer.BadParameter(str(exc), param_hint="--plane-keys") from None


PARSERS_PANEL = "Tools and reasoning"
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
