"""``dyn worker <engine>``: run engine workers that register in discovery and serve requests.

One subcommand per engine registered under the ``dyn.engines`` entry points (``dyn.core.engine``),
generated from its ``EnginePlugin``: the model flags, the engine's own flags (its config class's
declarations), its worker-level options, then the flags every worker has (parsers, discovery, host,
drain, system port, keys). An engine that ``passes_through`` hands the flags it does not declare to the engine.
Installing a package that registers an engine is enough for ``dyn worker NAME`` to exist.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

import msgspec
import typer
from typer.core import TyperGroup

from dyn.cli import options
from dyn.cli.config_flags import config_flags, discovery_flags
from dyn.cli.lazy import Loader, lazy_group, typer_loader
from dyn.core.messages import DisaggregationMode
from dyn.core.model.names import served_names

if TYPE_CHECKING:
    from dyn.core.config import DiscoveryConfig
    from dyn.core.engine import EnginePlugin
    from dyn.core.worker.settings import WorkerSettings

LISTED_FIRST = ("mocker", "vllm", "sglang")
"""dyn's own engines, in the order ``dyn worker --help`` has always listed them."""
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}

app = typer.Typer(
    cls=lazy_group(TyperGroup, lambda: engine_loaders()),  # defined below
    help="Run engine workers: each registers in discovery, serves the request plane and "
    "publishes KV events and load metrics.",
    no_args_is_help=True,
)


def _worker(
    ctx: typer.Context,
    model_path: str = options.MODEL_PATH,
    tokenizer: str = options.TOKENIZER,
    model_name: str = options.MODEL_NAME,
    served_model_name: list[str] = options.SERVED_MODEL_NAME,
    engine_config: Any = None,
    worker_options: Any = None,
    dyn_tool_call_parser: str = options.DYN_TOOL_CALL_PARSER,
    dyn_reasoning_parser: str = options.DYN_REASONING_PARSER,
    discovery: Any = None,  # --namespace, --discovery-backend, --discovery-dir
    host: str = options.HOST,
    advertise_host: str = options.ADVERTISE_HOST,
    disaggregation_mode: DisaggregationMode = options.DISAGGREGATION_MODE,
    drain_timeout: float = options.DRAIN_TIMEOUT,
    system_port: int = options.SYSTEM_PORT,
    plane_keys: str = options.PLANE_KEYS,
) -> None:
    """The body every ``dyn worker NAME`` shares; ``worker_command`` fills in the engine."""


def worker_command(plugin: EnginePlugin) -> Any:
    """The ``dyn worker NAME`` command function of ``plugin``."""

    def command(
        ctx: typer.Context,
        model_path: str | None,
        tokenizer: str | None,
        model_name: str | None,
        served_model_name: list[str],
        engine_config: Any,
        worker_options: Any,
        dyn_tool_call_parser: str | None,
        dyn_reasoning_parser: str | None,
        discovery: DiscoveryConfig,
        host: str,
        advertise_host: str | None,
        disaggregation_mode: DisaggregationMode,
        drain_timeout: float,
        system_port: int | None,
        plane_keys: str | None,
    ) -> None:
        try:
            name, aliases = served_names(model_name, served_model_name)
        except ValueError as exc:
            options.fail(str(exc))
        options.use_advertise_host(advertise_host)
        settings = _settings(
            discovery, host, dyn_tool_call_parser, dyn_reasoning_parser, model_path, drain_timeout, plane_keys
        )
        settings = msgspec.structs.replace(
            settings, disaggregation_mode=disaggregation_mode, system_port=system_port
        )
        extra = {"extra_args": list(ctx.args)} if plugin.passes_through else {}
        own = (
            {}
            if worker_options is None
            else {name: getattr(worker_options, name) for name in worker_options.__struct_fields__}
        )
        _serve(
            plugin,
            engine_config,
            settings,
            model_path=model_path,
            tokenizer_path=tokenizer,
            model_name=name,
            aliases=aliases,
            **extra,
            **own,
        )

    _present_as(command, plugin)
    command = discovery_flags(config_flags("engine_config", plugin.config_type)(command))
    if plugin.worker_options is None:
        return _without(command, "worker_options")
    return config_flags("worker_options", plugin.worker_options)(command)


