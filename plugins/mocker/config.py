"""Configuration of the mocker engine; flag names and defaults mirror Dynamo's mocker, vLLM and SGLang.

The mocker simulates one of two engine flavours (``engine_type``). Both run the same pass loop; they
differ in the flags they accept and in how they read ``GenerateRequest.priority``:

- ``vllm``: ``--scheduling-policy fcfs|priority`` (smaller priority value first);
- ``sglang``: ``--enable-priority-scheduling`` (larger value first, or smaller with
  ``--schedule-low-priority-values-first``), ``--radix-eviction-policy lru|priority`` and
  ``--enable-streaming-session``.

A flag of the other flavour is refused by ``validate`` with a sentence naming ``--engine-type``.
Each field declares its own flag (``dyn.core.config``); ``dyn worker mocker`` and ``dyn bench replay
--offline`` offer them. The ``--aic-*`` flags of ``--timing-model aic`` are the KV router's own
declarations (``dyn.core.router.config``), so a command with both (``dyn bench replay``) declares
them once and hands the router's values to the mocker (``dyn.cli.mocker_flags``).
"""

from __future__ import annotations

import math
from typing import Annotated

import msgspec

from dyn.core.config import ENGINE_PANEL, flag
from dyn.core.router.config import (
    AicAttentionDpSize,
    AicBackend,
    AicBackendVersion,
    AicModelPath,
    AicMoeEpSize,
    AicMoeTpSize,
    AicSystem,
    AicTpSize,
    check_aic_flags,
)

PREEMPTION_MODES = ("lifo", "fifo")
TIMING_MODELS = ("polynomial", "aic")
ENGINE_TYPES = ("vllm", "sglang")
SCHEDULING_POLICIES = ("fcfs", "priority")
RADIX_EVICTION_POLICIES = ("lru", "priority")
RUNNERS = ("auto", "generate", "pooling")
"""vLLM's ``--runner`` values the mocker takes; ``auto`` is ``generate`` (dyn-tiny generates)."""
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
"""vLLM's ``--kv-cache-dtype`` values (and ``float16``); ``auto``: the model's ``torch_dtype``."""
MAX_TRANSFER_S = 60.0
"""The longest one simulated KV transfer takes (before ``--speedup-ratio``), whatever the bandwidth."""
HOST_KV_BYTES_PER_TOKEN = 131072
"""KV bytes of one token of a Llama-3-8B-class model (32 layers x K and V x 8 KV heads x 128 dims x
2 bytes of bfloat16 = 128 KiB), the class of model the timing polynomials stand for: what
``--host-kv-transfer-ms-per-block`` defaults from."""
HOST_LINK_GB_S = 25.0
"""Host-to-device copy bandwidth, GB/s: what a PCIe Gen4 x16 link (32 GB/s raw) moves from pinned
host memory in practice; Gen5 doubles it."""


class ReasoningConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Dynamo mocker's ``--reasoning``: every output starts with a thinking section
    ``[start_thinking_token_id, ..., end_thinking_token_id]`` of ``floor(max_tokens *
    thinking_ratio)`` tokens (boundaries included; at least 2, none when that is 0 or
    ``max_tokens < 2``)."""

    start_thinking_token_id: int
    end_thinking_token_id: int
    thinking_ratio: float

    @classmethod
    def parse(cls, text: str) -> ReasoningConfig:
        """Decode the flag's JSON; raise ``ValueError`` saying what to fix."""
        try:
            return msgspec.json.decode(text, type=cls).validate()
        except msgspec.ValidationError as exc:
            raise ValueError(
                "--reasoning must be a JSON object with start_thinking_token_id, "
                f"end_thinking_token_id and thinking_ratio: {exc}"
            ) from None
        except msgspec.DecodeError as exc:
            raise ValueError(f"--reasoning is not valid JSON: {exc}") from None

    def validate(self) -> ReasoningConfig:
        if self.start_thinking_token_id < 0 or self.end_thinking_token_id < 0:
            raise ValueError("--reasoning token ids must be non-negative")
        if not (0.0 <= self.thinking_ratio <= 1.0) or math.isnan(self.thinking_ratio):
            raise ValueError("--reasoning thinking_ratio must be between 0 and 1")
        return self


def _parse_reasoning(text: str | None) -> ReasoningConfig | None:
    return ReasoningConfig.parse(text) if text else None


