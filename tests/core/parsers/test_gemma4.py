"""The gemma4 parser on Gemma 4 outputs (format: the chat template of the google/gemma-4 models,
its ``format_argument`` macro, and vLLM's parser/gemma4.py and gemma4_utils.py, whose examples
give the calls used here)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall

Gemma4 = TOOL_PARSERS.get("gemma4")
Q = '<|"|>'

WEATHER = Tool(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "location": {"type": "string"},
            "unit": {"type": "string"},
            "days": {"type": "integer"},
            "zip": {"type": "string"},
        },
    },
)
SHELL = Tool(
    "tools.shell-exec",
    {
        "type": "object",
        "properties": {
            "cmd": {"type": "string"},
            "args": {"type": "array", "items": {"type": "string"}},
            "env": {"type": "object"},
            "dry_run": {"type": "boolean"},
        },
    },
)


def with_tools():
    return Gemma4([WEATHER, SHELL])


TWO_CALLS = (
    "Let me check both cities.\n"
    f"<|tool_call>call:get_weather{{location:{Q}San Francisco, CA{Q},unit:{Q}celsius{Q},days:3}}<tool_call|>"
    f"<|tool_call>call:get_weather{{location:{Q}Tokyo{Q}}}<tool_call|>"
)
NESTED = (
    f"<|tool_call>call:tools.shell-exec{{cmd:{Q}echo {{hello, world}} [x]{Q},"
    f"args:[{Q}-n{Q},{Q}a,b{Q}],env:{{HOME:{Q}/root{Q},DEBUG:true,N:2.5}},dry_run:false}}<tool_call|>"
)


def test_content_then_two_calls(check_splits):
    got = check_splits(with_tools, TWO_CALLS)
    assert got.content == "Let me check both cities.\n"
    assert got.named_args == [
        ("get_weather", {"location": "San Francisco, CA", "unit": "celsius", "days": 3}),
        ("get_weather", {"location": "Tokyo"}),
    ]
    assert got.calls[0].arguments == json.dumps(
        {"location": "San Francisco, CA", "unit": "celsius", "days": 3}
    )


def test_nested_values_and_brackets_inside_strings(check_splits):
    got = check_splits(with_tools, NESTED)
    assert got.named_args == [
        (
            "tools.shell-exec",
            {
                "cmd": "echo {hello, world} [x]",
                "args": ["-n", "a,b"],
                "env": {"HOME": "/root", "DEBUG": True, "N": 2.5},
                "dry_run": False,
            },
        )
    ]


def test_values_typed_by_schema_and_untyped_without_one(check_splits):
    text = f"<|tool_call>call:get_weather{{zip:02139,days:{Q}4{Q},extra:7,note:maybe}}<tool_call|>"
    got = check_splits(with_tools, text)
    # zip is a string parameter (its bare text kept); days an integer; unknown keys: JSON or text
    assert got.named_args == [("get_weather", {"zip": "02139", "days": 4, "extra": 7, "note": "maybe"})]


def test_variants_without_call_and_with_parentheses(check_splits):
    text = f"<|tool_call>:get_weather{{location:{Q}Oslo{Q}}}<tool_call|><|tool_call>call:get_weather(days:1)<tool_call|>"
    got = check_splits(with_tools, text)
    assert got.named_args == [("get_weather", {"location": "Oslo"}), ("get_weather", {"days": 1})]


def test_call_closed_by_its_brace_without_the_end_marker(check_splits):
    # some checkpoints end the call with <turn|> (or the stream ends) instead of <tool_call|>
    got = check_splits(with_tools, f"<|tool_call>call:get_weather{{location:{Q}Oslo{Q}}}<turn|>")
    assert got.named_args == [("get_weather", {"location": "Oslo"})] and got.calls[0].complete


def test_plain_text_is_content(check_splits):
    text = "Write call:get_weather{location:x} to call it; <tool_call|> alone is text."
    assert check_splits(with_tools, text).content == text


def test_unreadable_body_is_content(check_splits):
    for text in ("<|tool_call>this isn't valid<tool_call|>", "<|tool_call>call:bad name{a:1}<tool_call|>"):
        got = check_splits(with_tools, text)
        assert got.calls == [] and got.content == text


def test_cut_off_call(parse):
    got = parse(with_tools, [f"<|tool_call>call:get_weather{{location:{Q}Paris{Q},days:1"])
    # the bare value may still grow: not sent
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"location": "Paris"', False)
    ]
    got = parse(with_tools, [f"<|tool_call>call:get_weather{{location:{Q}Par"])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("get_weather", "", False)]


def test_render_reads_back(check_splits):
    args = {"cmd": "ls", "args": ["-l", "a b"], "env": {"X": "1"}, "dry_run": True}
    calls = [ToolCall("tools.shell-exec", json.dumps(args)), ToolCall("get_weather", json.dumps({"days": 2}))]
    rendered = Gemma4.render(calls)
    assert rendered.startswith(f"<|tool_call>call:tools.shell-exec{{cmd:{Q}ls{Q},args:[{Q}-l{Q},")
    got = check_splits(with_tools, rendered)
    assert got.named_args == [(c.name, c.args) for c in calls]
