"""What ``dyn worker vllm`` passes to vLLM: its engine flags, in vLLM's own command-line form.

Contract: ``VllmConfig`` holds the flags ``dyn worker vllm`` declares (``None``: vLLM's default,
not passed) and ``extra_args``, any other vLLM engine flag, exactly as ``vllm serve`` takes it.
``engine_argv`` turns both into one argument list that vLLM's own parser reads
(``AsyncEngineArgs.add_cli_args``), so every flag means what it means in vLLM.

KV events: unless the flags carry a ``--kv-events-config``, dyn enables vLLM's ZMQ publisher with
``default_kv_events_config``: the PUB and the replay ROUTER on ``tcp://*:0``, which vLLM binds on
``VLLM_HOST_IP`` (dyn sets it to the worker's ``--host``, loopback by default) at a free port and
reports back through ``AsyncLLM.get_kv_event_sources()``. vLLM refuses ``tcp://*:0`` on a wildcard
``VLLM_HOST_IP``, so for a worker on a wildcard ``--host`` dyn picks the two free ports itself and
vLLM binds ``tcp://*:PORT`` (every interface). Peers connect to the worker's advertised address
(``advertised_endpoint``). Under ``--plane-keys`` both are Unix sockets only this user can reach
(``sockets.private_endpoint``) whatever ``--host`` is: the worker host relays them over CurveZMQ
(``dyn.core.worker.kv_relay``).
"""

from __future__ import annotations

import json
from typing import Annotated

import msgspec

from dyn.core.config import ENGINE_PANEL, flag
from dyn.core.model.lora import LoraModule, parse_lora_modules
from dyn.core.transport import sockets
from dyn.core.transport.sockets import free_ports, is_wildcard, tcp_endpoint
from dyn.plugins.checks import check_at_least_one
from dyn.plugins.vllm.lora import engine_flags

SCHEDULING_POLICIES = ("fcfs", "priority")
RUNNERS = ("auto", "generate", "pooling", "draft")
"""vLLM's ``--runner`` values (``vllm/config/model.py``)."""
KV_EVENTS_TOPIC = "kv-events"