def _checked_replies(path: str | None) -> str | None:
    """A bad replies file stops the command before anything starts."""
    if path is not None:
        from dyn.plugins.mocker.replies import Replies

        Replies.load(path)
    return path


class MockerConfig(msgspec.Struct, kw_only=True, frozen=True):
    """One simulated worker's engine settings, each declared with its flag (``dyn.core.config``).

    ``speedup_ratio`` divides every simulated pass time (``decode_speedup_ratio`` divides decode
    time on top); a ratio <= 0 means no scaling, i.e. the raw model time. ``timing_model`` says
    what a pass's raw time is: Dynamo's polynomials (``dyn.plugins.mocker.timing``) or
    AIConfigurator's tables of the ``aic_*`` setup (``dyn.plugins.mocker.aic_timing``).
    """

    block_size: Annotated[int, flag("--block-size", panel=ENGINE_PANEL, help="Tokens per KV block.")] = 64
    num_gpu_blocks: Annotated[
        int, flag("--num-gpu-blocks-override", panel=ENGINE_PANEL, help="KV blocks per simulated worker.")
    ] = 16384
    max_num_seqs: Annotated[
        int, flag("--max-num-seqs", panel=ENGINE_PANEL, help="Most requests running in one forward pass.")
    ] = 256
    max_num_batched_tokens: Annotated[
        int, flag("--max-num-batched-tokens", panel=ENGINE_PANEL, help="Token budget of one forward pass.")
    ] = 8192
    max_model_len: Annotated[
        int | None,
        flag(
            "--max-model-len",
            panel=ENGINE_PANEL,
            cli_type=int,
            help="Context length, as vLLM's flag (default: the model's): the worker advertises it and "
            "refuses a request whose prompt plus max_tokens exceeds it; at most the model's own.",
        ),
    ] = None
    """``--max-model-len``: caps the model's context for this worker (``context_length``)."""
    enable_prefix_caching: Annotated[
        bool,
        flag(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            panel=ENGINE_PANEL,
            help="Reuse cached KV blocks of shared prompt prefixes.",
        ),
    ] = True
    enable_chunked_prefill: Annotated[
        bool,
        flag(
            "--enable-chunked-prefill/--no-enable-chunked-prefill",
            panel=ENGINE_PANEL,
            help="Split long prompts across passes to fit the token budget.",
        ),
    ] = True
    preemption_mode: Annotated[
        str,
        flag(
            "--preemption-mode",
            panel=ENGINE_PANEL,
            help="Which running request to preempt when KV blocks run out: lifo or fifo.",
        ),
    ] = "lifo"
    speedup_ratio: Annotated[
        float,
        flag(
            "--speedup-ratio",
            panel=ENGINE_PANEL,
            help="Divide every simulated pass time by this (<= 0: no scaling).",
        ),
    ] = 1.0
    decode_speedup_ratio: Annotated[
        float,
        flag(
            "--decode-speedup-ratio", panel=ENGINE_PANEL, help="Further divide simulated decode time by this."
        ),
    ] = 1.0
    timing_model: Annotated[
        str,
        flag(
            "--timing-model",
            panel=ENGINE_PANEL,
            help="How long a simulated pass takes: polynomial (Dynamo mocker's curves: prefill from "
            "the pass's new tokens, decode from KV utilization), or aic: AIConfigurator's predictions "
            "for the GPU system, engine and model of the --aic-* flags (each request's prefill from its "
            "new and cached tokens; a decode step from the batch size and mean context), tabulated at "
            "start and cached on disk; needs pip install 'dyn[aic]'.",
        ),
    ] = "polynomial"
    aic_backend: AicBackend = None
    aic_system: AicSystem = None
    aic_model_path: AicModelPath = None
    aic_backend_version: AicBackendVersion = None
    aic_tp_size: AicTpSize = 1
    aic_moe_tp_size: AicMoeTpSize = None
    aic_moe_ep_size: AicMoeEpSize = None
    aic_attention_dp_size: AicAttentionDpSize = None
    engine_type: Annotated[
        str,
        flag(
            "--engine-type",
            panel=ENGINE_PANEL,
            help="Engine flavour to simulate: vllm or sglang (same pass loop; flags and "
            "priority conventions differ; SGLang's new_token_ratio and lpm are not simulated).",
        ),
    ] = "vllm"
    device: Annotated[
        str,
        flag(
            "--device",
            panel=ENGINE_PANEL,
            help="What the simulated worker says it computes on, for --router-mode "
            "device-aware-weighted: cuda (a GPU, what the timing model simulates) or cpu. The "
            "timing model is the same either way.",
        ),
    ] = "cuda"
    scheduling_policy: Annotated[
        str,
        flag(
            "--scheduling-policy",
            panel=ENGINE_PANEL,
            help="vLLM flavour: fcfs, or priority (waiting queue by priority then arrival, "
            "smaller value first; preempt the largest priority).",
        ),
    ] = "fcfs"
    """vLLM flavour: ``priority`` orders the waiting queue by (priority, arrival)."""
    enable_priority_scheduling: Annotated[
        bool,
        flag(
            "--enable-priority-scheduling",
            panel=ENGINE_PANEL,
            help="SGLang flavour: order the waiting queue by priority, larger value "
            "first; a request without one goes last.",
        ),
    ] = False
    """SGLang flavour: order the waiting queue by priority, larger value first."""
    schedule_low_priority_values_first: Annotated[
        bool,
        flag(
            "--schedule-low-priority-values-first",
            panel=ENGINE_PANEL,
            help="SGLang flavour: smaller priority values are more important "
            "(the worker then advertises lower_first).",
        ),
    ] = False
    """SGLang flavour: smaller priority values are the more important ones."""
    radix_eviction_policy: Annotated[
        str,
        flag(
            "--radix-eviction-policy",
            panel=ENGINE_PANEL,
            help="SGLang flavour: lru, or priority (evict the blocks of the smallest priority "
            "values first, as SGLang does in either scheduling order; ties least recently used).",
        ),
    ] = "lru"
    """SGLang flavour: ``priority`` evicts the least important cached leaf first."""
    enable_streaming_session: Annotated[
        bool,
        flag(
            "--enable-streaming-session",
            panel=ENGINE_PANEL,
            help="SGLang flavour: offer streaming sessions that hold a conversation's "
            "KV between turns, outside the prefix cache.",
        ),
    ] = False
    """SGLang flavour: offer streaming sessions (``open_session`` / ``close_session``)."""
    reasoning: Annotated[
        ReasoningConfig | None,
        flag(
            "--reasoning",
            panel=ENGINE_PANEL,
            cli_type=str,
            parse=_parse_reasoning,
            help='Start every output with a thinking section, as JSON: {"start_thinking_token_id": A, '
            '"end_thinking_token_id": B, "thinking_ratio": R} (R of max_tokens). Without it a '
            "request's max_thinking_tokens has no effect.",
        ),
    ] = None
    replies: Annotated[
        str | None,
        flag(
            "--replies",
            panel=ENGINE_PANEL,
            cli_type=str,
            parse=_checked_replies,
            help='Scripted answers, a JSON lines file of {"match": REGEX, "text": RAW_MODEL_OUTPUT}: the '
            "first entry whose regex is found in the conversation's last user message or tool result "
            "(system and developer messages after it are skipped) is streamed as the model's output, "
            "then EOS; other requests get random tokens. Scripts a whole agent tool loop.",
        ),
    ] = None
    """``--replies``: a JSON lines file of scripted answers (``replies``); read at start-up."""
    tool_call_rate: Annotated[
        float,
        flag(
            "--tool-call-rate",
            panel=ENGINE_PANEL,
            help="Probability (0..1, drawn from the request's seed) that a request offering tools with "
            "tool_choice auto is answered with one call to one of them, its arguments valid under the "
            "tool's schema, written in the worker's --dyn-tool-call-parser format (required when > 0). "
            "--replies wins when an entry matches.",
        ),
    ] = 0.0
    """``--tool-call-rate``: the probability that a request offering tools gets a tool call."""
    runner: Annotated[
        str,
        flag(
            "--runner",
            panel=ENGINE_PANEL,
            help="Model runner, as vLLM's --runner: auto or generate, or pooling: the worker embeds "
            "(POST /v1/embeddings) and refuses to generate.",
        ),
    ] = "auto"
    """``pooling``: an embedding worker whose vectors are unit vectors of the model's hidden size,
    seeded by the tokens, each costing a prefill (``dyn.plugins.mocker.embeddings``); else it
    generates."""

    lora_modules: Annotated[
        tuple[str, ...],
        flag(
            "--lora-modules",
            panel=ENGINE_PANEL,
            cli_type=list[str],
            parse=tuple,
            help="LoRA adapters to simulate, as vLLM's flag: NAME=PATH or a JSON object with name, "
            "path and base_model_name, several as --lora-modules a=/x b=/y (the path is only "
            "listed). Requests whose model names one run with it: its own prefix cache and block "
            "hashes, and a load time when it is not resident.",
        ),
    ] = ()
    """``--lora-modules``: the simulated adapters (``dyn.core.model.lora``)."""
    max_loras: Annotated[
        int,
        flag(
            "--max-loras",
            panel=ENGINE_PANEL,
            help="Most LoRA adapters resident at once (vLLM's flag); using another one evicts the "
            "least recently used and costs --lora-load-time-ms.",
        ),
    ] = 1
    lora_load_time_ms: Annotated[
        float,
        flag(
            "--lora-load-time-ms",
            panel=ENGINE_PANEL,
            help="Simulated time to load a LoRA adapter that is not resident, divided by --speedup-ratio.",
        ),
    ] = 50.0

    kv_transfer_bandwidth: Annotated[
        float,
        flag(
            "--kv-transfer-bandwidth",
            panel=ENGINE_PANEL,
            help="Disaggregated serving: GB/s at which a decode worker receives a prompt's KV from its "
            "prefill worker; the request waits (prompt tokens it does not hold locally) x "
            "--kv-bytes-per-token / bandwidth, at most 60 s, divided by --speedup-ratio, while the "
            "other requests run. 0: transfers take no time.",
        ),
    ] = 64.0
    kv_bytes_per_token: Annotated[
        int | None,
        flag(
            "--kv-bytes-per-token",
            panel=ENGINE_PANEL,
            cli_type=int,
            help="KV bytes of one token for the transfer time (default: from the model's config.json, "
            "layers x 2 x KV heads x head dim x --kv-cache-dtype bytes; 0 when it states no sizes).",
        ),
    ] = None
    kv_cache_dtype: Annotated[
        str,
        flag(
            "--kv-cache-dtype",
            panel=ENGINE_PANEL,
            help="KV cache data type, as vLLM's flag, for --kv-bytes-per-token's default: auto (the "
            "model's torch_dtype), bfloat16, float16 (2 bytes), fp8, fp8_e4m3, fp8_e5m2, fp8_inc, "
            "fp8_ds_mla (1 byte).",
        ),
    ] = "auto"

    num_host_kv_blocks: Annotated[
        int,
        flag(
            "--num-host-kv-blocks",
            panel=ENGINE_PANEL,
            help="Host (CPU) KV tier of this many blocks, as vLLM's CPU offloading or Dynamo's KVBM "
            "G2: a cached block evicted from the device is offloaded there (KV events with medium "
            "CPU_PINNED; least recently used dropped when full) and a prompt prefix continuing there "
            "is copied back instead of recomputed (counted cached, costing "
            "--host-kv-transfer-ms-per-block). 0: no host tier. Needs prefix caching.",
        ),
    ] = 0
    """``--num-host-kv-blocks``: the host tier's capacity (``dyn.plugins.mocker.host_tier``)."""
    host_kv_transfer_ms_per_block: Annotated[
        float | None,
        flag(
            "--host-kv-transfer-ms-per-block",
            panel=ENGINE_PANEL,
            cli_type=float,
            help="Simulated time to copy one KV block from the host tier back to the device, added to "
            "the pass that admits the request and divided by --speedup-ratio. Default: --block-size x "
            "128 KiB (a Llama-3-8B-class token's bfloat16 KV) over 25 GB/s (PCIe Gen4 x16 from pinned "
            "memory): 0.084 ms for 16-token blocks, 0.34 ms for 64.",
        ),
    ] = None
    """``None``: ``host_transfer_ms_per_block`` derives it from the block size (see its docstring)."""

    @property
    def host_transfer_ms_per_block(self) -> float:
        """Milliseconds (unscaled) one block takes to come back from the host tier: the flag, or
        ``block_size * HOST_KV_BYTES_PER_TOKEN`` bytes at ``HOST_LINK_GB_S``. A 16-token block of
        a Llama-3-8B-class model is 2 MiB, 0.084 ms at 25 GB/s; recomputing it costs about 0.24 ms
        at the prefill polynomial's marginal 0.0152 ms a token, so a host hit is cheaper than a
        recompute, as it is on a real GPU."""
        if self.host_kv_transfer_ms_per_block is not None:
            return self.host_kv_transfer_ms_per_block
        return self.block_size * HOST_KV_BYTES_PER_TOKEN / (HOST_LINK_GB_S * 1e9) * 1e3

    def context_length(self, model_context: int, model_name: str) -> int:
        """The context this worker serves: ``--max-model-len`` when set, else the model's own
        ``model_context``; ``ValueError`` for a value above the model's (vLLM refuses it too)."""
        if self.max_model_len is None:
            return model_context
        if self.max_model_len > model_context:
            raise ValueError(
                f"--max-model-len {self.max_model_len} is more than model {model_name}'s context "
                f"length of {model_context} tokens; pass at most {model_context}"
            )
        return self.max_model_len

    @property
    def is_pooling(self) -> bool:
        return self.runner == "pooling"

    @property
    def is_sglang(self) -> bool:
        return self.engine_type == "sglang"

    def validate(self) -> MockerConfig:
        """Raise ``ValueError`` with a sentence saying what to fix; return self when fine."""
        for name in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("--max-model-len must be at least 2 (one prompt and one output token)")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"--preemption-mode must be one of {', '.join(PREEMPTION_MODES)}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.block_size:
            raise ValueError("--max-num-batched-tokens must be at least --block-size")
        if self.engine_type not in ENGINE_TYPES:
            raise ValueError(f"--engine-type must be one of {', '.join(ENGINE_TYPES)}")
        if not self.device or not self.device.replace("_", "").isalnum():
            raise ValueError(f"--device must name a device (cuda, cpu, ...), got {self.device!r}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"--scheduling-policy must be one of {', '.join(SCHEDULING_POLICIES)}")
        if self.radix_eviction_policy not in RADIX_EVICTION_POLICIES:
            raise ValueError(f"--radix-eviction-policy must be one of {', '.join(RADIX_EVICTION_POLICIES)}")
        if self.is_sglang:
            if self.scheduling_policy != "fcfs":
                raise ValueError(
                    "--scheduling-policy is a vLLM flag: use --enable-priority-scheduling "
                    "with --engine-type sglang, or drop --engine-type sglang"
                )
        else:
            sglang_only = [
                flag
                for flag, used in (
                    ("--enable-priority-scheduling", self.enable_priority_scheduling),
                    ("--schedule-low-priority-values-first", self.schedule_low_priority_values_first),
                    ("--radix-eviction-policy", self.radix_eviction_policy != "lru"),
                    ("--enable-streaming-session", self.enable_streaming_session),
                )
                if used
            ]
            if sglang_only:
                raise ValueError(f"{sglang_only[0]} is an SGLang flag: add --engine-type sglang")
        if self.reasoning is not None:
            self.reasoning.validate()
        if not (0.0 <= self.tool_call_rate <= 1.0):
            raise ValueError("--tool-call-rate must be a probability between 0 and 1")
        if self.runner not in RUNNERS:
            raise ValueError(f"--runner must be one of {', '.join(RUNNERS)}")
        if self.max_loras < 1:
            raise ValueError("--max-loras must be at least 1")
        if not (0.0 <= self.lora_load_time_ms <= 600_000.0):
            raise ValueError("--lora-load-time-ms must be between 0 and 600000")
        if self.lora_modules and self.is_pooling:
            raise ValueError("--lora-modules needs a generating worker: drop --runner pooling")
        if not (0.0 <= self.kv_transfer_bandwidth < math.inf):
            raise ValueError("--kv-transfer-bandwidth must be a number of GB/s, at least 0")
        if self.kv_bytes_per_token is not None and self.kv_bytes_per_token < 0:
            raise ValueError("--kv-bytes-per-token must be at least 0")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}")
        if self.num_host_kv_blocks < 0:
            raise ValueError("--num-host-kv-blocks must be at least 0")
        if self.num_host_kv_blocks and not self.enable_prefix_caching:
            raise ValueError("--num-host-kv-blocks needs prefix caching: drop --no-enable-prefix-caching")
        ms = self.host_kv_transfer_ms_per_block
        if ms is not None and not (0.0 <= ms <= 60_000.0):
            raise ValueError("--host-kv-transfer-ms-per-block must be between 0 and 60000")
        if self.replies is not None and not self.replies.strip():
            raise ValueError("--replies needs a file path")
        if self.timing_model not in TIMING_MODELS:
            raise ValueError(
                f"--timing-model must be one of {', '.join(TIMING_MODELS)}, got {self.timing_model!r}"
            )
        if self.uses_aic:
            check_aic_flags(self, "--timing-model aic")
        return self

    @property
    def uses_aic(self) -> bool:
        """Whether passes are timed by AIConfigurator's tables (``--timing-model aic``)."""
        return self.timing_model == "aic"
