"""Cohere Command A tool calls (vLLM's ``cohere_command3``) and those of the later Command models
whose template also writes ``<|START_TEXT|>`` (``cohere_command4``), which vLLM reads with
Cohere's ``cohere_melody`` filter.

Format (the models' chat templates, cohere-ai/melody ``gen/templates/jinja/cmd3-hf.jinja`` and
``cmd4-hf.jinja``; melody's ``cmd3`` / ``cmd4`` presets): the output is sections opened and
closed by special tokens. ``<|START_THINKING|>`` ... ``<|END_THINKING|>`` is the reasoning (or
the plan before calls); ``<|START_RESPONSE|>`` ... ``<|END_RESPONSE|>`` (Command 4 also
``<|START_TEXT|>`` ... ``<|END_TEXT|>``) the answer; ``<|START_ACTION|>`` ... ``<|END_ACTION|>``
a JSON array of calls, each with the model's ``tool_call_id``, the ``tool_name`` and its
``parameters``:

    <|START_THINKING|>I will look up the weather in Paris.<|END_THINKING|><|START_ACTION|>[
        {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}
    ]<|END_ACTION|>

Like melody, this parser reads the whole output, reasoning included (``emits_reasoning``; there
is no separate Cohere reasoning parser): text after ``<|END_THINKING|>`` and outside any section
is the answer; text after an end of the answer or of the calls is dropped; whitespace before a
section marker and at the end is dropped; the grounding tags around cited spans (``<co>span</co:
0:[1,2]>``) are dropped, their span kept (the citations themselves are Cohere's API's, not
OpenAI's). Command 3 starts in the answer, Command 4 in the reasoning (its prompt opens it), as
melody does; given the rendered prompt, the output starts in the reasoning exactly when the
prompt ends with ``<|START_THINKING|>``.

A call starts once its ``tool_name`` is read, with ``tool_call_id`` as its id when it comes
first (as the template writes it); its parameters stream verbatim. An action block that is no
list of calls is content, markers included.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import ClassVar

from dyn.core.parsers.events import Event, Reasoning, ToolCallStart
from dyn.core.parsers.stream import BufferedParser
from dyn.core.parsers.text import find_first, split_held
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall, ToolParser
from dyn.core.parsers.tool.json_list import CallObject, JsonCallList

THINKING_START = "<|START_THINKING|>"
THINKING_END = "<|END_THINKING|>"
RESPONSE_START = "<|START_RESPONSE|>"
RESPONSE_END = "<|END_RESPONSE|>"
TEXT_START = "<|START_TEXT|>"
TEXT_END = "<|END_TEXT|>"
ACTION_START = "<|START_ACTION|>"
ACTION_END = "<|END_ACTION|>"
CITATION_START = "<co>"
CITATION_END = "</co:"

_ANSWER, _THINKING, _DROPPED, _ACTION, _RAW_ACTION = range(5)

_CALL_ID = re.compile(r'\s*\{\s*"tool_call_id"\s*:\s*("(?:[^"\\]|\\.)*")')


def _call_id(body: str) -> str | None:
    """The ``tool_call_id`` that opens a call object, if it does."""
    match = _CALL_ID.match(body)
    try:
        call_id = json.loads(match.group(1)) if match is not None else None
    except ValueError:
        return None
    return call_id or None


class _CohereCall(CallObject):
    """A call object of Cohere's: ``tool_name`` and ``parameters``; ``tool_call_id`` (when it is
    the first key) becomes the call's id."""

    def __init__(self) -> None:
        super().__init__("tool_name", ("parameters",))

    def events(
        self, body: str, complete: bool, final: bool = False, name_key: str = "tool_name"
    ) -> list[Event] | None:
        got = super().events(body, complete, final, "tool_name")
        if got and isinstance(got[0], ToolCallStart):
            got[0] = ToolCallStart(got[0].name, _call_id(body))
        return got


class _CohereCallList(JsonCallList):
    """The action block's JSON array (or a single object) of Cohere's call objects."""

    def __init__(self) -> None:
        super().__init__(array=None)
        self._object = _CohereCall()  # JsonCallList reads each element with this object


