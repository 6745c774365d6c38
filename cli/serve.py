"""``dyn serve``: one frontend and N workers on this machine, supervised by one command."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dyn.cli import options
from dyn.cli.completion import ChildFlagsCommand
from dyn.cli.config_flags import FROM_FLAGS, config_flags, discovery_flags, flag_table
from dyn.core.config import DiscoveryConfig
from dyn.core.serve_flags import ServeFlags

if TYPE_CHECKING:
    from dyn.core.serve import ServeConfig

CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def _children(ctx: Any) -> list[Any]:
    """The commands ``dyn serve`` hands its other flags to: the frontend and the engine's worker."""
    root = _root_command(ctx)
    engines = root.commands["worker"].commands
    engine = ctx.params.get("engine") or "mocker"
    return [root.commands["frontend"], *([engines[engine]] if engine in engines else [])]


class ServeCommand(ChildFlagsCommand):
    """``dyn serve`` completes the flags it hands to ``dyn frontend`` and ``dyn worker ENGINE``."""

    children = staticmethod(_children)


@discovery_flags
@config_flags("flags", ServeFlags, flags=flag_table(ServeFlags))
def serve(
    ctx: typer.Context,
    flags: ServeFlags = FROM_FLAGS,  # --workers, --engine, --http-port, ... (dyn.core.serve_flags)
    discovery: DiscoveryConfig = FROM_FLAGS,  # --namespace, --discovery-backend, --discovery-dir
    model_path: str = options.MODEL_PATH,
    model_name: str = options.MODEL_NAME,
) -> None:
    """Run a whole local stack: dyn frontend and N dyn worker ENGINE processes as children.

    Prefixes their logs, waits until every worker is routable, prints the URL, and on Ctrl-C or SIGTERM stops them all.

    Other flags go to the child command(s) that define them: --router-mode, --speedup-ratio, --block-size, ...
    With --engine vllm or sglang, a flag no child defines goes to the workers' engine.
    """
    from dyn.core.serve import flag_values, run_stack

    _check_discovery(discovery)
    roles = _roles(ctx, flags.workers, flags.prefill_workers, flags.decode_workers)
    frontend, worker = _route_children(ctx, flags.engine)
    shared = {
        "--namespace": discovery.namespace,
        "--discovery-backend": discovery.backend,
        "--discovery-dir": discovery.dir,
        "--etcd-endpoints": discovery.etcd_endpoints,
        "--model-path": model_path,
        "--model-name": model_name,
    }
    frontend_args = frontend.args({"--http-host": flags.http_host, "--http-port": flags.http_port, **shared})
    worker_args = worker.args(shared)

    per_process = max(1, _as_int(resolved_option(worker.command, worker.routed, "--num-workers"), 1))
    served = flag_values(frontend.routed, "--served-model-name")
    model = (
        model_name
        or (served[0] if served else None)
        or (Path(model_path).name if model_path else _tiny_model_name())
    )
    router_mode = resolved_option(frontend.command, frontend.routed, "--router-mode")
    summary = _summary(flags, model, len(roles), per_process, router_mode)
    config = _stack_config(ctx, flags, roles, per_process, summary, frontend_args, worker_args)
    raise typer.Exit(run_stack(config))


@dataclass(frozen=True)
class _Child:
    """A child command of ``dyn serve``, its options and the command-line flags routed to it."""

    command: Any
    specs: dict[str, int]
    routed: list[str]

    def args(self, own: dict[str, Any]) -> list[str]:
        """Its command line: those of ``dyn serve``'s ``own`` flags it defines, then the routed ones."""
        return [*_own_flags(own, self.specs), *self.routed]


def _route_children(ctx: typer.Context, engine: str) -> tuple[_Child, _Child]:
    """``dyn frontend`` and ``dyn worker ENGINE``, each with the flags of ``ctx.args`` it takes;
    exits with the reason for an unknown engine or a flag no child takes."""
    from dyn.core.serve import FlagRoutingError, route_flags

    root = _root_command(ctx)
    frontend_cmd = root.commands["frontend"]
    engines = root.commands["worker"].commands
    if engine not in engines:
        raise typer.BadParameter(
            options.env_hint(f"must be one of {', '.join(engines)}, got {engine!r}"),
            param_hint="--engine",
        )
    worker_cmd = engines[engine]
    frontend_name, worker_name = "dyn frontend", f"dyn worker {engine}"
    specs = {frontend_name: option_specs(frontend_cmd), worker_name: option_specs(worker_cmd)}
    try:
        routed = route_flags(
            ctx.args, specs, passthrough=worker_name if _passes_through(worker_cmd) else None
        )
    except FlagRoutingError as exc:
        options.fail(str(exc))
    return (
        _Child(frontend_cmd, specs[frontend_name], routed[frontend_name]),
        _Child(worker_cmd, specs[worker_name], routed[worker_name]),
    )


def _summary(flags: ServeFlags, model: str, workers: int, per_process: int, router_mode: Any) -> str:
    """The stack in a line: its model, its workers (and their processes), its router mode."""
    total = workers * per_process
    summary = f"model {model}, {total} {flags.engine} worker{'s' if total != 1 else ''}"
    if flags.prefill_workers:
        summary = (
            f"model {model}, {flags.prefill_workers * per_process} prefill + "
            f"{flags.decode_workers * per_process} decode {flags.engine} workers"
        )
    if per_process > 1:
        summary += f" in {workers} process{'es' if workers != 1 else ''}"
    if router_mode is not None:
        summary += f", router {router_mode}"
    return summary


