"""Python-style tool calls: a Python list of calls with keyword arguments, values literals
(Llama 3.2 / 3.3 zero-shot function calling, llama-models models/llama3_3/prompt_format.md;
Llama 4, which may wrap the list in ``<|python_start|>`` ... ``<|python_end|>``; ToolACE):

    [get_weather(city='San Francisco', metric='celsius'), get_weather(city='Seattle')]

The list is parsed with Python's ``ast``, never evaluated: only literals are read (strings,
numbers, booleans, ``None``, lists, tuples, dicts of them). Each call starts once ``name(`` is
read and its arguments stream as a JSON object, one keyword at a time (``{"city": "San
Francisco"`` ... ``, "metric": "celsius"`` ... ``}``); an argument that is no keyword literal
(``f(x)``, ``f(a=b)``) is left out, as Dynamo does (vLLM then reads the whole output as text).

vLLM reads calls only when the output starts with ``[`` (or ``<|python_start|>``); this parser
also reads a list that opens later, as Dynamo does, when it opens like a call (``[name(``), so
text before the calls is content; so is text after them.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from dyn.core.parsers.events import TOOL_CALL_END, Event, ToolCallArgs, ToolCallStart
from dyn.core.parsers.text import find_first, marker_tail
from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.call_lists import CallListParser, CallListReader
from dyn.core.parsers.tool.cursor_list import CursorListReader

_CALL_OPENING = re.compile(r"\[\s*[A-Za-z_]\w*\s*\(")
_MAYBE_OPENING = re.compile(r"\[\s*(?:[A-Za-z_]\w*\s*)?")
_CALL_HEAD = re.compile(r"\s*([A-Za-z_]\w*)\s*\(")
_MAYBE_HEAD = re.compile(r"\s*(?:[A-Za-z_]\w*\s*)?")

_OPEN, _NEXT, _ARGS, _AFTER = 0, 1, 2, 3
"""Before the list's ``[``; where a call (or the list's end) is due; inside a call's
parentheses; after a call (``,`` or ``]`` is due)."""


class NotALiteral(ValueError):
    """An argument value that is not a literal this parser reads."""


def literal(node: ast.expr) -> Any:
    """The JSON value of a Python literal's syntax tree; ``NotALiteral`` for anything else."""
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, (str, bool, int)):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
        raise NotALiteral(repr(value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
        raise NotALiteral("a sign before no number")
    if isinstance(node, (ast.List, ast.Tuple)):
        return [literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise NotALiteral("** in a dict")
        keys = [literal(k) for k in node.keys if k is not None]  # None (**) was refused above
        if not all(isinstance(k, (str, int, float, bool)) or k is None for k in keys):
            raise NotALiteral("a dict key that JSON cannot hold")
        return dict(zip(keys, (literal(v) for v in node.values)))
    raise NotALiteral(type(node).__name__)


def keyword_argument(text: str) -> tuple[str, Any] | None:
    """``(name, JSON value)`` of one ``name=literal`` argument, or ``None``."""
    try:
        tree = ast.parse(f"f({text})", mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree, ast.Call) or tree.args or len(tree.keywords) != 1:
        return None
    keyword = tree.keywords[0]
    if keyword.arg is None:
        return None
    try:
        return keyword.arg, literal(keyword.value)
    except (NotALiteral, RecursionError):
        return None


def python_literal(value: Any) -> str:
    """A JSON value written as the Python literal a model writes."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{python_literal(k)}: {python_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    return repr(value)


class ArgumentScanner:
    """Finds, in the text of a call's arguments as it grows, where each top-level argument
    ends (a ``,`` or the closing ``)``), skipping brackets and Python strings (quotes,
    triple quotes, backslash escapes); resumes where it stopped."""

    __slots__ = ("depth", "pos", "quote")

    def __init__(self, pos: int) -> None:
        self.pos = pos
        self.depth = 0
        self.quote = ""

    def next_stop(self, text: str, final: bool) -> int:
        """The index of the next top-level ``,`` or ``)`` at or after ``pos``, or -1 while
        the text does not say yet (a quote at the very end may be one of three)."""
        n = len(text)
        pos = self.pos
        while pos < n:
            char = text[pos]
            if self.quote:
                if char == "\\":
                    if pos + 1 >= n:
                        break
                    pos += 2
                    continue
                if char == self.quote[0]:
                    if len(self.quote) == 1:
                        self.quote = ""
                    elif text.startswith(self.quote, pos):
                        self.quote = ""
                        pos += 3
                        continue
                    elif n - pos < 3 and not final:
                        break
                pos += 1
                continue
            if char in "'\"":
                if text.startswith(char * 3, pos):
                    self.quote = char * 3
                    pos += 3
                    continue
                if n - pos < 3 and not final:
                    break
                self.quote = char
            elif char in "([{":
                self.depth += 1
            elif char in ")]}":
                if self.depth == 0:
                    self.pos = pos
                    return pos
                self.depth -= 1
            elif char == "," and self.depth == 0:
                self.pos = pos
                return pos
            pos += 1
        self.pos = pos
        return -1


class PythonCallList(CursorListReader):
    """Reads Python calls ``name(key=literal, ...)``: a list from its ``[`` on (``[f(), g()]``,
    see the module), or (``bracketed=False``) calls one after another, separated by commas or
    whitespace, up to the first text that is no call. A format configures what starts a call
    (``head``; ``maybe_head``: what may still become one), how one argument is read
    (``argument``: ``(key, JSON value)`` of a stripped ``key=literal``, or None) and whether an
    empty list ``[]`` is a list of no calls (``empty_list``) or unreadable."""

    def __init__(
        self,
        bracketed: bool = True,
        *,
        head: re.Pattern[str] = _CALL_HEAD,
        maybe_head: re.Pattern[str] = _MAYBE_HEAD,
        argument: Callable[[str], tuple[str, Any] | None] = keyword_argument,
        empty_list: bool = True,
    ) -> None:
        super().__init__()
        self.bracketed = bracketed
        self._empty_list = empty_list
        self._head = head
        self._maybe_head = maybe_head
        self._argument = argument
        self._phase = _OPEN
        self._scanner = ArgumentScanner(0)
        self._sent_any = False

    def in_call(self) -> bool:
        return self._phase == _ARGS

    def read_call(self, text: str, final: bool, events: list[Event]) -> bool:
        return self._read_arguments(text, final, events)

    def read_between(self, text: str, pos: int, final: bool, events: list[Event]) -> bool:
        char = text[pos]
        if self._phase == _OPEN:
            if not self.bracketed:
                self._phase = _NEXT
            elif char == "[":
                self._pos = pos + 1
                self._phase = _NEXT
            else:
                self.failed = True
        elif self.bracketed and char == "]" and (self.calls or self._empty_list):
            self.end = pos + 1
        elif self._phase == _AFTER and char == ",":
            self._pos = pos + 1
            self._phase = _NEXT
        elif self._phase == _NEXT or not self.bracketed:
            if not self._start_call(text, pos, final, events):
                return False
        else:
            self._stop()
        return True

    def _start_call(self, text: str, pos: int, final: bool, events: list[Event]) -> bool:
        """Starts the call at ``pos``; ``False`` while the text may still become one."""
        head = self._head.match(text, pos)
        if head is None:
            if not final and self._maybe_head.fullmatch(text, pos):
                return False
            self._stop()
            return True
        events.append(ToolCallStart(head.group(1)))
        self.calls += 1
        self._sent_any = False
        self._scanner = ArgumentScanner(head.end())
        self._pos = head.end()
        self._phase = _ARGS
        return True

    def _read_arguments(self, text: str, final: bool, events: list[Event]) -> bool:
        """Reads the current call's next argument; ``False`` while the text does not say more
        (a call cut off by the end of the stream ends the list there, without its end)."""
        stop = self._scanner.next_stop(text, final)
        if stop < 0:
            if final:
                self.end = len(text)
            return False
        argument = text[self._pos : stop].strip()
        read = self._argument(argument) if argument else None
        if read is not None:
            key, value = read
            piece = json.dumps(key) + ": " + json.dumps(value, ensure_ascii=False)
            events.append(ToolCallArgs((", " if self._sent_any else "{") + piece))
            self._sent_any = True
        self._scanner.pos = self._pos = stop + 1
        if text[stop] == ")":
            events.append(ToolCallArgs("}" if self._sent_any else "{}"))
            events.append(TOOL_CALL_END)
            self._last_end = stop + 1
            self._phase = _AFTER
        return True


@TOOL_PARSERS.register("pythonic", "llama4_pythonic")
class PythonicToolParser(CallListParser):
    markers = ("<|python_start|>",)
    end_marker = "<|python_end|>"

    def reader(self, marker: str) -> CallListReader:
        return PythonCallList()

    def find_opening(self, text: str, at_start: bool) -> tuple[int, str] | int:
        hit = find_first(text, self.markers)
        call = _CALL_OPENING.search(text)
        if call is not None and (hit is None or call.start() < hit[0]):
            return call.start(), ""
        if hit is not None:
            return hit
        keep = marker_tail(text, self.markers)
        bracket = text.rfind("[")
        if bracket >= 0 and _MAYBE_OPENING.fullmatch(text, bracket):
            keep = max(keep, len(text) - bracket)
        return keep

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        def call(c: ToolCall) -> str:
            arguments = json.loads(c.arguments).items()
            return f"{c.name}(" + ", ".join(f"{k}={python_literal(v)}" for k, v in arguments) + ")"

        return "[" + ", ".join(call(c) for c in calls) + "]"
