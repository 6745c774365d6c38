"""Benchmark workloads: deterministic (by seed) descriptions of what ``dyn bench`` sends.

A ``Workload`` is a list of ``Unit``s; a unit is what the load model starts at once (closed loop:
``--concurrency`` units in flight; open loop: units arrive as a Poisson process; traces: at their
recorded times). A unit holds ``Conversation``s; a conversation is an ordered list of ``Turn``s
sent one after another, each after the previous one ended plus the turn's ``delay_s`` (a tool-call
pause). A conversation with ``parent`` starts when its parent's turn ``after_turn`` has ended, and
the parent's next turn waits until every such child has finished (a subagent's result returns to
the lead agent as a tool result).

Every turn carries a *block model* of its whole prompt (``blocks``: ids of ``block_size``-token
blocks with Mooncake's prefix meaning) from which ``--dry-run`` computes the theoretical cache hit
rate. Chat turns add a user message whose text is built from those blocks: each block id becomes
``block_size`` words of a fixed vocabulary (about one token per word for BPE tokenizers), so equal
leading ids give equal leading text; the block model counts the assistant replies as
``max_tokens`` tokens each and ignores the chat template. Trace turns carry token ids instead.

Workloads:

- ``parallel_sampling``: P problems x S samples; one shared system prompt, one problem statement
  per problem; the S siblings of a problem form one unit (a burst sharing its prefix).
- ``multi_turn``: agent runs; a lead agent with growing history over its turns, and at some turns
  subagents (own system prompt and task, a few turns, ``nvext.session_control`` open / turns /
  close) whose result the lead waits for; pauses between turns; optional speculative prefill; a
  fraction of runs marked high priority (``nvext.agent_hints.priority``); optionally function
  tools on every request (``Conversation.tool_use``): a reply with tool calls makes the runner
  answer them and send *tool rounds* within the turn. Tool rounds depend on the server's replies,
  so the block model (and ``--dry-run``'s hit rate) knows only the scripted turns.
- ``prefix``: G groups x R requests; each prompt is its group's shared prefix (``ratio`` of the
  ISL) followed by a unique suffix; requests shuffled.
- ``trace``: rows of a Mooncake / Bailian trace; token-id prompts on ``/v1/completions``; rows of
  one ``session_id`` form a conversation; arrivals and delays divided by ``speedup``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from itertools import count
from typing import Any

import msgspec

from dyn.core.bench.tools import ToolUse, function_tools
from dyn.core.bench.trace import TokenSynth, TraceRow, theoretical_hit_rate
from dyn.core.bench.words import TextSynth

HIGH_PRIORITY = 10


class Turn(msgspec.Struct, frozen=True, kw_only=True):
    """One request of a conversation."""

    max_tokens: int
    blocks: tuple[int, ...]
    user: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    delay_s: float = 0.0
    nvext: dict[str, Any] | None = None


class Conversation(msgspec.Struct, frozen=True, kw_only=True):
    """Turns sent in order; ``system`` opens a chat; ``cls`` labels its requests in the report."""

    key: str
    group: str
    turns: tuple[Turn, ...]
    system: str | None = None
    cls: str | None = None
    parent: str | None = None
    after_turn: int = 0
    tool_use: ToolUse | None = None
    fork: bool = False
    """A subagent that starts from its parent's conversation so far (its ``system`` unused)."""

    @property
    def chat(self) -> bool:
        return self.turns[0].prompt_ids is None


class Unit(msgspec.Struct, frozen=True, kw_only=True):
    """Conversations started together; ``start_s`` is a recorded arrival (traces) or None."""

    conversations: tuple[Conversation, ...]
    start_s: float | None = None

    @property
    def num_requests(self) -> int:
        return sum(len(c.turns) for c in self.conversations)


class Workload(msgspec.Struct, frozen=True, kw_only=True):
    """``grouped``: a conversation's ``group`` shares a prefix (duplicate prefills are reported)."""

    name: str
    block_size: int
    units: tuple[Unit, ...]
    params: dict[str, Any]
    grouped: bool = False

    @property
    def timed(self) -> bool:
        return any(u.start_s is not None for u in self.units)

    @property
    def num_requests(self) -> int:
        return sum(u.num_requests for u in self.units)

    def turns(self) -> Iterator[Turn]:
        for unit in self.units:
            for conversation in unit.conversations:
                yield from conversation.turns


