"""The SGLang engine: ``dyn worker sglang`` hosts one SGLang ``Engine`` as a dyn worker.

Registered as the ``sglang`` entry point of ``dyn.engines``. SGLang itself is imported only when
the engine starts, so this package loads without it (``dyn --help``, the mocker, the tests).
SGLang publishes its own KV events (the worker advertises where); see ``engine`` for what is
registered and how requests, aborts and streaming sessions map onto SGLang.
"""

from __future__ import annotations

from collections.abc import Sequence
from dyn.core.engine import EnginePlugin
from dyn.core.worker.settings import WorkerSettings
from dyn.plugins.sglang.config import SglangConfig


def build_host(config: SglangConfig, settings: WorkerSettings, *, model_path: str | None,
               model_name: str | None = None, extra_args: Sequence[str] = ()):
    """A ready-to-run worker host around one (not yet started) SGLang engine.

    ``model_path`` is a local Hugging Face model directory (the frontend tokenizes with the same
    one); ``extra_args`` are further SGLang server flags. Raises ``ConfigError`` for what can be
    checked before SGLang starts; SGLang's own checks raise ``EngineStartError`` when the host runs.
    """
    from dyn.core.discovery.store import open_store
    from dyn.core.errors import ConfigError
    from dyn.core.model import load_model_info
    from dyn.core.worker.host import WorkerHost
    from dyn.plugins.sglang.config import merge_extra_args
    from dyn.plugins.sglang.engine import SglangEngine

    if model_path is None:
        raise ConfigError("dyn worker sglang needs --model-path: the local Hugging Face model directory "
                          "SGLang loads and the frontend tokenizes with")
    try:
        config = merge_extra_args(config, extra_args).validate()
        model = load_model_info(model_path, model_name)
        store = open_store(settings.discovery_backend, settings.namespace, settings.discovery_dir)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    engine = SglangEngine(config, model_path=str(model.path), host=settings.host,
                          context_length=model.context_length)
    return WorkerHost(engine, engine_name="sglang", model_name=model.name, store=store, settings=settings)


def serve(config: SglangConfig, settings: WorkerSettings, *, model_path: str | None = None,
          model_name: str | None = None, extra_args: Sequence[str] = ()) -> None:
    """Run one SGLang worker until SIGINT/SIGTERM. Raises ``ConfigError`` for bad flags and
    ``EngineStartError`` when SGLang cannot start."""
    import anyio

    from dyn.core.worker.runner import run_hosts

    host = build_host(config, settings, model_path=model_path, model_name=model_name,
                      extra_args=extra_args)
    anyio.run(run_hosts, [host])


ENGINE = EnginePlugin(name="sglang", serve=serve,
                      summary="SGLang's Engine: real model, radix cache, priority scheduling and "
                              "eviction, streaming sessions, KV events from SGLang's publisher.")
