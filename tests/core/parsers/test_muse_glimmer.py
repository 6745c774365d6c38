"""The muse_glimmer tool parser (core/parsers/tool/muse_glimmer.py) on MuseGlimmer outputs.

Recorded strings: vLLM's tests/tool_parsers/test_muse_glimmer_parsers.py (RAW_TOOLCALL,
test_parallel_calls_across_eom_boundaries, test_echoed_invoke_in_reasoning_is_not_parsed,
test_json_object_array_and_bool_params_decode, the name-normalization cases); checked against
vLLM 0.32's reasoning + tool parsers on the same strings.
"""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.muse_glimmer import MuseGlimmerToolParser

MuseGlimmer = TOOL_PARSERS.get("muse_glimmer")

# vLLM test_muse_glimmer_parsers.py, RAW_TOOLCALL: reasoning, then a call in its own message
TOOL_CALL = (
    " to=self<|message|>I should read the hostname file to answer.<|eom|>"
    "<|start|>assistant to=read.read<|message|>"
    '<atem:function_calls>\n<atem:invoke name="read.read">\n'
    '<atem:parameter name="path">/etc/hostname</atem:parameter>\n'
    "</atem:invoke>\n</atem:function_calls>"
)
# vLLM test_parallel_calls_across_eom_boundaries, after a reasoning message
PARALLEL = (
    " to=self<|message|>need two calls<|eom|>"
    "<|start|>assistant to=math.add<|message|>"
    '<atem:function_calls>\n<atem:invoke name="math.add">\n'
    '<atem:parameter name="a">1</atem:parameter>\n'
    '<atem:parameter name="b">2</atem:parameter>\n'
    "</atem:invoke>\n</atem:function_calls><|eom|>"
    "<|start|>assistant to=math.mul<|message|>"
    '<atem:function_calls>\n<atem:invoke name="math.mul">\n'
    '<atem:parameter name="a">3</atem:parameter>\n'
    '<atem:parameter name="b">4</atem:parameter>\n'
    "</atem:invoke>\n</atem:function_calls><|eot|>"
)


def call(name: str) -> str:
    return (
        f"<|start|>assistant to={name}<|message|>"
        f'<atem:function_calls>\n<atem:invoke name="{name}">\n'
        '<atem:parameter name="city">Paris</atem:parameter>\n'
        "</atem:invoke>\n</atem:function_calls><|eom|>"
    )


def test_names():
    assert MuseGlimmer is MuseGlimmerToolParser and TOOL_PARSERS.get("Muse-Glimmer") is MuseGlimmer
    assert MuseGlimmer.needs_special_tokens and MuseGlimmer.emits_reasoning


def test_reasoning_then_a_call(check_splits):
    got = check_splits(MuseGlimmer, TOOL_CALL)
    assert got.reasoning == "I should read the hostname file to answer."
    assert got.content == ""
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("read.read", '{"path": "/etc/hostname"}', True)
    ]


def test_parallel_calls_in_separate_messages(check_splits):
    got = check_splits(MuseGlimmer, PARALLEL)
    assert (got.reasoning, got.content) == ("need two calls", "")
    assert got.named_args == [("math.add", {"a": 1, "b": 2}), ("math.mul", {"a": 3, "b": 4})]
    assert got.calls[1].arguments == '{"a": 3, "b": 4}' and all(c.complete for c in got.calls)


def test_markup_quoted_in_reasoning_is_no_call(check_splits):
    # vLLM test_echoed_invoke_in_reasoning_is_not_parsed
    text = (
        'to=self<|message|>I could call <atem:invoke name="evil.fn">'
        '<atem:parameter name="x">1</atem:parameter></atem:invoke> '
        "but I will not.<|eom|>"
        "<|start|>assistant to=user<|message|>The answer is 42.<|eot|>"
    )
    got = check_splits(MuseGlimmer, text)
    assert got.calls == [] and got.content == "The answer is 42."
    assert got.reasoning == (
        'I could call <atem:invoke name="evil.fn"><atem:parameter name="x">1</atem:parameter>'
        "</atem:invoke> but I will not."
    )


def test_reasoning_messages_joined_and_answer(check_splits):
    text = (
        " to=self<|message|>First, the weather.<|eom|>"
        "<|start|>assistant to=self<|message|>Then the answer.<|eom|>"
        "<|start|>assistant to=user<|message|>It is sunny, 24 °C.<|eot|>"
    )
    got = check_splits(MuseGlimmer, text)
    assert (got.reasoning, got.content, got.calls) == (
        "First, the weather.\nThen the answer.",
        "It is sunny, 24 °C.",
        [],
    )


def test_values_are_json_else_text(check_splits):
    # vLLM test_json_object_array_and_bool_params_decode, plus values that are no JSON
    text = (
        "<|start|>assistant to=api.call<|message|>"
        '<atem:function_calls>\n<atem:invoke name="api.call">\n'
        '<atem:parameter name="payload">{"nested": [1, 2, 3]}</atem:parameter>\n'
        '<atem:parameter name="flag">true</atem:parameter>\n'
        '<atem:parameter name="zip">02134</atem:parameter>\n'
        '<atem:parameter name="note"> two words </atem:parameter>\n'
        '<atem:parameter name="ratio">NaN</atem:parameter>\n'
        "</atem:invoke>\n</atem:function_calls><|eot|>"
    )
    # the schema does not change the reading (the format's own: JSON, else text)
    tools = [Tool("api.call", {"properties": {"flag": {"type": "string"}}})]
    got = check_splits(lambda: MuseGlimmer(tools), text)
    assert got.calls[0].args == {
        "payload": {"nested": [1, 2, 3]},
        "flag": True,
        "zip": "02134",
        "note": " two words ",
        "ratio": "NaN",
    }


