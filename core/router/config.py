"""KV router configuration: one dataclass, validated once at start-up.

``KvRouterConfig`` holds every knob of the KV router (the ``--router-*`` flags). ``build_config``
applies, in order, the deprecated overlap-score weight and the ``--load-aware`` preset, then
validates and checks an ``--aic-*`` setup against AIConfigurator; ``KvRouterConfig.validate``
raises ``ConfigError`` with a sentence naming the flags to change. The environment helpers parse
``DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS`` and the deprecated weight variables the way the
reference does.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any, Protocol

import msgspec
from msgspec import Meta

from dyn.core.config import flag
from dyn.core.errors import ConfigError
from dyn.core.router.cost import DISK_CACHE_HIT_WEIGHT, HOST_CACHE_HIT_WEIGHT
from dyn.core.router.queue import QUEUE_POLICIES

log = logging.getLogger("dyn.router")

PREFILL_LOAD_MODELS = ("none", "ais", "aic")
AIC_MODELS = ("ais", "aic")
"""The prefill load models AIConfigurator predicts for: Dynamo 1.6.1's name, then its older alias."""
SHARED_CACHE_TYPES = ("none", "hicache")
DEFAULT_SHARED_CACHE_MULTIPLIER = 0.5
DEFAULT_UNSTARTED_BOOKING_SECS = 5.0
DEFAULT_MAX_QUEUED_REQUESTS = 1024
DEFAULT_OVERLAP_REFRESH_SECS = 10.0
OVERLAP_REFRESH_ENV = "DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS"
DEPRECATED_WEIGHT_ENVS = ("DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT", "DYN_OVERLAP_SCORE_WEIGHT")
PANEL = "KV router"
"""The ``--help`` panel of the router flags."""
AIC_PANEL = "AIConfigurator setup"
"""The ``--help`` panel of the ``--aic-*`` flags."""


def _zero_is_none(value: float | None) -> float | None:
    """A flag where 0 turns the limit off."""
    return value or None


def _queue_threshold(text: str) -> float | None:
    return parse_queue_threshold(text)  # defined below, read when a flag is parsed


def _conditional_disagg(text: str | None) -> ConditionalDisagg | None:
    return parse_conditional_disagg(text)  # defined below, read when a flag is parsed


CONDITIONAL_DISAGG_POLICIES = ("isl_bounding", "prefill_load", "isl_or_load")


