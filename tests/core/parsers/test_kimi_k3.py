"""The kimi_k3 parser on Kimi K3 outputs (format: vLLM's kimi_k3_tool_parser.py, whose docstring
gives the XTML channels used here, and SGLang's kimik3 structural tag, which spells the calls the
way the model's template does: no whitespace between tags, call indexes from 1)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

KimiK3 = TOOL_PARSERS.get("kimi_k3")
OP, CL, S = "<|open|>", "<|close|>", "<|sep|>"


def arg(key, kind, value):
    return f'{OP}argument key="{key}" type="{kind}"{S}{value}{CL}argument{S}'


# the prompt opens the response channel; the model answers, closes it, then calls
RESPONSE_THEN_CALLS = (
    f"Let me run that.{CL}response{S}{OP}tools{S}"
    f'{OP}call tool="python" index="1"{S}'
    + arg("code", "string", 'print("a < b")\nx = {"k": 1}')
    + arg("opts", "object", '{"timeout": 5, "tags": ["x"]}')
    + f"{CL}call{S}"
    f'{OP}call tool="get_weather" index="2"{S}'
    + arg("city", "string", "Beijing")
    + arg("days", "number", "3")
    + arg("metric", "boolean", "true")
    + arg("note", "null", "null")
    + f"{CL}call{S}{CL}tools{S}{CL}message{S}"
)


def test_response_channel_then_two_calls(check_splits):
    got = check_splits(KimiK3, RESPONSE_THEN_CALLS)
    assert got.content == "Let me run that."
    assert got.named_args == [
        ("python", {"code": 'print("a < b")\nx = {"k": 1}', "opts": {"timeout": 5, "tags": ["x"]}}),
        ("get_weather", {"city": "Beijing", "days": 3, "metric": True, "note": None}),
    ]
    assert all(c.complete for c in got.calls)


def test_whole_response_channel_is_unwrapped(check_splits):
    text = f"{OP}response{S}Hello! How can I help?{CL}response{S}{CL}message{S}"
    got = check_splits(KimiK3, text)
    assert got.content == "Hello! How can I help?" and got.calls == []


def test_attribute_escapes_and_bad_json_kept_as_text(check_splits):
    text = (
        f'{OP}tools{S}{OP}call tool="say &quot;hi&quot; &amp; go" index="1"{S}'
        + arg("a&amp;b", "array", "[1, 2")
        + f"{CL}call{S}{CL}tools{S}"
    )
    got = check_splits(KimiK3, text)
    assert got.named_args == [('say "hi" & go', {"a&b": "[1, 2"})]


def test_plain_text_is_content(check_splits):
    text = "The <|open|> marker and <|close|>call are text when they do not form channels."
    assert check_splits(KimiK3, text).content == text


def test_unreadable_call_is_content(check_splits):
    text = f'{OP}tools{S}{OP}call index="1"{S}{CL}call{S}{CL}tools{S}'
    got = check_splits(KimiK3, text)
    assert got.calls == [] and got.content == f'{OP}call index="1"{S}{CL}call{S}'


def test_cut_off_call(parse):
    text = f'{OP}tools{S}{OP}call tool="python" index="1"{S}' + arg("code", "string", "print(1)")
    got = parse(KimiK3, [text + f'{OP}argument key="more" type="string"{S}par'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("python", '{"code": "print(1)"', False)
    ]


def test_render_reads_back(check_splits):
    args = {"code": "print(1)", "n": 2, "ok": False, "xs": [1, "a"], "o": {"k": None}, "nothing": None}
    calls = [ToolCall("python", json.dumps(args)), ToolCall("noop", "{}")]
    rendered = KimiK3.render(calls)
    assert rendered.startswith(
        f'{OP}tools{S}{OP}call tool="python" index="1"{S}{OP}argument key="code" type="string"'
    )
    got = check_splits(KimiK3, rendered)
    assert got.named_args == [("python", args), ("noop", {})]
