"""The live load client: runs a ``Workload`` against an OpenAI-compatible server (``run_load``).

Load models (``LoadSettings``):

- closed loop (``concurrency`` C): C units in flight; each finished unit lets the next one start;
- open loop (``request_rate`` R): units arrive as a Poisson process of R units per second;
- recorded times: units with ``start_s`` (traces) start at that offset, unless a closed or open
  loop was asked for explicitly (then the trace is replayed as fast as that load allows).

Bounds: no unit starts once ``max_requests`` requests were started or ``duration_s`` has passed
(an open loop or trace stops at the first unit due after it, without waiting for it); units
already running finish their turns (each request is bounded by the client timeout). Session ids
in ``nvext.session_control`` get a per-run prefix. A
conversation stops at its first failed request (the rest of it is not sent; its children never
start). On SIGINT the run stops at once and returns what finished.

Tool calls (a conversation with ``tool_use``): every chat request offers the tools. A reply with
tool calls is answered as an agent does: the assistant message with its ``tool_calls`` and one
``tool`` message per call (``tools.tool_result``) join the history, and, after the tools' pause,
the next request of the same turn is sent (a *tool round*, recorded with ``tool_round`` k and
class ``<class>/tool-round``), up to ``max_rounds`` per turn; then the conversation goes on to
its next scripted turn (the last round's calls answered in its history). A tool round repeats its
turn's ``nvext`` with the session id but no session action (it continues the session the turn
opened; after the closing turn it is routed as any request). Tool rounds count against
``max_requests`` as they are sent. Without ``tool_use`` a reply is kept as plain text.
"""

from __future__ import annotations

import logging
import math
import random
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from dyn.core.bench.client import ClientOptions, Reply, chat_body, completion_body, send
from dyn.core.bench.metrics import RequestRecord
from dyn.core.bench.tools import ToolUse, tool_pause, tool_result
from dyn.core.bench.workloads import Conversation, Turn, Unit, Workload

log = logging.getLogger("dyn.bench")
TOOL_ROUND = "tool-round"


@dataclass(frozen=True)
class LoadSettings:
    concurrency: int | None = None
    request_rate: float | None = None
    max_requests: int | None = None
    duration_s: float | None = None
    seed: int = 0

    def validate(self) -> LoadSettings:
        if self.concurrency is not None and self.request_rate is not None:
            raise ValueError(
                "choose one load model: --concurrency (closed loop) or --request-rate (open loop), not both"
            )
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("--concurrency must be at least 1")
        if self.request_rate is not None and not (math.isfinite(self.request_rate) and self.request_rate > 0):
            raise ValueError("--request-rate must be a positive number")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError("--num-requests must be at least 1")
        if self.duration_s is not None and not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError("--duration must be positive")
        return self


@dataclass
class RunOutcome:
    records: list[RequestRecord]
    interrupted: bool
    wall_s: float