def test_doubled_name_is_the_registered_tool(check_splits):
    # vLLM's name normalization: get_weather.get_weather for a tool registered as get_weather
    weather = [Tool("get_weather")]
    got = check_splits(lambda: MuseGlimmer(weather), call("get_weather.get_weather"))
    assert got.named_args == [("get_weather", {"city": "Paris"})]
    # left as written: without tools, when it names a tool, when the halves differ
    assert (
        check_splits(MuseGlimmer, call("get_weather.get_weather")).calls[0].name == "get_weather.get_weather"
    )
    both = [Tool("get_weather"), Tool("get_weather.get_weather")]
    assert check_splits(lambda: MuseGlimmer(both), call("get_weather.get_weather")).calls[0].name == (
        "get_weather.get_weather"
    )
    assert (
        check_splits(lambda: MuseGlimmer([Tool("get")]), call("weather.get")).calls[0].name == "weather.get"
    )


def test_reasoning_left_open_before_a_call(check_splits):
    # the model switched to a tool without <|eom|>: the header still ends the reasoning
    text = (
        " to=self<|message|>Call it with no arguments.<|start|>assistant to=clock.now<|message|>"
        '<atem:function_calls>\n<atem:invoke name="clock.now">\n</atem:invoke>\n</atem:function_calls><|eom|>'
    )
    got = check_splits(MuseGlimmer, text)
    assert got.reasoning == "Call it with no arguments."
    assert [(c.name, c.arguments) for c in got.calls] == [("clock.now", "{}")]


def test_output_without_framing(check_splits):
    assert check_splits(MuseGlimmer, "Just a direct answer.").content == "Just a direct answer."
    # markup without any header (special tokens stripped upstream) is read as one tool message
    bare = '<atem:function_calls>\n<atem:invoke name="f">\n<atem:parameter name="x">1</atem:parameter>\n</atem:invoke>\n</atem:function_calls>'
    got = check_splits(MuseGlimmer, "Calling f. " + bare)
    assert got.content == "Calling f. " and got.named_args == [("f", {"x": 1})]


def test_unreadable_tool_messages_are_content(check_splits):
    # an invoke without a name, and a call written as JSON: content, as written
    nameless = '<atem:invoke>\n<atem:parameter name="x">1</atem:parameter>\n</atem:invoke>'
    got = check_splits(MuseGlimmer, f" to=f<|message|>{nameless}<|eom|>")
    assert got.calls == [] and got.content == nameless
    got = check_splits(MuseGlimmer, ' to=get_weather<|message|>{"city": "Paris"}<|eom|>')
    assert got.calls == [] and got.content == '{"city": "Paris"}'


def test_message_ended_inside_an_invoke(check_splits):
    # <|eom|> before </atem:invoke>: the call ends with the parameters read so far
    text = (
        ' to=search<|message|><atem:function_calls>\n<atem:invoke name="search">\n'
        '<atem:parameter name="q">rust</atem:parameter>\n<atem:parameter name="limit">1'
        "<|eom|><|start|>assistant to=user<|message|>Searching.<|eot|>"
    )
    got = check_splits(MuseGlimmer, text)
    assert [(c.name, c.args, c.complete) for c in got.calls] == [("search", {"q": "rust"}, True)]
    assert got.content == "Searching."


def test_cut_off(parse):
    # max_tokens inside the second parameter: the call started and never ended
    got = parse(
        MuseGlimmer,
        [
            " to=self<|message|>Look it up.<|eom|><|start|>assistant to=search<|message|><atem:function_calls>\n"
            '<atem:invoke name="search">\n<atem:parameter name="q">rust</atem:parameter>\n'
            '<atem:parameter name="limit">1'
        ],
    )
    assert got.reasoning == "Look it up."
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("search", '{"q": "rust"', False)]
    # cut off inside the reasoning, and inside a header: the reasoning so far, no content
    got = parse(MuseGlimmer, [" to=self<|message|>Let me think about", " it<|eom|><|start|>assistant to=us"])
    assert (got.reasoning, got.content, got.calls) == ("Let me think about it", "", [])


def test_render_reads_back(check_splits):
    calls = [
        ToolCall("get_weather", json.dumps({"city": "Paris", "days": 3, "opts": {"metric": True}})),
        ToolCall("noop", "{}"),
    ]
    text = MuseGlimmerToolParser.render(calls)
    got = check_splits(lambda: MuseGlimmer([Tool("get_weather"), Tool("noop")]), text)
    assert got.named_args == [
        ("get_weather", {"city": "Paris", "days": 3, "opts": {"metric": True}}),
        ("noop", {}),
    ]
    assert (got.content, got.reasoning) == ("", "")
    assert MuseGlimmerToolParser.render(calls[1:]) == (
        ' to=noop<|message|><atem:function_calls>\n<atem:invoke name="noop">\n</atem:invoke>\n'
        "</atem:function_calls><|eom|>"
    )
