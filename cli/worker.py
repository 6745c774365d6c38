"""``dyn worker <engine>``: run engine workers that register in discovery and serve requests."""

from __future__ import annotations

import typer

from dyn.cli import options, unbuilt
from dyn.cli.options import flag

app = typer.Typer(
    help="Run engine workers: each registers in discovery, serves the request plane and "
         "publishes KV events and load metrics.",
    no_args_is_help=True,
)


@app.command("mocker")
def mocker(
    model_path: str = options.MODEL_PATH,
    model_name: str = options.MODEL_NAME,
    block_size: int = flag(64, "--block-size", panel=options.ENGINE_PANEL, help="Tokens per KV block."),
    num_gpu_blocks_override: int = flag(16384, "--num-gpu-blocks-override", panel=options.ENGINE_PANEL, help="KV blocks per simulated worker."),
    max_num_seqs: int = flag(256, "--max-num-seqs", panel=options.ENGINE_PANEL, help="Most requests running in one forward pass."),
    max_num_batched_tokens: int = flag(8192, "--max-num-batched-tokens", panel=options.ENGINE_PANEL, help="Token budget of one forward pass."),
    enable_prefix_caching: bool = flag(True, "--enable-prefix-caching/--no-enable-prefix-caching", panel=options.ENGINE_PANEL,
                                       help="Reuse cached KV blocks of shared prompt prefixes."),
    enable_chunked_prefill: bool = flag(True, "--enable-chunked-prefill/--no-enable-chunked-prefill", panel=options.ENGINE_PANEL,
                                        help="Split long prompts across passes to fit the token budget."),
    preemption_mode: str = flag("lifo", "--preemption-mode", panel=options.ENGINE_PANEL,
                                help="Which running request to preempt when KV blocks run out: lifo or fifo."),
    speedup_ratio: float = flag(1.0, "--speedup-ratio", panel=options.ENGINE_PANEL,
                                help="Divide every simulated pass time by this (<= 0: no scaling)."),
    decode_speedup_ratio: float = flag(1.0, "--decode-speedup-ratio", panel=options.ENGINE_PANEL,
                                       help="Further divide simulated decode time by this."),
    num_workers: int = flag(1, "--num-workers", min=1, help="Simulated workers hosted by this process, each with "
                                                        "its own instance id, sockets and cache.",
                       panel=options.WORKER_PANEL),
    namespace: str = options.NAMESPACE,
    discovery_backend: str = options.DISCOVERY_BACKEND,
    discovery_dir: str = options.DISCOVERY_DIR,
    host: str = options.HOST,
) -> None:
    """Simulated engine (the default): paged KV cache with prefix caching, continuous batching,
    chunked prefill, preemption, Dynamo's timing model, real KV events. Needs no GPU."""
    from dyn.core.worker.settings import WorkerSettings
    from dyn.plugins.mocker.config import MockerConfig

    try:
        config = MockerConfig(
            block_size=block_size, num_gpu_blocks=num_gpu_blocks_override, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=enable_prefix_caching,
            enable_chunked_prefill=enable_chunked_prefill, preemption_mode=preemption_mode,
            speedup_ratio=speedup_ratio, decode_speedup_ratio=decode_speedup_ratio,
        ).validate()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    settings = WorkerSettings(namespace=namespace, discovery_backend=discovery_backend,
                              discovery_dir=discovery_dir, host=host)
    from dyn.core.engine import load_engine_plugin
    from dyn.core.errors import ConfigError

    try:
        load_engine_plugin("mocker").serve(config, settings, model_path=model_path, model_name=model_name,
                                           num_workers=num_workers)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


unbuilt.register(app, "vllm", "vLLM engine worker (needs the vllm extra).",
                 "the vLLM worker arrives with the real-engines milestone (issue 7).")
unbuilt.register(app, "sglang", "SGLang engine worker (needs the sglang extra).",
                 "the SGLang worker arrives with the real-engines milestone (issue 7).")