@dataclass(eq=False)
class _Run:
    """One load run: what it sends, how, and its records so far. ``origin``: when it began
    (``time.perf_counter``); ``run_id``: fresh per run (``own_sessions``)."""

    workload: Workload
    client: httpx.AsyncClient
    options: ClientOptions
    load: LoadSettings
    on_record: Callable[[RequestRecord], None] | None
    records: list[RequestRecord] = field(default_factory=list, init=False)
    started_requests: int = field(default=0, init=False)
    origin: float = field(default_factory=time.perf_counter, init=False)
    run_id: str = field(default_factory=lambda: secrets.token_hex(4), init=False)

    def may_start(self, unit: Unit) -> bool:
        if self.load.max_requests is not None and self.started_requests >= self.load.max_requests:
            return False
        if self.load.duration_s is not None and time.perf_counter() - self.origin >= self.load.duration_s:
            return False
        self.started_requests += unit.num_requests
        return True

    def own_sessions(self, nvext: dict | None) -> dict | None:
        """Session ids made unique to this run, so concurrent or repeated runs never share one;
        with ``--agent-ids`` the headers name the session instead (``nvext.session_control`` is
        dropped: servers such as Dynamo 1.6 take sessions in headers only)."""
        if not nvext or "session_control" not in nvext:
            return nvext
        if self.options.agent_ids:
            rest = {k: v for k, v in nvext.items() if k != "session_control"}
            return rest or None
        control = dict(nvext["session_control"])
        control["session_id"] = f"{self.run_id}-{control['session_id']}"
        return {**nvext, "session_control": control}

    async def unit(self, unit: Unit) -> None:
        children: dict[str, dict[int, list[Conversation]]] = {}
        for conv in unit.conversations:
            if conv.parent is not None:
                children.setdefault(conv.parent, {}).setdefault(conv.after_turn, []).append(conv)
        async with anyio.create_task_group() as tg:
            for conv in unit.conversations:
                if conv.parent is None:
                    tg.start_soon(self.conversation, conv, children)

    async def request(
        self, conv: Conversation, turn: int, path: str, body: dict[str, Any], tool_round: int = 0
    ) -> Reply:
        cls = conv.cls
        if tool_round:
            cls = f"{cls}/{TOOL_ROUND}" if cls else TOOL_ROUND
        record = RequestRecord(
            conversation=conv.key,
            group=conv.group,
            turn=turn,
            cls=cls,
            tool_round=tool_round,
            start_s=0.0,
            end_s=0.0,
        )
        headers = None
        if self.options.agent_ids:
            headers = {"x-dynamo-session-id": f"{self.run_id}-{conv.key}"}
            if conv.parent is not None:
                headers["x-dynamo-parent-session-id"] = f"{self.run_id}-{conv.parent}"
        reply = await send(
            self.client, path, body, record, time.perf_counter, self.origin, self.options, headers
        )
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)
        return reply

    async def conversation(
        self,
        conv: Conversation,
        children: dict[str, dict[int, list[Conversation]]],
        inherited: list[dict[str, Any]] | None = None,
    ) -> None:
        """Run ``conv``'s turns; a forked subagent (``Conversation.fork``) starts from
        ``inherited``, its parent's messages when it was spawned, instead of its own system."""
        messages: list[dict[str, Any]]
        if conv.fork and inherited is not None:
            messages = list(inherited)
        else:
            messages = [{"role": "system", "content": conv.system}] if conv.system else []
        spawns = children.get(conv.key, {})
        tools = conv.tool_use.tools if conv.tool_use is not None else None
        for index, turn in enumerate(conv.turns):
            if turn.delay_s > 0:
                await anyio.sleep(turn.delay_s)
            nvext = self.own_sessions(turn.nvext)
            if turn.prompt_ids is not None:
                path = "/v1/completions"
                body = completion_body(self.options, list(turn.prompt_ids), turn.max_tokens, nvext)
            else:
                messages.append({"role": "user", "content": turn.user or ""})
                path = "/v1/chat/completions"
                body = chat_body(self.options, messages, turn.max_tokens, nvext, tools)
            reply = await self.request(conv, index, path, body)
            if reply.record.error is not None:
                return
            if turn.prompt_ids is None and not await self.tool_rounds(
                conv, index, turn, nvext, messages, reply
            ):
                return
            if spawns.get(index):
                async with anyio.create_task_group() as tg:
                    for child in spawns[index]:
                        tg.start_soon(self.conversation, child, children, messages)

    async def tool_rounds(
        self,
        conv: Conversation,
        index: int,
        turn: Turn,
        nvext: dict[str, Any] | None,
        messages: list[dict[str, Any]],
        reply: Reply,
    ) -> bool:
        """Put ``reply`` into the history; while it carries tool calls, answer them and send the
        turn's next tool round (up to the limit). False when a round failed."""
        use = conv.tool_use
        round_ = 0
        while use is not None and reply.tool_calls:
            assistant = _assistant_calls(reply, index, round_)
            messages.append(assistant)
            messages.extend(_tool_messages(use, conv.key, index, round_, assistant["tool_calls"]))
            if round_ == use.max_rounds:
                return True
            round_ += 1
            pause = tool_pause(use, conv.key, index, round_)
            if pause > 0:
                await anyio.sleep(pause)
            self.started_requests += 1
            body = chat_body(
                self.options, messages, turn.max_tokens, _without_session_action(nvext), use.tools
            )
            reply = await self.request(conv, index, "/v1/chat/completions", body, tool_round=round_)
            if reply.record.error is not None:
                return False
        messages.append({"role": "assistant", "content": reply.text})
        return True

    async def closed_loop(self, units: Iterator[Unit], concurrency: int) -> None:
        async def lane() -> None:
            for unit in units:
                if not self.may_start(unit):
                    return
                await self.unit(unit)

        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(lane)

    async def at_times(self, units: list[tuple[float, Unit]]) -> None:
        async with anyio.create_task_group() as tg:
            for at, unit in units:
                if self.load.max_requests is not None and self.started_requests >= self.load.max_requests:
                    break
                if self.load.duration_s is not None and at >= self.load.duration_s:
                    break
                delay = at - (time.perf_counter() - self.origin)
                if delay > 0:
                    await anyio.sleep(delay)
                if not self.may_start(unit):
                    break
                tg.start_soon(self.unit, unit)


