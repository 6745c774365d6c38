"""``dyn worker <engine>``: run engine workers that register in discovery and serve requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from dyn.cli import options, unbuilt
from dyn.cli.mocker_flags import mocker_flags
from dyn.cli.options import flag

if TYPE_CHECKING:
    from dyn.plugins.mocker.config import MockerConfig

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
    namespace: str = options.NAMESPACE,
    discovery_backend: str = options.DISCOVERY_BACKEND,
    discovery_dir: str = options.DISCOVERY_DIR,
    host: str = options.HOST,
) -> None:
    """Simulated engine (the default): paged KV cache with prefix caching, continuous batching,
    chunked prefill, preemption, Dynamo's timing model, real KV events; vLLM or SGLang flavour with
    priority scheduling, priority eviction, streaming sessions, prefix pinning and thinking
    sections. Needs no GPU."""
    from dyn.core.engine import load_engine_plugin
    from dyn.core.errors import ConfigError
    from dyn.core.worker.settings import WorkerSettings

    settings = WorkerSettings(namespace=namespace, discovery_backend=discovery_backend,
                              discovery_dir=discovery_dir, host=host)

    try:
        load_engine_plugin("mocker").serve(mocker_config, settings, model_path=model_path,
                                           model_name=model_name, num_workers=num_workers)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


unbuilt.register(app, "vllm", "vLLM engine worker (needs the vllm extra).",
                 "the vLLM worker arrives with the real-engines milestone (issue 7).")
unbuilt.register(app, "sglang", "SGLang engine worker (needs the sglang extra).",
                 "the SGLang worker arrives with the real-engines milestone (issue 7).")
