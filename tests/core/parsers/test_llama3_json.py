"""The llama3_json parser on outputs of Llama 3.x models (format: meta-llama/llama-models
models/llama3_3/prompt_format.md, "JSON based tool calling"; vLLM's llama_tool_parser for when
an output is read as calls)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

Llama = TOOL_PARSERS.get("llama3_json")

# Llama 3.3 70B Instruct, the model response of prompt_format.md's "JSON based tool calling"
# (its <|eom_id|> is the stop token and never reaches the parser)
LLAMA33_PYTHON_TAG_CALL = (
    '<|python_tag|>{\n    "type": "function",\n    "name": "trending_songs",\n    "parameters": {\n'
    '        "n": "10",\n        "genre": "all"\n    }\n}'
)
# Llama 3.1 8B Instruct with vLLM's tool_chat_template_llama3.1_json.jinja: <|python_tag|> is a
# special token, skipped by the detokenizer, so the text starts with the JSON; two calls
# separated by "; " (vLLM's tests/tool_parsers/test_llama3_json_tool_parser.py)
LLAMA31_TWO_CALLS = (
    '{"name": "searchTool", "parameters": {"query": "test1"}}; '
    '{"name": "getOpenIncidentsTool", "parameters": {}}'
)


def test_python_tag_call(check_splits):
    got = check_splits(Llama, LLAMA33_PYTHON_TAG_CALL)
    assert got.content == ""
    assert got.named_args == [("trending_songs", {"n": "10", "genre": "all"})]
    assert got.calls[0].complete
    # a key before the name does not stop the arguments from streaming verbatim
    assert got.calls[0].arguments == '{\n        "n": "10",\n        "genre": "all"\n    }'


def test_parallel_calls(check_splits):
    got = check_splits(Llama, LLAMA31_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {})]
    assert all(c.complete for c in got.calls)


def test_calls_separated_by_newlines(check_splits):
    # vLLM streams calls separated by ";", "; ", ";\n" or a bare newline alike
    got = check_splits(
        Llama,
        '{"name": "a", "parameters": {}};\n{"name": "b", "parameters": {}}\n'
        '{"name": "c", "parameters": {"x": 1}}',
    )
    assert got.named_args == [("a", {}), ("b", {}), ("c", {"x": 1})] and got.content == ""


def test_leading_whitespace_and_arguments_key(check_splits):
    got = check_splits(Llama, '\n\n{"name": "f", "arguments": {"a": 1}}')
    assert got.named_args == [("f", {"a": 1})] and got.content == ""


def test_content_before_python_tag(check_splits):
    text = 'Let me look that up.<|python_tag|>{"name": "search", "parameters": {"q": "dyn"}}'
    got = check_splits(Llama, text)
    assert got.content == "Let me look that up."
    assert got.named_args == [("search", {"q": "dyn"})]


def test_text_after_calls_is_content(check_splits):
    got = check_splits(Llama, '{"name": "f", "parameters": {}}\nI called f.')
    assert got.named_args == [("f", {})] and got.content == "I called f."


def test_plain_text_is_content(check_splits):
    # JSON later in the answer is not a call: vLLM reads calls only at the start
    text = 'The answer is {"name": "f", "parameters": {}} as JSON.'
    got = check_splits(Llama, text)
    assert got.calls == [] and got.content == text


def test_unreadable_body_is_content(check_splits):
    for text in ('{"location": "Paris"}', '{"name": "Paris"}'):
        got = check_splits(Llama, text)
        assert got.calls == [] and got.content == text
    # Llama 3.1's built-in tools write Python after the tag: not a JSON call, so content
    text = '<|python_tag|>brave_search.call(query="latest price of 1oz gold")'
    got = check_splits(Llama, text)
    assert got.calls == [] and got.content == text


def test_cut_off_call(parse):
    got = parse(Llama, ['{"name": "searchTool", "parameters": {"query": "te'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("searchTool", '{"query": "te', False)]
    text = '{"name": "search'
    got = parse(Llama, [text])
    assert got.calls == [] and got.content == text
    # a key before the name (Llama 3.3's "type") does not delay the call
    got = parse(Llama, ['{"type": "function", "name": "f", "parameters": {"a"'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("f", '{"a"', False)]


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris"})), ToolCall("noop", "{}")]
    got = check_splits(Llama, Llama.render(calls))
    assert got.named_args == [("get_weather", {"city": "Paris"}), ("noop", {})] and got.content == ""