def _assistant_calls(reply: Reply, turn: int, round_: int) -> dict[str, Any]:
    """The assistant message of a reply with tool calls, as an agent sends it back; calls the
    server gave no id get one unique within the conversation."""
    calls = [
        {
            "id": call.id or f"call_{turn}_{round_}_{i}",
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for i, call in enumerate(reply.tool_calls)
    ]
    return {"role": "assistant", "content": reply.text or None, "tool_calls": calls}


def _tool_messages(
    use: ToolUse, conversation: str, turn: int, round_: int, calls: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    return [
        {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": tool_result(use, conversation, turn, round_, i, call["function"]["name"]),
        }
        for i, call in enumerate(calls)
    ]


def _without_session_action(nvext: dict[str, Any] | None) -> dict[str, Any] | None:
    if not nvext or "session_control" not in nvext:
        return nvext
    return {**nvext, "session_control": {"session_id": nvext["session_control"]["session_id"]}}


def arrival_times(workload: Workload, load: LoadSettings) -> list[tuple[float, Unit]] | None:
    """Start offsets for an open loop (Poisson) or recorded times; None means a closed loop."""
    if load.request_rate is not None:
        rng = random.Random(load.seed)
        at, out = 0.0, []
        for unit in workload.units:
            out.append((at, unit))
            at += rng.expovariate(load.request_rate)
        return out
    if load.concurrency is None and workload.timed:
        return [(unit.start_s or 0.0, unit) for unit in workload.units]
    return None


async def run_load(
    workload: Workload,
    url: str,
    options: ClientOptions,
    load: LoadSettings,
    on_record: Callable[[RequestRecord], None] | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> RunOutcome:
    """Send ``workload`` to ``url`` (the server's base URL, without ``/v1``) under ``load``;
    ``transport`` replaces the network (tests)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
    interrupted = False
    async with httpx.AsyncClient(
        base_url=url.rstrip("/"), limits=limits, timeout=options.timeout_s, transport=transport
    ) as client:
        run = _Run(workload, client, options, load, on_record)
        times = arrival_times(workload, load)
        async with anyio.create_task_group() as tg:

            async def watch_signals() -> None:
                nonlocal interrupted
                with anyio.open_signal_receiver(signal.SIGINT) as signals:
                    async for _ in signals:
                        interrupted = True
                        log.warning("interrupted: stopping and reporting what finished")
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(watch_signals)
            if times is None:
                await run.closed_loop(iter(workload.units), load.concurrency or 1)
            else:
                await run.at_times(times)
            tg.cancel_scope.cancel()
    return RunOutcome(records=run.records, interrupted=interrupted, wall_s=time.perf_counter() - run.origin)
