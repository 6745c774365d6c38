"""What ``dyn worker sglang`` passes to SGLang: its engine flags, as one SGLang ``ServerArgs``.

Contract: ``SglangConfig`` holds the flags ``dyn worker sglang`` declares (``None`` / ``False``:
SGLang's default, not passed) and ``extra_args``, any other SGLang server flag exactly as
``python -m sglang.launch_server`` takes it. ``parse_server_args`` parses ``extra_args`` with
SGLang's own parser (``ServerArgs.add_cli_args``) and lays dyn's flags over it; ``to_server_args``
adds dyn's fixed settings and builds the record with ``ServerArgs.from_cli_args``, so every flag
means what it means in SGLang. A flag given both ways, an SGLang argument dyn owns, or one SGLang's parser refuses raises
``EngineStartError`` with a sentence (parsing needs SGLang, so it happens when the engine starts).

SGLang keeps its tokenizer (its grammar backends compile structured outputs with it; SGLang 0.5.23
turns them off under ``--skip-tokenizer-init``, which a user without structured outputs may pass to
save SGLang's detokenizer), though dyn sends token ids and reads output ids.
dyn's fixed settings: ``incremental_streaming_output``
(each streamed chunk carries only its new token ids, as Dynamo's SGLang worker enforces) and the
``--kv-events-config`` that ``dyn.plugins.sglang.kv_events`` builds.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Annotated, Any

import msgspec

from dyn.core.config import ENGINE_PANEL, flag
from dyn.core.engine import EngineStartError
from dyn.plugins.checks import check_at_least_one

RADIX_EVICTION_POLICIES = ("lru", "priority")
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")

OWNED_BY_DYN = {
    "model_path": "give the model with dyn's own --model-path",
    "tokenizer_path": "give it with dyn's own --tokenizer (the frontend tokenizes with it too)",
    "kv_events_config": "give it with dyn's own --kv-events-config flag",
}
"""SGLang arguments dyn sets itself; passing them in ``extra_args`` is refused with this advice."""


class SglangConfig(msgspec.Struct, kw_only=True, frozen=True):
    """The engine flags of ``dyn worker sglang``, each declared with its flag (``dyn.core.config``);
    ``None`` / ``False`` leave SGLang's default.

    Field names are SGLang's ``ServerArgs`` field names, except ``kv_events_endpoint`` (dyn's:
    where the KV-event publisher binds when dyn builds the ``--kv-events-config``).
    """

    tp_size: Annotated[
        int | None,
        flag("--tp-size", panel=ENGINE_PANEL, help="Tensor-parallel size: GPUs one SGLang engine spans."),
    ] = None
    mem_fraction_static: Annotated[
        float | None,
        flag(
            "--mem-fraction-static",
            panel=ENGINE_PANEL,
            help="Fraction of GPU memory for model weights and the KV cache pool (SGLang's default: "
            "picked from the GPU).",
        ),
    ] = None
    max_running_requests: Annotated[
        int | None, flag("--max-running-requests", panel=ENGINE_PANEL, help="Most requests running at once.")
    ] = None
    max_prefill_tokens: Annotated[
        int | None,
        flag(
            "--max-prefill-tokens",
            panel=ENGINE_PANEL,
            help="Token budget of one prefill batch. Also registered as the worker's "
            "max_num_batched_tokens; unset, the whole KV pool is registered instead (as Dynamo "
            "does), which makes a router queue threshold much looser.",
        ),
    ] = None
    """Also what the worker registers as ``max_num_batched_tokens``; unset, SGLang's whole KV pool
    (``max_total_num_tokens``) is registered instead, as Dynamo does (see ``engine``)."""
    chunked_prefill_size: Annotated[
        int | None,
        flag(
            "--chunked-prefill-size",
            panel=ENGINE_PANEL,
            help="Most prompt tokens prefilled per chunk; -1 disables chunked prefill.",
        ),
    ] = None
    page_size: Annotated[
        int | None,
        flag(
            "--page-size",
            panel=ENGINE_PANEL,
            help="Tokens per KV page; the worker's KV block size (SGLang's default: 1).",
        ),
    ] = None
    context_length: Annotated[
        int | None,
        flag(
            "--context-length",
            panel=ENGINE_PANEL,
            help="Longest sequence (default: the model's config.json).",
        ),
    ] = None
    dtype: Annotated[
        str | None,
        flag(
            "--dtype",
            panel=ENGINE_PANEL,
            help="Weights and activations: auto, half, float16, bfloat16, float or float32.",
        ),
    ] = None
    enable_priority_scheduling: Annotated[
        bool,
        flag(
            "--enable-priority-scheduling",
            panel=ENGINE_PANEL,
            help="Order the waiting queue by request priority, larger value first.",
        ),
    ] = False
    schedule_low_priority_values_first: Annotated[
        bool,
        flag(
            "--schedule-low-priority-values-first",
            panel=ENGINE_PANEL,
            help="Smaller priority values are more important (the worker then advertises lower_first).",
        ),
    ] = False
    radix_eviction_policy: Annotated[
        str | None,
        flag(
            "--radix-eviction-policy",
            panel=ENGINE_PANEL,
            help="lru, or priority (evict the cached prefixes of the smallest priority values first, "
            "in either scheduling order).",
        ),
    ] = None
    enable_streaming_session: Annotated[
        bool,
        flag(
            "--enable-streaming-session",
            panel=ENGINE_PANEL,
            help="Offer streaming sessions (nvext.session_control) that hold a conversation's KV "
            "between turns, outside the radix cache.",
        ),
    ] = False
    disable_radix_cache: Annotated[
        bool,
        flag(
            "--disable-radix-cache",
            panel=ENGINE_PANEL,
            help="Turn off prefix caching (no KV events are published then).",
        ),
    ] = False
    kv_events_config: Annotated[
        str | None,
        flag(
            "--kv-events-config",
            panel=ENGINE_PANEL,
            help="SGLang's KV-events JSON, passed as given (default: dyn builds one that publishes on "
            "free ports of --host).",
        ),
    ] = None
    """SGLang's ``--kv-events-config`` JSON, passed as given; ``None``: dyn builds one."""
    kv_events_endpoint: Annotated[
        str | None,
        flag(
            "--kv-events-endpoint",
            panel=ENGINE_PANEL,
            help="tcp://HOST:PORT the KV-event publisher binds when dyn builds the KV-events config.",
        ),
    ] = None
    """``tcp://HOST:PORT`` the publisher binds when dyn builds the config (default: a free port on
    the worker's ``--host``)."""
    extra_args: list[str] = []
    """Any other SGLang server flag, passed through as given (``--quantization fp8``)."""

    def validate(self) -> SglangConfig:
        """Raise ``ValueError`` with a sentence naming the flag; return self when fine."""
        check_at_least_one(
            {
                "--tp-size": self.tp_size,
                "--max-running-requests": self.max_running_requests,
                "--max-prefill-tokens": self.max_prefill_tokens,
                "--page-size": self.page_size,
                "--context-length": self.context_length,
            }
        )
        if self.chunked_prefill_size is not None and (
            self.chunked_prefill_size < 1 and self.chunked_prefill_size != -1
        ):
            raise ValueError(
                "--chunked-prefill-size must be a positive number of tokens, or -1 to "
                f"disable chunked prefill, got {self.chunked_prefill_size}"
            )
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static <= 1:
            raise ValueError(f"--mem-fraction-static must be in (0, 1], got {self.mem_fraction_static}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if (
            self.radix_eviction_policy is not None
            and self.radix_eviction_policy not in RADIX_EVICTION_POLICIES
        ):
            raise ValueError(
                f"--radix-eviction-policy must be lru or priority, got {self.radix_eviction_policy!r}"
            )
        if self.kv_events_config is not None:
            if self.kv_events_endpoint is not None:
                raise ValueError(
                    "--kv-events-endpoint only applies to the KV-events config dyn builds; "
                    "put the endpoint in your --kv-events-config instead"
                )
            parse_kv_events_config(self.kv_events_config)
        if self.kv_events_endpoint is not None:
            parse_tcp_endpoint(self.kv_events_endpoint, "--kv-events-endpoint")
        return self

    def engine_fields(self) -> dict[str, Any]:
        """The ``ServerArgs`` fields these flags set (only those given)."""
        fields: dict[str, Any] = {}
        for name in (
            "tp_size",
            "mem_fraction_static",
            "max_running_requests",
            "max_prefill_tokens",
            "chunked_prefill_size",
            "page_size",
            "context_length",
            "dtype",
            "radix_eviction_policy",
            "kv_events_config",
        ):
            value = getattr(self, name)
            if value is not None:
                fields[name] = value
        for name in (
            "enable_priority_scheduling",
            "schedule_low_priority_values_first",
            "enable_streaming_session",
            "disable_radix_cache",
        ):
            if getattr(self, name):
                fields[name] = True
        return fields


