"""The output stage of a chat choice: its text -> content, ``reasoning_content`` and tool calls.

It sits between the incremental detokenizer and the response encoder. ``OutputPlan`` is decided
once per request (which reasoning parser, which tool-call parser or forced-call reader, whether
special tokens must stay in the text); each choice gets its own ``ChoiceOutput``, which runs the
reasoning parser first and the tool-call parser over the content it leaves.

``push``/``finish`` return ``OutputDelta``s for streaming: tool calls as OpenAI streams them (a
call's first delta has its ``index``, ``id``, ``type`` and ``function.name``; later ones add
``function.arguments`` pieces). The unary response is the same stage fed the whole text, read
with ``message()``. As in vLLM, a unary response whose last call was cut off (``max_tokens``)
returns the text as content and no calls, while a stream has already sent what it had. The
finish reason becomes ``tool_calls`` when a complete call was made and the engine stopped on its
own (``stop``); a forced named call keeps ``stop``, as OpenAI does.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.parsers.events import Reasoning, ToolCallArgs, ToolCallEnd, ToolCallStart
from dyn.core.parsers.forced import NamedToolCallParser, RequiredToolCallsParser
from dyn.core.parsers.reasoning import ReasoningParser
from dyn.core.parsers.tool import Tool, ToolParser
from dyn.core.protocol.openai import FunctionCallOut, ToolCallOut


class ToolCallDelta(NamedTuple):
    """One entry of a streamed ``delta.tool_calls``; ``id`` and ``name`` only in a call's first."""

    index: int  # type: ignore[assignment]  # OpenAI's name; hides tuple.index(), which nothing calls
    id: str | None
    name: str | None
    arguments: str


class OutputDelta(NamedTuple):
    content: str
    reasoning: str
    tool_calls: list[ToolCallDelta]


_NO_CALLS: list[ToolCallDelta] = []  # shared by content-only deltas; never mutated


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """How every choice of one chat request is read (see the module docstring)."""

    reasoning: type[ReasoningParser] | None = None
    tool_parser: type[ToolParser] | None = None
    tools: tuple[Tool, ...] = ()
    forced: str | None = None
    """``named`` or ``required`` for a forced tool choice (then ``tool_parser`` is unused)."""
    forced_name: str | None = None
    prompt_text: str | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None
    constrained: bool = False
    """The engine follows a grammar from the first token (see ``ReasoningParser.constrained``)."""
    tokenizer: Tokenizer | None = None
    """The served model's, for a tool-call or reasoning parser that ``takes_tokenizer``."""

    @property
    def needs_special_tokens(self) -> bool:
        return any(cls is not None and cls.needs_special_tokens for cls in (self.reasoning, self.tool_parser))

    def new(self) -> ChoiceOutput:
        if self.forced == "named":
            tools: ToolParser | None = NamedToolCallParser(self.forced_name or "")
        elif self.forced == "required":
            tools = RequiredToolCallsParser()
        elif self.tool_parser is None:
            tools = None
        else:
            # a parser that emits reasoning (gpt_oss) also takes the prompt, where the output starts
            # depending on it, and one that takes the tokenizer that; ToolParser's __init__ neither
            extra: dict[str, Any] = {}
            if self.tool_parser.emits_reasoning:
                extra["prompt_text"] = self.prompt_text
            if self.tool_parser.takes_tokenizer:
                extra["tokenizer"] = self.tokenizer
            tools = self.tool_parser(self.tools, **extra)
        reasoning = None
        # the instance decides: a parser may emit no reasoning for this model (hf: no thinking field)
        if self.reasoning is not None and not (tools is not None and tools.emits_reasoning):
            reasoning = self.reasoning(
                self.prompt_text,
                self.chat_template_kwargs,
                constrained=self.constrained,
                **({"tokenizer": self.tokenizer} if self.reasoning.takes_tokenizer else {}),
            )
        return ChoiceOutput(reasoning, tools, keep_stop=self.forced == "named")


class _Call:
    __slots__ = ("id", "name", "arguments", "complete")

    def __init__(self, call_id: str, name: str) -> None:
        self.id = call_id
        self.name = name
        self.arguments: list[str] = []
        self.complete = False