class CohereCommandToolParser(BufferedParser, ToolParser):
    """The Cohere Command section format; subclasses name their markers (see the module)."""

    needs_special_tokens = True  # the section markers are special tokens (melody needs them)
    emits_reasoning = True
    sections: ClassVar[dict[str, int]] = {
        THINKING_START: _THINKING,
        THINKING_END: _ANSWER,
        RESPONSE_START: _ANSWER,
        RESPONSE_END: _DROPPED,
        ACTION_START: _ACTION,
        ACTION_END: _DROPPED,
    }
    starts_thinking: ClassVar[bool] = False
    """Where the output starts when the prompt is not known (melody's preset)."""

    def __init__(self, tools: Sequence[Tool] = (), prompt_text: str | None = None) -> None:
        """``prompt_text``: the rendered prompt, when the caller has it (see the module)."""
        super().__init__(tools)
        if prompt_text is None:
            thinking = self.starts_thinking
        else:
            thinking = prompt_text.rstrip().endswith(THINKING_START)
        self._mode = _THINKING if thinking else _ANSWER
        self._markers = tuple(self.sections)
        self._text_markers = (*self._markers, CITATION_START, CITATION_END)
        self._space = ""
        """Whitespace at the end of the text so far, sent once more text follows."""
        self._action = ""
        self._calls = _CohereCallList()

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            text_mode = self._mode in (_ANSWER, _THINKING)
            markers = self._text_markers if text_mode else self._markers
            buf = self._buf
            hit = find_first(buf, markers)
            if hit is None:
                ready, self._buf = split_held(buf, markers, final)
                self._text(events, ready, final)
                return events
            at, marker = hit
            self._text(events, buf[:at], final=False)
            rest = buf[at + len(marker) :]
            if marker == CITATION_START:
                self._buf = rest
            elif marker == CITATION_END:
                close = rest.find(">")
                if close >= 0:
                    self._buf = rest[close + 1 :]
                elif final:
                    self._buf = ""
                    self._text(events, marker + rest, final)
                else:
                    self._buf = marker + rest
                    return events
            else:
                self._buf = rest
                self._section(events, marker)

    def _text(self, events: list[Event], text: str, final: bool) -> None:
        """Text of the current section, up to the next marker."""
        mode = self._mode
        if mode == _ACTION:
            self._action += text
            self._read_calls(events, final=final, closing="")
        elif mode == _RAW_ACTION:
            if text:
                events.append(text)
        elif mode != _DROPPED:
            text = self._space + text
            kept = text.rstrip()
            self._space = "" if final else text[len(kept) :]
            if kept:
                events.append(kept if mode == _ANSWER else Reasoning(kept))

    def _section(self, events: list[Event], marker: str) -> None:
        """A section marker: the current section ends, the marker's begins."""
        if self._mode == _ACTION:
            self._read_calls(events, final=True, closing=marker)
        elif self._mode == _RAW_ACTION and marker == ACTION_END:
            events.append(marker)
        self._space = ""
        self._mode = self.sections[marker]
        if self._mode == _ACTION:
            self._action = ""
            self._calls = _CohereCallList()

    def _read_calls(self, events: list[Event], final: bool, closing: str) -> None:
        """Read the action block so far; ``final``: it ended (``closing``: the marker that
        ended it, or none when the stream did)."""
        calls = self._calls
        got = calls.read(self._action, final)
        if not calls.failed:
            events.extend(got)
            return
        events.append(ACTION_START + self._action + (ACTION_END if closing == ACTION_END else ""))
        self._mode = _RAW_ACTION

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        items = ",".join(
            f'\n    {{"tool_call_id": "{c.id if c.id and c.id.isdigit() else i}", '
            f'"tool_name": {json.dumps(c.name)}, "parameters": {c.arguments}}}'
            for i, c in enumerate(calls)
        )
        return f"{ACTION_START}[{items}\n]{ACTION_END}"


@TOOL_PARSERS.register("cohere_command3")
class CohereCommand3ToolParser(CohereCommandToolParser):
    """Command A (melody's ``cmd3``): the output starts in the answer."""


@TOOL_PARSERS.register("cohere_command4")
class CohereCommand4ToolParser(CohereCommandToolParser):
    """Command A Reasoning and later (melody's ``cmd4``): ``<|START_TEXT|>`` sections too, and the
    output starts in the reasoning."""

    sections = {**CohereCommandToolParser.sections, TEXT_START: _ANSWER, TEXT_END: _DROPPED}
    starts_thinking = True