class ConditionalDisagg(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``--router-conditional-disagg-config`` (Dynamo's fields and defaults): when a
    disaggregated request is prefilled on its decode worker instead of a prefill worker.

    ``isl_bounding``: its uncached prompt on the decode worker that holds most of it (``eff_isl``)
    is under ``eff_isl_threshold`` tokens and under ``eff_isl_ratio_threshold`` of the prompt;
    ``prefill_load``: every prefill worker is busy (active prefill tokens over
    ``prefill_busy_threshold`` times its max_num_batched_tokens; default: the router queue's
    threshold); ``isl_or_load``: either. ``decode_busy_threshold`` (a fraction of KV blocks)
    vetoes local prefill on a decode worker whose active decode blocks exceed it."""

    policy: str = "isl_bounding"
    eff_isl_threshold: Annotated[int, Meta(ge=0)] = 2048
    eff_isl_ratio_threshold: Annotated[float, Meta(ge=0.0)] = 0.7
    prefill_busy_threshold: Annotated[float, Meta(gt=0.0)] | None = None
    decode_busy_threshold: Annotated[float, Meta(gt=0.0)] | None = None


# The --aic-* flags, declared once: the KV router's prefill load model (--router-prefill-load-model
# ais) and the mocker's timing model (--timing-model aic) both read an AIConfigurator setup.
_AIC_USE = "With --router-prefill-load-model ais or the mocker's --timing-model aic: "
AicBackend = Annotated[
    str | None,
    flag(
        "--aic-backend",
        panel=AIC_PANEL,
        help=_AIC_USE + "the engine AIConfigurator models the workers as (vllm, sglang or trtllm).",
    ),
]
AicSystem = Annotated[
    str | None,
    flag(
        "--aic-system",
        panel=AIC_PANEL,
        help=_AIC_USE + "the GPU system of AIConfigurator's performance database (h200_sxm, "
        "h100_sxm, b200_sxm, gb200, a100_sxm, l40s, ...).",
    ),
]
AicModelPath = Annotated[
    str | None,
    flag(
        "--aic-model-path",
        panel=AIC_PANEL,
        help=_AIC_USE + "the served model, a local directory with its config.json or a Hugging "
        "Face name AIConfigurator ships the config of (Qwen/Qwen3-32B, meta-llama/Meta-Llama-3.1-8B, ...).",
    ),
]
AicBackendVersion = Annotated[
    str | None,
    flag(
        "--aic-backend-version",
        panel=AIC_PANEL,
        help="The backend version of AIConfigurator's performance data (default: its current "
        "one for --aic-backend on --aic-system; also current, previous or next).",
    ),
]
AicTpSize = Annotated[
    int,
    Meta(ge=1),
    flag("--aic-tp-size", panel=AIC_PANEL, help="Tensor-parallel size of each modeled worker."),
]
AicMoeTpSize = Annotated[
    Annotated[int, Meta(ge=1)] | None,
    flag(
        "--aic-moe-tp-size",
        panel=AIC_PANEL,
        help="MoE models: tensor-parallel size of the experts (default: --aic-tp-size).",
    ),
]
AicMoeEpSize = Annotated[
    Annotated[int, Meta(ge=1)] | None,
    flag(
        "--aic-moe-ep-size",
        panel=AIC_PANEL,
        help="MoE models: expert-parallel size (default 1). --aic-tp-size x "
        "--aic-attention-dp-size must equal --aic-moe-tp-size x --aic-moe-ep-size.",
    ),
]
AicAttentionDpSize = Annotated[
    Annotated[int, Meta(ge=1)] | None,
    flag(
        "--aic-attention-dp-size",
        panel=AIC_PANEL,
        help="MoE models: attention data-parallel size (default 1).",
    ),
]


class AicFields(Protocol):
    """A config holding the ``--aic-*`` flags' values under their field names (``KvRouterConfig``,
    the mocker's ``MockerConfig``)."""

    @property
    def aic_backend(self) -> str | None: ...
    @property
    def aic_system(self) -> str | None: ...
    @property
    def aic_model_path(self) -> str | None: ...
    @property
    def aic_backend_version(self) -> str | None: ...
    @property
    def aic_tp_size(self) -> int: ...
    @property
    def aic_moe_tp_size(self) -> int | None: ...
    @property
    def aic_moe_ep_size(self) -> int | None: ...
    @property
    def aic_attention_dp_size(self) -> int | None: ...


def check_aic_flags(fields: AicFields, needed_by: str) -> None:
    """``ConfigError`` unless ``fields`` name a backend, a system and a model (the message says
    that ``needed_by``, a flag and its value, needs the missing ones) and every size set is a
    whole number of at least 1. What needs AIConfigurator itself is
    ``dyn.core.router.prefill_model.check_setup``'s."""
    missing = [
        f"{name} ({what})"
        for name, what, value in (
            ("--aic-backend", "the engine: vllm, sglang or trtllm", fields.aic_backend),
            ("--aic-system", "the GPU system, such as h200_sxm", fields.aic_system),
            ("--aic-model-path", "the served model", fields.aic_model_path),
        )
        if not value
    ]
    if missing:
        raise ConfigError(f"{needed_by} needs {', '.join(missing)}")
    for size, name in (
        (fields.aic_tp_size, "--aic-tp-size"),
        (fields.aic_moe_tp_size, "--aic-moe-tp-size"),
        (fields.aic_moe_ep_size, "--aic-moe-ep-size"),
        (fields.aic_attention_dp_size, "--aic-attention-dp-size"),
    ):
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ConfigError(f"{name} must be a whole number of at least 1, got {size!r}")


@dataclass(slots=True, kw_only=True)
class KvRouterConfig:
    """Every KV router setting; defaults are the seed's. Each field a user sets is declared with
    its flag (``dyn.core.config``), in the order ``--help`` lists them; ``dyn frontend``, ``dyn
    router`` and ``dyn bench replay`` offer them all.

    ``overlap_score_credit == 0`` means no prefix index and no KV events (``uses_indexer``).
    Thresholds left ``None`` are off; ``queue_threshold=None`` disables the router queue.

    ``unstarted_booking_secs``: a booking whose request was not sent to its worker (``started``)
    nor reached its first token within this many seconds is freed (None: never; Dynamo has no
    such limit, only the ``stale_request_secs`` expiry). ``max_queued_requests``: a request that
    would wait in the router queue while it already holds this many engine requests is refused
    with ``QueueFullError`` (None: no limit).
    """

    overlap_score_credit: Annotated[
        float,
        Meta(ge=0.0, le=1.0),
        flag(
            "--router-kv-overlap-score-credit",
            panel=PANEL,
            help="Credit for device-local prefix overlap in the prefill cost, 0 to 1; 0 ignores prefix "
            "caches and creates no indexer.",
        ),
    ] = 1.0
    host_cache_hit_weight: Annotated[
        float,
        Meta(ge=0.0, le=1.0),
        flag(
            "--router-host-cache-hit-weight",
            panel=PANEL,
            help="Credit, 0 to 1, for each prompt block that continues a worker's device-cached "
            "prefix in its host (CPU) memory tier, from engines that publish offloaded blocks.",
        ),
    ] = HOST_CACHE_HIT_WEIGHT
    disk_cache_hit_weight: Annotated[
        float,
        Meta(ge=0.0, le=1.0),
        flag(
            "--router-disk-cache-hit-weight",
            panel=PANEL,
            help="Credit, 0 to 1, for each prompt block that continues a worker's prefix on its "
            "disk or external tier (after its device and host blocks).",
        ),
    ] = DISK_CACHE_HIT_WEIGHT
    shared_cache_type: Annotated[
        str,
        flag(
            "--shared-cache-type",
            panel=PANEL,
            help="A KV cache all workers share, credited by --shared-cache-multiplier: none; "
            "hicache (SGLang HiCache's L3 pool in a Mooncake store) is refused, dyn does not read Mooncake.",
        ),
    ] = "none"
    shared_cache_multiplier: Annotated[
        float,
        Meta(ge=0.0, le=1.0),
        flag(
            "--shared-cache-multiplier",
            panel=PANEL,
            help="Credit, 0 to 1, for each prompt block found in the shared cache beyond a "
            "worker's device prefix; only with a --shared-cache-type other than none.",
        ),
    ] = DEFAULT_SHARED_CACHE_MULTIPLIER
    prefill_load_scale: Annotated[
        float,
        Meta(ge=0.0),
        flag(
            "--router-prefill-load-scale",
            panel=PANEL,
            help="Scale of the overlap-adjusted prompt-side load against decode blocks.",
        ),
    ] = 1.0
    load_aware: Annotated[
        bool,
        flag(
            "--load-aware",
            panel=PANEL,
            help="Preset: KV routing on load alone (overlap credit 0, no KV events, no KV-reuse "
            "assumption, active-block and prefill-token tracking on); implies --router-mode kv.",
        ),
    ] = False
    temperature: Annotated[
        float,
        Meta(ge=0.0),
        flag(
            "--router-temperature",
            panel=PANEL,
            help="Softmax temperature over normalised costs; 0 picks the cheapest worker.",
        ),
    ] = 0.0
    track_prefill_tokens: Annotated[
        bool,
        flag(
            "--router-track-prefill-tokens/--no-router-track-prefill-tokens",
            panel=PANEL,
            help="Count prompt tokens being prefilled in each worker's load.",
        ),
    ] = True
    prefill_load_model: Annotated[
        str,
        flag(
            "--router-prefill-load-model",
            panel=PANEL,
            help="Prompt-side load model: none (static until first token); ais (or aic, its older "
            "name): an AIConfigurator-predicted prefill duration per request decays each worker's "
            "oldest active prefill (needs the --aic-* flags and pip install 'dyn[aic]').",
        ),
    ] = "none"
    queue_threshold: Annotated[
        float | None,
        flag(
            "--router-queue-threshold",
            panel=PANEL,
            cli_type=str,
            default="16.0",
            parse=_queue_threshold,
            help="Hold requests while every worker's active prefill tokens exceed this fraction of "
            "its max_num_batched_tokens; None disables the queue.",
        ),
    ] = 16.0
    queue_policy: Annotated[
        str,
        flag(
            "--router-queue-policy",
            panel=PANEL,
            help="Router queue order: fcfs (tail TTFT), lcfs (experiments), wspt (average TTFT).",
        ),
    ] = "fcfs"
    max_queued_requests: Annotated[
        int | None,
        flag(
            "--router-queue-limit",
            panel=PANEL,
            cli_type=Annotated[int, Meta(ge=0)],
            parse=_zero_is_none,
            help="Most engine requests that may wait in the router queue (a request's n choices wait "
            "as one entry but count n); a request arriving at a full queue is answered 503 with "
            "Retry-After at once. 0: no limit (Dynamo's default).",
        ),
    ] = DEFAULT_MAX_QUEUED_REQUESTS
    unstarted_booking_secs: Annotated[
        float | None,
        flag(
            "--router-unstarted-booking-secs",
            panel=PANEL,
            cli_type=Annotated[float, Meta(ge=0.0)],
            parse=_zero_is_none,
            help="Free a routed request's load booking when the frontend has not sent it to its worker "
            "within this many seconds (a frontend that crashed or gave up after routing); 0: "
            "only the 300 s stale expiry. dyn's own flag: Dynamo has no such limit.",
        ),
    ] = DEFAULT_UNSTARTED_BOOKING_SECS
    use_kv_events: Annotated[
        bool,
        flag(
            "--router-kv-events/--no-router-kv-events",
            panel=PANEL,
            help="Follow workers' KV events; without them, predict cache state from routing "
            "decisions with a TTL.",
        ),
    ] = True
    ttl_secs: Annotated[
        float,
        Meta(ge=0.0),
        flag(
            "--router-ttl-secs",
            panel=PANEL,
            help="Lifetime of predicted blocks in approximate mode (--no-router-kv-events).",
        ),
    ] = 120.0
    predicted_ttl_secs: Annotated[
        Annotated[float, Meta(ge=0.0)] | None,
        flag(
            "--router-predicted-ttl-secs",
            panel=PANEL,
            help="Record each decision in a side index with this TTL so sibling requests find the "
            "prefix before the engine reports it (try 5); needs KV events.",
        ),
    ] = None
    event_threads: Annotated[
        int,
        Meta(ge=1),
        flag(
            "--router-event-threads",
            panel=PANEL,
            help="Threads that receive and decode KV events (1, the default: on the event loop; "
            "Dynamo defaults to 4, but Python threads share the GIL and measured slower).",
        ),
    ] = 1
    track_active_blocks: Annotated[
        bool,
        flag(
            "--router-track-active-blocks/--no-router-track-active-blocks",
            panel=PANEL,
            help="Count blocks of requests in flight in each worker's load.",
        ),
    ] = True
    track_output_blocks: Annotated[
        bool,
        flag(
            "--router-track-output-blocks",
            panel=PANEL,
            help="Experimental: add output blocks as tokens are generated, decaying toward "
            "nvext.agent_hints.osl.",
        ),
    ] = False
    assume_kv_reuse: Annotated[
        bool,
        flag(
            "--router-assume-kv-reuse/--no-router-assume-kv-reuse",
            panel=PANEL,
            help="Count a prefix block shared by requests on one worker once.",
        ),
    ] = True
    replica_sync: Annotated[
        bool,
        flag(
            "--router-replica-sync",
            panel=PANEL,
            help="Share routing decisions with the other router replicas of the namespace.",
        ),
    ] = False
    use_remote_indexer: Annotated[
        bool,
        flag(
            "--use-remote-indexer",
            panel=PANEL,
            help="Ask a dyn indexer for overlaps (see --indexer-address) instead of indexing here.",
        ),
    ] = False
    indexer_address: Annotated[
        str | None,
        flag(
            "--indexer-address",
            panel=PANEL,
            help="ZMQ address of the dyn indexer for --use-remote-indexer (default: found in discovery).",
        ),
    ] = None
    active_decode_blocks_threshold: Annotated[
        Annotated[float, Meta(ge=0.0)] | None,
        flag(
            "--active-decode-blocks-threshold",
            panel=PANEL,
            help="Busy when active decode blocks exceed this fraction of the worker's KV blocks.",
        ),
    ] = None
    active_prefill_tokens_threshold: Annotated[
        Annotated[int, Meta(ge=0)] | None,
        flag(
            "--active-prefill-tokens-threshold",
            panel=PANEL,
            help="Busy when active prefill tokens exceed this many.",
        ),
    ] = None
    active_prefill_tokens_threshold_frac: Annotated[
        Annotated[float, Meta(ge=0.0)] | None,
        flag(
            "--active-prefill-tokens-threshold-frac",
            panel=PANEL,
            help="Busy when active prefill tokens exceed this fraction of max_num_batched_tokens.",
        ),
    ] = None
    conditional_disagg: Annotated[
        bool,
        flag(
            "--router-conditional-disagg/--no-router-conditional-disagg",
            panel=PANEL,
            help="Disaggregated models: prefill a request on its decode worker when the policy of "
            "--router-conditional-disagg-config says so (a short uncached prompt, by default), "
            "so it does not pay the KV transfer.",
        ),
    ] = False
    conditional_disagg_config: Annotated[
        ConditionalDisagg | None,
        flag(
            "--router-conditional-disagg-config",
            panel=PANEL,
            cli_type=str,
            parse=_conditional_disagg,
            help='JSON policy of --router-conditional-disagg: {"policy": "isl_bounding" | '
            '"prefill_load" | "isl_or_load", "eff_isl_threshold": 2048, "eff_isl_ratio_threshold": '
            '0.7, "prefill_busy_threshold": null, "decode_busy_threshold": null}.',
        ),
    ] = None
    aic_backend: AicBackend = None
    aic_system: AicSystem = None
    aic_model_path: AicModelPath = None
    aic_backend_version: AicBackendVersion = None
    aic_tp_size: AicTpSize = 1
    aic_moe_tp_size: AicMoeTpSize = None
    aic_moe_ep_size: AicMoeEpSize = None
    aic_attention_dp_size: AicAttentionDpSize = None
    overlap_refresh_after_secs: float | None = DEFAULT_OVERLAP_REFRESH_SECS
    """Set from ``DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS`` only (no flag, as in Dynamo)."""
    stale_request_secs: float = 300.0

    @property
    def uses_aic(self) -> bool:
        """Whether prefill durations come from AIConfigurator (``ais``, or its alias ``aic``)."""
        return self.prefill_load_model in AIC_MODELS

    @property
    def uses_indexer(self) -> bool:
        """Whether prefix overlap matters at all (a nonzero credit): build an indexer, read events."""
        return self.overlap_score_credit > 0

    @property
    def effective_shared_cache_multiplier(self) -> float:
        """The shared-cache credit per block: ``shared_cache_multiplier`` with a shared cache
        (``shared_cache_type`` other than none), else 0 (the multiplier's default is Dynamo's,
        0.5, but like Dynamo's it counts only with a shared cache)."""
        return 0.0 if self.shared_cache_type == "none" else self.shared_cache_multiplier

    def validate(self) -> KvRouterConfig:
        """Return ``self`` if the settings can work together; raise ``ConfigError`` otherwise."""
        credit = self.overlap_score_credit
        if not _finite(credit) or not 0.0 <= credit <= 1.0:
            raise ConfigError(
                f"--router-kv-overlap-score-credit must be between 0.0 and 1.0, got {credit}; "
                "to weigh prompt load more, raise --router-prefill-load-scale instead"
            )
        for weight, name in (
            (self.host_cache_hit_weight, "--router-host-cache-hit-weight"),
            (self.disk_cache_hit_weight, "--router-disk-cache-hit-weight"),
            (self.shared_cache_multiplier, "--shared-cache-multiplier"),
        ):
            if not _finite(weight) or not 0.0 <= weight <= 1.0:
                raise ConfigError(f"{name} must be between 0.0 and 1.0, got {weight!r}")
        if self.shared_cache_type == "hicache":
            raise ConfigError(
                "--shared-cache-type hicache reads SGLang HiCache's L3 storage in a Mooncake store, which "
                "dyn does not build; use --shared-cache-type none"
            )
        if self.shared_cache_type not in SHARED_CACHE_TYPES:
            raise ConfigError(
                f"--shared-cache-type must be one of {', '.join(SHARED_CACHE_TYPES)}, "
                f"got {self.shared_cache_type!r}"
            )
        _non_negative(self.prefill_load_scale, "--router-prefill-load-scale")
        _non_negative(self.temperature, "--router-temperature")
        _positive(self.ttl_secs, "--router-ttl-secs")
        _positive(self.stale_request_secs, "the stale request timeout")
        if self.unstarted_booking_secs is not None:
            _positive(
                self.unstarted_booking_secs,
                "--router-unstarted-booking-secs",
                hint="; use 0 to never expire bookings that were not started",
            )
        limit = self.max_queued_requests
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ConfigError(
                f"--router-queue-limit must be a whole number of at least 1, got "
                f"{limit!r}; use 0 for no limit"
            )
        if (
            isinstance(self.event_threads, bool)
            or not isinstance(self.event_threads, int)
            or self.event_threads < 1
        ):
            raise ConfigError(
                f"--router-event-threads must be a whole number of at least 1, got {self.event_threads!r}"
            )
        if self.predicted_ttl_secs is not None:
            _positive(self.predicted_ttl_secs, "--router-predicted-ttl-secs")
            if not self.use_kv_events:
                raise ConfigError(
                    "--router-predicted-ttl-secs needs KV events: do not combine it with "
                    "--no-router-kv-events or --load-aware (approximate mode already records "
                    "routing decisions); drop one of them"
                )
            if not self.uses_indexer:
                raise ConfigError(
                    "--router-predicted-ttl-secs has no effect when "
                    "--router-kv-overlap-score-credit is 0 (or a deprecated overlap weight of 0 "
                    "is set): prefix overlap is ignored; drop the flag or raise the credit"
                )
        if self.queue_threshold is not None:
            _positive(
                self.queue_threshold,
                "--router-queue-threshold",
                hint="; use None to disable the router queue",
            )
        if self.queue_policy not in QUEUE_POLICIES:
            raise ConfigError(
                f"--router-queue-policy must be one of {', '.join(QUEUE_POLICIES)}, got {self.queue_policy!r}"
            )
        if self.prefill_load_model not in PREFILL_LOAD_MODELS:
            raise ConfigError(
                f"--router-prefill-load-model must be one of "
                f"{', '.join(PREFILL_LOAD_MODELS)}, got {self.prefill_load_model!r}"
            )
        if self.uses_aic:
            self._validate_aic()
        if self.track_output_blocks and not self.track_active_blocks:
            raise ConfigError(
                "--router-track-output-blocks needs active block tracking: drop "
                "--no-router-track-active-blocks or --router-track-output-blocks"
            )
        if self.overlap_refresh_after_secs is not None:
            _positive(
                self.overlap_refresh_after_secs,
                OVERLAP_REFRESH_ENV,
                hint="; set it to 0 to disable the dequeue-time overlap refresh",
            )
        for value, name in (
            (self.active_decode_blocks_threshold, "--active-decode-blocks-threshold"),
            (self.active_prefill_tokens_threshold, "--active-prefill-tokens-threshold"),
            (self.active_prefill_tokens_threshold_frac, "--active-prefill-tokens-threshold-frac"),
        ):
            if value is not None:
                _positive(value, name, hint="; omit it to turn that busy check off")
        return self

    def _validate_aic(self) -> None:
        """The flags an AIConfigurator prefill model needs, and their sizes (what needs
        AIConfigurator itself is ``dyn.core.router.prefill_model.check_setup``'s)."""
        model = self.prefill_load_model
        if not self.track_prefill_tokens:
            raise ConfigError(
                f"--router-prefill-load-model {model} decays the prompt-side load, which "
                "--no-router-track-prefill-tokens turns off: drop one of them"
            )
        check_aic_flags(self, f"--router-prefill-load-model {model}")


def build_config(
    *,
    deprecated_overlap_weight: float | None = None,
    deprecated_weight_source: str = "--router-kv-overlap-score-weight",
    load_aware: bool = False,
    **fields: Any,
) -> KvRouterConfig:
    """A validated config from ``fields`` (``KvRouterConfig`` field names), then, in order:

    1. the deprecated overlap-score weight (from ``deprecated_weight_source``, named in the
       warning): a nonzero weight becomes ``prefill_load_scale``; 0 sets both
       ``prefill_load_scale`` and ``overlap_score_credit`` to 0. It wins over the newer fields.
    2. the ``--load-aware`` preset: credit 0, no KV events, no KV reuse assumption, active block
       and prefill token tracking on, no remote indexer; ``prefill_load_scale`` is kept.

    With an AIConfigurator prefill load model it also checks the ``--aic-*`` setup against
    AIConfigurator (``dyn.core.router.prefill_model.check_setup``), so a bad one stops the start.
    """
    config = KvRouterConfig(**fields)
    if deprecated_overlap_weight is not None:
        weight = deprecated_overlap_weight
        if not _finite(weight) or weight < 0:
            raise ConfigError(
                f"{deprecated_weight_source} must be a number >= 0, got {weight}; "
                "better, replace it with --router-prefill-load-scale"
            )
        if weight == 0:
            log.warning(
                "%s is deprecated; a value of 0 now means --router-prefill-load-scale 0 "
                "--router-kv-overlap-score-credit 0: use those flags instead",
                deprecated_weight_source,
            )
            config = replace(config, prefill_load_scale=0.0, overlap_score_credit=0.0)
        else:
            log.warning(
                "%s is deprecated; use --router-prefill-load-scale %s instead (and "
                "--router-kv-overlap-score-credit only to tune the cache-overlap credit)",
                deprecated_weight_source,
                _fmt(weight),
            )
            config = replace(config, prefill_load_scale=float(weight))
    if load_aware:
        config = replace(
            config,
            overlap_score_credit=0.0,
            use_kv_events=False,
            assume_kv_reuse=False,
            track_active_blocks=True,
            track_prefill_tokens=True,
            use_remote_indexer=False,
            load_aware=True,
        )
    config.validate()
    if config.uses_aic:
        from dyn.core.router.prefill_model import AicSetup, check_setup

        check_setup(AicSetup.from_config(config))
    return config


def overlap_refresh_from_env(value: str | None) -> float | None:
    """``DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS``: unset means 10 s; 0, negative or non-finite
    disables the refresh (None); an unparsable value falls back to 10 s with a warning."""
    if value is None or not value.strip():
        return DEFAULT_OVERLAP_REFRESH_SECS
    try:
        secs = float(value)
    except ValueError:
        log.warning(
            "%s=%r is not a number; using %s s",
            OVERLAP_REFRESH_ENV,
            value,
            _fmt(DEFAULT_OVERLAP_REFRESH_SECS),
        )
        return DEFAULT_OVERLAP_REFRESH_SECS
    if not _finite(secs) or secs <= 0:
        return None
    return secs


def deprecated_overlap_weight_from_env(environ: Mapping[str, str]) -> tuple[float, str] | None:
    """The deprecated weight and the variable it came from, or None when neither variable is set
    (``DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT`` wins over ``DYN_OVERLAP_SCORE_WEIGHT``)."""
    for name in DEPRECATED_WEIGHT_ENVS:
        raw = environ.get(name)
        if raw is None or not raw.strip():
            continue
        try:
            return float(raw), name
        except ValueError:
            raise ConfigError(
                f"{name}={raw!r} is not a number; remove it and set DYN_ROUTER_PREFILL_LOAD_SCALE instead"
            ) from None
    return None


def parse_queue_threshold(text: str) -> float | None:
    """A ``--router-queue-threshold`` value: a number, or ``none`` to disable queueing."""
    if text.strip().lower() in ("none", "null", "off", ""):
        return None
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"--router-queue-threshold must be a number or None, got {text!r}") from None


def parse_conditional_disagg(text: str | None) -> ConditionalDisagg | None:
    """A ``--router-conditional-disagg-config`` value: a JSON object of ``ConditionalDisagg``'s
    fields (missing ones keep their defaults)."""
    if text is None or not text.strip():
        return None
    try:
        config = msgspec.json.decode(text, type=ConditionalDisagg)
    except msgspec.DecodeError as exc:
        raise ConfigError(
            f"--router-conditional-disagg-config: {exc} (a JSON object of {_CD_FIELDS})"
        ) from None
    except msgspec.ValidationError as exc:
        raise ConfigError(f"--router-conditional-disagg-config: {exc} (fields: {_CD_FIELDS})") from None
    if config.policy not in CONDITIONAL_DISAGG_POLICIES:
        raise ConfigError(
            f"--router-conditional-disagg-config: policy must be one of "
            f"{', '.join(CONDITIONAL_DISAGG_POLICIES)}, got {config.policy!r}"
        )
    return config


_CD_FIELDS = ", ".join(ConditionalDisagg.__struct_fields__)


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _non_negative(value: float, flag: str) -> None:
    if not _finite(value) or value < 0:
        raise ConfigError(f"{flag} must be a finite number >= 0, got {value!r}")


def _positive(value: float, flag: str, hint: str = "") -> None:
    if not _finite(value) or value <= 0:
        raise ConfigError(f"{flag} must be a finite number greater than 0, got {value!r}{hint}")


def _fmt(value: float) -> str:
    return f"{value:g}"
