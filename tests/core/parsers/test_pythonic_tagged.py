"""The lfm2 and olmo3 parsers: Python-style calls between a model's tags (formats: LiquidAI/LFM2's chat
template, a Python list between ``<|tool_call_start|>`` and ``<|tool_call_end|>``; allenai/Olmo-3's
chat template, calls one per line between ``<function_calls>`` and ``</function_calls>``; recorded
outputs from vLLM's tests/tool_parsers/test_lfm2_tool_parser.py and test_olmo3_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.events import ToolCallArgs
from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.pythonic_tagged import keyword_literal

Lfm2 = TOOL_PARSERS.get("lfm2")
Olmo3 = TOOL_PARSERS.get("olmo3")

# LFM2-1.2B answering a recruiting question (its model card's tool-use example)
LFM2_CALL_THEN_TEXT = (
    '<|tool_call_start|>[get_candidate_status(candidate_id="12345")]<|tool_call_end|>'
    "Checking the current status of candidate ID 12345."
)
LFM2_TWO_CALLS = (
    'I\'ll look both up.<|tool_call_start|>[get_weather(location="Paris"), '
    'get_weather(location="Berlin", unit="celsius")]<|tool_call_end|>'
)
# vLLM's olmo3 tests: SIMPLE_FUNCTION_OUTPUT and MORE_TYPES_FUNCTION_OUTPUT_JSON_LITERALS, one per line
OLMO3_TWO_CALLS = (
    "<function_calls>get_weather(city='San Francisco', metric='celsius')\n"
    "register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, "
    "role=null, passed_test=true, aliases=['John', 'Johnny'])</function_calls>"
)
REGISTER_USER = {
    "name": "John Doe",
    "age": 37,
    "address": {"city": "San Francisco", "state": "CA"},
    "role": None,
    "passed_test": True,
    "aliases": ["John", "Johnny"],
}


def calls(got):
    return [(c.name, c.arguments, c.complete) for c in got.calls]


def test_lfm2_one_call_then_content(check_splits):
    got = check_splits(Lfm2, LFM2_CALL_THEN_TEXT)
    assert got.content == "Checking the current status of candidate ID 12345."
    assert calls(got) == [("get_candidate_status", '{"candidate_id": "12345"}', True)]


def test_lfm2_content_then_two_calls(check_splits):
    got = check_splits(Lfm2, LFM2_TWO_CALLS)
    assert got.content == "I'll look both up."
    assert got.named_args == [
        ("get_weather", {"location": "Paris"}),
        ("get_weather", {"location": "Berlin", "unit": "celsius"}),
    ]


def test_olmo3_calls_one_per_line(check_splits):
    got = check_splits(Olmo3, OLMO3_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [
        ("get_weather", {"city": "San Francisco", "metric": "celsius"}),
        ("register_user", REGISTER_USER),
    ]
    assert all(c.complete for c in got.calls)
    # vLLM's PARAMETERLESS and EMPTY_LIST outputs, after content, separated by a comma too
    got = check_splits(
        Olmo3, "Sure.\n<function_calls>get_weather(), do_something_cool(steps=[])\n</function_calls>"
    )
    assert got.content == "Sure.\n" and got.named_args == [
        ("get_weather", {}),
        ("do_something_cool", {"steps": []}),
    ]


def test_arguments_stream_one_keyword_at_a_time():
    parser = Olmo3()
    events = parser.feed("<function_calls>get_weather(city='San Francisco', metric='cel")
    assert [e.text for e in events if isinstance(e, ToolCallArgs)] == ['{"city": "San Francisco"']


def test_quotes_and_markers_inside_strings(check_splits):
    # vLLM's ESCAPED_STRING_FUNCTION_OUTPUT, plus the tags inside strings
    call = (
        "get_weather(city='Martha\\'s Vineyard', metric='\\\"cool units\\\"', "
        'note="</function_calls> <|tool_call_end|> ), ]")'
    )
    args = {
        "city": "Martha's Vineyard",
        "metric": '"cool units"',
        "note": "</function_calls> <|tool_call_end|> ), ]",
    }
    got = check_splits(Olmo3, f"<function_calls>{call}</function_calls>")
    assert got.named_args == [("get_weather", args)]
    got = check_splits(Lfm2, f"<|tool_call_start|>[{call}]<|tool_call_end|>")
    assert got.named_args == [("get_weather", args)]


def test_values_vllm_reads_for_these_models():
    assert keyword_literal(" from='NYC'") == ("from", "NYC")  # a keyword Python reserves
    assert keyword_literal("zip=007") == ("zip", 7)
    assert keyword_literal("code='line1\nline2'") == ("code", "line1\nline2")  # a raw newline in a string
    assert keyword_literal("x=[true, false, null]") == ("x", [True, False, None])
    assert keyword_literal("x=True") == ("x", True)
    for text in ("x", "x == 1", "x=f(1)", "x=nope", "x=", "**kw", "x=1e999"):
        assert keyword_literal(text) is None, text


def test_dotted_names_and_arguments_that_are_no_literals(check_splits):
    got = check_splits(Lfm2, "<|tool_call_start|>[math.sqrt(x=2, y=__import__('os'), 5)]<|tool_call_end|>")
    assert got.named_args == [("math.sqrt", {"x": 2})]


def test_cut_off_call(parse):
    got = parse(Lfm2, ['<|tool_call_start|>[get_weather(location="Paris"), get_time(tz="CE'])
    assert calls(got) == [("get_weather", '{"location": "Paris"}', True), ("get_time", "", False)]
    got = parse(Olmo3, ["<function_calls>get_weather(city='San Francisco', metric='cel"])
    assert calls(got) == [("get_weather", '{"city": "San Francisco"', False)]
    for make, text in ((Lfm2, "<|tool_call_start|>[get_wea"), (Olmo3, "<function_calls>get_wea")):
        got = parse(make, [text])
        assert got.calls == [] and got.content == text


def test_unreadable_bodies_are_content(check_splits):
    for make, text in (
        (Lfm2, "<|tool_call_start|>[]<|tool_call_end|>"),
        (Lfm2, "<|tool_call_start|>get_weather(city='x')<|tool_call_end|>"),  # no list
        (Lfm2, "<|tool_call_start|>[1, 2]<|tool_call_end|>"),
        (Olmo3, "<function_calls>[get_weather(city='x')]</function_calls>"),  # a list, not lines
        (Olmo3, "<function_calls>not a call</function_calls>"),
    ):
        got = check_splits(make, text)
        assert got.calls == [] and got.content == text, text


def test_plain_text_is_content(check_splits):
    text = "How can I help you today? Call get_weather(city='x') or [f(a=1)] yourself."
    for make in (Lfm2, Olmo3):
        got = check_splits(make, text)
        assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits):
    calls_ = [ToolCall("register_user", json.dumps(REGISTER_USER)), ToolCall("noop", "{}")]
    text = Lfm2.render(calls_)
    assert text.startswith("<|tool_call_start|>[register_user(name='John Doe', age=37, ") and text.endswith(
        "noop()]<|tool_call_end|>"
    )
    assert check_splits(Lfm2, text).named_args == [("register_user", REGISTER_USER), ("noop", {})]
    text = Olmo3.render(calls_)
    assert text.startswith("<function_calls>register_user(") and "\nnoop()</function_calls>" in text
    got = check_splits(Olmo3, text)
    assert got.named_args == [("register_user", REGISTER_USER), ("noop", {})] and got.content == ""
    assert Lfm2.needs_special_tokens and not Olmo3.needs_special_tokens
