"""The Engine protocol every backend implements, and the registry that finds engines.

An engine turns a tokenized ``GenerateRequest`` into a stream of ``TokenChunk`` messages ended by
exactly one ``Finish`` (or an ``EngineError`` raised from the iterator). The worker host
(``dyn.core.worker``) owns the sockets and discovery; the engine owns scheduling and the KV cache.

KV events: an engine either publishes them itself on its own ZMQ PUB (vLLM, SGLang: it reports
the endpoints in ``EngineInfo``) or is handed a ``KvEventSink`` by its plugin and calls it once per
step with that step's events (the mocker); the host then publishes them in the vLLM wire format.

Engines are registered as entry points in the group ``dyn.engines``; core never imports a plugin
directly, so ``dyn --help`` and the mocker never load vllm or sglang.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

from dyn.core.kv.events import KvEvent
from dyn.core.messages import (
    CLASSIFY_TASKS,
    Finish,
    GenerateRequest,
    LoadMetrics,
    PoolingTask,
    PriorityOrder,
    TokenChunk,
)

if TYPE_CHECKING:
    from dyn.core.config import Flag

ENGINE_ENTRY_POINT_GROUP = "dyn.engines"

KvEventSink = Callable[[list[KvEvent], int], None]
"""``sink(events, dp_rank)``: publish one engine step's KV events for a data-parallel rank."""


class EngineError(RuntimeError):
    """The engine could not serve a request; ``code`` is an ``ErrorReply`` code."""

    def __init__(self, message: str, code: str = "engine_error") -> None:
        super().__init__(message)
        self.code = code


class EngineStartError(RuntimeError):
    """The engine could not start (not installed, no usable device, bad engine arguments, the
    engine's own start-up failed). The message says what to fix; ``dyn worker`` prints it and
    exits with status 1 instead of a traceback."""


class EngineInfo(msgspec.Struct, kw_only=True):
    """What a worker registers in discovery about its engine."""

    block_size: int
    total_kv_blocks: int
    max_num_batched_tokens: int
    dp_size: int = 1
    context_length: int | None = None
    kv_events_endpoint: str | None = None
    """Set when the engine publishes KV events itself; the host then advertises it (under
    ``--plane-keys`` it relays it, ``dyn.core.worker.kv_relay``, and advertises the relay)."""
    kv_replay_endpoint: str | None = None
    kv_events_topic: str = "kv-events"
    priority_order: PriorityOrder = "lower_first"
    """``lower_first`` or ``higher_first``: how ``GenerateRequest.priority`` orders requests."""
    features: list[str] = []
    """Optional calls this engine serves (``FEATURE_*``); the host answers the others with an
    ``unsupported`` error."""
    loras: dict[str, str] = {}
    """The LoRA adapters the engine serves, name to path (``WorkerRecord.loras``)."""
    device: str | None = None
    """What the engine computes on (``WorkerRecord.device``)."""


FEATURE_STREAMING_SESSIONS = "streaming_sessions"
FEATURE_PIN_PREFIX = "pin_prefix"
FEATURE_TOOL_HINTS = "tool_hints"
"""The engine acts on ``GenerateRequest.tools`` (the mocker's ``--tool-call-rate``)."""
FEATURE_EMBED = "embed"
"""The engine embeds (``Embedder``): the frontend sends ``/v1/embeddings`` only to such workers."""
FEATURE_CLASSIFY = "classify"
"""The engine classifies (``Embedder.embed`` with ``task="classify"``): its model is a
classification model, served by a pooling worker; ``/classify`` goes only to such workers."""


def pooling_feature(task: PoolingTask) -> str:
    """The feature a worker lists to pool with ``task``: ``classify`` for a classifier's tasks,
    else ``embed``."""
    return FEATURE_CLASSIFY if task in CLASSIFY_TASKS else FEATURE_EMBED


