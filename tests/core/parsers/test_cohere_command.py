"""The cohere_command3 / cohere_command4 parsers on Cohere Command A outputs (format: the chat
templates cohere-ai/melody gen/templates/jinja/cmd3-hf.jinja and cmd4-hf.jinja, which write the
sections and the action list used here, and melody's cmd3 / cmd4 presets, which vLLM reads them
with)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

Command3 = TOOL_PARSERS.get("cohere_command3")
Command4 = TOOL_PARSERS.get("cohere_command4")

# Command A planning, then two calls, as its template writes an assistant turn with tool calls
PLAN_THEN_CALLS = (
    "<|START_THINKING|>I will look up the weather in Toronto and Paris. <|END_THINKING|>"
    "<|START_ACTION|>[\n"
    '    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"location": "Toronto"}},\n'
    '    {"tool_call_id": "1", "tool_name": "get_weather", "parameters": {"location": "Paris, \\"FR\\""}}\n'
    "]<|END_ACTION|>"
)
# the answer after the tool results, grounded in them
GROUNDED_ANSWER = (
    "<|START_THINKING|>I have the results.<|END_THINKING|>"
    "<|START_RESPONSE|>It is <co>20°C and sunny</co: 0:[0]> in Toronto and "
    "<co>rainy</co: 1:[0,1]> in Paris.\n<|END_RESPONSE|><|END_OF_TURN_TOKEN|>"
)


def test_plan_is_reasoning_and_calls_carry_the_model_ids(check_splits):
    got = check_splits(Command3, PLAN_THEN_CALLS)
    assert got.reasoning == "I will look up the weather in Toronto and Paris."
    assert got.content == ""
    assert got.named_args == [
        ("get_weather", {"location": "Toronto"}),
        ("get_weather", {"location": 'Paris, "FR"'}),
    ]
    assert [c.id for c in got.calls] == ["0", "1"] and all(c.complete for c in got.calls)
    assert got.calls[0].arguments == '{"location": "Toronto"}'


def test_grounded_answer_drops_the_citation_tags(check_splits):
    got = check_splits(Command3, GROUNDED_ANSWER)
    assert got.reasoning == "I have the results."
    assert got.content == "It is 20°C and sunny in Toronto and rainy in Paris."
    assert got.calls == []


def test_command4_starts_in_the_reasoning_unless_the_prompt_closed_it(check_splits):
    text = "The user greets me.<|END_THINKING|><|START_TEXT|>Hello! How can I help?<|END_TEXT|>"
    got = check_splits(Command4, text)
    assert got.reasoning == "The user greets me." and got.content == "Hello! How can I help?"
    # the cmd4 template with reasoning off ends the prompt with an empty, closed section
    prompt = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>"
    got = check_splits(lambda: Command4(prompt_text=prompt), "Hello! How can I help?")
    assert got.content == "Hello! How can I help?" and got.reasoning == ""
    # Command 3 starts in the answer; a prompt that opens the section starts in the reasoning
    assert check_splits(Command3, "Hi there.").content == "Hi there."
    got = check_splits(lambda: Command3(prompt_text="...<|START_THINKING|>"), "Hmm.<|END_THINKING|>Hi.")
    assert (got.reasoning, got.content) == ("Hmm.", "Hi.")


def test_plain_text_keeps_its_markup(check_splits):
    text = "Use <b>bold</b> and <co without a closing bracket; a<|START_ACT is not a marker."
    got = check_splits(Command3, text)
    assert got.content == text


def test_unreadable_action_block_is_content(check_splits):
    text = "<|START_ACTION|>get_weather(location='Toronto')<|END_ACTION|>"
    got = check_splits(Command3, text)
    assert got.calls == [] and got.content == text


def test_cut_off_call(parse):
    got = parse(
        Command3,
        [
            '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"location": "Tor'
        ],
    )
    assert [(c.name, c.id, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", "0", '{"location": "Tor', False)
    ]


def test_render_reads_back(check_splits):
    calls = [
        ToolCall("get_weather", json.dumps({"location": "Toronto"}), id="call_x"),
        ToolCall("noop", "{}", id="4"),
    ]
    rendered = Command3.render(calls)
    assert rendered == (
        "<|START_ACTION|>[\n"
        '    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"location": "Toronto"}},\n'
        '    {"tool_call_id": "4", "tool_name": "noop", "parameters": {}}\n'
        "]<|END_ACTION|>"
    )
    for parser in (Command3, Command4):
        got = check_splits(parser, rendered)
        assert got.named_args == [("get_weather", {"location": "Toronto"}), ("noop", {})]
        assert [c.id for c in got.calls] == ["0", "4"]
