"""``dyn bench``'s settings, declared once: each field carries its flag, help, panel and range.

``BenchConfig`` holds what the command line gives ``dyn bench`` (``dyn.core.config``: every field is
``Annotated[T, flag(...)]``, in the order ``--help`` shows them); ``dyn.cli.bench`` turns the
declarations into its Typer options, their ``DYN_*`` twins and ``--config`` keys. ``settings()``
makes the ``BenchSettings`` the run takes (a ``WorkloadSpec``, ``LoadSettings`` and the client's
options), raising ``ConfigError`` with a sentence for a bad ``--url`` or no single workload. This
module imports nothing heavy: the command line is built from it before anything runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import msgspec
from msgspec import Meta

from dyn.core.config import flag

if TYPE_CHECKING:
    from dyn.core.bench.live import BenchSettings
    from dyn.core.bench.spec import WorkloadSpec

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
"""The ``--help`` panels of ``dyn bench``."""

# The trace flags ``dyn bench --trace`` and ``dyn bench replay --offline`` share, declared once
TraceBlockSize = Annotated[
    Annotated[int, Meta(ge=1)] | None,
    flag(
        "--trace-block-size",
        panel=TRACE,
        help="Tokens per trace hash id (default: 512, or 16 for Bailian traces).",
    ),
]
TraceSpeedup = Annotated[
    Annotated[float, Meta(ge=0.0)],
    flag("--speedup", panel=TRACE, help="Divide the trace's arrival times and delays by this."),
]


CHOOSE_ONE = "choose exactly one workload: --parallel-sampling, --multi-turn, --prefix or --trace FILE"


class BenchConfig(msgspec.Struct, kw_only=True, frozen=True):
    """Every flag of ``dyn bench`` (the workload's, the load's, the client's, the output's)."""

    # Target
    url: Annotated[
        str | None,
        flag(
            "--url",
            scope="bench",
            panel=TARGET,
            help="The server: http://HOST:PORT or the OpenAI base URL http://HOST:PORT/v1 that dyn serve prints.",
        ),
    ] = None
    model: Annotated[
        str | None,
        flag("--model", panel=TARGET, help="Model to ask for (default: the first of /v1/models)."),
    ] = None
    api_key: Annotated[str | None, flag("--api-key", panel=TARGET, help="Bearer token for the server.")] = (
        None
    )
    nvext: Annotated[
        bool,
        flag(
            "--nvext/--no-nvext",
            panel=TARGET,
            help="Ask for nvext.extra_fields worker_id and timing (per-worker spread, queue "
            "time); turn off for servers that reject nvext.",
        ),
    ] = True
    ignore_eos: Annotated[
        bool,
        flag(
            "--ignore-eos/--no-ignore-eos",
            panel=TARGET,
            help="Send ignore_eos so every request outputs exactly max_tokens.",
        ),
    ] = True
    timeout: Annotated[
        Annotated[float, Meta(ge=0.1)],
        flag("--timeout", panel=TARGET, help="Per-request timeout in seconds."),
    ] = 600.0
    # Workload
    parallel_sampling: Annotated[
        bool,
        flag(
            "--parallel-sampling",
            panel=WORKLOAD,
            help="P problems x S samples sharing a system prompt, fired as bursts of siblings.",
        ),
    ] = False
    multi_turn: Annotated[
        bool,
        flag(
            "--multi-turn",
            panel=WORKLOAD,
            help="Agent runs: a lead agent with growing history and subagents in engine sessions.",
        ),
    ] = False
    prefix: Annotated[
        bool,
        flag(
            "--prefix",
            panel=WORKLOAD,
            help="Synthetic groups of prompts sharing a prefix of --prefix-ratio of --isl.",
        ),
    ] = False
    trace: Annotated[
        str | None,
        flag(
            "--trace",
            panel=WORKLOAD,
            help="Replay a Mooncake (or Bailian) JSONL trace at its recorded times.",
        ),
    ] = None
    seed: Annotated[
        int,
        flag(
            "--seed",
            scope="bench",
            panel=WORKLOAD,
            help="Seed of every random choice (same seed, same workload).",
        ),
    ] = 0
    max_tokens: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--max-tokens", panel=WORKLOAD, help="Output tokens per request (traces use their output_length)."
        ),
    ] = 64
    block_size: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--block-size",
            panel=WORKLOAD,
            help="Tokens per block of the synthetic workloads' block model (match the "
            "server's KV block size for a meaningful --dry-run hit rate and history cached ratio).",
        ),
    ] = 64
    system_tokens: Annotated[
        Annotated[int, Meta(ge=0)],
        flag(
            "--system-tokens",
            panel=WORKLOAD,
            help="Shared system prompt length in tokens (parallel sampling, multi-turn).",
        ),
    ] = 1024
    # Parallel sampling
    problems: Annotated[
        Annotated[int, Meta(ge=1)], flag("--problems", panel=SAMPLING, help="Problems (bursts).")
    ] = 16
    samples: Annotated[
        Annotated[int, Meta(ge=1)],
        flag("--samples", panel=SAMPLING, help="Samples per problem (siblings in a burst)."),
    ] = 4
    problem_tokens: Annotated[
        Annotated[int, Meta(ge=1)],
        flag("--problem-tokens", panel=SAMPLING, help="Problem statement length in tokens."),
    ] = 256
    # Multi-turn agents
    agents: Annotated[
        Annotated[int, Meta(ge=1)], flag("--agents", panel=MULTI, help="Agent runs (units).")
    ] = 8
    lead_turns: Annotated[
        Annotated[int, Meta(ge=1)], flag("--lead-turns", panel=MULTI, help="Turns of each lead agent.")
    ] = 4
    subagents: Annotated[
        Annotated[int, Meta(ge=0)],
        flag(
            "--subagents",
            panel=MULTI,
            help="Subagents per run, one spawned after each of the lead's first turns.",
        ),
    ] = 2
    subagent_turns: Annotated[
        Annotated[int, Meta(ge=1)], flag("--subagent-turns", panel=MULTI, help="Turns of each subagent.")
    ] = 3
    turn_tokens: Annotated[
        Annotated[int, Meta(ge=1)], flag("--turn-tokens", panel=MULTI, help="New user/tool tokens per turn.")
    ] = 128
    tool_pause: Annotated[
        Annotated[float, Meta(ge=0.0)],
        flag(
            "--tool-pause",
            panel=MULTI,
            help="Mean pause between turns in seconds (exponential), a tool call; with "
            "--tools also before each tool round.",
        ),
    ] = 0.2
    speculative_prefill: Annotated[
        bool,
        flag(
            "--speculative-prefill",
            panel=MULTI,
            help="Set nvext.agent_hints.speculative_prefill on every turn but the last.",
        ),
    ] = False
    priority_mix: Annotated[
        Annotated[float, Meta(ge=0.0, le=1.0)],
        flag(
            "--priority-mix",
            panel=MULTI,
            help="Fraction of agent runs sent with high priority (agent_hints.priority).",
        ),
    ] = 0.0
    session_timeout: Annotated[
        Annotated[int, Meta(ge=1)],
        flag("--session-timeout", panel=MULTI, help="Idle timeout in seconds of the subagents' sessions."),
    ] = 60
    subagent_context: Annotated[
        str,
        flag(
            "--subagent-context",
            panel=MULTI,
            help="fresh: a subagent has its own system prompt and task; fork: it starts from the "
            "lead's conversation so far (its context shares the lead's prefix).",
        ),
    ] = "fresh"
    agent_ids: Annotated[
        bool,
        flag(
            "--agent-ids",
            panel=MULTI,
            help="Send each conversation's id as x-dynamo-session-id and a subagent's parent's as "
            "x-dynamo-parent-session-id, as agent harnesses do (session and parent affinity), "
            "instead of nvext.session_control.",
        ),
    ] = False
    tools: Annotated[
        Annotated[int, Meta(ge=0)],
        flag(
            "--tools",
            panel=MULTI,
            help="Function tools offered on every request; a reply's tool calls are answered "
            "with synthetic results and the turn goes on with a tool round.",
        ),
    ] = 0
    max_tool_rounds: Annotated[
        Annotated[int, Meta(ge=0)],
        flag("--max-tool-rounds", panel=MULTI, help="Most tool rounds per turn (with --tools)."),
    ] = 4
    tool_result_tokens: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--tool-result-tokens",
            panel=MULTI,
            help="Length of each synthetic tool result in tokens (with --tools).",
        ),
    ] = 64
    # Shared prefix
    groups: Annotated[Annotated[int, Meta(ge=1)], flag("--groups", panel=PREFIX, help="Prefix groups.")] = 20
    per_group: Annotated[
        Annotated[int, Meta(ge=1)], flag("--per-group", panel=PREFIX, help="Requests per group.")
    ] = 10
    isl: Annotated[
        Annotated[int, Meta(ge=1)], flag("--isl", panel=PREFIX, help="Prompt length in tokens.")
    ] = 1024
    prefix_ratio: Annotated[
        Annotated[float, Meta(ge=0.0, le=1.0)],
        flag("--prefix-ratio", panel=PREFIX, help="Share of the prompt common to a group."),
    ] = 0.5
    # Trace replay
    trace_block_size: TraceBlockSize = None
    speedup: TraceSpeedup = 1.0
    vocab_size: Annotated[
        Annotated[int, Meta(ge=17)],
        flag(
            "--vocab-size",
            panel=TRACE,
            help="Token ids of synthesized trace prompts stay below this (the model's vocabulary).",
        ),
    ] = 4096
    # Load
    concurrency: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        flag(
            "--concurrency",
            panel=LOAD,
            help="Closed loop: units in flight (a burst, an agent run, or a request; default 4; "
            "traces default to their recorded times).",
        ),
    ] = None
    request_rate: Annotated[
        float | None,
        flag("--request-rate", panel=LOAD, help="Open loop: units per second, Poisson arrivals."),
    ] = None
    num_requests: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        flag(
            "--num-requests",
            panel=LOAD,
            help="Start no unit once this many requests were started (traces: read only this many rows).",
        ),
    ] = None
    duration: Annotated[
        float | None,
        flag("--duration", scope="bench", panel=LOAD, help="Start no unit after this many seconds."),
    ] = None
    # Output
    output: Annotated[
        str | None,
        flag("--output", "-o", panel=OUTPUT, help="Write the results (JSON, schema dyn-bench/1) here."),
    ] = None
    plot: Annotated[
        str | None,
        flag(
            "--plot",
            panel=OUTPUT,
            help="Write a PNG: TTFT CDF and throughput over time (needs dyn\\[plot]).",
        ),
    ] = None
    dry_run: Annotated[
        bool,
        flag(
            "--dry-run",
            panel=OUTPUT,
            help="Print the workload's shape and theoretical cache hit rate; send nothing.",
        ),
    ] = False
    progress: Annotated[
        bool, flag("--progress/--no-progress", panel=OUTPUT, help="Show a progress bar while running.")
    ] = True

    def kind(self) -> str:
        """The one workload chosen (``dyn.core.bench.spec.KINDS``); ``ConfigError`` unless one is."""
        from dyn.core.errors import ConfigError

        chosen = [
            name
            for name, on in (
                ("parallel-sampling", self.parallel_sampling),
                ("multi-turn", self.multi_turn),
                ("prefix", self.prefix),
                ("trace", self.trace is not None),
            )
            if on
        ]
        if len(chosen) != 1:
            raise ConfigError(CHOOSE_ONE)
        return chosen[0]

    def settings(self) -> BenchSettings:
        """What the run takes; ``ConfigError`` for a bad ``--url`` or not exactly one workload."""
        from dyn.core.bench.live import BenchSettings
        from dyn.core.bench.runner import LoadSettings
        from dyn.core.server_url import server_root

        url = server_root(self.url) if self.url is not None else None
        kind = self.kind()
        concurrency = self.concurrency
        if concurrency is None and self.request_rate is None and kind != "trace":
            concurrency = 4
        load = LoadSettings(
            concurrency=concurrency,
            request_rate=self.request_rate,
            max_requests=self.num_requests,
            duration_s=self.duration,
            seed=self.seed,
        )
        return BenchSettings(
            spec=self.workload(kind),
            load=load,
            url=url,
            model=self.model,
            api_key=self.api_key,
            nvext=self.nvext,
            agent_ids=self.agent_ids,
            ignore_eos=self.ignore_eos,
            timeout_s=self.timeout,
            output=self.output,
            plot=self.plot,
            dry_run=self.dry_run,
            progress=self.progress,
        )

    def workload(self, kind: str) -> WorkloadSpec:
        """The ``WorkloadSpec`` of workload ``kind`` from these flags."""
        from dyn.core.bench.spec import WorkloadSpec

        return WorkloadSpec(
            kind=kind,
            seed=self.seed,
            block_size=self.block_size,
            max_tokens=self.max_tokens,
            problems=self.problems,
            samples=self.samples,
            system_tokens=self.system_tokens,
            problem_tokens=self.problem_tokens,
            agents=self.agents,
            lead_turns=self.lead_turns,
            subagents=self.subagents,
            subagent_turns=self.subagent_turns,
            turn_tokens=self.turn_tokens,
            tool_pause_s=self.tool_pause,
            speculative_prefill=self.speculative_prefill,
            priority_mix=self.priority_mix,
            session_timeout_s=self.session_timeout,
            subagent_context=self.subagent_context,
            tools=self.tools,
            max_tool_rounds=self.max_tool_rounds,
            tool_result_tokens=self.tool_result_tokens,
            groups=self.groups,
            per_group=self.per_group,
            isl=self.isl,
            prefix_ratio=self.prefix_ratio,
            trace=self.trace,
            trace_block_size=self.trace_block_size,
            speedup=self.speedup,
            vocab_size=self.vocab_size,
            limit=self.num_requests if kind == "trace" else None,
        )
