"""Kimi K3 tool calls in XTML (vLLM's ``kimi_k3``).

Format (vLLM's kimi_k3_tool_parser.py and SGLang's kimik3 structural tag, from the model's chat
template): the answer and the calls are channels opened by ``<|open|>NAME<|sep|>`` and closed
by ``<|close|>NAME<|sep|>``, the three markers special tokens. The ``tools`` channel follows the
``response`` channel and holds one ``call`` per tool call; each argument is an element whose
``type`` says how its text reads: ``string`` is the text as it is (no escaping), any other type
(``number``, ``boolean``, ``array``, ``object``, ``null``) is JSON.

    <|open|>response<|sep|>Let me check.<|close|>response<|sep|><|open|>tools<|sep|>
    <|open|>call tool="get_weather" index="1"<|sep|>
    <|open|>argument key="city" type="string"<|sep|>Beijing<|close|>argument<|sep|>
    <|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>
    <|close|>call<|sep|><|close|>tools<|sep|>

(one line in the output; wrapped here). Attribute values escape ``&`` and ``"`` as ``&amp;``
and ``&quot;``.

The content is the response channel with its markers dropped (the prompt often opens it, so
the output may start with its text), and ``<|close|>message<|sep|>`` is dropped too, as vLLM
does. A call starts once its ``tool`` attribute is read; its arguments stream one member per
complete argument and close with ``<|close|>call<|sep|>``. A string value that itself holds
``<|close|>argument<|sep|>`` cannot be told from the argument's end (the format has no escape).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from dyn.core.parsers.events import Event
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.content_markers import ContentMarkers
from dyn.core.parsers.tool.kv_arguments import MemberCalls
from dyn.core.parsers.tool.sectioned import SectionedToolParser

OPEN, CLOSE, SEP = "<|open|>", "<|close|>", "<|sep|>"
TOOLS_OPEN = f"{OPEN}tools{SEP}"
TOOLS_CLOSE = f"{CLOSE}tools{SEP}"
RESPONSE_OPEN = f"{OPEN}response{SEP}"
RESPONSE_CLOSE = f"{CLOSE}response{SEP}"
MESSAGE_CLOSE = f"{CLOSE}message{SEP}"
CALL_OPEN = f"{OPEN}call"
CALL_CLOSE = f"{CLOSE}call{SEP}"

_UNTIL_SEP = r"((?:(?!<\|sep\|>)[^\n])*?)"
_HEAD = re.compile(r"\s+" + _UNTIL_SEP + re.escape(SEP))
_ARGUMENT = re.compile(
    re.escape(f"{OPEN}argument")
    + r"\s+"
    + _UNTIL_SEP
    + re.escape(SEP)
    + r"(.*?)"
    + re.escape(f"{CLOSE}argument{SEP}"),
    re.DOTALL,
)
_ATTRIBUTE = re.compile(r'(\w+)="([^"]*)"')

_XTML_TYPES = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}


def attributes(text: str) -> dict[str, str]:
    """The ``key="value"`` attributes of a tag, their escapes undone."""
    return {
        m.group(1): m.group(2).replace("&quot;", '"').replace("&amp;", "&") for m in _ATTRIBUTE.finditer(text)
    }


def _escape(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;")


def argument_value(kind: str, text: str) -> Any:
    """An argument's value: the text for ``string``, else its JSON (the text when it is none)."""
    if kind == "string":
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


@TOOL_PARSERS.register("kimi_k3")
class KimiK3ToolParser(MemberCalls, SectionedToolParser):
    section_starts = (TOOLS_OPEN,)
    section_ends = (TOOLS_CLOSE,)
    call_start = CALL_OPEN
    call_end = CALL_CLOSE
    needs_special_tokens = True  # <|open|>, <|close|> and <|sep|> are special tokens
    member_pattern = _ARGUMENT

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        super().__init__(tools)
        self._markers = ContentMarkers((RESPONSE_OPEN, RESPONSE_CLOSE, MESSAGE_CLOSE))

    def feed(self, text: str) -> list[Event]:
        return self._markers.apply(super().feed(text))

    def finish(self) -> list[Event]:
        return self._markers.apply(super().finish(), final=True)

    def call_head(self, body: str, complete: bool) -> tuple[str, int] | None:
        head = _HEAD.match(body)
        name = attributes(head.group(1)).get("tool") if head is not None else None
        return None if head is None or not name else (name, head.end())

    def member(self, argument: re.Match[str]) -> tuple[str, Any]:
        """(key, value) of an ``argument`` element."""
        attrs = attributes(argument.group(1))
        return attrs.get("key", ""), argument_value(attrs.get("type", "string"), argument.group(2))

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        def argument(key: str, value: Any) -> str:
            kind = "null" if value is None else _XTML_TYPES.get(type(value), "string")
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            return f'{OPEN}argument key="{_escape(key)}" type="{kind}"{SEP}{text}{CLOSE}argument{SEP}'

        body = "".join(
            f'{CALL_OPEN} tool="{_escape(c.name)}" index="{i}"{SEP}'
            + "".join(argument(k, v) for k, v in c.args.items())
            + CALL_CLOSE
            for i, c in enumerate(calls, 1)
        )
        return f"{TOOLS_OPEN}{body}{TOOLS_CLOSE}"
