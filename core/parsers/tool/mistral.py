"""Mistral tool calls, in the two formats of mistral-common's tokenizers
(mistral_common/tokens/tokenizers/tools.py, ``decode_tool_calls``):

- v2 to v7 (Mistral-7B-Instruct-v0.3, Mixtral-8x22B, Mistral-Nemo, ...): one ``[TOOL_CALLS]``
  and a JSON array of ``{"name", "arguments"}`` objects::

      [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]

- v11 and later (Mistral-Small-3.x, Magistral, Devstral, Ministral-3): ``[TOOL_CALLS]`` before
  each call, then the name, maybe ``[CALL_ID]`` and the model's call id, ``[ARGS]`` and the
  arguments object (``[ARGS]`` is a control token, missing when the detokenizer skips it)::

      [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}

Text before the first ``[TOOL_CALLS]`` is content; ``[TOOL_CALLS]`` followed by one object
(Dynamo's reading) is a call too, and a ``[/TOOL_CALLS]`` after the calls is dropped. Mistral's
templates reject call ids that are not 9 letters and digits, so each call gets such an id, drawn
at random as vLLM does (the model's own ``[CALL_ID]`` when it is one).
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence

from dyn.core.parsers.events import TOOL_CALL_END, Event, ToolCallStart
from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.call_lists import CallListParser, CallListReader, skip_space
from dyn.core.parsers.tool.delimited import VerbatimJson
from dyn.core.parsers.tool.json_list import JsonCallList

_ID_CHARS = string.ascii_letters + string.digits
_NAME_CHARS = frozenset(_ID_CHARS + "_-")
_ARGS, _CALL_ID = "[ARGS]", "[CALL_ID]"


def new_call_id() -> str:
    """A Mistral call id: 9 random letters and digits."""
    return "".join(random.choices(_ID_CHARS, k=9))


def is_call_id(text: str) -> bool:
    return len(text) == 9 and text.isascii() and text.isalnum()


class MistralCalls(CallListReader):
    """What follows one ``[TOOL_CALLS]``: a JSON array (or object) of calls, or one v11 call."""

    def __init__(self) -> None:
        super().__init__()
        self._json: JsonCallList | None = None
        self._head_at = -1
        self._args_at = -1
        self._args = VerbatimJson()

    def read(self, text: str, final: bool) -> list[Event]:
        if self._json is None and self._head_at < 0:
            pos = skip_space(text, 0)
            if pos == len(text):
                self.failed = final
                return []
            if text[pos] in "[{":
                self._json = JsonCallList(array=None)
            else:
                self._head_at = pos
        if self._json is not None:
            events: list[Event] = [
                ToolCallStart(e.name, new_call_id()) if isinstance(e, ToolCallStart) else e
                for e in self._json.read(text, final)
            ]
            self.calls, self.end, self.failed = self._json.calls, self._json.end, self._json.failed
            return events
        events = []
        if self._args_at < 0:
            head = self._read_head(text, final)
            if head is None:
                return events
            name, call_id, self._args_at = head
            self.calls = 1
            events.append(ToolCallStart(name, call_id if is_call_id(call_id) else new_call_id()))
        end = self._args.send(text[self._args_at :], events)
        if end >= 0:
            events.append(TOOL_CALL_END)
            self.end = self._args_at + end
        elif final:
            self.end = len(text)
        return events

    def _read_head(self, text: str, final: bool) -> tuple[str, str, int] | None:
        """``(name, call id, where the arguments start)`` once the head up to the arguments'
        ``{`` is read; ``None`` while it is not (``failed`` set when it cannot be)."""
        n = len(text)
        pos = self._head_at
        while pos < n and text[pos] in _NAME_CHARS:
            pos += 1
        name = text[self._head_at : pos]
        call_id = ""
        pos = skip_space(text, pos)
        if name and text.startswith(_CALL_ID, pos):
            at = pos = pos + len(_CALL_ID)
            while pos < n and text[pos] in _NAME_CHARS:
                pos += 1
            call_id = text[at:pos]
        if name and text.startswith(_ARGS, pos):
            pos = skip_space(text, pos + len(_ARGS))
        if pos < n:
            if name and text[pos] == "{":
                return name, call_id, pos
            if not (name and (_ARGS.startswith(text[pos:]) or _CALL_ID.startswith(text[pos:]))):
                self.failed = True
                return None
        self.failed = final
        return None


@TOOL_PARSERS.register("mistral")
class MistralToolParser(CallListParser):
    markers = ("[TOOL_CALLS]",)
    end_marker = "[/TOOL_CALLS]"
    needs_special_tokens = True  # vLLM's adjust_request (without mistral-common's tokenizer)

    def reader(self, marker: str) -> CallListReader:
        return MistralCalls()

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        """The v11+ format (Mistral's current models)."""
        return "".join(f"[TOOL_CALLS]{c.name}[ARGS]{c.arguments}" for c in calls)
