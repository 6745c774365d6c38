"""``dyn worker vllm``'s engine flags: the common vLLM engine flags, under vLLM's own names.

``@vllm_flags`` (``dyn.cli.config_flags``) hands the command one validated ``VllmConfig``. Each
flag left unset keeps vLLM's default; any other vLLM engine flag is passed through untouched
(the command collects it into ``VllmConfig.extra_args``).
"""

from __future__ import annotations

from typing import Any

from dyn.cli import options
from dyn.cli.config_flags import config_flags
from dyn.cli.options import flag

PANEL = options.ENGINE_PANEL

_FLAGS: dict[str, tuple[Any, Any]] = {
    "dtype": (str, flag(None, "--dtype", panel=PANEL,
                        help="Weights and activations dtype: auto, bfloat16, float16, float32.")),
    "max_model_len": (int, flag(None, "--max-model-len", panel=PANEL,
                                help="Context length (default: the model's).")),
    "block_size": (int, flag(None, "--block-size", panel=PANEL,
                             help="Tokens per KV block (registered for the router's hashing).")),
    "enable_prefix_caching": (bool, flag(
        None, "--enable-prefix-caching/--no-enable-prefix-caching", panel=PANEL,
        help="Reuse cached KV blocks of shared prompt prefixes (vLLM's default: on).")),
    "gpu_memory_utilization": (float, flag(None, "--gpu-memory-utilization", panel=PANEL,
                                           help="Fraction of GPU memory vLLM may use (0-1].")),
    "max_num_seqs": (int, flag(None, "--max-num-seqs", panel=PANEL,
                               help="Most requests running in one forward pass.")),
    "max_num_batched_tokens": (int, flag(None, "--max-num-batched-tokens", panel=PANEL,
                                         help="Token budget of one forward pass.")),
    "tensor_parallel_size": (int, flag(None, "--tensor-parallel-size", "-tp", panel=PANEL,
                                       help="GPUs one model replica is split across.")),
    "scheduling_policy": (str, flag(
        None, "--scheduling-policy", panel=PANEL,
        help="fcfs, or priority: the waiting queue by request priority (smaller first), then "
             "arrival; nvext.agent_hints.priority reaches vLLM only with priority.")),
    "enforce_eager": (bool, flag(False, "--enforce-eager", panel=PANEL,
                                 help="Run eagerly: no CUDA graphs or torch.compile (faster start).")),
    "seed": (int, flag(None, "--seed", panel=PANEL, help="vLLM's random seed.")),
    "kv_events_config": (str, flag(
        None, "--kv-events-config", panel=PANEL,
        help="vLLM's KV-event publisher config as JSON (default: ZMQ PUB and replay sockets on "
             "--host at free ports, advertised in discovery).")),
}


def vllm_config(values: dict[str, Any]) -> Any:
    """The validated ``VllmConfig`` of the flags' values (extra flags are added by the command)."""
    from dyn.plugins.vllm.config import VllmConfig

    config = VllmConfig(**values)
    config.validate()
    return config


vllm_flags = config_flags("vllm_config", _FLAGS, vllm_config)
"""Put the vLLM flags where a command's ``vllm_config`` parameter is."""
