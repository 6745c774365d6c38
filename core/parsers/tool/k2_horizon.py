"""IFM K2 Horizon tool calls (vLLM's ``k2_horizon``): MBZUAI-IFM's K2 Horizon models.

Format (the model's chat template; vLLM's k2_horizon_tool_parser.py): the calls sit in one
``<ifm|tool_calls>`` ... ``</ifm|tool_calls>`` group, each between ``<ifm|tool_call>`` and
``</ifm|tool_call>``, written in the format the request picks with the ``tool_call_format``
template argument: ``xml`` (the default) puts the function's name first, then each argument as
a key and a value, strings as they are and other values as JSON; ``xml_typed`` adds each
argument's type; ``json`` writes the call as one JSON object.

    Let me check.<ifm|tool_calls>
    <ifm|tool_call>get_weather
    <ifm|arg_key>city</ifm|arg_key>
    <ifm|arg_value>Tokyo</ifm|arg_value>
    <ifm|arg_key>days</ifm|arg_key>
    <ifm|arg_value>3</ifm|arg_value>
    </ifm|tool_call>
    </ifm|tool_calls>

``xml_typed`` writes ``<ifm|arg_type>integer</ifm|arg_type>`` between a key and its value;
``json`` writes ``<ifm|tool_call>{"name": "get_weather", "arguments": {"city": "Tokyo"}}</ifm|tool_call>``.

An XML call starts once its name is read (at the first ``<ifm|arg_key>``, or the call's end
when it has no arguments); its arguments stream one member per complete ``<ifm|arg_value>`` and
close at the call's end. A
value is typed as vLLM types it (``schema_values.coerce``): by the parameter's schema, narrowed
to the written type where the schema allows several; by the written type where the tool does not
list the parameter (``any``: the text); else it is the text as written. A JSON call is read once
complete, each argument typed by its schema the same way (``"2"`` for an ``integer`` is 2).
A call whose name or JSON cannot be read is content, markers included; so is a call cut off
before its name. Text around the group is content.

Where dyn's reading differs from vLLM's: all three formats are read whatever the request's
``tool_call_format`` (vLLM reads only the one asked for and rejects an unknown one); vLLM reads
the group only once it is closed and all or nothing (one bad call, a call outside a group, or a
group cut off by ``max_tokens`` makes it all content), where here each call is read on its own
and a cut-off call is kept as far as it got; vLLM also rejects a call to a tool the request does
not offer, or another than the one ``tool_choice`` names, and duplicate or untyped (in
``xml_typed``) arguments; and it keeps the whitespace after the group, which is dropped here as
after any call (``delimited``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dyn.core.parsers.events import TOOL_CALL_END, Event, ToolCallArgs, ToolCallStart
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.kv_arguments import MemberCalls, value_text
from dyn.core.parsers.tool.schema_values import coerce, schema_types
from dyn.core.parsers.tool.sectioned import SectionedToolParser

GROUP_START = "<ifm|tool_calls>"
GROUP_END = "</ifm|tool_calls>"
CALL_START = "<ifm|tool_call>"
CALL_END = "</ifm|tool_call>"
ARG_KEY = "<ifm|arg_key>"

_ARGUMENT = re.compile(
    r"<ifm\|arg_key>(.*?)</ifm\|arg_key>\s*"
    r"(?:<ifm\|arg_type>(.*?)</ifm\|arg_type>\s*)?"
    r"<ifm\|arg_value>(.*?)</ifm\|arg_value>",
    re.DOTALL,
)
_NAME = re.compile(r"[^\s<>]+")


def typed_value(text: str, schema: Any, written_type: str | None = None) -> Any:
    """An argument's value from its text, its parameter's schema (``None``: not listed) and the
    type the model wrote (``xml_typed``), as the module says."""
    kind = (written_type or "").split("[", 1)[0].strip().lower()
    if isinstance(schema, Mapping):
        allowed = schema_types(schema)
        target: Mapping[str, Any] = {"type": kind} if kind in allowed and len(allowed) > 1 else schema
    elif kind and kind != "any":
        target = {"type": kind}
    else:
        return text
    return coerce(text if "string" in schema_types(target) else text.strip(), target)


def _listed(tool: Tool | None, key: str) -> Mapping[str, Any] | None:
    """The schema of parameter ``key`` where ``tool`` lists it (``None`` where it does not)."""
    properties = (tool.parameters or {}).get("properties") if tool is not None else None
    schema = properties.get(key) if isinstance(properties, Mapping) else None
    return schema if isinstance(schema, Mapping) else None


@TOOL_PARSERS.register("k2_horizon")
class K2HorizonToolParser(MemberCalls, SectionedToolParser):
    section_starts = (GROUP_START,)
    section_ends = (GROUP_END,)
    call_start = CALL_START
    call_end = CALL_END
    # vLLM asks for no change to the detokenisation: the ifm markers reach it as text

    def call_events(self, body: str, *, complete: bool, final: bool) -> list[Event]:
        events: list[Event] = []
        if self._name is None:
            if body.lstrip().startswith("{"):
                return self._json_call(body) if complete else self.unreadable(body, complete, final)
            at = body.find(ARG_KEY)
            name = (body if at < 0 else body[:at]).strip()
            if (at < 0 and not complete) or not _NAME.fullmatch(name):
                return self.unreadable(body, complete, final)
            self.start_call(events, name, max(at, 0))
        self.add_members(events, body, _ARGUMENT, self._argument)
        if complete:
            self.end_call(events)
        return events

    def _argument(self, argument: re.Match[str]) -> tuple[str, Any]:
        key = argument.group(1).strip()
        return key, typed_value(
            argument.group(3), _listed(self.tools.get(self._name or ""), key), argument.group(2)
        )

    def _json_call(self, body: str) -> list[Event]:
        try:
            call = json.loads(body)
        except (ValueError, RecursionError):
            call = None
        name = call.get("name") if isinstance(call, dict) else None
        arguments = call.get("arguments", {}) if isinstance(call, dict) else None
        if not isinstance(name, str) or not _NAME.fullmatch(name) or not isinstance(arguments, dict):
            return [self.raw_call(body)]
        tool = self.tools.get(name)
        typed = {}
        for key, value in arguments.items():
            schema = _listed(tool, key)
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            typed[key] = value if schema is None else typed_value(text, schema)
        try:
            text = json.dumps(typed, ensure_ascii=False, allow_nan=False)
        except ValueError:  # NaN or Infinity, which JSON cannot carry
            return [self.raw_call(body)]
        return [ToolCallStart(name), ToolCallArgs(text), TOOL_CALL_END]

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        def call(c: ToolCall) -> str:
            arguments = "".join(
                f"{ARG_KEY}{k}</ifm|arg_key>\n<ifm|arg_value>{value_text(v)}</ifm|arg_value>\n"
                for k, v in c.args.items()
            )
            return f"{CALL_START}{c.name}\n{arguments}{CALL_END}"

        return GROUP_START + "\n" + "\n".join(call(c) for c in calls) + "\n" + GROUP_END
