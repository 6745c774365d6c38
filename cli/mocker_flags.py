"""The mocker engine's flags, shared by ``dyn worker mocker`` and ``dyn bench replay --offline``.

``@mocker_flags`` (``dyn.cli.config_flags``) puts every flag below in place of the command's
``mocker_config`` parameter and hands the command one validated ``MockerConfig`` instead of
sixteen loose values. A bad value or combination exits with status 2
and a sentence naming the flag (``--replies`` is read here, so a bad file is reported before
anything starts). Worker-side flags (``--num-workers``, discovery, model) stay with
each command.
"""

from __future__ import annotations

from typing import Any

from dyn.cli import options
from dyn.cli.config_flags import config_flags
from dyn.cli.options import flag

PANEL = options.ENGINE_PANEL

# name -> (annotation, option); the names are MockerConfig's fields or handled in _config
_FLAGS: dict[str, tuple[Any, Any]] = {
    "block_size": (int, flag(64, "--block-size", panel=PANEL, help="Tokens per KV block.")),
    "num_gpu_blocks_override": (int, flag(16384, "--num-gpu-blocks-override", panel=PANEL,
                                          help="KV blocks per simulated worker.")),
    "max_num_seqs": (int, flag(256, "--max-num-seqs", panel=PANEL,
                               help="Most requests running in one forward pass.")),
    "max_num_batched_tokens": (int, flag(8192, "--max-num-batched-tokens", panel=PANEL,
                                         help="Token budget of one forward pass.")),
    "enable_prefix_caching": (bool, flag(
        True, "--enable-prefix-caching/--no-enable-prefix-caching", panel=PANEL,
        help="Reuse cached KV blocks of shared prompt prefixes.")),
    "enable_chunked_prefill": (bool, flag(
        True, "--enable-chunked-prefill/--no-enable-chunked-prefill", panel=PANEL,
        help="Split long prompts across passes to fit the token budget.")),
    "preemption_mode": (str, flag(
        "lifo", "--preemption-mode", panel=PANEL,
        help="Which running request to preempt when KV blocks run out: lifo or fifo.")),
    "speedup_ratio": (float, flag(
        1.0, "--speedup-ratio", panel=PANEL,
        help="Divide every simulated pass time by this (<= 0: no scaling).")),
    "decode_speedup_ratio": (float, flag(
        1.0, "--decode-speedup-ratio", panel=PANEL,
        help="Further divide simulated decode time by this.")),
    "engine_type": (str, flag(
        "vllm", "--engine-type", panel=PANEL,
        help="Engine flavour to simulate: vllm or sglang (same pass loop; flags and "
             "priority conventions differ; SGLang's new_token_ratio and lpm are not simulated).")),
    "scheduling_policy": (str, flag(
        "fcfs", "--scheduling-policy", panel=PANEL,
        help="vLLM flavour: fcfs, or priority (waiting queue by priority then arrival, "
             "smaller value first; preempt the largest priority).")),
    "enable_priority_scheduling": (bool, flag(
        False, "--enable-priority-scheduling", panel=PANEL,
        help="SGLang flavour: order the waiting queue by priority, larger value "
             "first; a request without one goes last.")),
    "schedule_low_priority_values_first": (bool, flag(
        False, "--schedule-low-priority-values-first", panel=PANEL,
        help="SGLang flavour: smaller priority values are more important "
             "(the worker then advertises lower_first).")),
    "radix_eviction_policy": (str, flag(
        "lru", "--radix-eviction-policy", panel=PANEL,
        help="SGLang flavour: lru, or priority (evict the blocks of the smallest priority "
             "values first, as SGLang does in either scheduling order; ties least recently used).")),
    "enable_streaming_session": (bool, flag(
        False, "--enable-streaming-session", panel=PANEL,
        help="SGLang flavour: offer streaming sessions that hold a conversation's "
             "KV between turns, outside the prefix cache.")),
    "reasoning": (str, flag(
        None, "--reasoning", panel=PANEL,
        help='Start every output with a thinking section, as JSON: {"start_thinking_token_id": A, '
             '"end_thinking_token_id": B, "thinking_ratio": R} (R of max_tokens). Without it a '
             "request's max_thinking_tokens has no effect.")),
    "replies": (str, flag(
        None, "--replies", panel=PANEL,
        help='Scripted answers, a JSON lines file of {"match": REGEX, "text": RAW_MODEL_OUTPUT}: the '
             "first entry whose regex is found in the conversation's last message (a user message or "
             "a tool result) is streamed as the model's output, then EOS; other requests get random "
             "tokens. Scripts a whole agent tool loop.")),
    "tool_call_rate": (float, flag(
        0.0, "--tool-call-rate", panel=PANEL,
        help="Probability (0..1, drawn from the request's seed) that a request offering tools with "
             "tool_choice auto is answered with one call to one of them, its arguments valid under the "
             "tool's schema, written in the worker's --dyn-tool-call-parser format (required when > 0). "
             "--replies wins when an entry matches.")),
}


def mocker_config(values: dict[str, Any]) -> Any:
    """The validated ``MockerConfig`` of the flags' values; ``ValueError`` names what to fix."""
    from dyn.plugins.mocker.config import MockerConfig, ReasoningConfig
    from dyn.plugins.mocker.replies import Replies

    reasoning = values["reasoning"]
    if values["replies"] is not None:
        Replies.load(values["replies"])  # a bad file stops the command before anything starts
    return MockerConfig(
        block_size=values["block_size"], num_gpu_blocks=values["num_gpu_blocks_override"],
        max_num_seqs=values["max_num_seqs"], max_num_batched_tokens=values["max_num_batched_tokens"],
        enable_prefix_caching=values["enable_prefix_caching"],
        enable_chunked_prefill=values["enable_chunked_prefill"],
        preemption_mode=values["preemption_mode"], speedup_ratio=values["speedup_ratio"],
        decode_speedup_ratio=values["decode_speedup_ratio"], engine_type=values["engine_type"],
        scheduling_policy=values["scheduling_policy"],
        enable_priority_scheduling=values["enable_priority_scheduling"],
        schedule_low_priority_values_first=values["schedule_low_priority_values_first"],
        radix_eviction_policy=values["radix_eviction_policy"],
        enable_streaming_session=values["enable_streaming_session"],
        reasoning=ReasoningConfig.parse(reasoning) if reasoning else None,
        replies=values["replies"], tool_call_rate=values["tool_call_rate"],
    ).validate()


mocker_flags = config_flags("mocker_config", _FLAGS, mocker_config)
"""Put the mocker flags where a command's ``mocker_config`` parameter is; the command receives
that parameter as a validated ``MockerConfig``."""
