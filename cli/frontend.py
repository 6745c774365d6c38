"""``dyn frontend``: the OpenAI-compatible HTTP server with an embedded router."""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand

from dyn.cli import completion, options
from dyn.cli.config_flags import FROM_FLAGS, config_flags, discovery_flags, flag_table
from dyn.cli.router_flags import router_flags
from dyn.core.config import DiscoveryConfig
from dyn.core.frontend import vllm_flags
from dyn.core.frontend.flags import FrontendFlags
from dyn.core.frontend.limits import RequestLimits
from dyn.core.frontend.media import MediaSettings, parse_limit_mm_per_prompt
from dyn.core.frontend.session_identity import SessionAffinity

if TYPE_CHECKING:
    from dyn.core.frontend.cors import CorsPolicy
    from dyn.core.frontend.tls import TlsSettings
    from dyn.core.model.multimodal import MediaProcessing
    from dyn.core.router.config import KvRouterConfig


log = logging.getLogger("dyn.frontend")

_COMPLETIONS: dict[str, Callable[..., Any]] = {
    "router_mode": completion.router_modes,
    "reasoning_field_name": lambda: ["reasoning_content", "reasoning"],
}
"""Typer completers of the flags whose values are known names."""

_PLACED_AFTER = {
    "api_key": "http_port",
    "plane_keys": "public_metrics",
    "host": "public_metrics",
    "advertise_host": "public_metrics",
    "model_path": "uvicorn_log_level",
    "tokenizer": "uvicorn_log_level",
    "model_name": "tokenizer_mode",
    "served_model_name": "tokenizer_mode",
}
"""Where the shared options (``dyn.cli.options``) stand among the ``FrontendFlags``: after that
flag, in the command's order (the order of ``--help``, the man page and the completions)."""


def frontend_flags(command: Callable[..., None]) -> Callable[..., None]:
    """Put ``FrontendFlags``' flags where the command's ``flags`` parameter is, with the
    command's own options among them as ``_PLACED_AFTER`` says; the command receives one
    ``FrontendFlags``."""
    wrapper = config_flags("flags", FrontendFlags, flags=flag_table(FrontendFlags, _COMPLETIONS))(command)
    signature = inspect.signature(wrapper)
    params = [p for p in signature.parameters.values() if p.name not in _PLACED_AFTER]
    for name, anchor in reversed(_PLACED_AFTER.items()):
        at = next(i for i, p in enumerate(params) if p.name == anchor)
        params.insert(at + 1, signature.parameters[name])
    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return wrapper


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


@router_flags
@discovery_flags
@frontend_flags
def frontend(
    flags: FrontendFlags = FROM_FLAGS,
    api_key: str = options.API_KEY,
    plane_keys: str = options.PLANE_KEYS,
    host: str = options.HOST,
    advertise_host: str = options.ADVERTISE_HOST,
    model_path: str = options.MODEL_PATH,
    tokenizer: str = options.TOKENIZER,
    model_name: str | None = options.MODEL_NAME,
    served_model_name: list[str] = options.SERVED_MODEL_NAME,
    discovery: DiscoveryConfig = FROM_FLAGS,  # --namespace, --discovery-backend, --discovery-dir
    router_config=None,
) -> None:
    """OpenAI-compatible HTTP frontend (chat, completions, streaming) with nvext, routing to the
    workers it finds in discovery. It serves its own model (--model-path) and every other model a
    worker registers, each routed within its own workers."""
    from dyn.core.frontend.server import FrontendSettings, run_frontend
    from dyn.core.model.names import served_names

    options.use_sockets(plane_keys, advertise_host)
    if flags.tokenizer_mode not in ("auto", "hf"):
        options.fail(vllm_flags.tokenizer_mode_refusal(flags.tokenizer_mode))
    try:
        model_name, aliases = served_names(model_name, served_model_name)
    except ValueError as exc:
        options.fail(str(exc))
    if flags.disable_log_requests:
        log.warning("--disable-log-requests is deprecated (as in vLLM): requests are not logged by default")
    settings = FrontendSettings(
        **_settings(flags),
        discovery=discovery,
        router_config=router_config,
        model_path=model_path,
        tokenizer_path=tokenizer,
        model_name=model_name,
        aliases=aliases,
        api_key=api_key or None,
        host=host,
        advertise_host=advertise_host,
    )
    if router_config.load_aware:
        settings.router_mode = "kv"
    if router_config.uses_aic:
        _start_prefill_table(router_config, settings.router_mode, settings.router_address)
    options.run_service(run_frontend, settings)


