"""``dyn frontend``'s own flags, declared once (``dyn.core.config``): ``FrontendFlags``.

Each field is one flag of ``dyn frontend``, named after it, with its default, range, help text and
``--help`` panel; ``dyn.cli.frontend`` offers them (``dyn.cli.config_flags.flag_table``: the Typer
options, their ``DYN_*`` twins, the ``--config`` keys, the man page and the completions) and builds
the ``FrontendSettings`` from the values. The flags several commands share (``--host``,
``--api-key``, ``--model-path``, ...) stay in ``dyn.cli.options``; the discovery and router flags
are ``DiscoveryConfig``'s and ``KvRouterConfig``'s.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from dyn.core.config import MODEL_PANEL, PARSERS_PANEL, SECURITY_PANEL, flag
from dyn.core.frontend.chat_template import ContentFormat
from dyn.core.frontend.limits import RequestLimits
from dyn.core.frontend.media import DEFAULT_LIMIT_PER_PROMPT, MediaSettings
from dyn.core.router.modes import modes_help

HTTP_PANEL = "HTTP"
ROUTER_PANEL = "Router"
LIMITS_PANEL = "Limits"
RELIABILITY_PANEL = "Reliability"
LOGGING_PANEL = "Logging"
MEDIA_PANEL = "Media"
_LIMITS = RequestLimits()
_MEDIA = MediaSettings()


def _parser_names(kind: str) -> str:
    """The registered parser names, for the help text."""
    if kind == "tool":
        from dyn.core.parsers.tool import TOOL_PARSERS

        return ", ".join(TOOL_PARSERS.names())
    from dyn.core.parsers.reasoning import REASONING_PARSERS

    return ", ".join(REASONING_PARSERS.names())


class FrontendFlags(msgspec.Struct, kw_only=True, frozen=True):
    """The values of ``dyn frontend``'s own flags, as given (``dyn.cli.frontend`` turns them into
    a ``FrontendSettings``)."""

    http_host: Annotated[
        str,
        flag("--http-host", panel=HTTP_PANEL, help="Address the HTTP server listens on."),
    ] = "127.0.0.1"
    http_port: Annotated[
        Annotated[int, Meta(ge=0, le=65535)],
        flag(
            "--http-port",
            "--port",
            panel=HTTP_PANEL,
            help="Port the HTTP server listens on (0: a free port, printed at start).",
        ),
    ] = 8000
    public_metrics: Annotated[
        bool,
        flag(
            "--public-metrics",
            panel=SECURITY_PANEL,
            help="Serve /metrics without the API key (for Prometheus scrapers).",
        ),
    ] = False
    num_http_workers: Annotated[
        Annotated[int, Meta(ge=1, le=64)],
        flag(
            "--num-http-workers",
            panel=HTTP_PANEL,
            help="Processes serving HTTP on the one port (SO_REUSEPORT), each a whole frontend; with "
            "--router-mode kv their routers share bookings (replica sync). /metrics is per process.",
        ),
    ] = 1
    max_inflight: Annotated[
        Annotated[int, Meta(ge=0)],
        flag(
            "--max-inflight",
            panel=LIMITS_PANEL,
            help="Most requests served at once; beyond it a request is answered 503 "
            "with Retry-After (0: no limit).",
        ),
    ] = 0
    max_n: Annotated[
        Annotated[int, Meta(ge=1)],
        flag("--max-n", panel=LIMITS_PANEL, help="Most choices (n) one request may ask for."),
    ] = _LIMITS.max_n
    max_prompts: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--max-prompts",
            panel=LIMITS_PANEL,
            help="Most engine requests one request may fan out to: its prompts (a batched "
            "completions request) times n.",
        ),
    ] = _LIMITS.max_prompts
    max_prompt_bytes: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        flag(
            "--max-prompt-bytes",
            panel=LIMITS_PANEL,
            help="Most bytes of prompt text (all messages) one request may send; checked "
            "before tokenizing (default: 32 bytes per token of the context length, "
            "at least 1 MiB).",
        ),
    ] = None
    max_response_bytes: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--max-response-bytes",
            panel=LIMITS_PANEL,
            help="Largest non-streaming response one request may ask for: n x max_tokens, with "
            "its logprobs, is checked before generating (a streamed response is not bounded).",
        ),
    ] = _LIMITS.max_response_bytes
    max_stop_strings: Annotated[
        Annotated[int, Meta(ge=0)],
        flag("--max-stop-strings", panel=LIMITS_PANEL, help="Most stop strings one request may send."),
    ] = _LIMITS.max_stop_strings
    max_stop_string_chars: Annotated[
        Annotated[int, Meta(ge=1)],
        flag("--max-stop-string-chars", panel=LIMITS_PANEL, help="Longest stop string a request may send."),
    ] = _LIMITS.max_stop_string_chars
    trust_request_chat_template: Annotated[
        bool,
        flag(
            "--trust-request-chat-template",
            panel=LIMITS_PANEL,
            help="Accept a chat_template in the request (vLLM's flag); it is "
            "then rendered with size and time limits.",
        ),
    ] = False
    allowed_local_media_path: Annotated[
        str | None,
        flag(
            "--allowed-local-media-path",
            panel=MEDIA_PANEL,
            help="Let requests name images, audio and video by file path or file:// URL under this "
            "directory (vLLM's flag; symlinks and .. may not leave it). Only for trusted clients: "
            "without it, files are refused.",
        ),
    ] = None
    allowed_media_domains: Annotated[
        list[str],
        flag(
            "--allowed-media-domains",
            panel=MEDIA_PANEL,
            help="Fetch http(s) media URLs only from these hosts, at every redirect too (vLLM's flag: "
            "--allowed-media-domains a.com b.com; comma-separated or repeated works too). Default: any host.",
        ),
    ] = []
    limit_mm_per_prompt: Annotated[
        str | None,
        flag(
            "--limit-mm-per-prompt",
            panel=MEDIA_PANEL,
            help="Most items of each modality one request may hold, a JSON object as vLLM takes it "
            '(\'{"image": 4, "video": 0}\', or --limit-mm-per-prompt.image 4); a modality not named: '
            f"{DEFAULT_LIMIT_PER_PROMPT}, vLLM's default. Checked before anything is loaded.",
        ),
    ] = None
    mm_processor_kwargs: Annotated[
        str | None,
        flag(
            "--mm-processor-kwargs",
            panel=MEDIA_PANEL,
            help="The model's image and video processor settings the engine was started with, a JSON "
            "object as vLLM takes it ('{\"max_pixels\": 1003520}'): placeholders are counted with "
            "them. dyn serve hands the flag to its vLLM workers too.",
        ),
    ] = None
    media_io_kwargs: Annotated[
        str | None,
        flag(
            "--media-io-kwargs",
            panel=MEDIA_PANEL,
            help="How the engine loads media, a JSON object by modality as vLLM takes it "
            '(\'{"video": {"fps": 1}}\': the frames its video loader samples): placeholders are '
            "counted with it. dyn serve hands the flag to its vLLM workers too.",
        ),
    ] = None
    max_media_bytes: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--max-media-bytes",
            panel=MEDIA_PANEL,
            help="Largest image, audio clip or video (encoded bytes) a request may send or link to.",
        ),
    ] = _MEDIA.max_media_bytes
    max_request_media_bytes: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--max-request-media-bytes",
            panel=MEDIA_PANEL,
            help="Most encoded bytes of all the media of one request together.",
        ),
    ] = _MEDIA.max_request_media_bytes
    media_fetch_timeout: Annotated[
        Annotated[float, Meta(ge=0.001)] | None,
        flag(
            "--media-fetch-timeout",
            panel=MEDIA_PANEL,
            help="Seconds one http(s) media fetch may take, redirects and body included (default: "
            "vLLM's, 5 for an image, 10 for audio, 30 for a video).",
        ),
    ] = None
    max_image_pixels: Annotated[
        Annotated[int, Meta(ge=1, le=_MEDIA.max_image_pixels)],
        flag(
            "--max-image-pixels",
            panel=MEDIA_PANEL,
            help="Most pixels (width x height) of an image, checked before it is decoded (vLLM's "
            "VLLM_MAX_IMAGE_PIXELS; larger ones Pillow refuses).",
        ),
    ] = _MEDIA.max_image_pixels
    migration_limit: Annotated[
        Annotated[int, Meta(ge=0)],
        flag(
            "--migration-limit",
            panel=RELIABILITY_PANEL,
            help="How many times a request whose worker dies or goes silent mid-stream "
            "continues on another worker (prompt plus the tokens already "
            "generated); 0 fails it instead, as Dynamo's default.",
        ),
    ] = 0
    migration_max_seq_len: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        flag(
            "--migration-max-seq-len",
            panel=RELIABILITY_PANEL,
            help="Stop tracking a choice for migration once its prompt plus output "
            "tokens pass this many (bounds the memory migration keeps; "
            "default: no bound), as Dynamo's flag.",
        ),
    ] = None
    first_token_timeout: Annotated[
        Annotated[float, Meta(ge=0.0)],
        flag(
            "--first-token-timeout",
            panel=RELIABILITY_PANEL,
            help="Seconds a worker may take to send a request's first token before "
            "it is treated as dead for that request (migrated or failed; "
            "0: wait forever).",
        ),
    ] = 300.0
    inter_token_timeout: Annotated[
        Annotated[float, Meta(ge=0.0)],
        flag(
            "--inter-token-timeout",
            panel=RELIABILITY_PANEL,
            help="Seconds a worker may go silent between a request's tokens before "
            "it is treated as dead for that request (0: wait forever).",
        ),
    ] = 60.0
    allowed_origins: Annotated[
        str,
        flag(
            "--allowed-origins",
            panel=HTTP_PANEL,
            help="CORS allowed origins, a JSON list or comma-separated.",
        ),
    ] = '["*"]'
    allowed_methods: Annotated[
        str,
        flag(
            "--allowed-methods",
            panel=HTTP_PANEL,
            help="CORS allowed methods, a JSON list or comma-separated.",
        ),
    ] = '["*"]'
    allowed_headers: Annotated[
        str,
        flag(
            "--allowed-headers",
            panel=HTTP_PANEL,
            help="CORS allowed headers, a JSON list or comma-separated.",
        ),
    ] = '["*"]'
    allow_credentials: Annotated[
        bool,
        flag("--allow-credentials", panel=HTTP_PANEL, help="CORS: allow credentials."),
    ] = False
    router_mode: Annotated[
        str,
        flag("--router-mode", panel=ROUTER_PANEL, help=modes_help()),
    ] = "round-robin"
    priority_convention: Annotated[
        str,
        flag(
            "--priority-convention",
            panel=ROUTER_PANEL,
            help="How nvext.agent_hints.priority is read. dyn: larger is more important "
            "(the router queue and every engine agree; Dynamo >= 1.1 does the same). dynamo: "
            "the value goes to the engine as sent and the router queue ignores it, as Dynamo "
            "1.0 did (with vLLM a smaller value is served first).",
        ),
    ] = "dyn"
    router_address: Annotated[
        str | None,
        flag(
            "--router-address",
            panel=ROUTER_PANEL,
            help="With --router-mode kv: ask the dyn router at this ZMQ address "
            "instead of routing in this process.",
        ),
    ] = None
    router_session_affinity: Annotated[
        str,
        flag(
            "--router-session-affinity",
            panel=ROUTER_PANEL,
            help="What the session id an agent sends (x-dynamo-session-id, X-Claude-Code-Session-Id, "
            "Codex's session-id, OpenCode's x-session-id, a Responses prompt_cache_key) does. soft: the session is bound to the worker "
            "of its first turn and later turns go there unless that worker is overloaded; hard: always "
            "there; off: ignored.",
        ),
    ] = "soft"
    router_session_affinity_ttl_secs: Annotated[
        Annotated[int, Meta(ge=1, le=31_536_000)],
        flag(
            "--router-session-affinity-ttl-secs",
            panel=ROUTER_PANEL,
            help="How long a session stays bound after its last turn (1 to 31536000).",
        ),
    ] = 300
    router_parent_affinity: Annotated[
        bool,
        flag(
            "--router-parent-affinity/--no-router-parent-affinity",
            panel=ROUTER_PANEL,
            help="A subagent's first request (its parent named by nvext.agent_context.parent_program_id "
            "or a parent header: x-dynamo-parent-session-id, x-claude-code-parent-agent-id, "
            "x-codex-parent-thread-id) goes to the worker of its parent's last request, where their "
            "shared context is cached, unless that worker is overloaded.",
        ),
    ] = True
    enable_anthropic_api: Annotated[
        bool,
        flag(
            "--enable-anthropic-api/--no-enable-anthropic-api",
            panel=HTTP_PANEL,
            help="Serve Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) for "
            "Claude Code and the anthropic SDK.",
        ),
    ] = True
    responses_store_max_entries: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--responses-store-max-entries",
            panel=LIMITS_PANEL,
            help="Most Responses API responses kept for previous_response_id and GET /v1/responses/{id} "
            "(least recently used dropped first).",
        ),
    ] = 1000
    responses_store_max_bytes: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--responses-store-max-bytes",
            panel=LIMITS_PANEL,
            help="Most bytes of stored Responses API responses.",
        ),
    ] = 64 << 20
    responses_store_ttl_secs: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--responses-store-ttl-secs",
            panel=LIMITS_PANEL,
            help="How long a stored Responses API response is kept.",
        ),
    ] = 3600
    files_store_max_entries: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--files-store-max-entries",
            panel=LIMITS_PANEL,
            help="Most files kept from uploads to /v1/files, read by file_id (least recently used "
            "dropped first).",
        ),
    ] = 1000
    files_store_max_bytes: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--files-store-max-bytes",
            panel=LIMITS_PANEL,
            help="Most bytes of uploaded files kept; a larger upload is a 413.",
        ),
    ] = 64 << 20
    files_store_ttl_secs: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--files-store-ttl-secs",
            panel=LIMITS_PANEL,
            help="How long an uploaded file is kept.",
        ),
    ] = 3600
    enable_cache_control: Annotated[
        bool,
        flag(
            "--enable-cache-control",
            panel=ROUTER_PANEL,
            help="Honour nvext.cache_control: after generation, ask the "
            "worker to pin the prompt's KV for the TTL (needs "
            "--router-mode kv).",
        ),
    ] = False
    enable_auto_tool_choice: Annotated[
        bool,
        flag(
            "--enable-auto-tool-choice",
            panel=PARSERS_PANEL,
            help="Accept tool_choice auto (the default when a request has "
            "tools): calls are parsed with --tool-call-parser. Workers "
            "started with --dyn-tool-call-parser turn it on by themselves.",
        ),
    ] = False
    tool_call_parser: Annotated[
        str | None,
        flag(
            "--tool-call-parser",
            panel=PARSERS_PANEL,
            help="How the model writes tool calls; overrides what workers advertise. "
            f"One of: {_parser_names('tool')}.",
        ),
    ] = None
    reasoning_parser: Annotated[
        str | None,
        flag(
            "--reasoning-parser",
            panel=PARSERS_PANEL,
            help="How the model writes reasoning (returned as reasoning_content); "
            f"overrides what workers advertise. One of: {_parser_names('reasoning')}.",
        ),
    ] = None
    tool_parser_plugin: Annotated[
        list[str] | None,
        flag(
            "--tool-parser-plugin",
            panel=PARSERS_PANEL,
            help="A Python file whose parsers register themselves "
            "(@TOOL_PARSERS.register(NAME) on a ToolParser subclass), or a vLLM tool-parser plugin "
            "(@ToolParserManager.register_module) when vLLM is installed; repeatable.",
        ),
    ] = None
    chat_template: Annotated[
        str | None,
        flag(
            "--chat-template",
            panel=PARSERS_PANEL,
            help="A Jinja chat template file (or the template text) replacing the model's.",
        ),
    ] = None
    enable_force_include_usage: Annotated[
        bool,
        flag(
            "--enable-force-include-usage",
            panel=PARSERS_PANEL,
            help="Every stream carries usage, in each chunk and in a last chunk, as if its "
            "stream_options set include_usage and continuous_usage_stats (vLLM's flag).",
        ),
    ] = False
    exclude_tools_when_tool_choice_none: Annotated[
        bool,
        flag(
            "--exclude-tools-when-tool-choice-none",
            panel=PARSERS_PANEL,
            help="A request with tool_choice none renders no tools into the prompt (vLLM's flag); "
            "by default they are rendered, as in vLLM.",
        ),
    ] = False
    chat_template_content_format: Annotated[
        ContentFormat,
        flag(
            "--chat-template-content-format",
            panel=PARSERS_PANEL,
            help="How message content reaches the chat template (vLLM's flag): 'string' (text "
            "parts joined), 'openai' (a list of parts, text ones as {type, text}), or 'auto' "
            "(openai when the template loops over a message's content).",
        ),
    ] = "auto"
    default_chat_template_kwargs: Annotated[
        str | None,
        flag(
            "--default-chat-template-kwargs",
            panel=PARSERS_PANEL,
            help="Chat template arguments, a JSON object ('{\"enable_thinking\": false}'), that every "
            "request gets unless its chat_template_kwargs set them (vLLM's flag).",
        ),
    ] = None
    max_logprobs: Annotated[
        Annotated[int, Meta(ge=0)],
        flag(
            "--max-logprobs",
            panel=PARSERS_PANEL,
            help="Most top logprobs a request may ask for (top_logprobs, logprobs, prompt_logprobs).",
        ),
    ] = 20
    reasoning_field_name: Annotated[
        str,
        flag(
            "--reasoning-field-name",
            panel=PARSERS_PANEL,
            help="The chat message's and stream delta's field for parsed reasoning: reasoning_content "
            "(Dynamo's, the default) or reasoning (vLLM's newer name).",
        ),
    ] = "reasoning_content"
    response_role: Annotated[
        str,
        flag(
            "--response-role",
            panel=PARSERS_PANEL,
            help="The role of chat answers when the request adds a generation prompt (the default); "
            "without one, the answer takes the last message's role.",
        ),
    ] = "assistant"
    return_tokens_as_token_ids: Annotated[
        bool,
        flag(
            "--return-tokens-as-token-ids",
            panel=PARSERS_PANEL,
            help="In logprobs, name each token 'token_id:N' instead of its text, so tokens that are "
            "not valid text alone are still identified (vLLM's format).",
        ),
    ] = False
    enable_prompt_tokens_details: Annotated[
        bool,
        flag(
            "--enable-prompt-tokens-details/--no-enable-prompt-tokens-details",
            panel=PARSERS_PANEL,
            help="Report usage.prompt_tokens_details.cached_tokens (the prompt tokens found in the "
            "worker's prefix cache), as Dynamo does; vLLM's default is off.",
        ),
    ] = True
    root_path: Annotated[
        str,
        flag(
            "--root-path",
            panel=HTTP_PANEL,
            help="The path prefix a proxy serves this server under (/llm): requests are served "
            "with and without it, and /openapi.json lists it in servers.",
        ),
    ] = ""
    disable_fastapi_docs: Annotated[
        bool,
        flag("--disable-fastapi-docs", panel=HTTP_PANEL, help="Do not serve /openapi.json (a 404)."),
    ] = False
    enable_tokenizer_info_endpoint: Annotated[
        bool,
        flag(
            "--enable-tokenizer-info-endpoint",
            panel=HTTP_PANEL,
            help="Serve GET /tokenizer_info, the served model's tokenizer configuration (vLLM's "
            "flag); off, a 404.",
        ),
    ] = False
    sse_keep_alive_interval: Annotated[
        Annotated[int, Meta(ge=0)],
        flag(
            "--sse-keep-alive-interval",
            panel=HTTP_PANEL,
            help="Send an SSE comment (': keep-alive') when a stream has been quiet this many "
            "seconds (queued, in prefill, between tokens), so proxies with read timeouts keep it "
            "open (vLLM's flag); 0: never.",
        ),
    ] = 0
    ssl_keyfile: Annotated[
        str | None,
        flag("--ssl-keyfile", panel=SECURITY_PANEL, help="The server's private key (PEM): serve HTTPS."),
    ] = None
    ssl_certfile: Annotated[
        str | None,
        flag(
            "--ssl-certfile",
            panel=SECURITY_PANEL,
            help="The server's certificate chain (PEM), with --ssl-keyfile.",
        ),
    ] = None
    ssl_ca_certs: Annotated[
        str | None,
        flag(
            "--ssl-ca-certs",
            panel=SECURITY_PANEL,
            help="CA certificates (PEM) that client certificates must be signed by.",
        ),
    ] = None
    ssl_cert_reqs: Annotated[
        Annotated[int, Meta(ge=0, le=2)],
        flag(
            "--ssl-cert-reqs",
            panel=SECURITY_PANEL,
            help="Client certificates (the ssl module's CERT_*): 0 not asked for, 1 optional, "
            "2 required (a client without one cannot connect).",
        ),
    ] = 0
    enable_log_requests: Annotated[
        bool,
        flag(
            "--enable-log-requests/--no-enable-log-requests",
            panel=LOGGING_PANEL,
            help="Log each request as it is routed: its parameters at info, its prompt and token ids at debug.",
        ),
    ] = False
    disable_log_requests: Annotated[
        bool,
        flag(
            "--disable-log-requests",
            panel=LOGGING_PANEL,
            help="Deprecated, as in vLLM (requests are not logged by default): turns --enable-log-requests off.",
        ),
    ] = False
    max_log_len: Annotated[
        Annotated[int, Meta(ge=0)] | None,
        flag(
            "--max-log-len",
            panel=LOGGING_PANEL,
            help="Most prompt characters and prompt token ids a logged request shows (default: all).",
        ),
    ] = None
    agent_trace_file: Annotated[
        str | None,
        flag(
            "--agent-trace-file",
            panel=LOGGING_PANEL,
            help="Write one JSON line per finished request here (a Mooncake trace row: timing, "
            "session, agent_context, worker, cached tokens, the prompt's block hashes), which dyn "
            "bench --trace and dyn bench replay --offline replay.",
        ),
    ] = None
    agent_trace_max_bytes: Annotated[
        Annotated[int, Meta(ge=4096)],
        flag(
            "--agent-trace-max-bytes",
            panel=LOGGING_PANEL,
            help="Size at which the agent trace file is renamed FILE.1 and a new one begun.",
        ),
    ] = 64 << 20
    agent_trace_backups: Annotated[
        Annotated[int, Meta(ge=0)],
        flag(
            "--agent-trace-backups",
            panel=LOGGING_PANEL,
            help="Rotated agent trace files kept (FILE.1 ... FILE.N); 0: the file starts over.",
        ),
    ] = 3
    uvicorn_log_level: Annotated[
        str | None,
        flag(
            "--uvicorn-log-level",
            panel=LOGGING_PANEL,
            help="Level of the HTTP server's (uvicorn's) own log: critical, error, warning, info, "
            "debug or trace (default: --log-level).",
        ),
    ] = None
    tokenizer_mode: Annotated[
        str,
        flag(
            "--tokenizer-mode",
            panel=MODEL_PANEL,
            help="vLLM's flag: auto or hf, both dyn's one tokenizer (tokenizer.json with the model's Jinja "
            "chat template); vLLM's other modes (mistral, deepseek_v32, ...) are refused.",
        ),
    ] = "auto"
