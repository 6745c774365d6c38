"""The vLLM engine: ``dyn worker vllm`` hosts one vLLM ``AsyncLLM`` as a dyn worker.

Registered as the ``vllm`` entry point of ``dyn.engines``. vLLM itself is imported only when the
engine starts, so this module loads without it (``dyn --help``, the mocker, the tests).
"""

from __future__ import annotations

from dyn.core.engine import EnginePlugin
from dyn.core.worker.settings import WorkerSettings
from dyn.plugins.vllm.config import VllmConfig


def build_host(config: VllmConfig, settings: WorkerSettings, *, model_path: str,
               model_name: str | None = None):
    """A ready-to-run worker host around one (not yet started) vLLM engine.

    Raises ``ConfigError`` for bad flags found before vLLM starts; vLLM's own checks raise
    ``EngineStartError`` when the host runs.
    """
    from pathlib import Path

    from dyn.core.discovery.store import open_store
    from dyn.core.errors import ConfigError
    from dyn.core.worker.host import WorkerHost
    from dyn.plugins.vllm.engine import VllmEngine

    try:
        config.validate()
        store = open_store(settings.discovery_backend, settings.namespace, settings.discovery_dir)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    engine = VllmEngine(config, model_path, host=settings.host)
    name = model_name or Path(model_path).name
    return WorkerHost(engine, engine_name="vllm", model_name=name, store=store, settings=settings)


def serve(config: VllmConfig, settings: WorkerSettings, *, model_path: str,
          model_name: str | None = None) -> None:
    """Run one vLLM worker until SIGINT/SIGTERM. Raises ``ConfigError`` for bad flags and
    ``EngineStartError`` when vLLM cannot start."""
    import anyio

    from dyn.core.worker.runner import run_hosts

    host = build_host(config, settings, model_path=model_path, model_name=model_name)
    anyio.run(run_hosts, [host])


ENGINE = EnginePlugin(name="vllm", serve=serve,
                      summary="vLLM's AsyncLLM: real model, prefix caching, priority scheduling, "
                              "KV events from vLLM's own publisher.")
