"""The gpt_oss tool parser (vLLM's ``openai``) on gpt-oss Harmony outputs (format: OpenAI's
"Harmony response format" guide and openai/harmony; recorded strings from
huggingface/transformers tests/utils/test_chat_parsing_utils.py, gpt-oss-20b)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip(
    "openai_harmony", reason="the gpt-oss parsers need openai-harmony (pip install 'dyn[harmony]')"
)

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

GptOss = TOOL_PARSERS.get("openai")

# gpt-oss-20b deciding to call a tool: analysis, then the call; the engine left out the
# <|call|> stop token (transformers test_chat_parsing_utils.py, test_gpt_oss_with_tool_call, shortened)
REASON_THEN_CALL = (
    '<|channel|>analysis<|message|>The user asks: "What is the weather like in SF?" We need to call '
    'get_current_weather with location "San Francisco, CA".\n\nWe will call function get_current_weather.'
    "<|end|><|start|>assistant<|channel|>commentary to=functions.get_current_weather <|constrain|>json"
    '<|message|>{\n  "location": "San Francisco, CA"\n}'
)
# gpt-oss-20b answering without a tool (test_gpt_oss_no_tool_call)
REASON_THEN_FINAL = (
    "<|channel|>analysis<|message|>User asks a simple math question: 2+2 = 4. Provide answer."
    "<|end|><|start|>assistant<|channel|>final<|message|>2"
)


def test_names_for_vllm_and_dynamo():
    assert TOOL_PARSERS.get("gpt-oss") is GptOss and TOOL_PARSERS.get("harmony") is GptOss
    assert GptOss.emits_reasoning and GptOss.needs_special_tokens


def test_analysis_then_call(check_splits):
    got = check_splits(GptOss, REASON_THEN_CALL)
    assert got.reasoning.startswith('The user asks: "What is the weather') and got.reasoning.endswith(
        "We will call function get_current_weather."
    )
    assert got.content == ""
    assert got.named_args == [("get_current_weather", {"location": "San Francisco, CA"})]
    # the model's JSON, verbatim; its JSON was complete, so the missing <|call|> does not matter
    assert got.calls[0].arguments == '{\n  "location": "San Francisco, CA"\n}' and got.calls[0].complete


def test_analysis_then_final(check_splits):
    got = check_splits(GptOss, REASON_THEN_FINAL + "<|return|>")
    assert got.reasoning == "User asks a simple math question: 2+2 = 4. Provide answer."
    assert got.content == "2" and got.calls == []


def test_preamble_and_calls_with_call_markers(check_splits):
    # the Harmony guide's call, after a commentary preamble and followed by a second call
    text = (
        "<|channel|>analysis<|message|>Need to use function get_current_weather.<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Checking two cities.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_current_weather <|constrain|>json"
        '<|message|>{"location":"San Francisco"}<|call|>'
        "<|start|>assistant to=functions.get_current_weather<|channel|>commentary json"
        '<|message|>{"location":"Tokyo"}<|call|>'
    )
    got = check_splits(GptOss, text)
    assert got.reasoning == "Need to use function get_current_weather."
    assert got.content == "Checking two cities."
    assert got.named_args == [
        ("get_current_weather", {"location": "San Francisco"}),
        ("get_current_weather", {"location": "Tokyo"}),
    ]
    assert all(c.complete for c in got.calls)


def test_messages_of_a_kind_are_joined_by_newlines(check_splits):
    text = (
        "<|channel|>analysis<|message|>First thought.<|end|><|start|>assistant<|channel|>analysis<|message|>"
        'Second thought.<|end|><|start|>assistant<|channel|>final<|message|>Answer with <|"|> and <b>.'
    )
    got = check_splits(GptOss, text)
    assert got.reasoning == "First thought.\nSecond thought."
    assert got.content == 'Answer with <|"|> and <b>.'


def test_where_the_output_starts(check_splits):
    got = check_splits(GptOss, "<|start|>assistant<|channel|>final<|message|>Hello!<|return|>")
    assert got.content == "Hello!" and got.reasoning == ""
    # a prompt that opened the final channel itself
    got = check_splits(lambda: GptOss((), prompt_text="<|start|>assistant<|channel|>final<|message|>"), "Hi.")
    assert got.content == "Hi." and got.reasoning == ""


def test_plain_text_is_content(check_splits):
    text = "Not Harmony at all: just an answer, with a <| and a <|end of nothing."
    got = check_splits(GptOss, text)
    assert got.content == text and got.reasoning == "" and got.calls == []


def test_unreadable_rest_is_content(check_splits):
    # after a message ends the parser wants <|start|>: anything else is not Harmony
    got = check_splits(GptOss, "<|channel|>analysis<|message|>thinking<|end|>\nplain words <|start|>x")
    assert got.reasoning == "thinking"
    assert got.content == "\nplain words <|start|>x"


def test_cut_off(parse):
    # max_tokens inside the arguments: the call streamed as far as it got, never ended
    got = parse(GptOss, [REASON_THEN_CALL[:-12]])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_current_weather", '{\n  "location": "San Fran', False)
    ]
    # cut off inside the header, before the function's name was read: the header is content
    got = parse(
        GptOss,
        ["<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant<|channel|>commentary to=fun"],
    )
    assert got.reasoning == "Call it." and got.calls == []
    assert got.content == "<|start|>assistant<|channel|>commentary to=fun"
    # cut off in the reasoning: it stays reasoning
    got = parse(GptOss, ["<|channel|>analysis<|message|>Let me thi"])
    assert got.reasoning == "Let me thi" and got.content == ""


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris"})), ToolCall("noop", "{}")]
    rendered = GptOss.render(calls)
    assert rendered.startswith(
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city"'
    )
    got = check_splits(GptOss, rendered)
    assert got.named_args == [("get_weather", {"city": "Paris"}), ("noop", {})] and got.content == ""
