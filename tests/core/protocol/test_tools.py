"""tools / tool_choice: the plan a chat request's tools make, and the forced-call schemas (vLLM's)."""

from __future__ import annotations

import pytest

from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.tools import MAX_TOOLS, forced_schema, tool_plan

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def param_of(*args) -> str:
    with pytest.raises(ApiError) as info:
        tool_plan(*args)
    assert info.value.status == 400
    return info.value.param


def test_choices():
    assert tool_plan(None, None).choice == "none"
    assert tool_plan([WEATHER], None).choice == "auto"  # tools without tool_choice: auto, as vLLM
    assert tool_plan([WEATHER], "none").choice == "none"
    assert tool_plan([WEATHER], "required").choice == "required"
    plan = tool_plan([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})
    assert (plan.choice, plan.name) == ("named", "get_time")
    assert [t.name for t in plan.tools] == ["get_weather", "get_time"]
    assert plan.tools[1].parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    "tools, choice, param",
    [
        (None, "required", "tool_choice"),
        (None, "auto", "tool_choice"),
        ([WEATHER], "sometimes", "tool_choice"),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name"),
        ([WEATHER], {"type": "function"}, "tool_choice"),
        ([{"type": "retrieval"}], None, "tools[0]"),
        ([{"type": "function", "function": {"name": ""}}], None, "tools[0].function.name"),
        ([WEATHER, WEATHER], None, "tools[1].function.name"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": [1]}}],
            None,
            "tools[0].function.parameters",
        ),
        ([TIME] * (MAX_TOOLS + 1), None, "tools"),
    ],
)
def test_bad_tools_name_the_field(tools, choice, param):
    assert param_of(tools, choice) == param


def test_forced_schemas():
    named = tool_plan([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}})
    assert forced_schema(named) == WEATHER["function"]["parameters"]
    required = forced_schema(tool_plan([WEATHER, TIME], "required"))
    assert required["type"] == "array" and required["minItems"] == 1 and "maxItems" not in required
    names = [item["properties"]["name"]["enum"] for item in required["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    single = forced_schema(tool_plan([WEATHER], "required", False))
    assert single["maxItems"] == 1 and single["items"]["required"] == ["name", "parameters"]
    assert forced_schema(tool_plan([WEATHER], "auto")) is None
