"""The mistral parser on outputs of Mistral models (formats: mistral-common's
mistral_common/tokens/tokenizers/tools.py ``decode_tool_calls``; outputs from vLLM's
tests/tool_parsers/test_mistral_tool_parser.py, whose tokenizers are those of
mistralai/Mistral-7B-Instruct-v0.3 (pre-v11) and Mistral-Small-3.2-24B-Instruct-2506 (v11+))."""

from __future__ import annotations

import itertools
import json

import pytest

from dyn.core.parsers.events import ToolCallStart
from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall, mistral

# Mistral-7B-Instruct-v0.3 (tokenizer v3): one [TOOL_CALLS], a JSON array (vLLM's "multiple_tools")
MISTRAL_V03_TWO_CALLS = (
    '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5, "b": 4}}, {"name": "get_current_weather", '
    '"arguments":{"city": "San Francisco", "state": "CA", "unit": "celsius"}}]'
)
# Mistral-Small-3.2 (tokenizer v13) as vLLM's tests decode it, [ARGS] skipped ("multiple_tool_calls")
MISTRAL_SMALL32_TWO_CALLS = '[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}'
# the same with the control tokens kept, as mistral-common's decode_tool_calls docstring writes v11+
MISTRAL_V11_ARGS_TOKEN = '[TOOL_CALLS]add[ARGS]{"a": 3.5, "b": 4}[TOOL_CALLS]multiply[ARGS]{"a": 3, "b": 6}'


@pytest.fixture
def Mistral(monkeypatch):
    """The parser with call ids counted (call00000, call00001, ...) per parser, so that every way
    of splitting a text gives the same ids."""

    def make():
        ids = (f"call{n:05d}" for n in itertools.count())
        monkeypatch.setattr(mistral, "new_call_id", lambda: next(ids))
        return TOOL_PARSERS.get("mistral")()

    return make


def test_pre_v11_array(check_splits, Mistral):
    got = check_splits(Mistral, MISTRAL_V03_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [
        ("add", {"a": 3.5, "b": 4}),
        ("get_current_weather", {"city": "San Francisco", "state": "CA", "unit": "celsius"}),
    ]
    assert [c.id for c in got.calls] == ["call00000", "call00001"] and all(c.complete for c in got.calls)


def test_pre_v11_arguments_before_name_and_content_before(check_splits, Mistral):
    # vLLM's "argument_before_name" and "content_before_tool" cases
    got = check_splits(Mistral, '[TOOL_CALLS] [{"arguments":{"name": "John Doe"}, "name": "get_age"}]')
    assert got.named_args == [("get_age", {"name": "John Doe"})] and got.content == ""
    got = check_splits(Mistral, 'Hello[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1, "b": 2}}]')
    assert got.named_args == [("add", {"a": 1, "b": 2})] and got.content == "Hello"


def test_v11_calls(check_splits, Mistral):
    for text in (MISTRAL_SMALL32_TWO_CALLS, MISTRAL_V11_ARGS_TOKEN):
        got = check_splits(Mistral, text)
        assert got.content == ""
        assert got.named_args == [("add", {"a": 3.5, "b": 4}), ("multiply", {"a": 3, "b": 6})]
        assert got.calls[0].arguments == '{"a": 3.5, "b": 4}' and all(c.complete for c in got.calls)
        assert [c.id for c in got.calls] == ["call00000", "call00001"]


def test_v11_call_id_and_skipped_args_token(check_splits, Mistral):
    # tokenizer v11 with [CALL_ID]: the model's id is kept when it is a Mistral id
    got = check_splits(Mistral, '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}')
    assert [(c.name, c.id, c.args) for c in got.calls] == [("get_weather", "a1B2c3D4e", {"city": "Paris"})]
    # an id that is no Mistral id is replaced
    got = check_splits(Mistral, "[TOOL_CALLS]get_weather[CALL_ID]call_1[ARGS]{}")
    assert [(c.name, c.id, c.args) for c in got.calls] == [("get_weather", "call00000", {})]


def test_content_before_and_after_call(check_splits, Mistral):
    # vLLM's "complex" case: content with a brace, then a call whose string holds braces
    text = 'hi{hi[TOOL_CALLS]bash{"command": "print(\\"hello world!\\")\\nre.compile(r\'{}\')"}'
    got = check_splits(Mistral, text)
    assert got.content == "hi{hi"
    assert got.named_args == [("bash", {"command": "print(\"hello world!\")\nre.compile(r'{}')"})]
    # vLLM's "trailing_data_after_json": the text after the calls is content here (vLLM drops it)
    text = (
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments":{"city": "Dallas", "state": "TX", '
        '"unit": "fahrenheit"}}]\nextra trailing data'
    )
    got = check_splits(Mistral, text)
    assert got.content == "extra trailing data" and [c.name for c in got.calls] == ["get_current_weather"]


def test_single_object_and_end_marker(check_splits, Mistral):
    # Dynamo's mistral fixture: one object, closed by [/TOOL_CALLS]
    got = check_splits(Mistral, '[TOOL_CALLS]{"name": "f", "arguments": {"x": 1}}[/TOOL_CALLS]')
    assert got.named_args == [("f", {"x": 1})] and got.content == ""


def test_plain_text_is_content(check_splits, Mistral):
    text = "Paris is the capital of France. [TOOL] and [/TOOL_CALLS are just text."
    assert check_splits(Mistral, text).content == text


def test_unreadable_body_is_content(check_splits, Mistral):
    for text in (
        "[TOOL_CALLS] this is not a call",
        '[TOOL_CALLS][{"arguments": {}}]',
        "[TOOL_CALLS]get weather",
        "[TOOL_CALLS]f[ARGS][1, 2]",
    ):
        got = check_splits(Mistral, text)
        assert got.calls == [] and got.content == text


def test_cut_off_call(parse, Mistral):
    got = parse(Mistral, ['[TOOL_CALLS]get_weather[ARGS]{"city": "Par'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("get_weather", '{"city": "Par', False)]
    got = parse(
        Mistral, [('[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b')]
    )
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("f", '{"a": 1}', True),
        ("g", '{"b', False),
    ]
    for text in ("[TOOL_CALLS]get_wea", "[TOOL_CALLS]get_weather[AR", '[TOOL_CALLS] [{"name": "get_'):
        got = parse(Mistral, [text])
        assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits, Mistral):
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris"})), ToolCall("noop", "{}")]
    got = check_splits(Mistral, TOOL_PARSERS.get("mistral").render(calls))
    assert got.named_args == [("get_weather", {"city": "Paris"}), ("noop", {})] and got.content == ""


def test_call_ids_are_mistral_ids():
    parser = TOOL_PARSERS.get("mistral")()
    events = parser.feed(MISTRAL_SMALL32_TWO_CALLS) + parser.finish()
    ids = [e.id for e in events if isinstance(e, ToolCallStart)]
    assert len(ids) == 2 and ids[0] != ids[1]
    assert all(len(i) == 9 and i.isalnum() for i in ids)
