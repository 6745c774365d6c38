"""The SGLang engine's flags for ``dyn worker sglang``.

``@sglang_flags`` (``dyn.cli.config_flags``) puts every flag below in place of the command's
``sglang_config`` parameter and hands the command one validated ``SglangConfig``. Flag names and meanings are SGLang's own; a flag left unset is not passed, so
SGLang's default applies. A bad value or combination exits with status 2 and a sentence naming
the flag. Any other SGLang server flag is passed through by the command (``extra_args``) and read
by SGLang's own parser when the engine starts.
"""

from __future__ import annotations

from typing import Any

from dyn.cli import options
from dyn.cli.config_flags import config_flags
from dyn.cli.options import flag

PANEL = options.ENGINE_PANEL

# name -> (annotation, option); the names are SglangConfig's fields
_FLAGS: dict[str, tuple[Any, Any]] = {
    "tp_size": (int, flag(None, "--tp-size", panel=PANEL,
                          help="Tensor-parallel size: GPUs one SGLang engine spans.")),
    "mem_fraction_static": (float, flag(
        None, "--mem-fraction-static", panel=PANEL,
        help="Fraction of GPU memory for model weights and the KV cache pool (SGLang's default: "
             "picked from the GPU).")),
    "max_running_requests": (int, flag(None, "--max-running-requests", panel=PANEL,
                                       help="Most requests running at once.")),
    "max_prefill_tokens": (int, flag(
        None, "--max-prefill-tokens", panel=PANEL,
        help="Token budget of one prefill batch. Also registered as the worker's "
             "max_num_batched_tokens; unset, the whole KV pool is registered instead (as Dynamo "
             "does), which makes a router queue threshold much looser.")),
    "chunked_prefill_size": (int, flag(
        None, "--chunked-prefill-size", panel=PANEL,
        help="Most prompt tokens prefilled per chunk; -1 disables chunked prefill.")),
    "page_size": (int, flag(None, "--page-size", panel=PANEL,
                            help="Tokens per KV page; the worker's KV block size (SGLang's default: 1).")),
    "context_length": (int, flag(None, "--context-length", panel=PANEL,
                                 help="Longest sequence (default: the model's config.json).")),
    "dtype": (str, flag(None, "--dtype", panel=PANEL,
                        help="Weights and activations: auto, half, float16, bfloat16, float or float32.")),
    "enable_priority_scheduling": (bool, flag(
        False, "--enable-priority-scheduling", panel=PANEL,
        help="Order the waiting queue by request priority, larger value first.")),
    "schedule_low_priority_values_first": (bool, flag(
        False, "--schedule-low-priority-values-first", panel=PANEL,
        help="Smaller priority values are more important (the worker then advertises lower_first).")),
    "radix_eviction_policy": (str, flag(
        None, "--radix-eviction-policy", panel=PANEL,
        help="lru, or priority (evict the cached prefixes of the smallest priority values first, "
             "in either scheduling order).")),
    "enable_streaming_session": (bool, flag(
        False, "--enable-streaming-session", panel=PANEL,
        help="Offer streaming sessions (nvext.session_control) that hold a conversation's KV "
             "between turns, outside the radix cache.")),
    "disable_radix_cache": (bool, flag(
        False, "--disable-radix-cache", panel=PANEL,
        help="Turn off prefix caching (no KV events are published then).")),
    "kv_events_config": (str, flag(
        None, "--kv-events-config", panel=PANEL,
        help="SGLang's KV-events JSON, passed as given (default: dyn builds one that publishes on "
             "free ports of --host).")),
    "kv_events_endpoint": (str, flag(
        None, "--kv-events-endpoint", panel=PANEL,
        help="tcp://HOST:PORT the KV-event publisher binds when dyn builds the KV-events config.")),
}


def sglang_config(values: dict[str, Any]) -> Any:
    """The validated ``SglangConfig`` of the flags' values; ``ValueError`` names what to fix."""
    from dyn.plugins.sglang.config import SglangConfig

    return SglangConfig(**values).validate()


sglang_flags = config_flags("sglang_config", _FLAGS, sglang_config)
"""Put the SGLang flags where a command's ``sglang_config`` parameter is."""
