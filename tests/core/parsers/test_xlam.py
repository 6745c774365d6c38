"""The xlam parser on outputs of Salesforce xLAM-2 models (format: a JSON array of ``{"name", "arguments"}``
calls, the xLAM-2 chat templates'; recorded outputs from vLLM's tests/tool_parsers/test_xlam_tool_parser.py,
run with Salesforce/Llama-xLAM-2-8B-fc-r's tokenizer)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

XLam = TOOL_PARSERS.get("xlam")

DALLAS = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}
ORLANDO = {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}

# vLLM's "parallel_tool_calls"
XLAM_TWO_CALLS = (
    '[{"name": "get_current_weather", "arguments": {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}}, '
    '{"name": "get_current_weather", "arguments": {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}}]'
)
ONE_CALL = (
    '[{"name": "get_current_weather", "arguments": {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}}]'
)


def test_one_call(check_splits):
    got = check_splits(XLam, ONE_CALL)
    assert got.content == "" and got.named_args == [("get_current_weather", DALLAS)]
    assert got.calls[0].arguments == json.dumps(DALLAS) and got.calls[0].complete


def test_two_calls(check_splits):
    got = check_splits(XLam, XLAM_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [("get_current_weather", DALLAS), ("get_current_weather", ORLANDO)]


def test_content_before_the_calls_in_each_wrapping(check_splits):
    # vLLM's single_tool_with_{think_tag,json_code_block,tool_calls_tag,tool_call_xml_tags}
    for text, content in (
        (f"<think>I'll help you with that.</think>{ONE_CALL}", "<think>I'll help you with that.</think>"),
        (f"I'll help you with that.\n```json\n{ONE_CALL}\n```", "I'll help you with that.\n"),
        (f"```\n{ONE_CALL}\n```\nAnything else?", "Anything else?"),
        (f"I'll check the weather for you.[TOOL_CALLS]{ONE_CALL}", "I'll check the weather for you."),
        (
            f"I'll help you check the weather.<tool_call>{ONE_CALL}</tool_call>",
            "I'll help you check the weather.",
        ),
    ):
        got = check_splits(XLam, text)
        assert got.content == content and got.named_args == [("get_current_weather", DALLAS)], text


def test_quotes_and_brackets_inside_strings(check_splits):
    text = '[{"name": "search", "arguments": {"q": "say \\"hi\\" ]} ```json [TOOL_CALLS]", "n": [1, {"a": null}]}}]'
    got = check_splits(XLam, text)
    assert got.named_args == [("search", {"q": 'say "hi" ]} ```json [TOOL_CALLS]', "n": [1, {"a": None}]})]


def test_cut_off_call(parse):
    got = parse(XLam, ['[{"name": "get_current_weather", "arguments": {"city": "Dal'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_current_weather", '{"city": "Dal', False)
    ]
    got = parse(XLam, ['[{"name": "get_curr'])
    assert got.calls == [] and got.content == '[{"name": "get_curr'


def test_unreadable_lists_are_content(check_splits):
    for text in (
        '[{"name": "f"}]',  # no arguments
        "[]",
        '```json\n{"name": "f", "arguments": {}}\n```',  # an object, not a list
        "<tool_call>not json</tool_call>",
    ):
        got = check_splits(XLam, text)
        assert got.calls == [] and got.content == text, text


def test_plain_text_is_content(check_splits):
    for text in (
        "This is a test",
        "[1] Smith et al. found it; see ```python\nprint([1])\n``` for code.",
        "<think>no calls</think> [see above]",
    ):
        got = check_splits(XLam, text)
        assert got.calls == [] and got.content == text, text


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_current_weather", json.dumps(DALLAS)), ToolCall("noop", "{}")]
    text = XLam.render(calls)
    assert text.startswith('[{"name": "get_current_weather", "arguments": {')
    got = check_splits(XLam, text)
    assert got.named_args == [("get_current_weather", DALLAS), ("noop", {})] and got.content == ""