def _blocks_for(tokens: int, block_size: int) -> int:
    return max(1, -(-tokens // block_size))


class _Ids:
    """Fresh block ids."""

    def __init__(self) -> None:
        self._next = count()

    def take(self, n: int) -> tuple[int, ...]:
        return tuple(next(self._next) for _ in range(n))


def parallel_sampling(
    *,
    problems: int,
    samples: int,
    system_tokens: int,
    problem_tokens: int,
    max_tokens: int,
    block_size: int,
    seed: int,
) -> Workload:
    """P problems x S samples sharing one system prompt; each problem's siblings are one burst."""
    _check_positive(problems=problems, samples=samples, max_tokens=max_tokens, block_size=block_size)
    ids, text = _Ids(), TextSynth(block_size, seed)
    system_blocks = ids.take(_blocks_for(system_tokens, block_size)) if system_tokens > 0 else ()
    system = text.text(system_blocks) if system_blocks else None
    units = []
    for p in range(problems):
        problem_blocks = ids.take(_blocks_for(problem_tokens, block_size))
        turn = Turn(
            max_tokens=max_tokens,
            blocks=system_blocks + problem_blocks,
            user=f"Problem {p}: {text.text(problem_blocks)}",
        )
        units.append(
            Unit(
                conversations=tuple(
                    Conversation(key=f"p{p}-s{s}", group=f"problem-{p}", turns=(turn,), system=system)
                    for s in range(samples)
                )
            )
        )
    return Workload(
        name="parallel-sampling",
        block_size=block_size,
        units=tuple(units),
        grouped=True,
        params={
            "problems": problems,
            "samples": samples,
            "system_tokens": system_tokens,
            "problem_tokens": problem_tokens,
            "max_tokens": max_tokens,
            "seed": seed,
        },
    )


def prefix_groups(
    *, groups: int, per_group: int, isl: int, ratio: float, max_tokens: int, block_size: int, seed: int
) -> Workload:
    """G groups x R requests whose prompts share ``ratio`` of ``isl`` tokens within a group."""
    _check_positive(groups=groups, per_group=per_group, isl=isl, max_tokens=max_tokens, block_size=block_size)
    if not 0.0 <= ratio <= 1.0:
        raise ValueError("the shared-prefix ratio must be between 0 and 1")
    ids, text = _Ids(), TextSynth(block_size, seed)
    shared = round(isl * ratio)
    conversations = []
    for g in range(groups):
        prefix = ids.take(shared // block_size) if shared >= block_size else ()
        prefix_text = text.text(prefix)
        for r in range(per_group):
            suffix = ids.take(_blocks_for(isl - len(prefix) * block_size, block_size))
            user = f"{prefix_text} {text.text(suffix)}" if prefix else text.text(suffix)
            conversations.append(
                Conversation(
                    key=f"g{g}-r{r}",
                    group=f"group-{g}",
                    turns=(Turn(max_tokens=max_tokens, blocks=prefix + suffix, user=user),),
                )
            )
    random.Random(seed).shuffle(conversations)
    return Workload(
        name="prefix",
        block_size=block_size,
        grouped=True,
        units=tuple(Unit(conversations=(c,)) for c in conversations),
        params={
            "groups": groups,
            "per_group": per_group,
            "isl": isl,
            "ratio": ratio,
            "max_tokens": max_tokens,
            "seed": seed,
        },
    )


def multi_turn(
    *,
    agents: int,
    lead_turns: int,
    subagents: int,
    subagent_turns: int,
    system_tokens: int,
    turn_tokens: int,
    max_tokens: int,
    tool_pause_s: float,
    speculative_prefill: bool,
    priority_mix: float,
    session_timeout_s: int,
    block_size: int,
    seed: int,
    tools: int = 0,
    max_tool_rounds: int = 4,
    tool_result_tokens: int = 64,
    fork: bool = False,
) -> Workload:
    """Agent runs: a lead with ``lead_turns`` turns; after each of its first ``subagents`` turns it
    spawns one subagent (``subagent_turns`` turns in an engine session) and waits for it. With
    ``tools`` > 0 every conversation offers that many function tools (``ToolUse``); with ``fork``
    a subagent starts from the lead's conversation so far (its context shares the lead's prefix)
    instead of a subagent system prompt of its own."""
    _check_positive(
        agents=agents,
        lead_turns=lead_turns,
        subagent_turns=subagent_turns,
        max_tokens=max_tokens,
        block_size=block_size,
    )
    if max_tool_rounds < 0:
        raise ValueError("--max-tool-rounds must be at least 0")
    if tool_result_tokens < 1:
        raise ValueError("--tool-result-tokens must be at least 1")
    tool_use = (
        ToolUse(
            tools=function_tools(tools, seed),
            max_rounds=max_tool_rounds,
            result_tokens=tool_result_tokens,
            seed=seed,
            pause_s=tool_pause_s,
        )
        if tools
        else None
    )
    if subagents < 0 or subagents >= lead_turns:
        raise ValueError(
            "--subagents must be between 0 and the lead's turns - 1 (each is spawned "
            "after a lead turn and its result feeds the next one)"
        )
    if not 0.0 <= priority_mix <= 1.0:
        raise ValueError("--priority-mix must be between 0 and 1")
    rng = random.Random(seed)
    ids, text = _Ids(), TextSynth(block_size, seed)
    lead_system = ids.take(_blocks_for(system_tokens, block_size))
    sub_system = ids.take(_blocks_for(max(system_tokens // 2, 1), block_size))
    turn_blocks = _blocks_for(turn_tokens, block_size)
    reply_blocks = _blocks_for(max_tokens, block_size)

    def pause() -> float:
        return rng.expovariate(1.0 / tool_pause_s) if tool_pause_s > 0 else 0.0

    def conversation(
        key: str,
        group: str,
        cls: str,
        system: tuple[int, ...],
        turns: int,
        priority: int | None,
        session: bool,
        histories: list[tuple[int, ...]] | None = None,
        **link: Any,
    ) -> Conversation:
        """One conversation's turns; ``histories`` (when given) collects its block history after
        each turn, reply included (what a forked subagent starts from)."""
        history = system
        out = []
        for t in range(turns):
            new = ids.take(turn_blocks)
            history = history + new
            hints: dict[str, Any] = {}
            if priority is not None:
                hints["priority"] = priority
            if speculative_prefill and t < turns - 1:
                hints["speculative_prefill"] = True
            nvext: dict[str, Any] = {"agent_hints": hints} if hints else {}
            if session and turns > 1:  # a one-turn conversation has nothing to keep
                control: dict[str, Any] = {"session_id": key}
                if t == 0:
                    control.update(action="open", timeout=session_timeout_s)
                elif t == turns - 1:
                    control["action"] = "close"
                nvext["session_control"] = control
            out.append(
                Turn(
                    max_tokens=max_tokens,
                    blocks=history,
                    user=text.text(new),
                    delay_s=pause() if t else 0.0,
                    nvext=nvext or None,
                )
            )
            history = history + ids.take(reply_blocks)
            if histories is not None:
                histories.append(history)
        return Conversation(
            key=key,
            group=group,
            cls=cls,
            system=text.text(system),
            turns=tuple(out),
            tool_use=tool_use,
            **link,
        )

    units = []
    for a in range(agents):
        high = rng.random() < priority_mix
        priority = HIGH_PRIORITY if high else (0 if priority_mix > 0 else None)
        prio = "high" if high else "normal"
        lead_key = f"agent{a}-lead"
        lead_histories: list[tuple[int, ...]] = []
        members = [
            conversation(
                lead_key,
                f"agent-{a}",
                f"lead/{prio}",
                lead_system,
                lead_turns,
                priority,
                session=False,
                histories=lead_histories,
            )
        ]
        for s in range(subagents):
            members.append(
                conversation(
                    f"agent{a}-sub{s}",
                    f"agent-{a}",
                    f"subagent/{prio}",
                    lead_histories[s] if fork else sub_system,
                    subagent_turns,
                    priority,
                    session=True,
                    parent=lead_key,
                    after_turn=s,
                    fork=fork,
                )
            )
        units.append(Unit(conversations=tuple(members)))
    params: dict[str, Any] = {
        "agents": agents,
        "lead_turns": lead_turns,
        "subagents": subagents,
        "subagent_turns": subagent_turns,
        "system_tokens": system_tokens,
        "turn_tokens": turn_tokens,
        "max_tokens": max_tokens,
        "tool_pause_s": tool_pause_s,
        "speculative_prefill": speculative_prefill,
        "priority_mix": priority_mix,
        "seed": seed,
    }
    if tool_use is not None:  # without tools the shape stays as it always was
        params.update(tools=tools, max_tool_rounds=max_tool_rounds, tool_result_tokens=tool_result_tokens)
    if fork:
        params["subagent_context"] = "fork"
    return Workload(name="multi-turn", block_size=block_size, units=tuple(units), params=params)


def from_trace(
    rows: Sequence[TraceRow],
    *,
    block_size: int,
    vocab_size: int,
    speedup: float,
    seed: int,
    max_tokens_cap: int | None = None,
) -> Workload:
    """A trace as a workload: token-id prompts; sessions become conversations at their first turn."""
    if speedup <= 0:
        raise ValueError("--speedup must be positive")
    synth = TokenSynth(block_size, vocab_size, seed=seed)
    sessions: dict[str, list[tuple[int, TraceRow]]] = {}
    starts: list[tuple[float, str | int]] = []
    for index, row in enumerate(rows):
        if row.session_id is None:
            starts.append((row.timestamp_ms or 0.0, index))
            continue
        if row.session_id not in sessions:
            sessions[row.session_id] = []
            starts.append((row.timestamp_ms or 0.0, row.session_id))
        sessions[row.session_id].append((index, row))

    def turn(index: int, row: TraceRow) -> Turn:
        out = max(row.output_length, 1)
        return Turn(
            max_tokens=min(out, max_tokens_cap) if max_tokens_cap else out,
            blocks=row.hash_ids,
            prompt_ids=tuple(synth.prompt(row, salt=index)),
            delay_s=(row.delay_ms or 0.0) / 1000.0 / speedup,
        )

    units = []
    for start_ms, ref in sorted(starts, key=lambda s: s[0]):
        if isinstance(ref, int):
            conv = Conversation(key=f"r{ref}", group=f"r{ref}", turns=(turn(ref, rows[ref]),))
        else:
            conv = Conversation(
                key=f"s{ref}", group=f"s{ref}", turns=tuple(turn(i, r) for i, r in sessions[ref])
            )
        units.append(Unit(conversations=(conv,), start_s=start_ms / 1000.0 / speedup))
    return Workload(
        name="trace",
        block_size=block_size,
        units=tuple(units),
        params={
            "rows": len(rows),
            "sessions": len(sessions),
            "speedup": speedup,
            "seed": seed,
            "vocab_size": vocab_size,
        },
    )


def shape(workload: Workload) -> dict[str, Any]:
    """What ``--dry-run`` prints: counts, prompt/output lengths and the theoretical hit rate."""
    turns = list(workload.turns())
    isl = [
        len(t.prompt_ids) if t.prompt_ids is not None else len(t.blocks) * workload.block_size for t in turns
    ]
    osl = [t.max_tokens for t in turns]
    conversations = [c for u in workload.units for c in u.conversations]
    timed = [u.start_s for u in workload.units if u.start_s is not None]
    return {
        "workload": workload.name,
        **workload.params,
        "units": len(workload.units),
        "conversations": len(conversations),
        "requests": len(turns),
        "block_size": workload.block_size,
        "mean_isl_tokens": sum(isl) / len(isl) if isl else 0.0,
        "max_isl_tokens": max(isl, default=0),
        "mean_osl_tokens": sum(osl) / len(osl) if osl else 0.0,
        "span_s": (max(timed) - min(timed)) if timed else None,
        "theoretical_hit_rate": theoretical_hit_rate(_in_order(workload)),
    }


def _in_order(workload: Workload) -> Iterator[tuple[int, ...]]:
    """Prompts in the order they are first sent when units run one after another."""
    for unit in workload.units:
        for conversation in unit.conversations:
            for turn in conversation.turns:
                yield turn.blocks


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name.replace('_', '-')} must be at least 1 (got {value})")
