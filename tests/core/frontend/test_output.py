"""The output stage: a chat choice's text -> content, reasoning_content and tool calls, streamed
in OpenAI's delta shapes and whole for unary responses."""

from __future__ import annotations

import json

import orjson

from dyn.core.frontend.apis.chat_completions.chunks import chat_delta
from dyn.core.frontend.output import OutputPlan
from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.tool import TOOL_PARSERS, Tool

HERMES = TOOL_PARSERS.get("hermes")
QWEN3 = REASONING_PARSERS.get("qwen3")
TOOLS = (Tool("get_weather", {"type": "object"}), Tool("get_time", {"type": "object"}))

REPLY = (
    "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
)


def stream(plan: OutputPlan, text: str, step: int):
    out = plan.new()
    deltas = [out.push(text[i : i + step]) for i in range(0, len(text), step)] + [out.finish()]
    return out, [d for d in deltas if d is not None]


def test_streamed_deltas_have_openai_shapes_at_every_step():
    plan = OutputPlan(reasoning=QWEN3, tool_parser=HERMES, tools=TOOLS)
    for step in (1, 3, 7, len(REPLY)):
        out, deltas = stream(plan, REPLY, step)
        assert "".join(d.reasoning for d in deltas) == "\nThe user wants weather.\n"
        assert "".join(d.content for d in deltas) == "Let me check.\n"
        calls: dict[int, dict] = {}
        for delta in deltas:
            for call in delta.tool_calls:
                if call.index not in calls:  # the first delta of a call names it
                    assert call.id and call.id.startswith("call_") and call.name
                    calls[call.index] = {"id": call.id, "name": call.name, "arguments": call.arguments}
                else:
                    assert call.id is None and call.name is None
                    calls[call.index]["arguments"] += call.arguments
        assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
            ("get_weather", {"city": "Paris"}),
            ("get_time", {"tz": "CET"}),
        ]
        assert len({c["id"] for c in calls.values()}) == 2
        assert out.finish_reason("stop") == "tool_calls" and out.finish_reason("length") == "length"


def test_unary_message():
    out = OutputPlan(reasoning=QWEN3, tool_parser=HERMES, tools=TOOLS).new()
    out.push(REPLY)
    out.finish()
    content, reasoning, calls = out.message()
    assert content == "Let me check.\n" and reasoning == "\nThe user wants weather.\n"
    assert [(c.function.name, json.loads(c.function.arguments), c.type) for c in calls] == [
        ("get_weather", {"city": "Paris"}, "function"),
        ("get_time", {"tz": "CET"}, "function"),
    ]


def test_no_call_keeps_stop_and_content():
    out = OutputPlan(tool_parser=HERMES, tools=TOOLS).new()
    out.push("Just text.")
    out.finish()
    assert out.message() == ("Just text.", None, []) and out.finish_reason("stop") == "stop"


def test_a_call_cut_off_by_max_tokens_is_content_when_unary():
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    out = OutputPlan(tool_parser=HERMES, tools=TOOLS).new()
    out.push(text)
    out.finish()
    assert out.message() == (text, None, []) and out.finish_reason("length") == "length"
    # streamed, the call went out as far as it got (as vLLM streams it)
    _, deltas = stream(OutputPlan(tool_parser=HERMES, tools=TOOLS), text, 4)
    args = "".join(c.arguments for d in deltas for c in d.tool_calls)
    assert args == '{"city": "Par'


def test_thinking_cut_off_stays_reasoning():
    out = OutputPlan(reasoning=QWEN3).new()
    out.push("<think>I am still think")
    out.finish()
    assert out.message() == (None, "I am still think", [])


def test_forced_named_call():
    plan = OutputPlan(forced="named", forced_name="get_weather", tools=TOOLS)
    out, deltas = stream(plan, ' {"city": "Oslo"}', 2)
    content, _, calls = out.message()
    assert content is None and [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", '{"city": "Oslo"}')
    ]
    assert out.finish_reason("stop") == "stop"  # OpenAI keeps stop for a named tool_choice
    assert deltas[0].tool_calls[0].name == "get_weather"


def test_forced_required_calls():
    text = '[{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Rome"}}]'
    for step in (1, 5, len(text)):
        out, _ = stream(OutputPlan(forced="required", tools=TOOLS), text, step)
        _, _, calls = out.message()
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("get_time", {}),
            ("get_weather", {"city": "Rome"}),
        ]
        assert out.finish_reason("stop") == "tool_calls"


def test_special_tokens_kept_when_a_parser_needs_them():
    assert OutputPlan(tool_parser=HERMES).needs_special_tokens
    assert not OutputPlan(reasoning=QWEN3).needs_special_tokens


def test_chat_delta_json():
    from dyn.core.frontend.output import ToolCallDelta

    first = orjson.loads(chat_delta("", "", [ToolCallDelta(0, "call_1", "f", "")]))
    assert first == {
        "tool_calls": [
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
        ]
    }
    later = orjson.loads(chat_delta("hi", "hmm", [ToolCallDelta(0, None, None, '{"a"')]))
    assert later == {
        "content": "hi",
        "reasoning_content": "hmm",
        "tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}],
    }


def test_parsers_get_the_prompt_and_the_tokenizer_they_ask_for():
    """A tool-call parser that emits reasoning gets ``prompt_text``, one that takes the tokenizer
    ``tokenizer``, one that does both both; a reasoning parser that takes the tokenizer gets it."""
    from dyn.core.parsers.reasoning import ReasoningParser
    from dyn.core.parsers.tool import ToolParser

    seen: dict[str, dict] = {}

    class Both(ToolParser):
        emits_reasoning = True
        takes_tokenizer = True

        def __init__(self, tools=(), **kwargs):
            super().__init__(tools)
            seen["tool"] = kwargs

        def feed(self, text):
            return [text]

    class Reads(ReasoningParser):
        takes_tokenizer = True

        def setup(self):
            seen["reasoning"] = {"tokenizer": self.tokenizer, "prompt_text": self.prompt_text}

        def feed(self, text):
            return [text]

    tok = object()
    OutputPlan(tool_parser=Both, prompt_text="P", tokenizer=tok).new()  # type: ignore[arg-type]
    assert seen.pop("tool") == {"prompt_text": "P", "tokenizer": tok}
    OutputPlan(reasoning=Reads, prompt_text="P", tokenizer=tok).new()  # type: ignore[arg-type]
    assert seen.pop("reasoning") == {"tokenizer": tok, "prompt_text": "P"}
    Both.emits_reasoning = False
    OutputPlan(tool_parser=Both, prompt_text="P", tokenizer=tok).new()  # type: ignore[arg-type]
    assert seen.pop("tool") == {"tokenizer": tok}
