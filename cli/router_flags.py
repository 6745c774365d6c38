"""The KV router's flags (seed 001), shared by ``dyn frontend``, ``dyn router`` and ``dyn bench replay``.

Every router flag is declared once, on ``KvRouterConfig``'s fields (``dyn.core.router.config``);
``@router_flags`` adds them to a command and hands the command one validated ``KvRouterConfig``
(argument ``router_config``), so the same flag means the same thing in every command. Only the
flags that set no field are declared here: the deprecated overlap weight and JetStream's, which
are refused with a sentence. A bad combination exits with status 2 and a sentence naming the flag.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

import typer

from dyn.cli import options
from dyn.cli.config_flags import flag_table
from dyn.cli.options import flag
from dyn.core.config import fields_from_flags
from dyn.core.router.config import PANEL, KvRouterConfig

JETSTREAM = (
    "JetStream mode is not built: dyn's routers read KV events straight from the "
    "workers' event plane (the path Dynamo recommends); drop {flag}"
)

_UNBUILT: dict[str, tuple[Any, Any]] = {
    "router_kv_overlap_score_weight": (
        float | None,
        flag(
            None,
            "--router-kv-overlap-score-weight",
            "--kv-overlap-score-weight",
            hidden=True,
            panel=PANEL,
            help="Deprecated: use --router-prefill-load-scale.",
        ),
    ),
    "router_durable_kv_events": (
        bool,
        flag(False, "--router-durable-kv-events", hidden=True, panel=PANEL, help="Deprecated; not built."),
    ),
    "router_reset_states": (
        bool,
        flag(False, "--router-reset-states", hidden=True, panel=PANEL, help="JetStream only; not built."),
    ),
    "router_snapshot_threshold": (
        int | None,
        flag(
            None, "--router-snapshot-threshold", hidden=True, panel=PANEL, help="JetStream only; not built."
        ),
    ),
}
"""Hidden flags that set no ``KvRouterConfig`` field: accepted for Dynamo's command lines."""

_FLAGS: dict[str, tuple[Any, Any]] = {**flag_table(KvRouterConfig), **_UNBUILT}
"""``{parameter: (annotation, option)}``: the declared router flags, then the hidden ones."""


def _config(values: dict[str, Any]) -> KvRouterConfig:
    from dyn.core.router.config import (
        build_config,
        deprecated_overlap_weight_from_env,
        overlap_refresh_from_env,
    )

    for name, flag_name in (
        ("router_durable_kv_events", "--router-durable-kv-events"),
        ("router_reset_states", "--router-reset-states"),
        ("router_snapshot_threshold", "--router-snapshot-threshold"),
    ):
        if values[name] not in (None, False):
            raise typer.BadParameter(options.env_hint(JETSTREAM.format(flag=flag_name)), param_hint=flag_name)
    weight, source = values["router_kv_overlap_score_weight"], "--router-kv-overlap-score-weight"
    if weight is None:
        from_env = deprecated_overlap_weight_from_env(os.environ)
        if from_env is not None:
            weight, source = from_env
    return build_config(
        deprecated_overlap_weight=weight,
        deprecated_weight_source=source,
        overlap_refresh_after_secs=overlap_refresh_from_env(
            os.environ.get("DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS")
        ),
        **fields_from_flags(KvRouterConfig, values),
    )


def router_flags(command: Callable[..., None]) -> Callable[..., None]:
    """Add the router flags to ``command``, which takes ``router_config`` (a validated
    ``KvRouterConfig``) instead."""
    from dyn.core.errors import ConfigError

    signature = inspect.signature(command)
    own = [p for p in signature.parameters.values() if p.name != "router_config"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
        for name, (kind, option) in _FLAGS.items()
    ]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        values = {name: kwargs.pop(name) for name in _FLAGS}
        try:
            kwargs["router_config"] = _config(values)
        except ConfigError as exc:
            options.fail(str(exc))
        command(**kwargs)

    wrapper.__signature__ = signature.replace(parameters=own + added)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**{p.name: p.annotation for p in own}, **{p.name: p.annotation for p in added}}
    return wrapper
