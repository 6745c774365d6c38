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
    engine_type: str = flag("vllm", "--engine-type", panel=options.ENGINE_PANEL,
                            help="Engine flavour to simulate: vllm or sglang (same pass loop; flags and "
                                 "priority conventions differ; SGLang's new_token_ratio and lpm are not simulated)."),
    scheduling_policy: str = flag("fcfs", "--scheduling-policy", panel=options.ENGINE_PANEL,
                                  help="vLLM flavour: fcfs, or priority (waiting queue by priority then arrival, "
                                       "smaller value first; preempt the largest priority)."),
    enable_priority_scheduling: bool = flag(False, "--enable-priority-scheduling", panel=options.ENGINE_PANEL,
                                            help="SGLang flavour: order the waiting queue by priority, larger value "
                                                 "first; a request without one goes last."),
    schedule_low_priority_values_first: bool = flag(False, "--schedule-low-priority-values-first",
                                                    panel=options.ENGINE_PANEL,
                                                    help="SGLang flavour: smaller priority values are more important "
                                                         "(the worker then advertises lower_first)."),
    radix_eviction_policy: str = flag("lru", "--radix-eviction-policy", panel=options.ENGINE_PANEL,
                                      help="SGLang flavour: lru, or priority (evict the least important cached "
                                           "block first, ties least recently used)."),
    enable_streaming_session: bool = flag(False, "--enable-streaming-session", panel=options.ENGINE_PANEL,
                                          help="SGLang flavour: offer streaming sessions that hold a conversation's "
                                               "KV between turns, outside the prefix cache."),
    reasoning: str = flag(None, "--reasoning", panel=options.ENGINE_PANEL,
                          help='Start every output with a thinking section, as JSON: {"start_thinking_token_id": A, '
                               '"end_thinking_token_id": B, "thinking_ratio": R} (R of max_tokens). Without it a '
                               "request's max_thinking_tokens has no effect."),
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
    from dyn.core.worker.settings import WorkerSettings
    from dyn.plugins.mocker.config import MockerConfig, ReasoningConfig

    try:
        config = MockerConfig(
            block_size=block_size, num_gpu_blocks=num_gpu_blocks_override, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=enable_prefix_caching,
            enable_chunked_prefill=enable_chunked_prefill, preemption_mode=preemption_mode,
            speedup_ratio=speedup_ratio, decode_speedup_ratio=decode_speedup_ratio,
            engine_type=engine_type, scheduling_policy=scheduling_policy,
            enable_priority_scheduling=enable_priority_scheduling,
            schedule_low_priority_values_first=schedule_low_priority_values_first,
            radix_eviction_policy=radix_eviction_policy, enable_streaming_session=enable_streaming_session,
            reasoning=ReasoningConfig.parse(reasoning) if reasoning else None,
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
