"""MiniMax tool calls: MiniMax-M2 / M2.1 (vLLM's ``minimax_m2``) and MiniMax-M3 (vLLM's
``minimax_m3``).

MiniMax-M2 (the model's chat template, MiniMaxAI/MiniMax-M2 ``chat_template.jinja``, and its
tool-calling guide): a ``<minimax:tool_call>`` block of ``invoke`` elements, one per call, each
parameter an element whose text is the value; text before the block is content.

    Let me check.
    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Seattle</parameter>
    <parameter name="days">3</parameter>
    </invoke>
    </minimax:tool_call>

A value is the text between ``<parameter name="...">`` and ``</parameter>`` (or the next
``<parameter name=``), kept as written, and typed by the tool's schema as vLLM's parser engine
does (``schema_values.coerce``: ``3`` is a number where the schema says so, text where the
tool does not list the parameter). The name may be quoted with ``"`` or ``'`` or bare. The call
starts when the invoke's name is read; the arguments object streams one member per complete
parameter and is closed by ``</invoke>``.

MiniMax-M3 (vLLM's ``minimax_m3`` and its chat template): the same block, but every tag is
preceded by the marker ``]<]minimax[>[`` (plain text, not a special token) and parameters are
elements named after the argument, which nest: an element holding elements is an object, or an
array where the schema says so (the template writes list items as ``<item>``); an element
repeated at one level collects into a list; an empty element is an empty array or object when
the schema asks for one.

    ]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="create_order">
    ]<]minimax[>[<user_id>42]<]minimax[>[</user_id>
    ]<]minimax[>[<items>
    ]<]minimax[>[<item>]<]minimax[>[<sku>book-001]<]minimax[>[</sku>]<]minimax[>[</item>
    ]<]minimax[>[</items>
    ]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

Because a later element can turn an earlier value into a list, an M3 call's arguments are sent
once its ``</invoke>`` is read, as vLLM does; a call cut off before it has its name only.
Elements after the first one that is malformed or unclosed are left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dyn.core.parsers.events import TOOL_CALL_END, Event, ToolCallArgs
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.kv_arguments import MemberCalls, value_text
from dyn.core.parsers.tool.schema_values import coerce, schema_types
from dyn.core.parsers.tool.sectioned import SectionedToolParser

M2_BEGIN = "<minimax:tool_call>"
M2_END = "</minimax:tool_call>"
M2_INVOKE = "<invoke name="
M2_INVOKE_END = "</invoke>"

NS = "]<]minimax[>["
M3_BEGIN = f"{NS}<tool_call>"
M3_END = f"{NS}</tool_call>"
M3_INVOKE = f"{NS}<invoke name="
M3_INVOKE_END = f"{NS}</invoke>"
_ELEMENT = f"{NS}<"
_MAX_DEPTH = 128
_MIXED_TEXT = "$text"

_NAME = r"""\s*(?:"([^"<>]*)"|'([^'<>]*)'|([^\s"'<>]+))\s*"""
_HEAD = re.compile(_NAME + ">")
_PARAMETER_OPEN = r"<parameter\s+name\s*=" + _NAME + ">"
_PARAMETER = re.compile(_PARAMETER_OPEN + r"(.*?)(?:</parameter>|(?=<parameter\s+name\s*=))", re.DOTALL)
_OPEN_PARAMETER = re.compile(_PARAMETER_OPEN + r"(.*)", re.DOTALL)


def _properties(tool: Tool | None) -> Mapping[str, Any]:
    """The parameter schemas of ``tool`` by name (empty when unknown)."""
    properties = (tool.parameters or {}).get("properties") if tool is not None else None
    return properties if isinstance(properties, Mapping) else {}


def _name(match: re.Match[str]) -> str:
    return (match.group(1) or match.group(2) or match.group(3) or "").strip()


class _MiniMaxParser(MemberCalls, SectionedToolParser):
    """The block and invoke markers of one MiniMax generation; the body is read by subclasses."""

    def _read_head(self, body: str, events: list[Event]) -> bool:
        """Reads the invoke's name (``"NAME">``); False while it is not (or cannot be) read."""
        if self._name is not None:
            return True
        head = _HEAD.match(body)
        if head is None or not _name(head):
            return False
        self.start_call(events, _name(head), head.end())
        return True


@TOOL_PARSERS.register("minimax_m2")
class MiniMaxM2ToolParser(_MiniMaxParser):
    section_starts = (M2_BEGIN,)
    section_ends = (M2_END,)
    call_start = M2_INVOKE
    call_end = M2_INVOKE_END
    needs_special_tokens = True  # vLLM's parser engine keeps special tokens in the text

    def call_events(self, body: str, *, complete: bool, final: bool) -> list[Event]:
        events: list[Event] = []
        if not self._read_head(body, events):
            return self.unreadable(body, complete, final)
        self.add_members(events, body, _PARAMETER, lambda p: self._member(_name(p), p.group(4)))
        if complete:
            last = _OPEN_PARAMETER.search(body, self._pos)
            if last is not None:  # not closed before </invoke>
                self.add_member(events, *self._member(_name(last), last.group(4).removesuffix("\n")))
            self.end_call(events)
        return events

    def _member(self, key: str, text: str) -> tuple[str, Any]:
        return key, coerce(text, self._schema(key))

    def _schema(self, key: str) -> Any:
        """The schema of parameter ``key`` of the tool being called; ``None`` when not listed."""
        return _properties(self.tools.get(self._name or "")).get(key)

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        invokes = "".join(
            f'<invoke name="{c.name}">\n'
            + "".join(f'<parameter name="{k}">{value_text(v)}</parameter>\n' for k, v in c.args.items())
            + "</invoke>\n"
            for c in calls
        )
        return f"{M2_BEGIN}\n{invokes}{M2_END}"


