"""``dyn frontend``: the OpenAI-compatible HTTP server with an embedded router."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand

from dyn.cli import completion, options
from dyn.cli.config_flags import FROM_FLAGS, discovery_flags
from dyn.cli.options import flag
from dyn.cli.router_flags import router_flags
from dyn.core.config import DiscoveryConfig
from dyn.core.frontend import vllm_flags
from dyn.core.frontend.limits import RequestLimits
from dyn.core.frontend.media import DEFAULT_LIMIT_PER_PROMPT, MediaSettings, parse_limit_mm_per_prompt
from dyn.core.frontend.session_identity import SessionAffinity
from dyn.core.router.modes import modes_help

if TYPE_CHECKING:
    from dyn.core.router.config import KvRouterConfig

HTTP_PANEL = "HTTP"
ROUTER_PANEL = "Router"
LIMITS_PANEL = "Limits"
RELIABILITY_PANEL = "Reliability"
LOGGING_PANEL = "Logging"
MEDIA_PANEL = "Media"
_LIMITS = RequestLimits()
_MEDIA = MediaSettings()
log = logging.getLogger("dyn.frontend")


class FrontendCommand(TyperCommand):
    """``dyn frontend``: a ``vllm serve`` API-server flag it does not take is refused with why
    (``dyn.core.frontend.vllm_flags``), not only as an unknown option."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:  # completion parses too: it must not exit
            for arg in args:
                if arg == "--":
                    break
                refused = (
                    vllm_flags.refusal(arg, "dyn frontend", frontend=True) if arg.startswith("--") else None
                )
                if refused is not None:
                    options.fail(refused)
        return super().parse_args(ctx, args)


