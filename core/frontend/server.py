"""Running the frontend: discovery-fed worker pool, router, OpenAI service, HTTP server.

``run_frontend(settings)`` blocks until SIGINT/SIGTERM. The HTTP server is uvicorn with uvloop
and httptools (chosen by measurement, see docs/benchmarks.md) hosting the ASGI app in this
process's event loop, next to the worker pool's ZMQ sockets; free heap memory goes back to the
system every few seconds (``dyn.core.memory``). When it accepts connections it
prints ``dyn frontend listening on http://HOST:PORT`` on stdout (``dyn serve`` and tests read
the port from it when ``http_port`` is 0).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import anyio

from dyn.core.config import DiscoveryConfig
from dyn.core.errors import ConfigError
from dyn.core.frontend.agent_trace import AgentTrace, PipeSink, TraceFile
from dyn.core.frontend.apis.chat_completions.chunks import REASONING_FIELD_NAMES
from dyn.core.frontend.apis.files.store import FileStore
from dyn.core.frontend.apis.responses.store import ResponseStore
from dyn.core.frontend.app import FrontendApp
from dyn.core.frontend.catalog import ModelCatalog, ServedModel
from dyn.core.frontend.chat_template import ChatTemplateError, ContentFormat
from dyn.core.frontend.cors import CorsPolicy
from dyn.core.frontend.limits import RequestLimits
from dyn.core.frontend.media import MediaSettings
from dyn.core.frontend.metrics import FrontendMetrics
from dyn.core.frontend.migration import Reliability
from dyn.core.frontend.preprocessor import Preprocessor
from dyn.core.frontend.request_log import RequestLog
from dyn.core.frontend.service import OpenAIService, OutputSettings, check_parsers
from dyn.core.frontend.session_identity import AFFINITY_MODES, SessionAffinity
from dyn.core.frontend.tls import TlsSettings
from dyn.core.logs import status
from dyn.core.memory import trim_periodically
from dyn.core.model.info import ModelError, ModelInfo, load_model_info
from dyn.core.model.multimodal import MediaProcessing
from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.registry import ParserUnavailable, UnknownParserError, load_plugin
from dyn.core.parsers.tool import TOOL_PARSERS
from dyn.core.protocol.openai import DEFAULT_MAX_LOGPROBS
from dyn.core.protocol.priority import CONVENTIONS
from dyn.core.router.agent import AgentRouter
from dyn.core.router.build import build_router
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.pool import WorkerPool
from dyn.core.service import bind_http, run_service

log = logging.getLogger(__name__)

READY_PREFIX = "dyn frontend listening on "


@dataclass(slots=True)
class FrontendSettings:
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    router_mode: str = "round-robin"
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    model_path: str | None = None
    tokenizer_path: str | None = None
    """Where the model's tokenizer files are when not in ``model_path`` (``--tokenizer``)."""
    model_name: str | None = None
    aliases: tuple[str, ...] = ()
    """Other names requests may use for the model (``--served-model-name``'s after the first)."""
    api_key: str | None = None
    cors: CorsPolicy = field(default_factory=CorsPolicy)
    graceful_shutdown_s: float = 10.0
    router_config: KvRouterConfig = field(default_factory=KvRouterConfig)
    router_address: str | None = None
    enable_cache_control: bool = False
    session_affinity: SessionAffinity = field(default_factory=SessionAffinity)
    """What a session id a client sends does (``--router-session-affinity``)."""
    parent_affinity: bool = True
    """A subagent's first request prefers its parent's worker (``--router-parent-affinity``)."""
    enable_anthropic_api: bool = True
    """``/v1/messages`` is served (``--enable-anthropic-api``)."""
    responses_store_max_entries: int = 1000
    responses_store_max_bytes: int = 64 << 20
    responses_store_ttl_s: int = 3600
    """The bounds of the Responses API's store (``--responses-store-*``)."""
    files_store_max_entries: int = 1000
    files_store_max_bytes: int = 64 << 20
    files_store_ttl_s: int = 3600
    """The bounds of the Files API's store (``--files-store-*``)."""
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    enable_auto_tool_choice: bool = False
    tool_parser_plugins: tuple[str, ...] = ()
    chat_template: str | None = None
    """A file holding a Jinja chat template, or the template itself (``--chat-template``)."""
    default_chat_template_kwargs: dict[str, Any] | None = None
    """Chat template arguments for every request that does not set them itself."""
    chat_template_content_format: ContentFormat = "auto"
    """How message content reaches the chat template (``--chat-template-content-format``)."""
    enable_force_include_usage: bool = False
    """Every stream carries usage (``--enable-force-include-usage``)."""
    exclude_tools_when_tool_choice_none: bool = False
    """``tool_choice: "none"`` renders no tools (``--exclude-tools-when-tool-choice-none``)."""
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    public_metrics: bool = False
    """``/metrics`` answers without the API key."""
    max_inflight: int = 0
    """Most requests served at once (0: no limit); beyond it, 503 with Retry-After."""
    limits: RequestLimits = field(default_factory=RequestLimits)
    media: MediaSettings = field(default_factory=MediaSettings)
    """Where images, audio and video may come from and how much of them a request may hold
    (``--allowed-local-media-path``, ``--allowed-media-domains``, ``--limit-mm-per-prompt``, ...)."""
    media_processing: MediaProcessing = field(default_factory=MediaProcessing)
    """How the workers' engine processes media beyond the model's files (``--mm-processor-kwargs``,
    ``--media-io-kwargs``): what placeholders are counted with."""
    reliability: Reliability = field(default_factory=Reliability)
    priority_convention: str = "dyn"
    """How ``agent_hints.priority`` is read: ``dyn`` (larger is more important) or ``dynamo``
    (forwarded raw, as Dynamo 1.0 did); see ``dyn.core.protocol.priority``."""
    response_role: str = "assistant"
    """The role of chat answers to requests that add a generation prompt (``--response-role``)."""
    root_path: str = ""
    """The path prefix a proxy serves this server under (``--root-path``): requests are served
    with and without it, and ``/openapi.json`` names it in ``servers``."""
    tls: TlsSettings | None = None
    """HTTPS instead of HTTP (``--ssl-*``)."""
    return_tokens_as_token_ids: bool = False
    """Logprob tokens as ``token_id:N`` (``--return-tokens-as-token-ids``)."""
    enable_prompt_tokens_details: bool = True
    """``usage.prompt_tokens_details`` (its ``cached_tokens``) in every usage; vLLM's default is off."""
    reasoning_field_name: str = "reasoning_content"
    """Where chat answers carry parsed reasoning: ``reasoning_content`` or ``reasoning``."""
    enable_log_requests: bool = False
    """Log each request's parameters (info) and prompt (debug) (``--enable-log-requests``)."""
    max_log_len: int | None = None
    """Most prompt characters and token ids a logged request shows (None: all)."""
    agent_trace_file: str | None = None
    """Where the agent trace goes (``--agent-trace-file``; ``dyn.core.frontend.agent_trace``)."""
    agent_trace_max_bytes: int = 64 << 20
    """Size at which the agent trace file is rotated."""
    agent_trace_backups: int = 3
    """Rotated agent trace files kept."""
    agent_trace_pipe: Connection | None = None
    """In an HTTP worker process of ``--num-http-workers``: where its agent-trace entries go (the
    supervising process writes the one file); None: this process writes it."""
    disable_fastapi_docs: bool = False
    """``/openapi.json`` is a 404 (``--disable-fastapi-docs``)."""
    enable_tokenizer_info_endpoint: bool = False
    """``GET /tokenizer_info`` is served (``--enable-tokenizer-info-endpoint``)."""
    sse_keep_alive_interval: int = 0
    """Seconds of a quiet stream before an SSE keep-alive comment (``--sse-keep-alive-interval``; 0: never)."""
    uvicorn_log_level: str | None = None
    """The level of uvicorn's own loggers; None: they follow ``--log-level``."""
    host: str = "127.0.0.1"
    """Where the ZMQ sockets this frontend binds listen (replica sync's PUB): ``--host``."""
    advertise_host: str | None = None
    """The address peers connect to for them (``--advertise-host``; ``dyn.core.transport.sockets``)."""
    num_http_workers: int = 1
    """Processes serving HTTP on the one port (``--num-http-workers``; ``http_workers``)."""
    reuse_port: bool = False
    """Bind the HTTP port with ``SO_REUSEPORT``, beside the other HTTP worker processes."""
    on_ready: Callable[[str], None] | None = None
    """Called with the URL once serving, instead of printing the ``READY_PREFIX`` status line (an
    HTTP worker process tells its supervisor so)."""


