"""The mocker engine: a faithful GPU-free simulation of an LLM engine (Dynamo's mocker).

Registered as the ``mocker`` entry point of ``dyn.engines``; ``ENGINE.serve`` runs
``--num-workers`` simulated workers in this process, each with its own instance id, sockets,
scheduler and KV cache.
"""

from __future__ import annotations

from dyn.core.engine import EnginePlugin
from dyn.core.worker.settings import WorkerSettings
from dyn.plugins.mocker.config import MockerConfig


def build_hosts(config: MockerConfig, settings: WorkerSettings, *, model_path: str | None,
                model_name: str | None, num_workers: int):
    """Create ``num_workers`` ready-to-run worker hosts. Raises ``ConfigError`` for bad input."""
    from dyn.core.discovery.store import open_store
    from dyn.core.errors import ConfigError
    from dyn.core.model import load_model_info
    from dyn.core.transport.event_plane import KvEventPublisher
    from dyn.core.worker.host import WorkerHost
    from dyn.plugins.mocker.engine import MockerEngine, answers_for

    try:
        config.validate()
        model = load_model_info(model_path, model_name)
        answers = answers_for(config, model, settings.tool_call_parser)
        store = open_store(settings.discovery_backend, settings.namespace, settings.discovery_dir)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if num_workers < 1:
        raise ConfigError("--num-workers must be at least 1")
    hosts = []
    for _ in range(num_workers):
        publisher = KvEventPublisher(settings.host)
        engine = MockerEngine(config, model, publisher.publish, answers=answers)
        hosts.append(WorkerHost(engine, engine_name="mocker", model_name=model.name, store=store,
                                settings=settings, kv_publisher=publisher))
    return hosts


def serve(config: MockerConfig, settings: WorkerSettings, *, model_path: str | None = None,
          model_name: str | None = None, num_workers: int = 1) -> None:
    """Run mocker workers until SIGINT/SIGTERM. Raises ``ConfigError`` for bad input."""
    import anyio

    from dyn.core.worker.runner import run_hosts

    hosts = build_hosts(config, settings, model_path=model_path, model_name=model_name,
                        num_workers=num_workers)
    anyio.run(run_hosts, hosts)


ENGINE = EnginePlugin(name="mocker", serve=serve,
                      summary="Simulated engine: no GPU, real scheduling, KV cache and events.")