def _json_object(value: str | None, name: str) -> dict | None:
    """A flag's JSON object, or None when not given."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint=name) from None
    if not isinstance(parsed, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=name)
    return parsed


def _list(value: str, name: str) -> tuple[str, ...]:
    """vLLM takes a JSON list ('["a", "b"]'); a comma-separated list works too."""
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"{name}: not a JSON list: {exc}") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise typer.BadParameter(f"{name}: must be a JSON list of strings")
        return tuple(items)
    return tuple(i.strip() for i in text.split(",") if i.strip())


def _parser_names(kind: str) -> str:
    """The registered parser names, for the help text."""
    if kind == "tool":
        from dyn.core.parsers.tool import TOOL_PARSERS

        return ", ".join(TOOL_PARSERS.names())
    from dyn.core.parsers.reasoning import REASONING_PARSERS

    return ", ".join(REASONING_PARSERS.names())


@router_flags
@discovery_flags
def frontend(
    http_host: str = flag(
        "127.0.0.1", "--http-host", panel=HTTP_PANEL, help="Address the HTTP server listens on."
    ),
    http_port: int = flag(
        8000,
        "--http-port",
        "--port",
        min=0,
        max=65535,
        panel=HTTP_PANEL,
        help="Port the HTTP server listens on (0: a free port, printed at start).",
    ),
    api_key: str = options.API_KEY,
    public_metrics: bool = flag(
        False,
        "--public-metrics",
        panel=options.SECURITY_PANEL,
        help="Serve /metrics without the API key (for Prometheus scrapers).",
    ),
    plane_keys: str = options.PLANE_KEYS,
    host: str = options.HOST,
    advertise_host: str = options.ADVERTISE_HOST,
    num_http_workers: int = flag(
        1,
        "--num-http-workers",
        min=1,
        max=64,
        panel=HTTP_PANEL,
        help="Processes serving HTTP on the one port (SO_REUSEPORT), each a whole frontend; with "
        "--router-mode kv their routers share bookings (replica sync). /metrics is per process.",
    ),
    max_inflight: int = flag(
        0,
        "--max-inflight",
        min=0,
        panel=LIMITS_PANEL,
        help="Most requests served at once; beyond it a request is answered 503 "
        "with Retry-After (0: no limit).",
    ),
    max_n: int = flag(
        _LIMITS.max_n, "--max-n", min=1, panel=LIMITS_PANEL, help="Most choices (n) one request may ask for."
    ),
    max_prompts: int = flag(
        _LIMITS.max_prompts,
        "--max-prompts",
        min=1,
        panel=LIMITS_PANEL,
        help="Most engine requests one request may fan out to: its prompts (a batched "
        "completions request) times n.",
    ),
    max_prompt_bytes: int = flag(
        None,
        "--max-prompt-bytes",
        min=1,
        panel=LIMITS_PANEL,
        help="Most bytes of prompt text (all messages) one request may send; checked "
        "before tokenizing (default: 32 bytes per token of the context length, "
        "at least 1 MiB).",
    ),
    max_response_bytes: int = flag(
        _LIMITS.max_response_bytes,
        "--max-response-bytes",
        min=1,
        panel=LIMITS_PANEL,
        help="Largest non-streaming response one request may ask for: n x max_tokens, with "
        "its logprobs, is checked before generating (a streamed response is not bounded).",
    ),
    max_stop_strings: int = flag(
        _LIMITS.max_stop_strings,
        "--max-stop-strings",
        min=0,
        panel=LIMITS_PANEL,
        help="Most stop strings one request may send.",
    ),
    max_stop_string_chars: int = flag(
        _LIMITS.max_stop_string_chars,
        "--max-stop-string-chars",
        min=1,
        panel=LIMITS_PANEL,
        help="Longest stop string a request may send.",
    ),
    trust_request_chat_template: bool = flag(
        False,
        "--trust-request-chat-template",
        panel=LIMITS_PANEL,
        help="Accept a chat_template in the request (vLLM's flag); it is "
        "then rendered with size and time limits.",
    ),
    allowed_local_media_path: str = flag(
        None,
        "--allowed-local-media-path",
        panel=MEDIA_PANEL,
        help="Let requests name images, audio and video by file path or file:// URL under this "
        "directory (vLLM's flag; symlinks and .. may not leave it). Only for trusted clients: "
        "without it, files are refused.",
    ),
    allowed_media_domains: list[str] = flag(
        [],
        "--allowed-media-domains",
        panel=MEDIA_PANEL,
        help="Fetch http(s) media URLs only from these hosts, at every redirect too (vLLM's flag: "
        "--allowed-media-domains a.com b.com; comma-separated or repeated works too). Default: any host.",
    ),
    limit_mm_per_prompt: str = flag(
        None,
        "--limit-mm-per-prompt",
        panel=MEDIA_PANEL,
        help="Most items of each modality one request may hold, a JSON object as vLLM takes it "
        '(\'{"image": 4, "video": 0}\', or --limit-mm-per-prompt.image 4); a modality not named: '
        f"{DEFAULT_LIMIT_PER_PROMPT}, vLLM's default. Checked before anything is loaded.",
    ),
    max_media_bytes: int = flag(
        _MEDIA.max_media_bytes,
        "--max-media-bytes",
        min=1,
        panel=MEDIA_PANEL,
        help="Largest image, audio clip or video (encoded bytes) a request may send or link to.",
    ),
    max_request_media_bytes: int = flag(
        _MEDIA.max_request_media_bytes,
        "--max-request-media-bytes",
        min=1,
        panel=MEDIA_PANEL,
        help="Most encoded bytes of all the media of one request together.",
    ),
    media_fetch_timeout: float = flag(
        None,
        "--media-fetch-timeout",
        min=0.001,
        panel=MEDIA_PANEL,
        help="Seconds one http(s) media fetch may take, redirects and body included (default: "
        "vLLM's, 5 for an image, 10 for audio, 30 for a video).",
    ),
    max_image_pixels: int = flag(
        _MEDIA.max_image_pixels,
        "--max-image-pixels",
        min=1,
        max=_MEDIA.max_image_pixels,
        panel=MEDIA_PANEL,
        help="Most pixels (width x height) of an image, checked before it is decoded (vLLM's "
        "VLLM_MAX_IMAGE_PIXELS; larger ones Pillow refuses).",
    ),
    migration_limit: int = flag(
        0,
        "--migration-limit",
        min=0,
        panel=RELIABILITY_PANEL,
        help="How many times a request whose worker dies or goes silent mid-stream "
        "continues on another worker (prompt plus the tokens already "
        "generated); 0 fails it instead, as Dynamo's default.",
    ),
    migration_max_seq_len: int = flag(
        None,
        "--migration-max-seq-len",
        min=1,
        panel=RELIABILITY_PANEL,
        help="Stop tracking a choice for migration once its prompt plus output "
        "tokens pass this many (bounds the memory migration keeps; "
        "default: no bound), as Dynamo's flag.",
    ),
    first_token_timeout: float = flag(
        300.0,
        "--first-token-timeout",
        min=0.0,
        panel=RELIABILITY_PANEL,
        help="Seconds a worker may take to send a request's first token before "
        "it is treated as dead for that request (migrated or failed; "
        "0: wait forever).",
    ),
    inter_token_timeout: float = flag(
        60.0,
        "--inter-token-timeout",
        min=0.0,
        panel=RELIABILITY_PANEL,
        help="Seconds a worker may go silent between a request's tokens before "
        "it is treated as dead for that request (0: wait forever).",
    ),
    allowed_origins: str = flag(
        '["*"]',
        "--allowed-origins",
        panel=HTTP_PANEL,
        help="CORS allowed origins, a JSON list or comma-separated.",
    ),
    allowed_methods: str = flag(
        '["*"]',
        "--allowed-methods",
        panel=HTTP_PANEL,
        help="CORS allowed methods, a JSON list or comma-separated.",
    ),
    allowed_headers: str = flag(
        '["*"]',
        "--allowed-headers",
        panel=HTTP_PANEL,
        help="CORS allowed headers, a JSON list or comma-separated.",
    ),
    allow_credentials: bool = flag(
        False, "--allow-credentials", panel=HTTP_PANEL, help="CORS: allow credentials."
    ),
    router_mode: str = flag(
        "round-robin",
        "--router-mode",
        panel=ROUTER_PANEL,
        help=modes_help(),
        autocompletion=completion.router_modes,
    ),
    priority_convention: str = flag(
        "dyn",
        "--priority-convention",
        panel=ROUTER_PANEL,
        help="How nvext.agent_hints.priority is read. dyn: larger is more important "
        "(the router queue and every engine agree; Dynamo >= 1.1 does the same). dynamo: "
        "the value goes to the engine as sent and the router queue ignores it, as Dynamo "
        "1.0 did (with vLLM a smaller value is served first).",
    ),
    router_address: str = flag(
        None,
        "--router-address",
        panel=ROUTER_PANEL,
        help="With --router-mode kv: ask the dyn router at this ZMQ address "
        "instead of routing in this process.",
    ),
    router_session_affinity: str = flag(
        "soft",
        "--router-session-affinity",
        panel=ROUTER_PANEL,
        help="What the session id an agent sends (x-dynamo-session-id, X-Claude-Code-Session-Id, "
        "Codex's session-id, OpenCode's x-session-id, a Responses prompt_cache_key) does. soft: the session is bound to the worker "
        "of its first turn and later turns go there unless that worker is overloaded; hard: always "
        "there; off: ignored.",
    ),
    router_session_affinity_ttl_secs: int = flag(
        300,
        "--router-session-affinity-ttl-secs",
        min=1,
        max=31_536_000,
        panel=ROUTER_PANEL,
        help="How long a session stays bound after its last turn (1 to 31536000).",
    ),
    router_parent_affinity: bool = flag(
        True,
        "--router-parent-affinity/--no-router-parent-affinity",
        panel=ROUTER_PANEL,
        help="A subagent's first request (its parent named by nvext.agent_context.parent_program_id "
        "or a parent header: x-dynamo-parent-session-id, x-claude-code-parent-agent-id, "
        "x-codex-parent-thread-id) goes to the worker of its parent's last request, where their "
        "shared context is cached, unless that worker is overloaded.",
    ),
    enable_anthropic_api: bool = flag(
        True,
        "--enable-anthropic-api/--no-enable-anthropic-api",
        panel=HTTP_PANEL,
        help="Serve Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) for "
        "Claude Code and the anthropic SDK.",
    ),
    responses_store_max_entries: int = flag(
        1000,
        "--responses-store-max-entries",
        min=1,
        panel=LIMITS_PANEL,
        help="Most Responses API responses kept for previous_response_id and GET /v1/responses/{id} "
        "(least recently used dropped first).",
    ),
    responses_store_max_bytes: int = flag(
        64 << 20,
        "--responses-store-max-bytes",
        min=1,
        panel=LIMITS_PANEL,
        help="Most bytes of stored Responses API responses.",
    ),
    responses_store_ttl_secs: int = flag(
        3600,
        "--responses-store-ttl-secs",
        min=1,
        panel=LIMITS_PANEL,
        help="How long a stored Responses API response is kept.",
    ),
    enable_cache_control: bool = flag(
        False,
        "--enable-cache-control",
        panel=ROUTER_PANEL,
        help="Honour nvext.cache_control: after generation, ask the "
        "worker to pin the prompt's KV for the TTL (needs "
        "--router-mode kv).",
    ),
    enable_auto_tool_choice: bool = flag(
        False,
        "--enable-auto-tool-choice",
        panel=options.PARSERS_PANEL,
        help="Accept tool_choice auto (the default when a request has "
        "tools): calls are parsed with --tool-call-parser. Workers "
        "started with --dyn-tool-call-parser turn it on by themselves.",
    ),
    tool_call_parser: str = flag(
        None,
        "--tool-call-parser",
        panel=options.PARSERS_PANEL,
        help="How the model writes tool calls; overrides what workers advertise. "
        f"One of: {_parser_names('tool')}.",
    ),
    reasoning_parser: str = flag(
        None,
        "--reasoning-parser",
        panel=options.PARSERS_PANEL,
        help="How the model writes reasoning (returned as reasoning_content); "
        f"overrides what workers advertise. One of: {_parser_names('reasoning')}.",
    ),
    tool_parser_plugin: list[str] = flag(
        None,
        "--tool-parser-plugin",
        panel=options.PARSERS_PANEL,
        help="A Python file whose parsers register themselves "
        "(@TOOL_PARSERS.register(NAME) on a ToolParser subclass), or a vLLM tool-parser plugin "
        "(@ToolParserManager.register_module) when vLLM is installed; repeatable.",
    ),
    chat_template: str = flag(
        None,
        "--chat-template",
        panel=options.PARSERS_PANEL,
        help="A Jinja chat template file (or the template text) replacing the model's.",
    ),
    default_chat_template_kwargs: str = flag(
        None,
        "--default-chat-template-kwargs",
        panel=options.PARSERS_PANEL,
        help="Chat template arguments, a JSON object ('{\"enable_thinking\": false}'), that every "
        "request gets unless its chat_template_kwargs set them (vLLM's flag).",
    ),
    max_logprobs: int = flag(
        20,
        "--max-logprobs",
        min=0,
        panel=options.PARSERS_PANEL,
        help="Most top logprobs a request may ask for (top_logprobs, logprobs, prompt_logprobs).",
    ),
    reasoning_field_name: str = flag(
        "reasoning_content",
        "--reasoning-field-name",
        panel=options.PARSERS_PANEL,
        help="The chat message's and stream delta's field for parsed reasoning: reasoning_content "
        "(Dynamo's, the default) or reasoning (vLLM's newer name).",
        autocompletion=lambda: ["reasoning_content", "reasoning"],
    ),
    response_role: str = flag(
        "assistant",
        "--response-role",
        panel=options.PARSERS_PANEL,
        help="The role of chat answers when the request adds a generation prompt (the default); "
        "without one, the answer takes the last message's role.",
    ),
    return_tokens_as_token_ids: bool = flag(
        False,
        "--return-tokens-as-token-ids",
        panel=options.PARSERS_PANEL,
        help="In logprobs, name each token 'token_id:N' instead of its text, so tokens that are "
        "not valid text alone are still identified (vLLM's format).",
    ),
    enable_prompt_tokens_details: bool = flag(
        True,
        "--enable-prompt-tokens-details/--no-enable-prompt-tokens-details",
        panel=options.PARSERS_PANEL,
        help="Report usage.prompt_tokens_details.cached_tokens (the prompt tokens found in the "
        "worker's prefix cache), as Dynamo does; vLLM's default is off.",
    ),
    root_path: str = flag(
        "",
        "--root-path",
        panel=HTTP_PANEL,
        help="The path prefix a proxy serves this server under (/llm): requests are served "
        "with and without it, and /openapi.json lists it in servers.",
    ),
    disable_fastapi_docs: bool = flag(
        False, "--disable-fastapi-docs", panel=HTTP_PANEL, help="Do not serve /openapi.json (a 404)."
    ),
    ssl_keyfile: str = flag(
        None,
        "--ssl-keyfile",
        panel=options.SECURITY_PANEL,
        help="The server's private key (PEM): serve HTTPS.",
    ),
    ssl_certfile: str = flag(
        None,
        "--ssl-certfile",
        panel=options.SECURITY_PANEL,
        help="The server's certificate chain (PEM), with --ssl-keyfile.",
    ),
    ssl_ca_certs: str = flag(
        None,
        "--ssl-ca-certs",
        panel=options.SECURITY_PANEL,
        help="CA certificates (PEM) that client certificates must be signed by.",
    ),
    ssl_cert_reqs: int = flag(
        0,
        "--ssl-cert-reqs",
        min=0,
        max=2,
        panel=options.SECURITY_PANEL,
        help="Client certificates (the ssl module's CERT_*): 0 not asked for, 1 optional, "
        "2 required (a client without one cannot connect).",
    ),
    enable_log_requests: bool = flag(
        False,
        "--enable-log-requests/--no-enable-log-requests",
        panel=LOGGING_PANEL,
        help="Log each request as it is routed: its parameters at info, its prompt and token ids at debug.",
    ),
    disable_log_requests: bool = flag(
        False,
        "--disable-log-requests",
        panel=LOGGING_PANEL,
        help="Deprecated, as in vLLM (requests are not logged by default): turns --enable-log-requests off.",
    ),
    max_log_len: int = flag(
        None,
        "--max-log-len",
        min=0,
        panel=LOGGING_PANEL,
        help="Most prompt characters and prompt token ids a logged request shows (default: all).",
    ),
    agent_trace_file: str = flag(
        None,
        "--agent-trace-file",
        panel=LOGGING_PANEL,
        help="Write one JSON line per finished request here (a Mooncake trace row: timing, "
        "session, agent_context, worker, cached tokens, the prompt's block hashes), which dyn "
        "bench --trace and dyn bench replay --offline replay.",
    ),
    agent_trace_max_bytes: int = flag(
        64 << 20,
        "--agent-trace-max-bytes",
        min=4096,
        panel=LOGGING_PANEL,
        help="Size at which the agent trace file is renamed FILE.1 and a new one begun.",
    ),
    agent_trace_backups: int = flag(
        3,
        "--agent-trace-backups",
        min=0,
        panel=LOGGING_PANEL,
        help="Rotated agent trace files kept (FILE.1 ... FILE.N); 0: the file starts over.",
    ),
    uvicorn_log_level: str = flag(
        None,
        "--uvicorn-log-level",
        panel=LOGGING_PANEL,
        help="Level of the HTTP server's (uvicorn's) own log: critical, error, warning, info, "
        "debug or trace (default: --log-level).",
    ),
    model_path: str = options.MODEL_PATH,
    tokenizer: str = options.TOKENIZER,
    tokenizer_mode: str = flag(
        "auto",
        "--tokenizer-mode",
        panel=options.MODEL_PANEL,
        help="vLLM's flag: auto or hf, both dyn's one tokenizer (tokenizer.json with the model's Jinja "
        "chat template); vLLM's other modes (mistral, deepseek_v32, ...) are refused.",
    ),
    model_name: str | None = options.MODEL_NAME,
    served_model_name: list[str] = options.SERVED_MODEL_NAME,
    discovery: DiscoveryConfig = FROM_FLAGS,  # --namespace, --discovery-backend, --discovery-dir
    router_config=None,
) -> None:
    """OpenAI-compatible HTTP frontend (chat, completions, streaming) with nvext, routing to the
    workers it finds in discovery. It serves its own model (--model-path) and every other model a
    worker registers, each routed within its own workers."""
    from dyn.core.errors import ConfigError
    from dyn.core.frontend.cors import CorsPolicy
    from dyn.core.frontend.server import FrontendSettings, Reliability, run_frontend
    from dyn.core.frontend.tls import TlsSettings
    from dyn.core.model.names import served_names

    options.use_plane_keys(plane_keys)
    options.use_advertise_host(advertise_host)
    if tokenizer_mode not in ("auto", "hf"):
        options.fail(vllm_flags.tokenizer_mode_refusal(tokenizer_mode))
    try:
        model_name, aliases = served_names(model_name, served_model_name)
    except ValueError as exc:
        options.fail(str(exc))
    if disable_log_requests:
        log.warning("--disable-log-requests is deprecated (as in vLLM): requests are not logged by default")
    try:
        tls = TlsSettings.from_flags(ssl_keyfile, ssl_certfile, ssl_ca_certs, ssl_cert_reqs)
    except ConfigError as exc:
        options.fail(str(exc))
    try:
        media = MediaSettings(
            allowed_local_media_path=allowed_local_media_path or None,
            allowed_media_domains=tuple(
                d for given in allowed_media_domains for d in _list(given, "--allowed-media-domains")
            ),
            limit_mm_per_prompt=parse_limit_mm_per_prompt(limit_mm_per_prompt) if limit_mm_per_prompt else {},
            max_media_bytes=max_media_bytes,
            max_request_media_bytes=max_request_media_bytes,
            fetch_timeout_s=media_fetch_timeout,
            max_image_pixels=max_image_pixels,
        )
    except ConfigError as exc:
        options.fail(str(exc))
    cors = CorsPolicy(
        _list(allowed_origins, "--allowed-origins"),
        _list(allowed_methods, "--allowed-methods"),
        _list(allowed_headers, "--allowed-headers"),
        allow_credentials,
    )
    settings = FrontendSettings(
        http_host=http_host,
        http_port=http_port,
        router_mode=router_mode,
        discovery=discovery,
        model_path=model_path,
        tokenizer_path=tokenizer,
        model_name=model_name,
        aliases=aliases,
        api_key=api_key or None,
        cors=cors,
        router_config=router_config,
        router_address=router_address,
        enable_cache_control=enable_cache_control,
        session_affinity=SessionAffinity(router_session_affinity, router_session_affinity_ttl_secs),  # type: ignore[arg-type]
        parent_affinity=router_parent_affinity,
        enable_anthropic_api=enable_anthropic_api,
        responses_store_max_entries=responses_store_max_entries,
        responses_store_max_bytes=responses_store_max_bytes,
        responses_store_ttl_s=responses_store_ttl_secs,
        tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
        enable_auto_tool_choice=enable_auto_tool_choice,
        tool_parser_plugins=tuple(tool_parser_plugin or ()),
        chat_template=chat_template,
        default_chat_template_kwargs=_json_object(
            default_chat_template_kwargs, "--default-chat-template-kwargs"
        ),
        max_logprobs=max_logprobs,
        public_metrics=public_metrics,
        max_inflight=max_inflight,
        priority_convention=priority_convention,
        response_role=response_role,
        reasoning_field_name=reasoning_field_name,
        root_path=root_path,
        tls=tls,
        return_tokens_as_token_ids=return_tokens_as_token_ids,
        enable_prompt_tokens_details=enable_prompt_tokens_details,
        enable_log_requests=enable_log_requests and not disable_log_requests,
        max_log_len=max_log_len,
        agent_trace_file=agent_trace_file,
        agent_trace_max_bytes=agent_trace_max_bytes,
        agent_trace_backups=agent_trace_backups,
        disable_fastapi_docs=disable_fastapi_docs,
        uvicorn_log_level=uvicorn_log_level,
        num_http_workers=num_http_workers,
        host=host,
        advertise_host=advertise_host,
        limits=RequestLimits(
            max_n=max_n,
            max_prompts=max_prompts,
            max_prompt_bytes=max_prompt_bytes,
            max_response_bytes=max_response_bytes,
            max_stop_strings=max_stop_strings,
            max_stop_string_chars=max_stop_string_chars,
            trust_request_chat_template=trust_request_chat_template,
        ),
        media=media,
        reliability=Reliability(
            migration_limit=migration_limit,
            migration_max_seq_len=migration_max_seq_len,
            first_token_timeout_s=first_token_timeout,
            inter_token_timeout_s=inter_token_timeout,
        ),
    )
    if router_config.load_aware:
        settings.router_mode = "kv"
    if router_config.uses_aic:
        _start_prefill_table(router_config, settings.router_mode, settings.router_address)
    try:
        run_frontend(settings)
    except ConfigError as exc:
        options.fail(str(exc))


def _start_prefill_table(router_config: KvRouterConfig, router_mode: str, router_address: str | None) -> None:
    """``--router-prefill-load-model aic``: refuse it where this frontend routes with no KV router
    of its own, else start building its table now, so that it is ready before workers register."""
    from dyn.core.router.prefill_model import AicSetup, shared_durations

    model = router_config.prefill_load_model
    if router_mode != "kv":
        options.fail(
            f"--router-prefill-load-model {model} models the KV router's prompt load: it needs "
            f"--router-mode kv, not {router_mode}"
        )
    if router_address is not None:
        options.fail(
            f"with --router-address the dyn router routes: pass --router-prefill-load-model {model} "
            "and the --aic-* flags to the dyn router instead"
        )
    shared_durations(AicSetup.from_config(router_config))
