"""Python-style calls between a model's own tags: LiquidAI LFM2 / LFM2.5 (vLLM's ``lfm2``) and
Ai2 OLMo 3 (vLLM's ``olmo3``).

- LFM2 writes a Python list of calls between its special tokens ``<|tool_call_start|>`` and
  ``<|tool_call_end|>`` (LiquidAI/LFM2-1.2B's chat template), often with text after it::

      <|tool_call_start|>[get_candidate_status(candidate_id="12345")]<|tool_call_end|>Checking now.

- OLMo 3 writes its calls one per line, without brackets, between ``<function_calls>`` and
  ``</function_calls>`` (allenai/Olmo-3-7B-Instruct's chat template; vLLM's olmo3 parser)::

      <function_calls>get_weather(city='San Francisco', metric='celsius')
      get_time(tz='PST')</function_calls>

Values are Python literals, read with Python's ``ast`` and never evaluated, as the ``pythonic``
parser reads them; as in vLLM's reading of these models, JSON's ``true``, ``false`` and ``null``
are read too, and so are keywords that Python reserves (``from='NYC'``), integers written with
leading zeros (``007``) and strings holding raw newlines or tabs. Dotted function names
(``math.sqrt(x=2)``) keep their dots. Each call starts once ``name(`` is read and its arguments
stream one keyword at a time; an argument that is no keyword literal is left out. Text before the
opening tag and after the closing one is content; an opening tag followed by no call is content,
tag included.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.call_lists import CallListParser, CallListReader
from dyn.core.parsers.tool.pythonic import NotALiteral, PythonCallList, literal, python_literal

_CALL_HEAD = re.compile(r"\s*([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*\(")
_MAYBE_HEAD = re.compile(r"\s*(?:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\.?\s*)?")
_KEYWORD = re.compile(r"\s*([A-Za-z_]\w*)\s*=(?!=)(.*)", re.DOTALL)
_LEADING_ZEROS = re.compile(r"-?0+\d+")
_JSON_NAMES = {"true": True, "false": False, "null": None}
_RAW_CONTROLS = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})


class _JsonNames(ast.NodeTransformer):
    """Turns the names ``true``, ``false`` and ``null`` into the constants they mean in JSON."""

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in _JSON_NAMES:
            return ast.Constant(_JSON_NAMES[node.id])
        return node


def keyword_literal(text: str) -> tuple[str, Any] | None:
    """``(name, JSON value)`` of one ``name=literal`` argument (see the module), or ``None``."""
    match = _KEYWORD.fullmatch(text)
    if match is None:
        return None
    value = match.group(2).strip()
    candidates = [value]
    if _LEADING_ZEROS.fullmatch(value):
        candidates.append(str(int(value)))
    if value.translate(_RAW_CONTROLS) != value:
        candidates.append(value.translate(_RAW_CONTROLS))
    for candidate in candidates:
        try:
            tree = ast.parse(candidate, mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        try:
            return match.group(1), literal(_JsonNames().visit(tree))
        except (NotALiteral, RecursionError):
            return None
    return None


def python_calls(bracketed: bool) -> PythonCallList:
    """The reader of these formats: dotted names, arguments read by ``keyword_literal``, and an
    empty list is unreadable (content)."""
    return PythonCallList(
        bracketed, head=_CALL_HEAD, maybe_head=_MAYBE_HEAD, argument=keyword_literal, empty_list=False
    )


def python_call(call: ToolCall) -> str:
    """A call written as Python: ``name(key=literal, ...)``."""
    arguments = json.loads(call.arguments).items()
    return f"{call.name}(" + ", ".join(f"{k}={python_literal(v)}" for k, v in arguments) + ")"


@TOOL_PARSERS.register("lfm2")
class Lfm2ToolParser(CallListParser):
    markers = ("<|tool_call_start|>",)
    end_marker = "<|tool_call_end|>"
    needs_special_tokens = True  # vLLM's adjust_request: the markers are special tokens

    def reader(self, marker: str) -> CallListReader:
        return python_calls(bracketed=True)

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        return f"{cls.markers[0]}[{', '.join(python_call(c) for c in calls)}]{cls.end_marker}"


@TOOL_PARSERS.register("olmo3")
class Olmo3ToolParser(CallListParser):
    markers = ("<function_calls>",)
    end_marker = "</function_calls>"

    def reader(self, marker: str) -> CallListReader:
        return python_calls(bracketed=False)

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        lines = "\n".join(python_call(c) for c in calls)
        return f"{cls.markers[0]}{lines}{cls.end_marker}"