class ChoiceOutput:
    """One choice's output stage; keeps what it produced for ``message()``."""

    __slots__ = ("_reasoning", "_tools", "_keep_stop", "_content", "_thinking", "_raw", "calls")

    def __init__(
        self, reasoning: ReasoningParser | None, tools: ToolParser | None, keep_stop: bool = False
    ) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self._keep_stop = keep_stop
        self._content: list[str] = []
        self._thinking: list[str] = []
        self._raw: list[str] = []
        self.calls: list[_Call] = []

    def push(self, text: str) -> OutputDelta | None:
        """Read the next piece of text; the delta to stream now, or None."""
        if not text:
            return None
        events = self._reasoning.feed(text) if self._reasoning is not None else [text]
        if len(events) == 1 and type(events[0]) is str and self._tools is not None:
            # the common piece: plain text that stays plain content (no list-building below)
            piece = events[0]
            self._raw.append(piece)
            got = self._tools.feed(piece)
            if len(got) == 1 and type(got[0]) is str:
                self._content.append(got[0])
                return OutputDelta(got[0], "", _NO_CALLS)
            return self._tool_delta(got)
        return self._apply(events, final=False)

    def finish(self) -> OutputDelta | None:
        """The stream ended: what the parsers held back."""
        events = self._reasoning.finish() if self._reasoning is not None else []
        return self._apply(events, final=True)

    def _apply(self, events: Sequence[Any], final: bool) -> OutputDelta | None:
        content: list[str] = []
        reasoning: list[str] = []
        deltas: list[ToolCallDelta] = []
        tools = self._tools
        for event in events:
            if isinstance(event, Reasoning):
                reasoning.append(event.text)
            elif tools is None:
                content.append(event)
            else:
                self._raw.append(event)
                self._tool_events(tools.feed(event), content, reasoning, deltas)
        if final and tools is not None:
            self._tool_events(tools.finish(), content, reasoning, deltas)
        return self._delta(content, reasoning, deltas)

    def _delta(
        self, content: list[str], reasoning: list[str], deltas: list[ToolCallDelta]
    ) -> OutputDelta | None:
        if not (content or reasoning or deltas):
            return None
        text, thought = "".join(content), "".join(reasoning)
        if text:
            self._content.append(text)
        if thought:
            self._thinking.append(thought)
        return OutputDelta(text, thought, deltas)

    def _tool_delta(self, events: Sequence[Any]) -> OutputDelta | None:
        content: list[str] = []
        reasoning: list[str] = []
        deltas: list[ToolCallDelta] = []
        self._tool_events(events, content, reasoning, deltas)
        return self._delta(content, reasoning, deltas)

    def _tool_events(
        self, events: Sequence[Any], content: list[str], reasoning: list[str], deltas: list[ToolCallDelta]
    ) -> None:
        for event in events:
            if isinstance(event, str):
                content.append(event)
            elif isinstance(event, ToolCallArgs):
                call = self.calls[-1]
                call.arguments.append(event.text)
                last = deltas[-1] if deltas else None
                if last is not None and last.index == len(self.calls) - 1:
                    deltas[-1] = last._replace(arguments=last.arguments + event.text)
                else:
                    deltas.append(ToolCallDelta(len(self.calls) - 1, None, None, event.text))
            elif isinstance(event, ToolCallStart):
                call = _Call(event.id or f"call_{uuid.uuid4().hex[:24]}", event.name)
                self.calls.append(call)
                deltas.append(ToolCallDelta(len(self.calls) - 1, call.id, call.name, ""))
            elif isinstance(event, ToolCallEnd):
                self.calls[-1].complete = True
            elif isinstance(event, Reasoning):
                reasoning.append(event.text)

    # ------------------------------------------------------------------ unary

    @property
    def called(self) -> bool:
        """Tool calls were made, each complete."""
        return bool(self.calls) and all(call.complete for call in self.calls)

    def finish_reason(self, engine_reason: str) -> str:
        if engine_reason == "stop" and self.called and not self._keep_stop:
            return "tool_calls"
        return engine_reason

    def message(self) -> tuple[str | None, str | None, list[ToolCallOut]]:
        """(content, reasoning_content, tool_calls) of the whole choice."""
        reasoning = "".join(self._thinking) or None
        if any(not call.complete for call in self.calls):
            return "".join(self._raw) or None, reasoning, []
        calls = [ToolCallOut(c.id, FunctionCallOut(c.name, "".join(c.arguments))) for c in self.calls]
        return "".join(self._content) or None, reasoning, calls
