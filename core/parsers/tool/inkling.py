"""Inkling output: typed blocks, reasoning and tool calls included (vLLM's ``inkling``,
parser/inkling.py).

Format (every marker a special token): the output is blocks, each opened by a marker naming its
kind and closed by ``<|end_message|>`` (or ``<|content_model_end_sampling|>``); a block may be
preceded by ``<|message_model|>`` and a header (the called function's name before a call), which
is no content. The template's generation prompt ends with ``<|message_model|>``:

    <|content_thinking|>I should check the weather.<|end_message|><|message_model|>
    <|content_text|>Let me check.<|end_message|><|message_model|>get_weather
    <|content_invoke_tool_json|>{"name":"get_weather","args":{"city":"SF"}}<|end_message|>

(one line in the output, wrapped here). ``<|content_thinking|>`` blocks are reasoning;
``<|content_text|>``, ``<|content_invoke_tool_text|>`` and ``<|content_tool_error|>`` blocks are
content; a ``<|content_invoke_tool_json|>`` block is a call, its ``name`` and its ``args`` (or
``arguments``/``parameters``) object. Text outside any block is content; a header not followed
by a block (the output was plain text) is content too.

Since the calls sit between reasoning blocks, this parser reads the whole output, reasoning
included (``emits_reasoning``), like vLLM's single Inkling engine; the ``inkling`` reasoning
parser reads the same blocks and leaves a call block as content, markers included. Where the
output starts follows the rendered prompt's last Inkling marker: inside a thinking block, a
text block, or a header (the default).

As vLLM: markers inside a thinking block other than a call's are part of the reasoning; the
whitespace that ends the reasoning is dropped; content that is only whitespace before a call is
dropped. Differs from vLLM: a call block that is no JSON call object is content (vLLM drops
it); ``arguments``/``parameters`` are read when ``args`` is missing (vLLM gives ``{}``).
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.events import Event, Reasoning, ToolCallArgs
from dyn.core.parsers.stream import BufferedParser
from dyn.core.parsers.text import find_first, split_held
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall, ToolParser
from dyn.core.parsers.tool.delimited import JsonCallBody, json_call

MESSAGE_MODEL = "<|message_model|>"
TEXT = "<|content_text|>"
THINKING = "<|content_thinking|>"
TOOL_JSON = "<|content_invoke_tool_json|>"
TOOL_TEXT = "<|content_invoke_tool_text|>"
TOOL_ERROR = "<|content_tool_error|>"
END_SAMPLING = "<|content_model_end_sampling|>"
END_MESSAGE = "<|end_message|>"

MARKERS = (MESSAGE_MODEL, TEXT, THINKING, TOOL_JSON, TOOL_TEXT, TOOL_ERROR, END_SAMPLING, END_MESSAGE)
_ENDS = (END_MESSAGE, END_SAMPLING)
_VISIBLE = (TEXT, TOOL_TEXT, TOOL_ERROR)

_HEADER, _CONTENT, _THINKING, _CALL = range(4)
"""After ``<|message_model|>`` (a header may follow), in a visible block or between blocks, in a
thinking block, in a call block."""


class _CallBody(JsonCallBody):
    """A call block's JSON object; read whole (keys in another order), its arguments must be an
    object."""

    def __init__(self) -> None:
        super().__init__("name", ("args", "arguments", "parameters"))

    def events(
        self, body: str, complete: bool, final: bool = False, name_key: str = "name"
    ) -> list[Event] | None:
        got = super().events(body, complete, final, name_key)
        if (
            got
            and not self._started
            and isinstance(args := got[1], ToolCallArgs)
            and not args.text.startswith("{")
        ):
            return None
        return got


class InklingBlocks(BufferedParser):
    """Reads Inkling's blocks (see the module); ``reads_calls``: a call block becomes a call,
    else it stays content, markers included. Subclasses call ``start_blocks`` when built."""

    reads_calls = True

    def start_blocks(self, prompt_text: str | None) -> None:
        last = max(((prompt_text or "").rfind(m), m) for m in MARKERS)
        self._state = {THINKING: _THINKING, TEXT: _CONTENT}.get(last[1], _HEADER) if last[0] >= 0 else _HEADER
        self._header = ""
        self._space = ""
        """Whitespace at the end of the reasoning so far: sent if more reasoning follows."""
        self._lead = ""
        """The content so far while it is only whitespace (``_seen`` false): dropped if a call
        follows."""
        self._seen = False
        self._body = ""
        self._call = _CallBody()

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            markers = _ENDS if self._state == _CALL else MARKERS
            hit = find_first(self._buf, markers)
            if hit is None:
                ready, self._buf = split_held(self._buf, markers, final)
                self._text(events, ready)
                if final:
                    self._end(events)
                return events
            at, marker = hit
            text, self._buf = self._buf[:at], self._buf[at + len(marker) :]
            self._text(events, text)
            self._marker(events, marker)

    def _text(self, events: list[Event], text: str) -> None:
        if not text:
            return
        if self._state == _HEADER:
            self._header += text
        elif self._state == _CONTENT:
            self._content(events, text)
        elif self._state == _THINKING:
            kept = text.rstrip()
            if kept:
                events.append(Reasoning(self._space + kept))
                self._space = ""
            self._space += text[len(kept) :]
        else:
            self._body += text
            self._call_events(events, complete=False, final=False)

    def _content(self, events: list[Event], text: str) -> None:
        self._space = ""
        if not self._seen:
            text = self._lead + text
            if text.isspace():
                self._lead = text
                return
            self._lead, self._seen = "", True
        events.append(text)

    def _marker(self, events: list[Event], marker: str) -> None:
        state = self._state
        if state == _CALL:  # an end marker
            self._call_events(events, complete=True, final=False, closing=marker)
            self._state = _CONTENT
        elif state == _THINKING and marker not in (THINKING, TOOL_JSON, *_ENDS):
            self._text(events, marker)  # literal inside the reasoning
        elif marker == MESSAGE_MODEL:
            self._header, self._state = "", _HEADER
        elif marker in _ENDS:
            if state == _HEADER and self._header:
                self._content(events, self._header)
            if state == _THINKING and marker == END_SAMPLING:
                self._space = ""
            self._header, self._state = "", _CONTENT
        else:  # a block opens; a header before it is dropped
            self._header = ""
            if marker == THINKING:
                self._state = _THINKING
            elif marker == TOOL_JSON:
                self._open_call(events)
            else:
                self._space, self._state = "", _CONTENT

    def _open_call(self, events: list[Event]) -> None:
        self._space, self._state, self._body = "", _CALL, ""
        if self.reads_calls:
            self._lead = ""
            self._call.reset()
        else:
            self._content(events, TOOL_JSON)

    def _call_events(self, events: list[Event], complete: bool, final: bool, closing: str = "") -> None:
        if not self.reads_calls:
            text, self._body = self._body + closing, ""
            if text:
                self._content(events, text)
            return
        got = self._call.events(self._body, complete, final)
        if got is None:
            self._content(events, TOOL_JSON + self._body + closing)
        else:
            events.extend(got)

    def _end(self, events: list[Event]) -> None:
        """The output ended: a header is content, a call is read as far as it got."""
        if self._state == _HEADER and self._header:
            self._content(events, self._header)
        elif self._state == _CALL and self.reads_calls:
            self._call_events(events, complete=False, final=True)
        if self._lead:
            events.append(self._lead)
        self._header = self._lead = self._space = ""


@TOOL_PARSERS.register("inkling")
class InklingToolParser(InklingBlocks, ToolParser):
    needs_special_tokens = True  # every marker is a special token
    emits_reasoning = True

    def __init__(self, tools: Sequence[Tool] = (), prompt_text: str | None = None) -> None:
        """``prompt_text``: the rendered prompt, when the caller has it (see the module)."""
        super().__init__(tools)
        self.start_blocks(prompt_text)

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        return MESSAGE_MODEL.join(f"{TOOL_JSON}{json_call(c, 'args')}{END_MESSAGE}" for c in calls)
