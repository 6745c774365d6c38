"""``dyn frontend``: the OpenAI-compatible HTTP server with an embedded router."""

from __future__ import annotations

import json

import typer

from dyn.cli import options
from dyn.cli.options import flag
from dyn.cli.router_flags import router_flags

HTTP_PANEL = "HTTP"
ROUTER_PANEL = "Router"


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
        from dyn.core.parsers.tool import TOOL_PARSERS as registry
    else:
        from dyn.core.parsers.reasoning import REASONING_PARSERS as registry
    return ", ".join(registry.names())


@router_flags
def frontend(
    http_host: str = flag("127.0.0.1", "--http-host", panel=HTTP_PANEL, help="Address the HTTP server listens on."),
    http_port: int = flag(8000, "--http-port", min=0, max=65535, panel=HTTP_PANEL,
                          help="Port the HTTP server listens on (0: a free port, printed at start)."),
    api_key: str = flag(None, "--api-key", panel=HTTP_PANEL,
                        help="Require 'Authorization: Bearer KEY' on /v1 endpoints."),
    allowed_origins: str = flag('["*"]', "--allowed-origins", panel=HTTP_PANEL,
                                help="CORS allowed origins, a JSON list or comma-separated."),
    allowed_methods: str = flag('["*"]', "--allowed-methods", panel=HTTP_PANEL,
                                help="CORS allowed methods, a JSON list or comma-separated."),
    allowed_headers: str = flag('["*"]', "--allowed-headers", panel=HTTP_PANEL,
                                help="CORS allowed headers, a JSON list or comma-separated."),
    allow_credentials: bool = flag(False, "--allow-credentials", panel=HTTP_PANEL,
                                   help="CORS: allow credentials."),
    router_mode: str = flag("round-robin", "--router-mode", panel=ROUTER_PANEL,
                            help="How to pick a worker: kv (KV-cache and load aware), round-robin, "
                                 "random, or direct (the request names its worker with "
                                 "nvext.backend_instance_id or the x-worker-instance-id header)."),
    router_address: str = flag(None, "--router-address", panel=ROUTER_PANEL,
                               help="With --router-mode kv: ask the dyn router at this ZMQ address "
                                    "instead of routing in this process."),
    enable_cache_control: bool = flag(False, "--enable-cache-control", panel=ROUTER_PANEL,
                                      help="Honour nvext.cache_control: after generation, ask the "
                                           "worker to pin the prompt's KV for the TTL (needs "
                                           "--router-mode kv)."),
    enable_auto_tool_choice: bool = flag(False, "--enable-auto-tool-choice", panel=options.PARSERS_PANEL,
                                         help="Accept tool_choice auto (the default when a request has "
                                              "tools): calls are parsed with --tool-call-parser. Workers "
                                              "started with --dyn-tool-call-parser turn it on by themselves."),
    tool_call_parser: str = flag(None, "--tool-call-parser", panel=options.PARSERS_PANEL,
                                 help="How the model writes tool calls; overrides what workers advertise. "
                                      f"One of: {_parser_names('tool')}."),
    reasoning_parser: str = flag(None, "--reasoning-parser", panel=options.PARSERS_PANEL,
                                 help="How the model writes reasoning (returned as reasoning_content); "
                                      f"overrides what workers advertise. One of: {_parser_names('reasoning')}."),
    tool_parser_plugin: list[str] = flag(None, "--tool-parser-plugin", panel=options.PARSERS_PANEL,
                                         help="A Python file whose parsers register themselves "
                                              "(@TOOL_PARSERS.register(NAME) on a ToolParser subclass); "
                                              "repeatable."),
    chat_template: str = flag(None, "--chat-template", panel=options.PARSERS_PANEL,
                              help="A Jinja chat template file (or the template text) replacing the model's."),
    max_logprobs: int = flag(20, "--max-logprobs", min=0, panel=options.PARSERS_PANEL,
                             help="Most top logprobs a request may ask for (top_logprobs, logprobs, "
                                  "prompt_logprobs)."),
    model_path: str = options.MODEL_PATH,
    model_name: str = options.MODEL_NAME,
    namespace: str = options.NAMESPACE,
    discovery_backend: str = options.DISCOVERY_BACKEND,
    discovery_dir: str = options.DISCOVERY_DIR,
    router_config=None,
) -> None:
    """OpenAI-compatible HTTP frontend (chat, completions, streaming) with nvext, routing to the
    workers it finds in discovery."""
    from dyn.core.errors import ConfigError
    from dyn.core.frontend.cors import CorsPolicy
    from dyn.core.frontend.server import FrontendSettings, run_frontend

    cors = CorsPolicy(_list(allowed_origins, "--allowed-origins"), _list(allowed_methods, "--allowed-methods"),
                      _list(allowed_headers, "--allowed-headers"), allow_credentials)
    settings = FrontendSettings(
        http_host=http_host, http_port=http_port, router_mode=router_mode, namespace=namespace,
        discovery_backend=discovery_backend, discovery_dir=discovery_dir, model_path=model_path,
        model_name=model_name, api_key=api_key or None, cors=cors, router_config=router_config,
        router_address=router_address, enable_cache_control=enable_cache_control,
        tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser,
        enable_auto_tool_choice=enable_auto_tool_choice,
        tool_parser_plugins=tuple(tool_parser_plugin or ()), chat_template=chat_template,
        max_logprobs=max_logprobs)
    if router_config.load_aware:
        settings.router_mode = "kv"
    try:
        run_frontend(settings)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