def build_app(settings: FrontendSettings) -> tuple[FrontendApp, WorkerPool]:
    """The app and its own model's worker pool (whose ``client_factory`` the pools of the models
    discovered later copy); run ``app.models.run`` to serve. ``ConfigError`` on a bad model,
    namespace or router mode."""
    try:
        info = load_model_info(settings.model_path, settings.model_name, settings.tokenizer_path)
        chat_template = _chat_template(settings.chat_template)
    except ModelError as exc:
        raise ConfigError(str(exc)) from None
    outputs = _output_settings(settings)
    _uvicorn_level(settings.uvicorn_log_level)
    if settings.enable_cache_control and settings.router_mode != "kv":
        raise ConfigError(
            "--enable-cache-control needs --router-mode kv (the pin goes to the worker the KV router chose)"
        )
    if settings.session_affinity.mode not in AFFINITY_MODES:
        raise ConfigError(
            f"--router-session-affinity must be one of {', '.join(AFFINITY_MODES)}, "
            f"got {settings.session_affinity.mode!r}"
        )
    convention = settings.priority_convention
    if convention not in CONVENTIONS:
        raise ConfigError(
            f"--priority-convention must be one of {', '.join(CONVENTIONS)}, got {convention!r}"
        )
    metrics = FrontendMetrics()
    request_log = _request_log(settings)
    agent_trace = _agent_trace(settings)
    try:
        store = settings.discovery.open()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None

    def served(
        info: ModelInfo, chat_template: str | None = None, lora_name: str | None = None
    ) -> ServedModel:
        """One model's pipeline, or that of its LoRA adapter ``lora_name``; ``ValueError``
        (``ChatTemplateError``) says what to fix."""
        reliability = settings.reliability
        preprocessor = Preprocessor(
            info,
            chat_template=chat_template,
            limits=settings.limits,
            default_template_kwargs=settings.default_chat_template_kwargs,
            content_format=settings.chat_template_content_format,
            exclude_tools_when_none=settings.exclude_tools_when_tool_choice_none,
            media_processing=settings.media_processing,
        )
        check_parsers(outputs, preprocessor.tokenizer)  # hf: the model's response_template
        pool = WorkerPool(
            store,
            info.name,
            first_token_timeout_s=reliability.first_token_timeout_s,
            inter_token_timeout_s=reliability.inter_token_timeout_s,
            warn_other_models=False,
            lora_name=lora_name,
        )
        router = build_router(
            settings.router_mode,
            pool,
            settings.router_config,
            metrics.registry,
            namespace=settings.discovery.namespace,
            router_address=settings.router_address,
            host=settings.host,
        )
        agent = AgentRouter(
            router,
            enable_cache_control=settings.enable_cache_control,
            parent_affinity=settings.parent_affinity,
        )
        service = OpenAIService(
            lora_name or info.name,
            preprocessor,
            agent,
            metrics,
            agent.background,
            outputs,
            reliability,
            priority_convention=convention,
            request_log=request_log,
            agent_trace=agent_trace,
            affinity=settings.session_affinity,
            media=settings.media,
        )
        service.lora_name = lora_name
        return ServedModel(service, pool)

    try:
        primary = served(info, chat_template)
    except ChatTemplateError as exc:
        raise ConfigError(f"--chat-template does not compile: {exc}") from None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None

    def discovered(info: ModelInfo, lora_name: str | None) -> ServedModel:
        model = served(info, lora_name=lora_name)
        model.pool.client_factory = primary.pool.client_factory
        return model

    catalog = ModelCatalog(
        primary,
        aliases=settings.aliases,
        store=store,
        build=discovered,
        why_not=(
            f"the frontend routes through the dyn router at {settings.router_address}, which routes "
            f"model {info.name!r} only"
            if settings.router_address is not None
            else None
        ),
    )
    return FrontendApp(
        catalog,
        api_key=settings.api_key,
        cors=settings.cors,
        kv_views=_kv_views(cast(AgentRouter, primary.service.router).inner, primary.pool, info.name, metrics),
        public_metrics=settings.public_metrics,
        max_inflight=settings.max_inflight,
        root_path=_root_path(settings.root_path),
        docs=not settings.disable_fastapi_docs,
        anthropic_api=settings.enable_anthropic_api,
        sse_keep_alive_s=settings.sse_keep_alive_interval,
        tokenizer_info=settings.enable_tokenizer_info_endpoint,
        response_store=ResponseStore(
            settings.responses_store_max_entries,
            settings.responses_store_max_bytes,
            settings.responses_store_ttl_s,
        ),
        file_store=FileStore(
            settings.files_store_max_entries, settings.files_store_max_bytes, settings.files_store_ttl_s
        ),
    ), primary.pool