FEATURE_POOLING_ONLY = "pooling_only"
"""The engine embeds and does not generate (vLLM's ``--runner pooling``); ``generate`` refuses."""
FEATURE_MEDIA = "media"
"""The engine takes ``GenerateRequest.media`` (images, audio, video at their placeholder tokens):
the frontend routes requests with media only to such workers."""


@runtime_checkable
class Engine(Protocol):
    """A backend that generates tokens. Implementations: dyn.plugins.mocker, .vllm, .sglang."""

    info: EngineInfo

    async def run(self, *, task_status: Any = ...) -> None:
        """Run the engine until cancelled; call ``task_status.started()`` once ``generate`` may
        be called (the host starts it with ``await task_group.start(engine.run)``), and fill
        ``info`` before that (the host registers it). Cancellation stops it and releases its
        resources. Raises ``EngineStartError`` when it cannot start."""

    def generate(self, request: GenerateRequest) -> AsyncGenerator[TokenChunk | Finish, None]:
        """Stream output for one request: ``TokenChunk``s then one ``Finish``.

        Closing the iterator early aborts the request in the engine.
        """

    async def abort(self, request_id: str) -> bool:
        """Abort a live request; its stream ends with ``Finish(reason="cancelled")``.

        Returns False when the request is unknown or already finished.
        """

    def load_metrics(self) -> list[LoadMetrics]:
        """One snapshot per data-parallel rank (``instance_id`` left 0; the host fills it)."""

    # Optional calls, offered when named in ``info.features``: ``StreamingSessions``
    # (FEATURE_STREAMING_SESSIONS), ``PrefixPinning`` (FEATURE_PIN_PREFIX), ``Embedder``
    # (FEATURE_EMBED). An engine with metrics of its own offers ``PrometheusMetrics``.


ReplySink = Callable[["TokenChunk | Finish | EngineError"], None]
"""Where a pushing engine puts one request's outputs: ``TokenChunk``s, then one ``Finish`` or
``EngineError``."""


@runtime_checkable
class PushingEngine(Protocol):
    """An engine that can hand a request's outputs to a callback from its own loop as its steps
    produce them, instead of through an iterator read by a task per request (a token then costs
    no task switch). The worker host uses ``start`` instead of ``generate`` when it is offered."""

    async def start(self, request: GenerateRequest, emit: ReplySink) -> None:
        """Admit ``request``, or raise ``EngineError`` (nothing is emitted then). Its outputs
        then go to ``emit``, called from the engine's loop and never after the terminal one;
        ``abort`` ends it with ``Finish(reason="cancelled")``."""

    def start_now(self, request: GenerateRequest, emit: ReplySink) -> bool:
        """``start`` without waiting, when admitting ``request`` needs none: True once admitted
        (or ``EngineError`` as ``start`` raises), False having changed nothing (the host then
        awaits ``start`` in a task of its own; most requests need no task at all)."""


class StreamingSessions(Protocol):
    """The calls of an engine that lists ``FEATURE_STREAMING_SESSIONS`` in ``info.features``."""

    async def open_session(self, session_id: str, timeout_s: float) -> bool:
        """Open a streaming session idle-closed after ``timeout_s``; False if it was already
        open (its timeout is then updated). Raises ``EngineError`` when it cannot."""

    async def close_session(self, session_id: str) -> bool:
        """Close it and free its KV; False if it was not open."""


@runtime_checkable
class PrometheusMetrics(Protocol):
    """An engine with metrics of its own (SGLang's with ``--enable-metrics``), which the worker
    serves on its ``--system-port`` ``/metrics``."""

    def prometheus_text(self) -> bytes:
        """The engine's metrics in the Prometheus text format (empty when it keeps none)."""


class PrefixPinning(Protocol):
    """The call of an engine that lists ``FEATURE_PIN_PREFIX`` in ``info.features``."""

    async def pin_prefix(self, token_ids: list[int], ttl_s: float) -> int:
        """Pin the cached blocks of the prompt's prefix for ``ttl_s`` seconds; returns how many."""