def _present_as(command: Any, plugin: EnginePlugin) -> None:
    """Give ``command`` the options of ``_worker`` (with the plugin's own ``--model-path``), and
    the plugin's name and help."""
    signature = inspect.signature(_worker)
    params = dict(signature.parameters)
    if plugin.model_path is not None:
        declared = plugin.model_path
        params["model_path"] = params["model_path"].replace(
            default=options.flag(declared.default, *declared.names, help=declared.help, panel=declared.panel)
        )
    command.__signature__ = signature.replace(parameters=list(params.values()))
    command.__doc__ = plugin.description or plugin.summary
    command.__name__ = plugin.name


def _without(command: Any, name: str) -> Any:
    """``command`` with its ``name`` parameter removed (called with it as None)."""
    signature = inspect.signature(command)

    def wrapper(**kwargs: Any) -> None:
        command(**kwargs, **{name: None})

    kept = [p for p in signature.parameters.values() if p.name != name]
    wrapper.__signature__ = signature.replace(parameters=kept)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in kept}
    wrapper.__doc__, wrapper.__name__ = command.__doc__, command.__name__
    return wrapper


def engine_loaders() -> dict[str, Loader]:
    """The loader of ``dyn worker NAME`` for every installed engine: dyn's own in ``LISTED_FIRST``
    order, then the others by name. A plugin is imported when its command is first looked up.

    An engine whose plugin cannot be imported is left out with a warning on stderr (its command is
    then not found), so one broken package does not take the whole CLI down.
    """
    from dyn.core.engine import available_engines

    engines = available_engines()
    rank = {name: at for at, name in enumerate(LISTED_FIRST)}
    ordered = sorted(engines, key=lambda n: (rank.get(n, len(rank)), n))
    return {
        name: typer_loader(name, functools.partial(_register_engine, name, engines[name])) for name in ordered
    }


def _register_engine(name: str, entry: Any, target: typer.Typer) -> None:
    try:
        plugin = entry.load()
    except Exception as exc:
        typer.echo(f"warning: engine {name!r} ({entry.value}) cannot be loaded: {exc}", err=True)
        return
    settings = PASS_THROUGH if plugin.passes_through else None
    target.command(name, context_settings=settings)(worker_command(plugin))


def _settings(
    discovery: DiscoveryConfig,
    host: str,
    tool_call_parser: str | None,
    reasoning_parser: str | None,
    model_path: str | None,
    drain_timeout: float,
    plane_keys: str | None,
) -> WorkerSettings:
    """The worker settings; an unknown parser name exits 2 with the known ones."""
    from dyn.core.worker.settings import WorkerSettings, model_parsers

    options.use_plane_keys(plane_keys)
    try:
        tool_call_parser, reasoning_parser = model_parsers(tool_call_parser, reasoning_parser, model_path)
    except ValueError as exc:
        options.fail(str(exc))
    return WorkerSettings(
        discovery=discovery,
        host=host,
        tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
        drain_timeout_s=drain_timeout,
    )


def _serve(plugin: EnginePlugin, config: object, settings: WorkerSettings, **kwargs: Any) -> None:
    """Run the plugin's workers; a bad setting exits 2, an engine that cannot start 1."""
    from dyn.core.engine import EngineStartError
    from dyn.core.errors import ConfigError
    from dyn.core.worker.launch import serve

    try:
        serve(plugin, config, settings, **kwargs)
    except ConfigError as exc:
        options.fail(str(exc))
    except EngineStartError as exc:
        options.fail(str(exc), 1)


def register(root: typer.Typer) -> None:
    """Add ``dyn worker`` to ``root`` (``dyn.cli.app``'s loaders)."""
    root.add_typer(app, name="worker")