class VllmConfig(msgspec.Struct, kw_only=True, frozen=True):
    """The engine flags of ``dyn worker vllm``, each declared with its flag (``dyn.core.config``);
    ``None`` leaves vLLM's default."""

    dtype: Annotated[
        str | None,
        flag(
            "--dtype",
            panel=ENGINE_PANEL,
            help="Weights and activations dtype: auto, bfloat16, float16, float32.",
        ),
    ] = None
    max_model_len: Annotated[
        int | None, flag("--max-model-len", panel=ENGINE_PANEL, help="Context length (default: the model's).")
    ] = None
    block_size: Annotated[
        int | None,
        flag(
            "--block-size",
            panel=ENGINE_PANEL,
            help="Tokens per KV block (registered for the router's hashing).",
        ),
    ] = None
    enable_prefix_caching: Annotated[
        bool | None,
        flag(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            panel=ENGINE_PANEL,
            help="Reuse cached KV blocks of shared prompt prefixes (vLLM's default: on).",
        ),
    ] = None
    gpu_memory_utilization: Annotated[
        float | None,
        flag(
            "--gpu-memory-utilization", panel=ENGINE_PANEL, help="Fraction of GPU memory vLLM may use (0-1]."
        ),
    ] = None
    max_num_seqs: Annotated[
        int | None,
        flag("--max-num-seqs", panel=ENGINE_PANEL, help="Most requests running in one forward pass."),
    ] = None
    max_num_batched_tokens: Annotated[
        int | None,
        flag("--max-num-batched-tokens", panel=ENGINE_PANEL, help="Token budget of one forward pass."),
    ] = None
    tensor_parallel_size: Annotated[
        int | None,
        flag(
            "--tensor-parallel-size",
            "-tp",
            panel=ENGINE_PANEL,
            help="GPUs one model replica is split across.",
        ),
    ] = None
    scheduling_policy: Annotated[
        str | None,
        flag(
            "--scheduling-policy",
            panel=ENGINE_PANEL,
            help="fcfs, or priority: the waiting queue by request priority (smaller first), then "
            "arrival; nvext.agent_hints.priority reaches vLLM only with priority.",
        ),
    ] = None
    enforce_eager: Annotated[
        bool,
        flag(
            "--enforce-eager",
            panel=ENGINE_PANEL,
            help="Run eagerly: no CUDA graphs or torch.compile (faster start).",
        ),
    ] = False
    seed: Annotated[int | None, flag("--seed", panel=ENGINE_PANEL, help="vLLM's random seed.")] = None
    runner: Annotated[
        str | None,
        flag(
            "--runner",
            panel=ENGINE_PANEL,
            help="Model runner, as vLLM's --runner: auto or generate, or pooling: the worker embeds "
            "(POST /v1/embeddings) and refuses to generate.",
        ),
    ] = None
    mm_processor_kwargs: Annotated[
        str | None,
        flag(
            "--mm-processor-kwargs",
            panel=ENGINE_PANEL,
            help="vLLM's flag, handed to it: the model's image and video processor settings, a JSON "
            "object ('{\"max_pixels\": 1003520}'). Give dyn frontend the same (dyn serve does).",
        ),
    ] = None
    media_io_kwargs: Annotated[
        str | None,
        flag(
            "--media-io-kwargs",
            panel=ENGINE_PANEL,
            help="vLLM's flag, handed to it: how media are loaded, a JSON object by modality "
            '(\'{"video": {"fps": 1}}\'). Give dyn frontend the same (dyn serve does).',
        ),
    ] = None
    lora_modules: Annotated[
        tuple[str, ...],
        flag(
            "--lora-modules",
            panel=ENGINE_PANEL,
            cli_type=list[str],
            parse=tuple,
            help="LoRA adapters to serve, as vLLM's flag: NAME=PATH (a local PEFT adapter "
            "directory) or a JSON object with name, path and base_model_name; several as "
            "--lora-modules a=/x b=/y. A request whose model names one runs with it.",
        ),
    ] = ()
    max_loras: Annotated[
        int | None,
        flag("--max-loras", panel=ENGINE_PANEL, help="Most LoRA adapters in one batch (vLLM's default: 1)."),
    ] = None
    max_lora_rank: Annotated[
        int | None,
        flag("--max-lora-rank", panel=ENGINE_PANEL, help="Highest LoRA rank served (vLLM's default: 16)."),
    ] = None
    max_cpu_loras: Annotated[
        int | None,
        flag(
            "--max-cpu-loras",
            panel=ENGINE_PANEL,
            help="Most LoRA adapters kept in CPU memory (vLLM's default: --max-loras).",
        ),
    ] = None
    kv_events_config: Annotated[
        str | None,
        flag(
            "--kv-events-config",
            panel=ENGINE_PANEL,
            help="vLLM's KV-event publisher config as JSON (default: ZMQ PUB and replay sockets on "
            "--host at free ports, advertised in discovery).",
        ),
    ] = None
    """vLLM's ``--kv-events-config`` JSON; ``None``: ``default_kv_events_config()``."""
    kv_connector: Annotated[
        str | None,
        flag(
            "--kv-connector",
            panel=ENGINE_PANEL,
            help="How a --disaggregation-mode prefill|decode worker moves KV: nixl (vLLM's "
            "NixlConnector, memory to memory) or storage (files under --kv-storage-path). Default: "
            "storage on vLLM's CPU build, nixl on a GPU. vLLM's own --kv-transfer-config replaces it.",
        ),
    ] = None
    kv_storage_path: Annotated[
        str | None,
        flag(
            "--kv-storage-path",
            panel=ENGINE_PANEL,
            help="Directory --kv-connector storage writes prompts' KV to and reads it from; prefill "
            "and decode workers must share it (one machine or a shared filesystem). Default: "
            "kv-transfer in the namespace's discovery directory.",
        ),
    ] = None
    extra_args: list[str] = []
    """Any other vLLM engine flag, passed through as given (``--swap-space 4``, ``--quantization fp8``)."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the flag when a value cannot work."""
        check_at_least_one(
            {
                "--max-model-len": self.max_model_len,
                "--block-size": self.block_size,
                "--max-num-seqs": self.max_num_seqs,
                "--max-num-batched-tokens": self.max_num_batched_tokens,
                "--tensor-parallel-size": self.tensor_parallel_size,
            }
        )
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.runner is not None and self.runner not in RUNNERS:
            raise ValueError(f"--runner must be one of {', '.join(RUNNERS)}, got {self.runner!r}")
        if self.scheduling_policy is not None and self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"--scheduling-policy must be fcfs or priority, got {self.scheduling_policy!r}")
        self.lora_flags()
        if self.kv_connector is not None and self.kv_connector not in ("nixl", "storage"):
            raise ValueError(f"--kv-connector must be nixl or storage, got {self.kv_connector!r}")
        if self.kv_events_config is not None:
            try:
                parsed = json.loads(self.kv_events_config)
            except ValueError as exc:
                raise ValueError(f"--kv-events-config must be a JSON object: {exc}") from None
            if not isinstance(parsed, dict):
                raise ValueError(
                    "--kv-events-config must be a JSON object such as "
                    '{"enable_kv_cache_events": true, "publisher": "zmq"}'
                )

    def lora_modules_parsed(self) -> list[LoraModule]:
        """The ``--lora-modules`` adapters; ``LoraSpecError`` (a ``ValueError``) names a bad one."""
        return parse_lora_modules(self.lora_modules)

    def lora_flags(self) -> list[str]:
        """vLLM's engine flags for the adapters (none without ``--lora-modules``); ``ValueError``
        names a bad adapter or limit."""
        return engine_flags(
            self.lora_modules_parsed(),
            max_loras=self.max_loras,
            max_lora_rank=self.max_lora_rank,
            max_cpu_loras=self.max_cpu_loras,
        )

    def engine_argv(
        self, model_path: str, host: str = "127.0.0.1", tokenizer: str | None = None
    ) -> list[str]:
        """The vLLM command line for these flags: ``--model PATH`` (and ``--tokenizer``), the
        flags set, the extras (``host``: the worker's ``--host``, where dyn's default KV-event
        sockets listen)."""
        argv = ["--model", model_path] + (["--tokenizer", tokenizer] if tokenizer else [])
        values = {
            "--dtype": self.dtype,
            "--max-model-len": self.max_model_len,
            "--block-size": self.block_size,
            "--gpu-memory-utilization": self.gpu_memory_utilization,
            "--max-num-seqs": self.max_num_seqs,
            "--max-num-batched-tokens": self.max_num_batched_tokens,
            "--tensor-parallel-size": self.tensor_parallel_size,
            "--scheduling-policy": self.scheduling_policy,
            "--seed": self.seed,
            "--runner": self.runner,
            "--mm-processor-kwargs": self.mm_processor_kwargs,
            "--media-io-kwargs": self.media_io_kwargs,
        }
        for name, value in values.items():
            if value is not None:
                argv += [name, str(value)]
        if self.enable_prefix_caching is not None:
            argv.append(
                "--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching"
            )
        if self.enforce_eager:
            argv.append("--enforce-eager")
        argv += self.lora_flags()
        argv += ["--kv-events-config", self.kv_events_config or default_kv_events_config(host)]
        return [*argv, *self.extra_args]


def default_kv_events_config(host: str = "127.0.0.1") -> str:
    """vLLM's ``--kv-events-config`` dyn uses when none is given for a worker on ``host`` (see
    the module docstring)."""
    endpoint, replay = "tcp://*:0", "tcp://*:0"
    if sockets.plane_keys() is not None:
        endpoint, replay = sockets.private_endpoint("kv-events"), sockets.private_endpoint("kv-replay")
    elif is_wildcard(host):
        endpoint, replay = (tcp_endpoint("*", port) for port in free_ports(host, 2))
    return json.dumps(
        {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": endpoint,
            "replay_endpoint": replay,
            "topic": KV_EVENTS_TOPIC,
        }
    )


def advertised_endpoint(endpoint: str | None, host: str) -> str | None:
    """The address peers connect to for an endpoint vLLM bound for a worker on ``host``: a
    wildcard or ``host`` becomes the worker's advertised address (``--advertise-host``;
    ``dyn.core.transport.sockets.advertised_endpoint``).

    ``None`` for no endpoint, or for a port vLLM chose without reporting it (``:0``).
    """
    if not endpoint or endpoint.endswith(":0"):
        return None
    return sockets.advertised_endpoint(endpoint, host)
