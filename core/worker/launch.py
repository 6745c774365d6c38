"""Turn an engine plugin, its config and the worker settings into running worker hosts.

What every engine shares lives here once: check the config, find the model, open discovery, make
one engine per hosted worker (with a host-side KV-event publisher for an engine that hands its
events over), wrap each in a ``WorkerHost`` and run them until SIGINT or SIGTERM. What differs is
the plugin's (``dyn.core.engine.EnginePlugin``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dyn.core.engine import EnginePlugin
from dyn.core.errors import ConfigError
from dyn.core.worker.host import WorkerHost
from dyn.core.worker.settings import WorkerSettings


def build_hosts(
    plugin: EnginePlugin,
    config: Any,
    settings: WorkerSettings,
    *,
    model_path: str | None = None,
    tokenizer_path: str | None = None,
    model_name: str | None = None,
    aliases: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    num_workers: int = 1,
) -> list[WorkerHost]:
    """``num_workers`` ready-to-run hosts, each around one new ``plugin`` engine, registered as
    serving ``model_name`` (default: the model directory's name) under ``aliases`` too, with the
    model's directory (and ``tokenizer_path``, vLLM's ``--tokenizer``, when its tokenizer files
    are elsewhere) as the place a frontend loads it from.

    Raises ``ConfigError`` with a sentence for what can be checked before the engine starts: a
    missing required model, a bad config or extra flag, a model that cannot be read, a bad
    discovery setting. The engine's own checks raise ``EngineStartError`` when the host runs.
    """
    from dyn.core.transport.event_plane import KvEventPublisher

    if num_workers < 1:
        raise ConfigError("--num-workers must be at least 1")
    if settings.disaggregation_mode != "agg" and not plugin.disaggregation:
        raise ConfigError(
            f"--disaggregation-mode {settings.disaggregation_mode}: dyn worker {plugin.name} serves "
            "aggregated requests only (both phases on one worker); start it without the flag"
        )
    try:
        config = prepare(plugin, config, extra_args)
        model = load_model(plugin, model_path, model_name, tokenizer_path)
        store = settings.discovery.open()
        publishers = [
            None if plugin.publishes_kv_events else KvEventPublisher(settings.host)
            for _ in range(num_workers)
        ]
        engines = plugin.create(config, model, settings, [p.publish if p else None for p in publishers])
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return [
        WorkerHost(
            engine,
            engine_name=plugin.name,
            model_name=model.name,
            store=store,
            settings=settings,
            kv_publisher=publisher,
            model_path=_where_loaded(model_path, model),
            tokenizer_path=_where_loaded(tokenizer_path, None),
            aliases=tuple(aliases),
        )
        for engine, publisher in zip(engines, publishers, strict=True)
    ]


def _where_loaded(model_path: str | None, model: Any) -> str | None:
    """The model's (or tokenizer's) directory as an absolute path, for other processes to load it
    from (None: the embedded dyn-tiny, or no separate tokenizer; as given when it is not a local
    directory, such as a Hugging Face id)."""
    if model_path is None:
        return None
    from pathlib import Path

    path = Path(getattr(model, "path", model_path)).expanduser()
    return str(path.resolve()) if path.is_dir() else model_path


def prepare(plugin: EnginePlugin, config: Any, extra_args: Sequence[str] = ()) -> Any:
    """The config the engine runs with: the plugin's ``prepare``, else ``config.validate()``."""
    if plugin.prepare is not None:
        return plugin.prepare(config, extra_args)
    check = getattr(config, "validate", None)
    if check is not None:
        check()
    return config


def load_model(
    plugin: EnginePlugin, model_path: str | None, model_name: str | None, tokenizer_path: str | None = None
) -> Any:
    """The plugin's model for ``model_path`` (default: ``load_model_info``, dyn-tiny when None)."""
    if plugin.load_model is not None:
        return plugin.load_model(model_path, model_name, tokenizer_path)
    from dyn.core.model import load_model_info

    return load_model_info(model_path, model_name, tokenizer_path)


def serve(plugin: EnginePlugin, config: Any, settings: WorkerSettings, **kwargs: Any) -> None:
    """Run ``build_hosts(plugin, config, settings, **kwargs)`` until SIGINT or SIGTERM, on
    uvloop as every dyn service."""
    from dyn.core.service import run_service
    from dyn.core.worker.runner import run_hosts

    run_service(run_hosts, build_hosts(plugin, config, settings, **kwargs))
