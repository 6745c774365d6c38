"""GigaChat 3 and 3.1 tool calls (vLLM's ``gigachat3``): ai-sage/GigaChat3-10B-A1.8B and its kin.

Format (the models' chat templates, GigaChat3-10B-A1.8B.jinja and GigaChat3.1-10B-A1.8B.jinja):
every message is ``ROLE<|role_sep|>\\n`` + its text + ``<|message_sep|>\\n\\n`` (both markers special
tokens). GigaChat 3 writes its one call as a message of its own, of the role ``function call``,
after the assistant's text; GigaChat 3.1 writes it inside the assistant's message after
``<|function_call|>``. The call is a JSON object with ``name`` and ``arguments``:

    I'll remember that.<|message_sep|>

    function call<|role_sep|>
    {"name": "manage_user_memory", "arguments": {"action": "create", "id": "test"}}

    I'll remember that.<|function_call|>{"name": "manage_user_memory", "arguments": {"id": "test"}}

A call opens at ``function call<|role_sep|>`` or ``<|function_call|>``; its arguments (an object)
stream verbatim once the name is read, as the JSON-list formats do (``json_list.CallObject``). An
object without arguments, or whose arguments are no object, is no call: it stays content, as does
a body that is no JSON. ``<|message_sep|>`` and the newlines after it are dropped from the
content, and so is an end-of-text ``</s>`` right after the call.

Where dyn's reading differs from vLLM's: vLLM re-serialises the arguments (``json.dumps``) where
they stream verbatim here; it drops all text after the first ``<|message_sep|>``, where only the
marker is dropped here; and a later call would be read here too (the templates write one).
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.events import Event
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.call_lists import CallListParser, CallListReader
from dyn.core.parsers.tool.content_markers import ContentMarkers
from dyn.core.parsers.tool.delimited import json_call
from dyn.core.parsers.tool.json_list import JsonCallList

MESSAGE_SEP = "<|message_sep|>"
FUNCTION_CALL_ROLE = "function call<|role_sep|>"
FUNCTION_CALL = "<|function_call|>"
END_OF_TEXT = "</s>"


@TOOL_PARSERS.register("gigachat3")
class GigaChat3ToolParser(CallListParser):
    markers = (FUNCTION_CALL_ROLE, FUNCTION_CALL)
    end_marker = END_OF_TEXT
    needs_special_tokens = True  # vLLM's adjust_request: <|role_sep|> and the rest are special tokens

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        super().__init__(tools)
        self._separators = ContentMarkers((MESSAGE_SEP,), after="\n")

    def reader(self, marker: str) -> CallListReader:
        return JsonCallList(array=False)

    def feed(self, text: str) -> list[Event]:
        return self._separators.apply(super().feed(text))

    def finish(self) -> list[Event]:
        return self._separators.apply(super().finish(), final=True)

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        return "".join(f"{MESSAGE_SEP}\n\n{FUNCTION_CALL_ROLE}\n{json_call(c)}" for c in calls)
