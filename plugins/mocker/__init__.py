"""The mocker engine: a faithful GPU-free simulation of an LLM engine (Dynamo's mocker).

Registered as the ``mocker`` entry point of ``dyn.engines``: ``dyn worker mocker`` runs
``--num-workers`` simulated workers in this process, each with its own instance id, sockets,
scheduler and KV cache. The engine flags are ``MockerConfig``'s; the host publishes the KV events
each simulated step hands it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import msgspec

from dyn.core.config import WORKER_PANEL, flag
from dyn.core.engine import EnginePlugin, KvEventSink
from dyn.core.worker.settings import WorkerSettings
from dyn.plugins.mocker.config import MockerConfig


class MockerWorkers(msgspec.Struct, kw_only=True, frozen=True):
    """``dyn worker mocker``'s worker-level flag."""

    num_workers: Annotated[
        int,
        msgspec.Meta(ge=1),
        flag(
            "--num-workers",
            panel=WORKER_PANEL,
            help="Simulated workers hosted by this process, each with its own instance id, sockets and "
            "cache.",
        ),
    ] = 1


def create_engines(
    config: MockerConfig, model: Any, settings: WorkerSettings, kv_sinks: Sequence[KvEventSink | None]
) -> list[Any]:
    """One simulated engine per sink; they share the scripted answers (read once)."""
    from dyn.plugins.mocker.engine import MockerEngine, answers_for

    answers = answers_for(config, model, settings.tool_call_parser)
    return [
        MockerEngine(config, model, sink, answers=answers, disaggregation_mode=settings.disaggregation_mode)
        for sink in kv_sinks
    ]


def build_hosts(
    config: MockerConfig,
    settings: WorkerSettings,
    *,
    model_path: str | None,
    model_name: str | None,
    num_workers: int,
):
    """Create ``num_workers`` ready-to-run worker hosts. Raises ``ConfigError`` for bad input."""
    from dyn.core.worker.launch import build_hosts

    return build_hosts(
        ENGINE, config, settings, model_path=model_path, model_name=model_name, num_workers=num_workers
    )


ENGINE = EnginePlugin(
    name="mocker",
    config_type=MockerConfig,
    create=create_engines,
    publishes_kv_events=False,
    worker_options=MockerWorkers,
    disaggregation=True,
    summary="Simulated engine: no GPU, real scheduling, KV cache and events.",
    description="""Simulated engine (the default): paged KV cache with prefix caching, continuous batching,
    chunked prefill, preemption, Dynamo's timing model or AIConfigurator's for a real GPU
    (--timing-model aic), real KV events; vLLM or SGLang flavour with
    priority scheduling, priority eviction, streaming sessions, prefix pinning and thinking
    sections; the prefill and decode roles of disaggregated serving, with a KV transfer time
    from --kv-transfer-bandwidth. Needs no GPU.""",
)