def _settings(flags: FrontendFlags) -> dict[str, Any]:
    """The ``FrontendSettings`` fields ``flags`` set: those of the same name as given, the
    others made of theirs."""
    from dyn.core.frontend.server import FrontendSettings, Reliability

    tls, media, cors = _tls(flags), _media(flags), _cors(flags)
    affinity = SessionAffinity(flags.router_session_affinity, flags.router_session_affinity_ttl_secs)  # type: ignore[arg-type]
    given = {f.name: getattr(flags, f.name) for f in fields(FrontendSettings) if hasattr(flags, f.name)}
    return given | dict(
        cors=cors,
        session_affinity=affinity,
        parent_affinity=flags.router_parent_affinity,
        responses_store_ttl_s=flags.responses_store_ttl_secs,
        files_store_ttl_s=flags.files_store_ttl_secs,
        tool_parser_plugins=tuple(flags.tool_parser_plugin or ()),
        default_chat_template_kwargs=_json_object(
            flags.default_chat_template_kwargs, "--default-chat-template-kwargs"
        ),
        tls=tls,
        enable_log_requests=flags.enable_log_requests and not flags.disable_log_requests,
        limits=RequestLimits(
            max_n=flags.max_n,
            max_prompts=flags.max_prompts,
            max_prompt_bytes=flags.max_prompt_bytes,
            max_response_bytes=flags.max_response_bytes,
            max_stop_strings=flags.max_stop_strings,
            max_stop_string_chars=flags.max_stop_string_chars,
            trust_request_chat_template=flags.trust_request_chat_template,
        ),
        media=media,
        media_processing=_media_processing(flags),
        reliability=Reliability(
            migration_limit=flags.migration_limit,
            migration_max_seq_len=flags.migration_max_seq_len,
            first_token_timeout_s=flags.first_token_timeout,
            inter_token_timeout_s=flags.inter_token_timeout,
        ),
    )


def _tls(flags: FrontendFlags) -> TlsSettings | None:
    """HTTPS from the ``--ssl-*`` flags (None: HTTP); exits with the reason when they do not fit."""
    from dyn.core.errors import ConfigError
    from dyn.core.frontend.tls import TlsSettings

    try:
        return TlsSettings.from_flags(
            flags.ssl_keyfile, flags.ssl_certfile, flags.ssl_ca_certs, flags.ssl_cert_reqs
        )
    except ConfigError as exc:
        options.fail(str(exc))


def _media(flags: FrontendFlags) -> MediaSettings:
    """What media requests may bring (``--allowed-*-media-*``, ``--limit-mm-per-prompt``, ...)."""
    from dyn.core.errors import ConfigError

    try:
        return MediaSettings(
            allowed_local_media_path=flags.allowed_local_media_path or None,
            allowed_media_domains=tuple(
                d for given in flags.allowed_media_domains for d in _list(given, "--allowed-media-domains")
            ),
            limit_mm_per_prompt=parse_limit_mm_per_prompt(flags.limit_mm_per_prompt)
            if flags.limit_mm_per_prompt
            else {},
            max_media_bytes=flags.max_media_bytes,
            max_request_media_bytes=flags.max_request_media_bytes,
            fetch_timeout_s=flags.media_fetch_timeout,
            max_image_pixels=flags.max_image_pixels,
        )
    except ConfigError as exc:
        options.fail(str(exc))


def _media_processing(flags: FrontendFlags) -> MediaProcessing:
    """How the engine processes media (``--mm-processor-kwargs``, ``--media-io-kwargs``)."""
    from dyn.core.errors import ConfigError
    from dyn.core.model.multimodal import MediaProcessing

    try:
        return MediaProcessing.parse(flags.mm_processor_kwargs, flags.media_io_kwargs)
    except ConfigError as exc:
        options.fail(str(exc))


def _cors(flags: FrontendFlags) -> CorsPolicy:
    """The CORS policy of the ``--allow*`` flags."""
    from dyn.core.frontend.cors import CorsPolicy

    return CorsPolicy(
        _list(flags.allowed_origins, "--allowed-origins"),
        _list(flags.allowed_methods, "--allowed-methods"),
        _list(flags.allowed_headers, "--allowed-headers"),
        flags.allow_credentials,
    )


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


def register(app: typer.Typer) -> None:
    """Add this command to ``app`` (``dyn.cli.app``'s loaders)."""
    app.command("frontend", cls=FrontendCommand)(frontend)
