"""The SGLang engine: ``dyn worker sglang`` hosts one SGLang ``Engine`` as a dyn worker.

Registered as the ``sglang`` entry point of ``dyn.engines``. SGLang itself is imported only when
the engine starts, so this package loads without it (``dyn --help``, the mocker, the tests).
SGLang publishes its own KV events (the worker advertises where); see ``engine`` for what is
registered and how requests, aborts and streaming sessions map onto SGLang.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dyn.core.config import MODEL_PANEL, flag
from dyn.core.engine import EnginePlugin
from dyn.core.worker.settings import WorkerSettings
from dyn.plugins.sglang.config import SglangConfig


def load_model(model_path: str | None, model_name: str | None, tokenizer_path: str | None = None) -> Any:
    """The local model directory SGLang loads (the frontend tokenizes with the same one)."""
    from dyn.core.model import load_model_info

    if model_path is None:
        raise ValueError(
            "dyn worker sglang needs --model-path: the local Hugging Face model directory "
            "SGLang loads and the frontend tokenizes with"
        )
    return load_model_info(model_path, model_name, tokenizer_path)


def prepare(config: SglangConfig, extra_args: Sequence[str]) -> SglangConfig:
    from dyn.plugins.sglang.config import merge_extra_args

    return merge_extra_args(config, extra_args).validate()


def create_engines(
    config: SglangConfig, model: Any, settings: WorkerSettings, kv_sinks: Sequence[Any]
) -> list[Any]:
    from dyn.plugins.sglang.engine import SglangEngine

    return [
        SglangEngine(
            config,
            model_path=str(model.path),
            tokenizer_path=str(model.tokenizer_path) if model.tokenizer_path else None,
            host=settings.host,
            context_length=model.context_length,
        )
        for _ in kv_sinks
    ]


def build_host(
    config: SglangConfig,
    settings: WorkerSettings,
    *,
    model_path: str | None,
    model_name: str | None = None,
    extra_args: Sequence[str] = (),
):
    """A ready-to-run worker host around one (not yet started) SGLang engine.

    ``model_path`` is a local Hugging Face model directory (the frontend tokenizes with the same
    one); ``extra_args`` are further SGLang server flags. Raises ``ConfigError`` for what can be
    checked before SGLang starts; SGLang's own checks raise ``EngineStartError`` when the host runs.
    """
    from dyn.core.worker.launch import build_hosts

    return build_hosts(
        ENGINE, config, settings, model_path=model_path, model_name=model_name, extra_args=extra_args
    )[0]


ENGINE = EnginePlugin(
    name="sglang",
    config_type=SglangConfig,
    create=create_engines,
    load_model=load_model,
    prepare=prepare,
    passes_through=True,
    model_path=flag(
        "--model-path",
        panel=MODEL_PANEL,
        default=...,
        help="Local Hugging Face model directory SGLang loads (the frontend tokenizes with the same one).",
    ),
    summary="SGLang's Engine: real model, radix cache, priority scheduling and "
    "eviction, streaming sessions, KV events from SGLang's publisher.",
    description="""SGLang engine (needs the sglang extra): one sglang.Engine per worker process, with priority
    scheduling and eviction, streaming sessions and SGLang's own KV events. Any other SGLang
    server flag is passed through as in python -m sglang.launch_server. On a CPU, --device cpu
    runs SGLang's CPU engine (scripts/provision_sglang_cpu.sh makes its venv).""",
)
