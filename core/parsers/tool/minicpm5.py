"""OpenBMB MiniCPM5 tool calls (vLLM's ``minicpm5``, tool_parsers/minicpm5xml_tool_parser.py).

Format: each call an XML ``function`` element naming the function, its arguments ``param``
elements (the tags are special tokens; a value may be wrapped in ``<![CDATA[...]]>``):

    Intro before.
    <function name="get_weather"><param name="city">上海</param><param name="date">2024-06-27</param></function>
    Outro after.

A call is read once its ``</function>`` arrives, and checked against the request's tools as vLLM
checks it: the function must be one of them; a ``param`` without a name, or a name given twice,
makes the block no call; parameters the tool's schema does not list are dropped, except that a
``properties`` or ``arguments`` parameter holding an object gives its members the schema lists;
every ``required`` parameter must be there. A block that fails is content, as it was written. A
value is typed by its parameter's schema: ``string`` keeps the text, anything else is read as
JSON or a Python literal when it spells one. The tokenizer's byte-level space and newline
(``Ġ``, ``Ċ``) are read as a space and a newline, and ``<functionname=`` / ``<paramname=`` as
their spaced spelling, everywhere in the output, as vLLM reads them.

Differs from vLLM: content around calls is kept (vLLM's unary reading drops it once a call is
made; its streaming keeps it); vLLM's renaming of some benchmark tools' calls (``enable_roaming``
-> ``toggle_roaming`` and the like) is not done; a ``</think>`` in the content is the reasoning
parser's business (vLLM keeps only what follows the last one when no call was made).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dyn.core.parsers.events import TOOL_CALL_END, Event, ToolCallArgs, ToolCallStart
from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.delimited import DelimitedToolParser
from dyn.core.parsers.tool.kv_arguments import value_text

CALL_START = "<function"
CALL_END = "</function>"

_HEAD = re.compile(r"""\s*name=(["'])([^"']+)\1[^>]*>""")
_PARAM = re.compile(r"""<param\s*name=(["'])([^"']*)\1\s*>(.*?)</param>""", re.DOTALL)
_PARAM_TAG = re.compile(r"<param\b[^>]*>")
_CDATA = re.compile(r"<!\[CDATA\[(.*)\]\]>", re.DOTALL)
_BAD_AMPERSAND = re.compile(r"&(?!(?:lt|gt|amp|quot|apos|#\d+|#x[0-9a-fA-F]+);)")
_ENTITY = re.compile(r"&(lt|gt|amp|quot|apos|#\d+|#x[0-9a-fA-F]+);")
_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}
_WRAPPERS = ("properties", "arguments")


@TOOL_PARSERS.register("minicpm5")
class MiniCPM5ToolParser(DelimitedToolParser):
    call_start = CALL_START
    call_end = CALL_END
    needs_special_tokens = True  # vLLM's adjust_request: the tags are special tokens

    def feed(self, text: str) -> list[Event]:
        return super().feed(text.replace("\u0120", " ").replace("\u010a", "\n"))

    def call_events(self, body: str, *, complete: bool, final: bool) -> list[Event]:
        if not complete:
            return [self.raw_call(body, complete=False)] if final else []
        body = body.replace("<functionname=", "<function name=").replace("<paramname=", "<param name=")
        read = self._read(body)
        if read is None:
            return [self.raw_call(body)]
        name, args = read
        return [ToolCallStart(name), ToolCallArgs(json.dumps(args, ensure_ascii=False)), TOOL_CALL_END]

    def _read(self, body: str) -> tuple[str, dict[str, Any]] | None:
        """The call a complete ``function`` element makes, or ``None`` when it makes none."""
        head = _HEAD.match(body)
        tool = self.tools.get(head.group(2).strip()) if head is not None else None
        if head is None or tool is None:
            return None
        schema = tool.parameters or {}
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        params = list(_PARAM.finditer(body, head.end()))
        if len(params) != len(_PARAM_TAG.findall(body, head.end())) or any(not p.group(2) for p in params):
            return None  # a param without a name
        xml = not any(_markup(p.group(3)) for p in params)
        args: dict[str, Any] = {}
        for param in params:
            key, text = param.group(2).strip(), _value_text(param.group(3), xml)
            if key in _WRAPPERS and properties and key not in properties:
                members = _literal(text)
                if not isinstance(members, dict):
                    return None
                pairs = [(k, v) for k, v in members.items() if k in properties]
                if not pairs:
                    return None
            elif properties and key not in properties:
                continue
            else:
                pairs = [(key, text)]
            for k, v in pairs:
                if k in args:
                    return None
                args[k] = _typed(v, properties.get(k))
        required = schema.get("required")
        if isinstance(required, list) and not set(required) <= set(args):
            return None
        return tool.name, args

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        def param(key: str, value: Any) -> str:
            text = value_text(value)
            if "<" in text or "&" in text:
                text = f"<![CDATA[{text}]]>"
            return f'<param name="{key}">{text}</param>'

        return "\n".join(
            f'{CALL_START} name="{c.name}">' + "".join(param(k, v) for k, v in c.args.items()) + CALL_END
            for c in calls
        )


def _markup(raw: str) -> bool:
    """The value holds markup that makes its block no well-formed XML (vLLM then falls back to
    reading it with patterns)."""
    return _CDATA.fullmatch(raw.strip()) is None and ("<" in raw or _BAD_AMPERSAND.search(raw) is not None)


def _value_text(raw: str, xml: bool) -> str:
    """A param's text: a CDATA section's content as it is; else, when the block is well-formed
    XML, the text with its entities read (as vLLM's XML reading gives it), otherwise trimmed (as
    its fallback reading does)."""
    cdata = _CDATA.fullmatch(raw.strip())
    if cdata is not None:
        return cdata.group(1)
    if not xml:
        return raw.strip()
    return _ENTITY.sub(_entity, raw)


def _entity(match: re.Match[str]) -> str:
    name = match.group(1)
    if name.startswith("#"):
        return chr(int(name[2:], 16) if name[1] == "x" else int(name[1:]))
    return _ENTITIES[name]


def _literal(text: str) -> Any:
    """The JSON value or Python literal ``text`` spells, else ``text``."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        value = ast.literal_eval(text)
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text
    return value


def _typed(value: Any, schema: Any) -> Any:
    if isinstance(schema, Mapping) and schema.get("type") == "string":
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return _literal(value) if isinstance(value, str) else value
