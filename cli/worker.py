"""``dyn worker <engine>``: run engine workers that register in discovery and serve requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from dyn.cli import options
from dyn.cli.mocker_flags import mocker_flags
from dyn.cli.options import flag
from dyn.cli.sglang_flags import sglang_flags
from dyn.cli.vllm_flags import vllm_flags

if TYPE_CHECKING:
    from dyn.core.worker.settings import WorkerSettings
    from dyn.plugins.mocker.config import MockerConfig
    from dyn.plugins.sglang.config import SglangConfig
    from dyn.plugins.vllm.config import VllmConfig

PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}

app = typer.Typer(
    help="Run engine workers: each registers in discovery, serves the request plane and "
         "publishes KV events and load metrics.",
    no_args_is_help=True,
)


@app.command("mocker")
@mocker_flags
def mocker(
    model_path: str = options.MODEL_PATH,
    model_name: str = options.MODEL_NAME,
    mocker_config: MockerConfig = None,  # the engine flags, see dyn.cli.mocker_flags
    num_workers: int = flag(1, "--num-workers", min=1, help="Simulated workers hosted by this process, each with "
                                                        "its own instance id, sockets and cache.",
                       panel=options.WORKER_PANEL),
    dyn_tool_call_parser: str = options.DYN_TOOL_CALL_PARSER,
    dyn_reasoning_parser: str = options.DYN_REASONING_PARSER,
    namespace: str = options.NAMESPACE,
    discovery_backend: str = options.DISCOVERY_BACKEND,
    discovery_dir: str = options.DISCOVERY_DIR,
    host: str = options.HOST,
    drain_timeout: float = options.DRAIN_TIMEOUT,
    plane_keys: str = options.PLANE_KEYS,
) -> None:
    """Simulated engine (the default): paged KV cache with prefix caching, continuous batching,
    chunked prefill, preemption, Dynamo's timing model, real KV events; vLLM or SGLang flavour with
    priority scheduling, priority eviction, streaming sessions, prefix pinning and thinking
    sections. Needs no GPU."""
    settings = _settings(namespace, discovery_backend, discovery_dir, host, dyn_tool_call_parser,
                         dyn_reasoning_parser, model_path, drain_timeout, plane_keys)
    _serve("mocker", mocker_config, settings, model_path=model_path, model_name=model_name,
           num_workers=num_workers)


@app.command("vllm", context_settings=PASS_THROUGH)
@vllm_flags
def vllm(
    ctx: typer.Context,
    model_path: str = flag(..., "--model-path", "--model", panel=options.MODEL_PANEL,
                           help="Model directory (or Hugging Face id vLLM can load) to serve."),
    model_name: str = options.MODEL_NAME,
    vllm_config: VllmConfig = None,  # the engine flags, see dyn.cli.vllm_flags
    dyn_tool_call_parser: str = options.DYN_TOOL_CALL_PARSER,
    dyn_reasoning_parser: str = options.DYN_REASONING_PARSER,
    namespace: str = options.NAMESPACE,
    discovery_backend: str = options.DISCOVERY_BACKEND,
    discovery_dir: str = options.DISCOVERY_DIR,
    host: str = options.HOST,
    drain_timeout: float = options.DRAIN_TIMEOUT,
    plane_keys: str = options.PLANE_KEYS,
) -> None:
    """vLLM engine (needs the vllm extra): one AsyncLLM per worker process. Any other vLLM engine flag
    is passed through as in vllm serve (--swap-space 4, --quantization fp8, ...). vLLM publishes
    KV events itself; the worker advertises its endpoints in discovery."""
    import msgspec

    config = msgspec.structs.replace(vllm_config, extra_args=list(ctx.args))  # vLLM's parser reads them
    settings = _settings(namespace, discovery_backend, discovery_dir, host, dyn_tool_call_parser,
                         dyn_reasoning_parser, model_path, drain_timeout, plane_keys)
    _serve("vllm", config, settings, model_path=model_path, model_name=model_name)


@app.command("sglang", context_settings=PASS_THROUGH)
@sglang_flags
def sglang(
    ctx: typer.Context,
    model_path: str = flag(..., "--model-path", panel=options.MODEL_PANEL,
                           help="Local Hugging Face model directory SGLang loads (the frontend "
                                "tokenizes with the same one)."),
    model_name: str = options.MODEL_NAME,
    sglang_config: SglangConfig = None,  # the engine flags, see dyn.cli.sglang_flags
    dyn_tool_call_parser: str = options.DYN_TOOL_CALL_PARSER,
    dyn_reasoning_parser: str = options.DYN_REASONING_PARSER,
    namespace: str = options.NAMESPACE,
    discovery_backend: str = options.DISCOVERY_BACKEND,
    discovery_dir: str = options.DISCOVERY_DIR,
    host: str = options.HOST,
    drain_timeout: float = options.DRAIN_TIMEOUT,
    plane_keys: str = options.PLANE_KEYS,
) -> None:
    """SGLang engine (needs the sglang extra): one sglang.Engine per worker process, with priority
    scheduling and eviction, streaming sessions and SGLang's own KV events. Any other SGLang
    server flag is passed through as in python -m sglang.launch_server. Not yet run against a
    live SGLang: tested against a fake engine with SGLang 0.5.23's method signatures."""
    settings = _settings(namespace, discovery_backend, discovery_dir, host, dyn_tool_call_parser,
                         dyn_reasoning_parser, model_path, drain_timeout, plane_keys)
    _serve("sglang", sglang_config, settings, model_path=model_path, model_name=model_name,
           extra_args=list(ctx.args))


def _settings(namespace: str, discovery_backend: str, discovery_dir: str | None, host: str,
              tool_call_parser: str | None, reasoning_parser: str | None,
              model_path: str | None, drain_timeout: float, plane_keys: str | None) -> WorkerSettings:
    """The worker settings; an unknown parser name exits 2 with the known ones."""
    from dyn.core.worker.settings import WorkerSettings, model_parsers

    options.use_plane_keys(plane_keys)
    try:
        tool_call_parser, reasoning_parser = model_parsers(tool_call_parser, reasoning_parser, model_path)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    return WorkerSettings(namespace=namespace, discovery_backend=discovery_backend,
                          discovery_dir=discovery_dir, host=host, tool_call_parser=tool_call_parser,
                          reasoning_parser=reasoning_parser, drain_timeout_s=drain_timeout)


def _serve(engine: str, config: object, settings: WorkerSettings, **kwargs: object) -> None:
    """Run the ``engine`` plugin's workers; a bad setting exits 2, an engine that cannot start 1."""
    from dyn.core.engine import EngineStartError, load_engine_plugin
    from dyn.core.errors import ConfigError

    try:
        load_engine_plugin(engine).serve(config, settings, **kwargs)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except EngineStartError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
