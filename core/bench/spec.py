"""Which workload to build, from the command line's flags (``WorkloadSpec.build``)."""

from __future__ import annotations

from dataclasses import dataclass

from dyn.core.bench import workloads
from dyn.core.bench.trace import default_block_size, read_trace
from dyn.core.bench.workloads import Workload

KINDS = ("parallel-sampling", "multi-turn", "prefix", "trace")


@dataclass(frozen=True)
class WorkloadSpec:
    """Every workload's parameters; ``kind`` picks which are used."""

    kind: str
    seed: int = 0
    block_size: int = 64
    max_tokens: int = 64
    # parallel sampling
    problems: int = 16
    samples: int = 4
    system_tokens: int = 1024
    problem_tokens: int = 256
    # multi-turn
    agents: int = 8
    lead_turns: int = 4
    subagents: int = 2
    subagent_turns: int = 3
    turn_tokens: int = 128
    tool_pause_s: float = 0.2
    speculative_prefill: bool = False
    priority_mix: float = 0.0
    session_timeout_s: int = 60
    subagent_context: str = "fresh"
    """``fresh``: a subagent has its own system prompt; ``fork``: it starts from the lead's conversation."""
    tools: int = 0
    max_tool_rounds: int = 4
    tool_result_tokens: int = 64
    # prefix
    groups: int = 20
    per_group: int = 10
    isl: int = 1024
    prefix_ratio: float = 0.5
    # trace
    trace: str | None = None
    trace_block_size: int | None = None
    speedup: float = 1.0
    vocab_size: int = 4096
    limit: int | None = None

    def build(self) -> Workload:
        """The workload; ``ValueError`` / ``TraceError`` with a sentence for bad parameters."""
        common = {"block_size": self.block_size, "seed": self.seed}
        if self.tools and self.kind != "multi-turn":
            raise ValueError("--tools needs --multi-turn (the agents offer the tools)")
        if self.subagent_context not in ("fresh", "fork"):
            raise ValueError(f"--subagent-context must be fresh or fork, got {self.subagent_context!r}")
        if self.kind == "parallel-sampling":
            return workloads.parallel_sampling(
                problems=self.problems,
                samples=self.samples,
                system_tokens=self.system_tokens,
                problem_tokens=self.problem_tokens,
                max_tokens=self.max_tokens,
                **common,
            )
        if self.kind == "multi-turn":
            return workloads.multi_turn(
                agents=self.agents,
                lead_turns=self.lead_turns,
                subagents=self.subagents,
                subagent_turns=self.subagent_turns,
                system_tokens=self.system_tokens,
                turn_tokens=self.turn_tokens,
                max_tokens=self.max_tokens,
                tool_pause_s=self.tool_pause_s,
                speculative_prefill=self.speculative_prefill,
                priority_mix=self.priority_mix,
                session_timeout_s=self.session_timeout_s,
                tools=self.tools,
                max_tool_rounds=self.max_tool_rounds,
                tool_result_tokens=self.tool_result_tokens,
                fork=self.subagent_context == "fork",
                **common,
            )
        if self.kind == "prefix":
            return workloads.prefix_groups(
                groups=self.groups,
                per_group=self.per_group,
                isl=self.isl,
                ratio=self.prefix_ratio,
                max_tokens=self.max_tokens,
                **common,
            )
        if self.kind == "trace":
            if self.trace is None:
                raise ValueError("--trace needs a JSONL file")
            rows = read_trace(self.trace, limit=self.limit)
            block_size = self.trace_block_size or default_block_size(rows, self.trace)
            return workloads.from_trace(
                rows, block_size=block_size, vocab_size=self.vocab_size, speedup=self.speedup, seed=self.seed
            )
        raise ValueError(f"unknown workload {self.kind!r}; choose one of {', '.join(KINDS)}")