class Embedder(Protocol):
    """The call of an engine that lists ``FEATURE_EMBED`` in ``info.features``."""

    async def embed(
        self, prompts: list[list[int]], task: PoolingTask = "embed", activation: bool = True
    ) -> list[list[float]]:
        """One vector per tokenized prompt, in order: with ``task`` ``embed`` an embedding of the
        model's embedding size, with ``classify`` (an engine listing ``FEATURE_CLASSIFY``) the
        probabilities of the model's classes; ``token_embed`` and ``token_classify`` the same
        for each token, the prompt's rows laid end to end (``EmbedRequest``); ``activation``
        False: the same without the pooler's activation (the embedding not normalized, the
        classes' logits). Raises
        ``EngineError`` (code ``bad_request`` for an input the engine cannot take,
        ``unsupported`` for a task it does not serve)."""


@dataclass(frozen=True)
class EnginePlugin:
    """What an engine package registers under ``dyn.engines``: everything ``dyn worker NAME``
    needs, so a third-party engine gets its command without an edit in dyn.

    ``config_type`` is the engine's config class; the fields it declares with a ``Flag``
    (``dyn.core.config``) are the command's engine flags, and the command hands the engine one
    validated instance. ``create(config, model, settings, kv_sinks)`` makes one (not yet started)
    engine per entry of ``kv_sinks`` (one per worker this process hosts, so what the engines can
    share is made once): ``model`` is what ``load_model(model_path, model_name, tokenizer_path)`` returned (it has a
    ``name``); each sink is its host's KV-event publisher when ``publishes_kv_events`` is False (the
    engine calls it once per step), None when the engine publishes its own and reports where in
    ``EngineInfo``. The shared rest (discovery, sockets, hosts, signals) is ``dyn.core.worker.launch``.

    Optional, for what differs between engines:

    - ``description``: the command's ``--help`` text (default: ``summary``);
    - ``model_path``: the engine's own ``--model-path`` flag (default: optional, the embedded dyn-tiny);
    - ``load_model``: how the model is found (default: ``dyn.core.model.load_model_info``); raises
      ``ValueError`` saying what to fix;
    - ``prepare(config, extra_args)``: the config to run, checked (default: ``config.validate()``);
      ``extra_args`` are the flags the command did not declare, given only when ``passes_through``;
    - ``worker_options``: a config class whose flags are worker-level options of the command; its
      field values reach ``create`` through ``dyn.core.worker.launch.build_hosts`` (``num_workers``:
      how many engines this process hosts);
    - ``disaggregation``: the engine serves the ``prefill`` and ``decode`` roles of
      ``--disaggregation-mode`` (``WorkerSettings.disaggregation_mode``; the ``KvTransfer`` of
      ``dyn.core.messages``); without it a worker started in either role is refused.
    """

    name: str
    summary: str
    config_type: type
    create: Callable[..., Sequence[Engine]]
    description: str = ""
    model_path: Flag | None = None
    load_model: Callable[[str | None, str | None, str | None], Any] | None = None
    prepare: Callable[[Any, Sequence[str]], Any] | None = None
    passes_through: bool = False
    publishes_kv_events: bool = True
    worker_options: type | None = None
    disaggregation: bool = False

    def serve(self, config: Any, settings: Any, **kwargs: Any) -> None:
        """Run this engine's workers in this process until SIGINT or SIGTERM (see
        ``dyn.core.worker.launch.serve``); ``ConfigError`` for bad settings, ``EngineStartError``
        when the engine cannot start."""
        from dyn.core.worker.launch import serve

        serve(self, config, settings, **kwargs)


def available_engines() -> dict[str, EntryPoint]:
    """Registered engine plugins by name (entry point group ``dyn.engines``)."""
    return {ep.name: ep for ep in entry_points(group=ENGINE_ENTRY_POINT_GROUP)}