def _root_path(value: str) -> str:
    """``--root-path`` as a prefix: one leading slash, no trailing one (``""``: none)."""
    path = value.strip().rstrip("/")
    if path and not path.startswith("/"):
        raise ConfigError(f"--root-path must start with '/' (a URL path such as /llm), got {value!r}")
    return path


def _request_log(settings: FrontendSettings) -> RequestLog | None:
    if settings.max_log_len is not None and settings.max_log_len < 0:
        raise ConfigError("--max-log-len must be at least 0")
    return RequestLog(settings.max_log_len) if settings.enable_log_requests else None


def _agent_trace(settings: FrontendSettings) -> AgentTrace | None:
    """The trace of this process's requests: written here, or sent to the process that writes it
    for every HTTP worker (``agent_trace_pipe``); None without ``--agent-trace-file``, and in that
    process's own check of the settings (it opens the file itself: ``http_workers``)."""
    if settings.agent_trace_file is None:
        return None
    if settings.agent_trace_pipe is not None:
        return AgentTrace(PipeSink(settings.agent_trace_pipe))
    if settings.num_http_workers > 1:
        return None
    return AgentTrace(trace_file(settings))


def trace_file(settings: FrontendSettings) -> TraceFile:
    """``--agent-trace-file`` opened for writing, with its rotation settings."""
    assert settings.agent_trace_file is not None
    return TraceFile(settings.agent_trace_file, settings.agent_trace_max_bytes, settings.agent_trace_backups)