def _stack_config(
    ctx: typer.Context,
    flags: ServeFlags,
    roles: Sequence[str | None],
    per_process: int,
    summary: str,
    frontend_args: list[str],
    worker_args: list[str],
) -> ServeConfig:
    """The children to start and how to supervise them; exits with the reason when the GPUs do
    not go round."""
    from dyn.core.serve import ChildSpec, ServeConfig, device_sets

    base = [sys.executable, "-m", "dyn.cli"]
    engine, workers = flags.engine, len(roles)
    try:
        devices = (
            device_sets(workers, flags.gpus_per_worker, os.environ.get("CUDA_VISIBLE_DEVICES"))
            if flags.gpus_per_worker
            else [None] * workers
        )
        return ServeConfig(
            frontend=ChildSpec("frontend", [*base, "frontend", *frontend_args]),
            workers=[
                ChildSpec(
                    f"worker-{i}" if role is None else f"{role}-{i}",
                    [*base, "worker", engine, *worker_args]
                    + (["--disaggregation-mode", role] if role is not None else []),
                    env={"CUDA_VISIBLE_DEVICES": d} if d is not None else {},
                )
                for i, (d, role) in enumerate(zip(devices, roles, strict=True))
            ],
            instances_per_worker=per_process,
            startup_timeout_s=flags.startup_timeout_s(),
            summary=summary,
            env=_log_env(ctx),
            log_format=_log_env(ctx).get("DYN_LOG_FORMAT", "rich"),
            restart_workers=flags.restart_workers,
        )
    except ValueError as exc:
        raise typer.BadParameter(options.env_hint(str(exc))) from None


def _roles(ctx: typer.Context, workers: int, prefill: int, decode: int) -> Sequence[str | None]:
    """Each worker process's ``--disaggregation-mode`` (None: left to the worker's own flags):
    ``--workers`` aggregated ones, or ``--prefill-workers`` then ``--decode-workers``."""
    if not prefill and not decode:
        return [None] * workers
    if not prefill or not decode:
        options.fail(
            "a disaggregated stack needs both --prefill-workers and --decode-workers (at least 1 each)"
        )
    source = ctx.get_parameter_source("workers")
    if source is not None and source.name != "DEFAULT":
        options.fail(
            "--workers starts aggregated workers: give it, or --prefill-workers and --decode-workers"
        )
    return ["prefill"] * prefill + ["decode"] * decode


def _check_discovery(discovery: DiscoveryConfig) -> None:
    """Refuse a bad discovery setting (an unsafe directory, say) once, before any child starts."""
    from dyn.core.errors import ConfigError

    try:
        discovery.open()
    except (ConfigError, ValueError) as exc:
        options.fail(str(exc))


def option_specs(command: Any) -> dict[str, int]:
    """``{flag: values it takes}`` for every option of a click command (0 for boolean flags)."""
    specs: dict[str, int] = {}
    for param in command.params:
        if getattr(param, "param_type_name", "") != "option":
            continue
        nvalues = 0 if (param.is_flag or getattr(param, "count", False)) else max(1, param.nargs)
        for opt in (*param.opts, *param.secondary_opts):
            specs[opt] = nvalues
    return specs


def resolved_option(command: Any, args: list[str], name: str) -> Any:
    """What ``command`` will see for option ``name``: the value in ``args``, else its env twin, else its default.

    None when ``command`` has no such option.
    """
    from dyn.core.serve import flag_value

    param = next(
        (p for p in command.params if getattr(p, "param_type_name", "") == "option" and name in p.opts), None
    )
    if param is None:
        return None
    given = flag_value(args, name)
    if given is not None:
        return given
    envvar = param.envvar if isinstance(param.envvar, str) else None
    if envvar and os.environ.get(envvar):
        return os.environ[envvar]
    return param.default if not callable(param.default) else param.default()


def _passes_through(command: Any) -> bool:
    """Whether ``command`` hands flags it does not declare to its engine (``dyn worker vllm``)."""
    return bool(getattr(command, "context_settings", {}).get("ignore_unknown_options"))


def _own_flags(values: dict[str, Any], specs: dict[str, int]) -> list[str]:
    """``dyn serve``'s own flags, for a child that defines them; unset (None) ones stay unset."""
    return [
        arg
        for name, value in values.items()
        if value is not None and name in specs
        for arg in (name, str(value))
    ]


def _root_command(ctx: typer.Context) -> Any:
    root = ctx.find_root().command
    commands = getattr(root, "commands", {})
    if "frontend" in commands and "worker" in commands:
        return root
    import typer.main

    from dyn.cli.app import app

    return typer.main.get_command(app)


def _log_env(ctx: typer.Context) -> dict[str, str]:
    """Children log like the supervisor: ``dyn --log-level L --log-format F serve`` reaches them as env twins."""
    env: dict[str, str] = {}
    parent = ctx.find_root().params
    for key, var in (("log_level", "DYN_LOG_LEVEL"), ("log_format", "DYN_LOG_FORMAT")):
        if isinstance(parent.get(key), str):
            env[var] = parent[key]
    return env


def _as_int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _tiny_model_name() -> str:
    from dyn.core.model import TINY_MODEL_NAME

    return TINY_MODEL_NAME


def register(app: typer.Typer) -> None:
    """Add this command to ``app`` (``dyn.cli.app``'s loaders)."""
    app.command("serve", cls=ServeCommand, context_settings=CONTEXT_SETTINGS)(serve)
