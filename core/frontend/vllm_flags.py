"""``vllm serve``'s API-server flags that ``dyn frontend`` does not take, each with why and what to
use instead: what a vLLM user is told when one is given to ``dyn frontend`` or ``dyn serve``.

vLLM's engine flags are not listed: ``dyn worker vllm`` hands every flag it does not declare to
vLLM's own parser. ``docs/vllm-serve-flags.md`` lists every ``vllm serve`` flag with its fate here
(``scripts/gen_vllm_flag_table.py`` writes it from the installed vLLM and this table).
"""

from __future__ import annotations

REFUSED: dict[str, str] = {
    "--trust-request-mm-kwargs": "dyn takes no per-request multimodal options (mm_processor_kwargs, "
    "media_io_kwargs): media are processed with the model's defaults",
    "--tool-strict-level": "not built yet",
    "--tool-server": "dyn runs no built-in tools (MCP or demo tool servers); agents run their own tools",
    "--enable-per-request-metrics": "per-request timing is nvext.extra_fields ['timing'] in dyn",
    "--enable-server-load-tracking": "dyn's /metrics always carries the frontend's in-flight "
    "requests (dynamo_frontend_active_requests)",
    "--enable-log-outputs": "not built yet; --enable-log-requests logs each request",
    "--enable-log-deltas": "not built yet; --enable-log-requests logs each request",
    "--cohere-is-reasoning-model": "dyn serves no Cohere-specific API",
    "--cohere-format": "dyn serves no Cohere-specific API",
    "--anthropic-disabled-thinking-effort": "dyn's /v1/messages maps thinking on and off to the "
    "model's own switch, with no effort level",
    "--log-error-stack": "dyn logs every server error with its traceback",
    "--tokens-only": "dyn's frontend always tokenizes and renders; send token ids as the prompt instead",
    "--enable-scale-out": "run more dyn workers or frontends instead (discovery finds them)",
    "--fingerprint-mode": "not built yet: dyn's responses carry no system_fingerprint",
    "--fingerprint-value": "not built yet: dyn's responses carry no system_fingerprint",
    "--headless": "dyn worker vllm always runs vLLM without its HTTP server; dyn frontend serves HTTP",
    "--api-server-count": "use dyn frontend's --num-http-workers",
    "--grpc": "dyn serves HTTP only",
    "--grpc-port": "dyn serves HTTP only",
    "--data-parallel-supervisor-port": "dyn runs one engine rank per worker; dyn serve supervises them",
    "--dp-supervisor-probe-interval-s": "dyn runs one engine rank per worker; dyn serve supervises them",
    "--dp-supervisor-probe-timeout-s": "dyn runs one engine rank per worker; dyn serve supervises them",
    "--dp-supervisor-probe-failure-threshold": "dyn runs one engine rank per worker; dyn serve "
    "supervises them",
    "--uds": "dyn listens on TCP only (--http-host, --http-port)",
    "--disable-uvicorn-access-log": "dyn writes no access log (--uvicorn-log-level sets uvicorn's level)",
    "--disable-access-log-for-endpoints": "dyn writes no access log",
    "--enable-ssl-refresh": "not built yet: restart the frontend to load new certificates",
    "--ssl-ciphers": "not built yet: the ciphers are Python's defaults",
    "--middleware": "dyn's HTTP server is its own ASGI app and loads no user middleware; put a "
    "proxy in front of it",
    "--enable-request-id-headers": "dyn always answers with the x-request-id header",
    "--h11-max-incomplete-event-size": "dyn's HTTP server bounds requests itself (--max-prompt-bytes)",
    "--h11-max-header-count": "dyn's HTTP server bounds requests itself",
    "--enable-offline-docs": "dyn serves its OpenAPI schema at /openapi.json and no docs pages",
    "--enable-flash-late-interaction": (
        "dyn scores late interaction (MaxSim) in the frontend over the rows a worker pools; "
        "vLLM's fused in-engine scoring is not built"
    ),
}
"""``vllm serve`` API-server flag -> why ``dyn frontend`` does not take it (one line)."""


FRONTEND_REFUSED: dict[str, str] = {
    "--trust-remote-code": "the frontend runs no model code: it reads tokenizer.json and the Jinja "
    "chat template with the tokenizers library (dyn worker vllm hands the flag to vLLM; dyn serve "
    "passes it to its vLLM workers)",
}
"""vLLM flags that only its engine needs: ``dyn frontend`` refuses them with why, ``dyn serve``
hands them to its workers' engine."""


def refusal(flag: str, command: str, *, frontend: bool = False) -> str | None:
    """The error for vLLM's ``flag`` (``--x``, ``--no-x`` or ``--x=value``) given to ``command``,
    or None when it is not one of them; ``frontend``: ``command`` is the frontend alone, which
    also refuses ``FRONTEND_REFUSED``."""
    name = flag.split("=", 1)[0]
    table = {**REFUSED, **FRONTEND_REFUSED} if frontend else REFUSED
    why = table.get(name) or table.get(name.replace("--no-", "--", 1))
    return f"vLLM's {name} is not taken by {command}: {why}" if why is not None else None


def tokenizer_mode_refusal(mode: str) -> str:
    """Why ``--tokenizer-mode mode`` (anything but auto or hf) is refused."""
    return (
        f"--tokenizer-mode {mode!r} is not served: dyn's frontend tokenizes with tokenizer.json and "
        "renders the model's Jinja chat template (vLLM's 'auto' and 'hf' do the same); vLLM's own "
        "encoders for other modes (mistral_common, DeepSeek's, Kimi's, Cohere's) are not built"
    )