def _chat_template(value: str | None) -> str | None:
    """``--chat-template``: a path to a template file, or the template itself (as vLLM takes it)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if len(value) < 4096 and "{" not in value and "\n" not in value:
        if not path.is_file():
            raise ConfigError(
                f"--chat-template {value!r}: no such file (pass a Jinja template file, "
                "or the template text itself)"
            )
        return path.read_text(encoding="utf-8")
    return value


def _output_settings(settings: FrontendSettings) -> OutputSettings:
    """The parser flags, checked: plugins imported, names known, ranges sane."""
    for plugin in settings.tool_parser_plugins:
        try:
            load_plugin(plugin)
        except ValueError as exc:
            raise ConfigError(f"--tool-parser-plugin: {exc}") from None
    for flag, registry, name in (
        ("--tool-call-parser", TOOL_PARSERS, settings.tool_call_parser),
        ("--reasoning-parser", REASONING_PARSERS, settings.reasoning_parser),
    ):
        try:
            if name:
                registry.usable(name)
        except (UnknownParserError, ParserUnavailable) as exc:
            raise ConfigError(f"{flag}: {exc}") from None
    if settings.max_logprobs < 0:
        raise ConfigError("--max-logprobs must be at least 0")
    if not settings.response_role.strip():
        raise ConfigError("--response-role must not be empty (vLLM's default is assistant)")
    if settings.reasoning_field_name not in REASONING_FIELD_NAMES:
        raise ConfigError(
            f"--reasoning-field-name must be one of {', '.join(REASONING_FIELD_NAMES)}, "
            f"not {settings.reasoning_field_name!r}"
        )
    return OutputSettings(
        settings.tool_call_parser or None,
        settings.reasoning_parser or None,
        settings.enable_auto_tool_choice,
        settings.max_logprobs,
        response_role=settings.response_role,
        return_tokens_as_token_ids=settings.return_tokens_as_token_ids,
        prompt_tokens_details=settings.enable_prompt_tokens_details,
        reasoning_field_name=settings.reasoning_field_name,
        force_include_usage=settings.enable_force_include_usage,
    )


def _kv_views(router, pool: WorkerPool, model_name: str, metrics: FrontendMetrics):
    """``dyn indexer``'s read-only HTTP views over the embedded KV router's index, at ``/kv/``
    (every live worker is listed, with or without cached blocks)."""
    from dyn.core.kv.views import IndexerHttpApp, IndexerMetrics, router_index_view

    view = router_index_view(router, pool, model_name)
    if view is None:
        return None
    return IndexerHttpApp(view, IndexerMetrics(metrics.registry, view), prefix="/kv")


async def serve_frontend(settings: FrontendSettings) -> None:
    import uvicorn

    app, pool = build_app(settings)
    sock = bind_http(settings.http_host, settings.http_port, reuse_port=settings.reuse_port)
    host, port = sock.getsockname()[:2]
    # uvicorn waits timeout_graceful_shutdown with asyncio.wait_for: a float of seconds works,
    # though its annotation says int
    grace: Any = settings.graceful_shutdown_s
    config = uvicorn.Config(
        app,
        loop="none",
        http=app.http_protocol(),
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=grace,
        backlog=2048,
        timeout_keep_alive=30,
        log_level=_uvicorn_level(settings.uvicorn_log_level),
        **(settings.tls.uvicorn_options() if settings.tls is not None else {}),
    )
    if settings.tls is not None:
        settings.tls.check(config)
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        await tg.start(app.models.run)
        tg.start_soon(trim_periodically)

        async def announce() -> None:
            while not server.started:  # noqa: ASYNC110 (uvicorn sets a flag, not an event)
                await anyio.sleep(0.01)
            scheme = "https" if settings.tls is not None else "http"
            url = f"{scheme}://{host if ':' not in host else f'[{host}]'}:{port}"
            if settings.on_ready is not None:
                settings.on_ready(url)
            else:
                status(READY_PREFIX + url, url=url)
            log.info(
                "serving model %r at %s/v1 (router %s, %d worker(s) so far)",
                app.service.model_name,
                url,
                settings.router_mode,
                len(pool),
            )

        tg.start_soon(announce)
        try:
            await server.serve(sockets=[sock])
        finally:
            with anyio.CancelScope(shield=True):
                await app.background_responses.drain(grace)
                trace = app.service.agent_trace
                if trace is not None:  # an HTTP worker process's entries still in its pipe go
                    await anyio.to_thread.run_sync(trace.close)
            tg.cancel_scope.cancel()


UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
"""``--uvicorn-log-level`` choices (vLLM's, uvicorn's own)."""


def _uvicorn_level(level: str | None) -> str | None:
    if level is None:
        return None
    if level.lower() not in UVICORN_LOG_LEVELS:
        raise ConfigError(
            f"--uvicorn-log-level must be one of {', '.join(UVICORN_LOG_LEVELS)}, got {level!r}"
        )
    return level.lower()


def run_frontend(settings: FrontendSettings) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn handles both and drains open requests), in this
    process or, with ``num_http_workers`` above 1, in that many (``http_workers``)."""
    # the encode thread's batches are a few short prompts: the Rust tokenizer's thread pool would
    # cost ~8 MB of RSS (a malloc arena per thread) for no measured gain; the user's choice stands
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if settings.num_http_workers > 1:
        from dyn.core.frontend.http_workers import run_http_workers

        run_http_workers(settings)
        return
    run_service(serve_frontend, settings)
