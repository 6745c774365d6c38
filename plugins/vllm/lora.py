"""LoRA adapters of ``dyn worker vllm``: vLLM's engine flags for the adapters ``--lora-modules``
declares (parsed by ``dyn.core.model.lora``), and the ``LoRARequest`` each request carries.

Followed from vLLM 0.32 (``vllm/config/lora.py``, ``vllm/entrypoints/openai/models/serving.py``,
``vllm/lora/request.py``):

- ``--lora-modules`` is a ``vllm serve`` (API server) flag, not an engine flag: the worker parses
  it itself and gives vLLM ``--enable-lora`` with ``--max-loras``, ``--max-lora-rank`` and
  ``--max-cpu-loras`` (``engine_flags``). An adapter whose rank exceeds ``--max-lora-rank`` is
  refused before vLLM starts, naming it (vLLM finds out only when it loads the adapter).
- ``LoraAdapters`` gives each adapter the ``lora_int_id`` vLLM keys its loaded adapters by:
  1, 2, ... in the order given, fixed for the worker's life, as vLLM's own server numbers its
  ``--lora-modules`` (``OpenAIServingModels.init_static_loras``, a counter from 1). Routing never
  sees the id: block hashes mix the adapter *name* in (``dyn.core.kv.hashing``), as Dynamo's and
  vLLM's KV events (``BlockStored.lora_name``) do.

vLLM is imported only by ``LoraAdapters.lora_request``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dyn.core.model.lora import (  # noqa: F401  (re-exported: the worker's whole LoRA vocabulary)
    ADAPTER_CONFIG,
    MAX_LORA_MODULES,
    LoraModule,
    LoraSpecError,
    parse_lora_modules,
)

MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM 0.32 accepts for ``--max-lora-rank`` (``vllm/config/lora.py``, ``MaxLoRARanks``)."""


class UnknownLoraAdapter(ValueError):
    """A request named an adapter this worker does not serve."""


def adapter_rank(module: LoraModule) -> int:
    """The rank ``r`` in the adapter's ``adapter_config.json``; raises ``LoraSpecError``."""
    config_path = Path(module.path) / ADAPTER_CONFIG
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LoraSpecError(f"adapter {module.name!r}: cannot read {config_path}: {exc}") from None
    rank = config.get("r") if isinstance(config, dict) else None
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise LoraSpecError(f"adapter {module.name!r}: {config_path} has no positive integer rank 'r'")
    return rank


def engine_flags(
    modules: Sequence[LoraModule],
    *,
    max_loras: int | None = None,
    max_lora_rank: int | None = None,
    max_cpu_loras: int | None = None,
) -> list[str]:
    """vLLM's engine flags for serving ``modules``: none without adapters, else ``--enable-lora``
    and the limits given (``None``: vLLM's default: 1 adapter per batch, rank 16, as many kept in
    CPU memory as ``--max-loras``). Raises ``LoraSpecError`` for a limit vLLM would refuse and for
    an adapter whose rank exceeds ``--max-lora-rank``, naming it (vLLM finds that out only when it
    loads the adapter).
    """
    if not modules:
        if any(v is not None for v in (max_loras, max_lora_rank, max_cpu_loras)):
            raise LoraSpecError("--max-loras, --max-lora-rank and --max-cpu-loras need --lora-modules")
        return []
    if max_loras is not None and max_loras < 1:
        raise LoraSpecError(f"--max-loras must be at least 1, got {max_loras}")
    if max_lora_rank is not None and max_lora_rank not in MAX_LORA_RANKS:
        raise LoraSpecError(
            f"--max-lora-rank must be one of {', '.join(map(str, MAX_LORA_RANKS))} (vLLM's sizes), "
            f"got {max_lora_rank}"
        )
    if max_cpu_loras is not None and max_cpu_loras < (max_loras or 1):
        raise LoraSpecError(
            f"--max-cpu-loras ({max_cpu_loras}) must be at least --max-loras ({max_loras or 1})"
        )
    limit = max_lora_rank or 16
    for module in modules:
        rank = adapter_rank(module)
        if rank > limit:
            raise LoraSpecError(
                f"adapter {module.name!r} has rank {rank}, above --max-lora-rank {limit}; raise "
                f"--max-lora-rank to at least {min(r for r in MAX_LORA_RANKS if r >= rank)}"
            )
    argv = ["--enable-lora"]
    for flag_name, value in (
        ("--max-loras", max_loras),
        ("--max-lora-rank", max_lora_rank),
        ("--max-cpu-loras", max_cpu_loras),
    ):
        if value is not None:
            argv += [flag_name, str(value)]
    return argv


class LoraAdapters:
    """The adapters one worker serves, each with the ``lora_int_id`` vLLM knows it by (1, 2, ...
    in the order given; the same for the worker's whole life)."""

    def __init__(self, modules: Sequence[LoraModule]) -> None:
        self.modules = list(modules)
        self._by_name = {m.name: (i, m) for i, m in enumerate(self.modules, start=1)}
        if len(self._by_name) != len(self.modules):
            raise LoraSpecError("adapter names must be unique")

    def names(self) -> list[str]:
        return [m.name for m in self.modules]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def int_id(self, name: str) -> int:
        """The adapter's ``lora_int_id``; raises ``UnknownLoraAdapter``."""
        return self._lookup(name)[0]

    def lora_request(self, lora_name: str | None) -> Any:
        """vLLM's ``LoRARequest`` for a request's ``lora_name`` (``None`` or empty: the base model,
        no request); raises ``UnknownLoraAdapter`` for a name this worker does not serve."""
        if not lora_name:
            return None
        int_id, module = self._lookup(lora_name)
        from vllm.lora.request import LoRARequest

        return LoRARequest(
            lora_name=module.name,
            lora_int_id=int_id,
            lora_path=module.path,
            base_model_name=module.base_model_name,
        )

    def _lookup(self, name: str) -> tuple[int, LoraModule]:
        found = self._by_name.get(name)
        if found is None:
            served = ", ".join(self.names()) or "none"
            raise UnknownLoraAdapter(f"this worker serves no LoRA adapter {name!r} (it serves: {served})")
        return found