# ---------------------------------------------------------------------------------- MiniMax-M3

Element = str | list[tuple[str, "Element"]]
"""An element's value: its text, or its child elements ``(name, value)`` in order."""


def read_element(text: str, pos: int, depth: int = 1) -> tuple[str, Element, int] | None:
    """The element that starts at ``text[pos]`` (``NS<name>``): (name, value, index past its
    closing tag); ``None`` when it is malformed or not closed."""
    if depth > _MAX_DEPTH:
        return None
    name_at = pos + len(_ELEMENT)
    name_end = text.find(">", name_at)
    name = text[name_at:name_end] if name_end >= 0 else ""
    if not name.strip() or name.startswith("/") or NS in name:
        return None
    closing = f"{NS}</{name}>"
    pos = name_end + 1
    parts: list[str] = []
    children: list[tuple[str, Element]] = []
    while True:
        at = text.find(NS, pos)
        if at < 0:
            return None
        parts.append(text[pos:at])
        if text.startswith(closing, at):
            pos = at + len(closing)
            break
        child = read_element(text, at, depth + 1)
        if child is None:
            return None
        children.append(child[:2])
        pos = child[2]
    own_text = "".join(parts)
    if not children:
        return name, own_text, pos
    if own_text.strip():  # text between child elements: kept under a name no child has
        key = _MIXED_TEXT
        while any(k == key for k, _ in children):
            key = "$" + key
        children.append((key, own_text))
    return name, children, pos


def read_elements(text: str, pos: int = 0) -> list[tuple[str, Element]]:
    """The elements one after another from ``pos`` (whitespace between them), up to the first
    that is malformed or not closed."""
    found: list[tuple[str, Element]] = []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if not text.startswith(_ELEMENT, pos) or text.startswith(f"{NS}</", pos):
            return found
        element = read_element(text, pos)
        if element is None:
            return found
        found.append(element[:2])
        pos = element[2]


def _container(schema: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """The first alternative of ``schema`` that is an array or an object: (kind, that schema)."""
    kind = schema.get("type")
    for name in ("array", "object"):
        if kind == name or (isinstance(kind, list) and name in kind):
            return name, schema
    if kind is None:
        if "items" in schema:
            return "array", schema
        if "properties" in schema or "additionalProperties" in schema:
            return "object", schema
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or ():
            if isinstance(branch, Mapping) and (found := _container(branch)) is not None:
                return found
    return None


def element_value(value: Element, schema: Any) -> Any:
    """The JSON value of an element under its schema (``None``: no schema)."""
    schema = schema if isinstance(schema, Mapping) else None
    container = _container(schema) if schema is not None else None
    if isinstance(value, str):
        if schema is None:
            return value
        if container is not None and "string" not in schema_types(schema) and not value.strip():
            return [] if container[0] == "array" else {}
        return coerce(value, schema)
    if container is not None and container[0] == "array":
        items = container[1].get("items")
        return [element_value(child, items) for _, child in value]
    return elements_object(value, container[1] if container is not None else None)


def elements_object(elements: list[tuple[str, Element]], schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """Named elements as an object under ``schema``; a name repeated collects into a list."""
    properties = (schema or {}).get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    additional = (schema or {}).get("additionalProperties")
    out: dict[str, Any] = {}
    repeated: set[str] = set()
    for name, element in elements:
        value = element_value(element, properties.get(name, additional))
        if name not in out:
            out[name] = value
        elif name in repeated:
            out[name].append(value)
        else:
            out[name] = [out[name], value]
            repeated.add(name)
    return out


def _m3_scalar(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _m3_element(name: str, value: Any) -> str:
    if isinstance(value, dict):
        inner = "".join(_m3_element(k, v) + "\n" for k, v in value.items())
    elif isinstance(value, list):
        inner = "".join(_m3_element("item", v) + "\n" for v in value)
    else:
        return f"{NS}<{name}>{_m3_scalar(value)}{NS}</{name}>"
    return f"{NS}<{name}>" + (f"\n{inner}" if inner else "") + f"{NS}</{name}>"


@TOOL_PARSERS.register("minimax_m3")
class MiniMaxM3ToolParser(_MiniMaxParser):
    section_starts = (M3_BEGIN,)
    section_ends = (M3_END,)
    call_start = M3_INVOKE
    call_end = M3_INVOKE_END
    # the marker and the tags are added tokens that are not special: vLLM asks for no change

    def call_events(self, body: str, *, complete: bool, final: bool) -> list[Event]:
        events: list[Event] = []
        if not self._read_head(body, events):
            return self.unreadable(body, complete, final)
        if complete:
            schema = {"properties": _properties(self.tools.get(self._name or ""))}
            arguments = elements_object(read_elements(body, self._pos), schema)
            events += [ToolCallArgs(json.dumps(arguments, ensure_ascii=False)), TOOL_CALL_END]
        return events

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        invokes = "".join(
            f'{M3_INVOKE}"{c.name}">\n'
            + "".join(_m3_element(k, v) + "\n" for k, v in c.args.items())
            + f"{M3_INVOKE_END}\n"
            for c in calls
        )
        return f"{M3_BEGIN}\n{invokes}{M3_END}"
