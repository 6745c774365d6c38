"""A chat request's ``tools`` and ``tool_choice``, checked once, as vLLM reads them.

``tool_plan(req)`` gives the tools (``dyn.core.parsers.tool.Tool``) and what the model may do
with them: ``none`` (tools are rendered, calls are never parsed), ``auto`` (the tool-call parser
reads calls from free text), ``required`` (at least one call, constrained to the tools' schemas)
or ``named`` (exactly one call to the named function, constrained to its schema). With tools and
no ``tool_choice`` the choice is ``auto``; without tools, ``none``. Every shape error is a 400
naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dyn.core.parsers.tool import Tool
from dyn.core.protocol.errors import bad_request

MAX_TOOLS = 512
"""Their schemas' size is bounded where it matters: as a forced call's grammar
(``dyn.core.protocol.structured.MAX_CONSTRAINT_BYTES``), and by the request body's limit."""

TOOL_CHOICES = ("none", "auto", "required", "named")


@dataclass(frozen=True, slots=True)
class ToolPlan:
    tools: tuple[Tool, ...]
    choice: str
    """One of ``TOOL_CHOICES``."""
    name: str | None = None
    """The forced function (``named``)."""
    parallel: bool = True
    """``parallel_tool_calls``: more than one call per turn allowed."""


NO_TOOLS = ToolPlan((), "none")


def tool_plan(
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    parallel_tool_calls: bool | None = None,
) -> ToolPlan:
    """The checked tools and tool choice of a chat request (see the module docstring)."""
    parsed = _tools(tools) if tools else ()
    parallel = parallel_tool_calls is not False
    if tool_choice is None:
        return ToolPlan(parsed, "auto" if parsed else "none", parallel=parallel)
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise bad_request(
                "tool_choice must be 'none', 'auto', 'required' or "
                '{"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        if tool_choice != "none" and not parsed:
            raise bad_request(f"tool_choice '{tool_choice}' needs 'tools'", param="tool_choice")
        return ToolPlan(parsed, tool_choice, parallel=parallel)
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if tool_choice.get("type", "function") != "function" or not isinstance(name, str):
        raise bad_request(
            'a named tool_choice is {"type": "function", "function": {"name": NAME}}', param="tool_choice"
        )
    if not any(t.name == name for t in parsed):
        raise bad_request(
            f"tool_choice names the function {name!r}, which is not in 'tools'",
            param="tool_choice.function.name",
        )
    return ToolPlan(parsed, "named", name, parallel)


def _tools(tools: list[dict[str, Any]]) -> tuple[Tool, ...]:
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"tools may hold at most {MAX_TOOLS} functions", param="tools")
    out: list[Tool] = []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise bad_request(f'{where} must be {{"type": "function", "function": {{...}}}}', param=where)
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"{where}.function must be an object", param=f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(
                f"{where}.function.name must be a non-empty string", param=f"{where}.function.name"
            )
        if name in names:
            raise bad_request(
                f"{where}.function.name {name!r} is already used by another tool",
                param=f"{where}.function.name",
            )
        names.add(name)
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise bad_request(
                f"{where}.function.parameters must be a JSON Schema object",
                param=f"{where}.function.parameters",
            )
        out.append(Tool(name, parameters))
    return tuple(out)


def forced_schema(plan: ToolPlan) -> dict[str, Any] | None:
    """The JSON Schema a forced tool choice constrains the output to (vLLM's): the named
    function's parameters, or for ``required`` an array of ``{"name", "parameters"}`` objects,
    one of the tools each (at most one item without ``parallel_tool_calls``). ``None`` when
    the choice is not forced."""
    if plan.choice == "named":
        # Tool types it as a Mapping; _tools above always builds a dict
        return next(t.parameters for t in plan.tools if t.name == plan.name)  # type: ignore[return-value]
    if plan.choice != "required":
        return None
    items = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [t.name]}, "parameters": t.parameters},
            "required": ["name", "parameters"],
        }
        for t in plan.tools
    ]
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": items[0] if len(items) == 1 else {"anyOf": items},
    }
    if not plan.parallel:
        schema["maxItems"] = 1
    return schema
