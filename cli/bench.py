"""``dyn bench``: agentic load against any OpenAI-compatible server; ``compare``; ``replay``."""

from __future__ import annotations

import sys

import typer

from dyn.cli import bench_replay
from dyn.cli.options import flag

TARGET, WORKLOAD, SAMPLING, MULTI, PREFIX, TRACE, LOAD, OUTPUT = (
    "Target",
    "Workload",
    "Parallel sampling",
    "Multi-turn agents",
    "Shared prefix",
    "Trace replay",
    "Load",
    "Output",
)

app = typer.Typer(
    help="Agentic load client and trace replay for any OpenAI-compatible server.",
    no_args_is_help=True,
    invoke_without_command=True,
)


@app.callback()
def bench(
    ctx: typer.Context,
    url: str = flag(
        None,
        "--url",
        scope="bench",
        panel=TARGET,
        help="The server: http://HOST:PORT or the OpenAI base URL http://HOST:PORT/v1 that dyn serve prints.",
    ),
    model: str = flag(
        None, "--model", panel=TARGET, help="Model to ask for (default: the first of /v1/models)."
    ),
    api_key: str = flag(None, "--api-key", panel=TARGET, help="Bearer token for the server."),
    nvext: bool = flag(
        True,
        "--nvext/--no-nvext",
        panel=TARGET,
        help="Ask for nvext.extra_fields worker_id and timing (per-worker spread, queue "
        "time); turn off for servers that reject nvext.",
    ),
    ignore_eos: bool = flag(
        True,
        "--ignore-eos/--no-ignore-eos",
        panel=TARGET,
        help="Send ignore_eos so every request outputs exactly max_tokens.",
    ),
    timeout: float = flag(600.0, "--timeout", min=0.1, panel=TARGET, help="Per-request timeout in seconds."),
    parallel_sampling: bool = flag(
        False,
        "--parallel-sampling",
        panel=WORKLOAD,
        help="P problems x S samples sharing a system prompt, fired as bursts of siblings.",
    ),
    multi_turn: bool = flag(
        False,
        "--multi-turn",
        panel=WORKLOAD,
        help="Agent runs: a lead agent with growing history and subagents in engine sessions.",
    ),
    prefix: bool = flag(
        False,
        "--prefix",
        panel=WORKLOAD,
        help="Synthetic groups of prompts sharing a prefix of --prefix-ratio of --isl.",
    ),
    trace: str = flag(
        None,
        "--trace",
        panel=WORKLOAD,
        help="Replay a Mooncake (or Bailian) JSONL trace at its recorded times.",
    ),
    seed: int = flag(
        0,
        "--seed",
        scope="bench",
        panel=WORKLOAD,
        help="Seed of every random choice (same seed, same workload).",
    ),
    max_tokens: int = flag(
        64,
        "--max-tokens",
        min=1,
        panel=WORKLOAD,
        help="Output tokens per request (traces use their output_length).",
    ),
    block_size: int = flag(
        64,
        "--block-size",
        min=1,
        panel=WORKLOAD,
        help="Tokens per block of the synthetic workloads' block model (match the "
        "server's KV block size for a meaningful --dry-run hit rate and history cached ratio).",
    ),
    system_tokens: int = flag(
        1024,
        "--system-tokens",
        min=0,
        panel=WORKLOAD,
        help="Shared system prompt length in tokens (parallel sampling, multi-turn).",
    ),
    problems: int = flag(16, "--problems", min=1, panel=SAMPLING, help="Problems (bursts)."),
    samples: int = flag(
        4, "--samples", min=1, panel=SAMPLING, help="Samples per problem (siblings in a burst)."
    ),
    problem_tokens: int = flag(
        256, "--problem-tokens", min=1, panel=SAMPLING, help="Problem statement length in tokens."
    ),
    agents: int = flag(8, "--agents", min=1, panel=MULTI, help="Agent runs (units)."),
    lead_turns: int = flag(4, "--lead-turns", min=1, panel=MULTI, help="Turns of each lead agent."),
    subagents: int = flag(
        2,
        "--subagents",
        min=0,
        panel=MULTI,
        help="Subagents per run, one spawned after each of the lead's first turns.",
    ),
    subagent_turns: int = flag(3, "--subagent-turns", min=1, panel=MULTI, help="Turns of each subagent."),
    turn_tokens: int = flag(128, "--turn-tokens", min=1, panel=MULTI, help="New user/tool tokens per turn."),
    tool_pause: float = flag(
        0.2,
        "--tool-pause",
        min=0.0,
        panel=MULTI,
        help="Mean pause between turns in seconds (exponential), a tool call; with "
        "--tools also before each tool round.",
    ),
    speculative_prefill: bool = flag(
        False,
        "--speculative-prefill",
        panel=MULTI,
        help="Set nvext.agent_hints.speculative_prefill on every turn but the last.",
    ),
    priority_mix: float = flag(
        0.0,
        "--priority-mix",
        min=0.0,
        max=1.0,
        panel=MULTI,
        help="Fraction of agent runs sent with high priority (agent_hints.priority).",
    ),
    session_timeout: int = flag(
        60,
        "--session-timeout",
        min=1,
        panel=MULTI,
        help="Idle timeout in seconds of the subagents' sessions.",
    ),
    subagent_context: str = flag(
        "fresh",
        "--subagent-context",
        panel=MULTI,
        help="fresh: a subagent has its own system prompt and task; fork: it starts from the "
        "lead's conversation so far (its context shares the lead's prefix).",
    ),
    agent_ids: bool = flag(
        False,
        "--agent-ids",
        panel=MULTI,
        help="Send each conversation's id as x-dynamo-session-id and a subagent's parent's as "
        "x-dynamo-parent-session-id, as agent harnesses do (session and parent affinity), "
        "instead of nvext.session_control.",
    ),
    tools: int = flag(
        0,
        "--tools",
        min=0,
        panel=MULTI,
        help="Function tools offered on every request; a reply's tool calls are answered "
        "with synthetic results and the turn goes on with a tool round.",
    ),
    max_tool_rounds: int = flag(
        4, "--max-tool-rounds", min=0, panel=MULTI, help="Most tool rounds per turn (with --tools)."
    ),
    tool_result_tokens: int = flag(
        64,
        "--tool-result-tokens",
        min=1,
        panel=MULTI,
        help="Length of each synthetic tool result in tokens (with --tools).",
    ),
    groups: int = flag(20, "--groups", min=1, panel=PREFIX, help="Prefix groups."),
    per_group: int = flag(10, "--per-group", min=1, panel=PREFIX, help="Requests per group."),
    isl: int = flag(1024, "--isl", min=1, panel=PREFIX, help="Prompt length in tokens."),
    prefix_ratio: float = flag(
        0.5, "--prefix-ratio", min=0.0, max=1.0, panel=PREFIX, help="Share of the prompt common to a group."
    ),
    trace_block_size: int = flag(
        None,
        "--trace-block-size",
        min=1,
        panel=TRACE,
        help="Tokens per trace hash id (default: 512, or 16 for Bailian traces).",
    ),
    speedup: float = flag(
        1.0, "--speedup", min=0.0, panel=TRACE, help="Divide the trace's arrival times and delays by this."
    ),
    vocab_size: int = flag(
        4096,
        "--vocab-size",
        min=17,
        panel=TRACE,
        help="Token ids of synthesized trace prompts stay below this (the model's vocabulary).",
    ),
    concurrency: int = flag(
        None,
        "--concurrency",
        min=1,
        panel=LOAD,
        help="Closed loop: units in flight (a burst, an agent run, or a request; default 4; "
        "traces default to their recorded times).",
    ),
    request_rate: float = flag(
        None, "--request-rate", panel=LOAD, help="Open loop: units per second, Poisson arrivals."
    ),
    num_requests: int = flag(
        None,
        "--num-requests",
        min=1,
        panel=LOAD,
        help="Start no unit once this many requests were started (traces: read only this many rows).",
    ),
    duration: float = flag(
        None, "--duration", scope="bench", panel=LOAD, help="Start no unit after this many seconds."
    ),
    output: str = flag(
        None, "--output", "-o", panel=OUTPUT, help="Write the results (JSON, schema dyn-bench/1) here."
    ),
    plot: str = flag(
        None,
        "--plot",
        panel=OUTPUT,
        help="Write a PNG: TTFT CDF and throughput over time (needs dyn\\[plot]).",
    ),
    dry_run: bool = flag(
        False,
        "--dry-run",
        panel=OUTPUT,
        help="Print the workload's shape and theoretical cache hit rate; send nothing.",
    ),
    progress: bool = flag(
        True, "--progress/--no-progress", panel=OUTPUT, help="Show a progress bar while running."
    ),
) -> None:
    """Agentic load against any OpenAI-compatible server (dyn or not): pick one workload, then
    --concurrency or --request-rate. Subcommands: compare two results, replay a trace offline."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.console import Console

    from dyn.core.bench.live import BenchSettings, run_bench
    from dyn.core.bench.runner import LoadSettings
    from dyn.core.bench.spec import WorkloadSpec
    from dyn.core.errors import ConfigError
    from dyn.core.server_url import server_root

    if url is not None:
        try:
            url = server_root(url)
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    chosen = [
        name
        for name, on in (
            ("parallel-sampling", parallel_sampling),
            ("multi-turn", multi_turn),
            ("prefix", prefix),
            ("trace", trace is not None),
        )
        if on
    ]
    if len(chosen) != 1:
        typer.echo(
            "error: choose exactly one workload: --parallel-sampling, --multi-turn, --prefix or --trace FILE",
            err=True,
        )
        raise typer.Exit(2)
    kind = chosen[0]
    spec = WorkloadSpec(
        kind=kind,
        seed=seed,
        block_size=block_size,
        max_tokens=max_tokens,
        problems=problems,
        samples=samples,
        system_tokens=system_tokens,
        problem_tokens=problem_tokens,
        agents=agents,
        lead_turns=lead_turns,
        subagents=subagents,
        subagent_turns=subagent_turns,
        turn_tokens=turn_tokens,
        tool_pause_s=tool_pause,
        speculative_prefill=speculative_prefill,
        priority_mix=priority_mix,
        session_timeout_s=session_timeout,
        subagent_context=subagent_context,
        tools=tools,
        max_tool_rounds=max_tool_rounds,
        tool_result_tokens=tool_result_tokens,
        groups=groups,
        per_group=per_group,
        isl=isl,
        prefix_ratio=prefix_ratio,
        trace=trace,
        trace_block_size=trace_block_size,
        speedup=speedup,
        vocab_size=vocab_size,
        limit=num_requests if kind == "trace" else None,
    )
    if concurrency is None and request_rate is None and kind != "trace":
        concurrency = 4
    load = LoadSettings(
        concurrency=concurrency,
        request_rate=request_rate,
        max_requests=num_requests,
        duration_s=duration,
        seed=seed,
    )
    settings = BenchSettings(
        spec=spec,
        load=load,
        url=url,
        model=model,
        api_key=api_key,
        nvext=nvext,
        agent_ids=agent_ids,
        ignore_eos=ignore_eos,
        timeout_s=timeout,
        output=output,
        plot=plot,
        dry_run=dry_run,
        progress=progress,
    )
    try:
        status = run_bench(settings, Console())
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(status)


@app.command("compare")
def compare(
    a: str = typer.Argument(..., help="Results of the baseline run (dyn bench --output)."),
    b: str = typer.Argument(..., help="Results of the run to compare with it."),
    json_out: bool = flag(False, "--json", help="Print the rows as JSON instead of a table."),
) -> None:
    """Compare two results files: each metric's change from A to B (green: better)."""
    import orjson
    from rich.console import Console

    from dyn.core.bench.compare import compare_rows, compare_table
    from dyn.core.bench.report import ResultError, read_result

    try:
        rows = compare_rows(read_result(a), read_result(b))
    except ResultError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if json_out:
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        Console().print(compare_table(rows, a, b))


app.command("replay")(bench_replay.replay)