def parse_kv_events_config(text: str) -> dict[str, Any]:
    """Decode a ``--kv-events-config`` JSON object; ``ValueError`` says what is wrong."""
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--kv-events-config must be a JSON object: {exc}") from None
    if not isinstance(parsed, dict):
        raise ValueError(
            '--kv-events-config must be a JSON object, e.g. {"publisher": "zmq", "endpoint": "tcp://*:5557"}'
        )
    return parsed


def parse_tcp_endpoint(endpoint: str, what: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` -> ``(HOST, PORT)`` (IPv6 hosts in brackets); ``ValueError`` otherwise."""
    host, sep, port = endpoint.removeprefix("tcp://").rpartition(":")
    if (
        not endpoint.startswith("tcp://")
        or not sep
        or not host
        or not (port.isascii() and port.isdigit())
        or not 0 < int(port) < 65536
    ):
        raise ValueError(f"{what} must look like tcp://HOST:PORT, got {endpoint!r}")
    return host.strip("[]"), int(port)


class _ArgumentError(Exception):
    """SGLang's parser refused an argument (argparse would have exited)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgumentError(message)


def parse_server_args(
    server_args_cls: Any, config: SglangConfig, model_path: str, tokenizer_path: str | None = None
) -> tuple[argparse.Namespace, set[str]]:
    """Parse ``extra_args`` with SGLang's own parser (``server_args_cls.add_cli_args``) and lay
    dyn's flags over them.

    Returns ``(namespace, given)``: ``given`` names the fields the user set, by a dyn flag or in
    ``extra_args``. Raises ``EngineStartError`` with a sentence for a bad argument, one dyn owns,
    or one given both ways.
    """
    parser = _Parser(prog="dyn worker sglang ... --", add_help=False)
    server_args_cls.add_cli_args(parser)
    base = ["--model-path", model_path] + (["--tokenizer-path", tokenizer_path] if tokenizer_path else [])
    try:
        namespace = parser.parse_args([*base, *config.extra_args])
        defaults = vars(parser.parse_args(base))
    except _ArgumentError as exc:
        raise EngineStartError(f"SGLang refused the arguments passed through to it: {exc}") from None
    except SystemExit:
        raise EngineStartError(
            "SGLang's parser exited on the arguments passed through to it; pass "
            "SGLang server flags only (see python -m sglang.launch_server --help)"
        ) from None
    passed = {name for name, value in vars(namespace).items() if defaults.get(name, value) != value}
    for name in sorted(passed & OWNED_BY_DYN.keys()):
        raise EngineStartError(
            f"--{name.replace('_', '-')} is among the arguments passed through to "
            f"SGLang: {OWNED_BY_DYN[name]}"
        )
    ours = config.engine_fields()
    for name in sorted(passed & ours.keys()):
        raise EngineStartError(
            f"--{name.replace('_', '-')} is given both as a dyn flag and among the "
            "arguments passed through to SGLang; give it once"
        )
    for name, value in ours.items():
        setattr(namespace, name, value)
    return namespace, passed | ours.keys()


def to_server_args(server_args_cls: Any, namespace: argparse.Namespace, fixed: dict[str, Any]) -> Any:
    """``server_args_cls.from_cli_args`` of ``namespace`` with ``fixed`` (dyn's own settings) set.

    Raises ``EngineStartError`` when SGLang refuses the combination.
    """
    for name, value in fixed.items():
        setattr(namespace, name, value)
    try:
        return server_args_cls.from_cli_args(namespace)
    except (ValueError, TypeError) as exc:
        raise EngineStartError(f"SGLang refused its arguments: {exc}") from None


def on_cpu(config: SglangConfig) -> bool:
    """Whether the flags passed through to SGLang ask for its CPU engine (``--device cpu``)."""
    args = list(config.extra_args)
    return "--device=cpu" in args or any(
        a == "--device" and b == "cpu" for a, b in zip(args, args[1:], strict=False)
    )


def merge_extra_args(config: SglangConfig, extra_args: Sequence[str]) -> SglangConfig:
    """``config`` with ``extra_args`` appended to its own."""
    if not extra_args:
        return config
    return msgspec.structs.replace(config, extra_args=[*config.extra_args, *extra_args])
