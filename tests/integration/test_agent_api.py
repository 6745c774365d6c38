"""What an agent needs from the API, through the official openai client against real processes:
tool calls (auto, none, required, named; unary and streamed; a whole tool loop), reasoning,
structured outputs and logprobs, on the mocker, scripted with ``--replies``.

Each reply below is raw model output in its family's format; the mocker tokenizes and streams it,
the frontend's output stage parses it back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from dyn.core.model import TINY_MODEL_DIR

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}

HERMES_TWO_CALLS = (
    '<think>\nI need both tools.\n</think>\n\nLet me check both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
    '"unit": "c"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}'
    "\n</tool_call>"
)
REPLIES = [
    {"match": "weather and time in Paris", "text": HERMES_TWO_CALLS},
    {"match": "14:05", "text": "<think>\nBoth tools answered.\n</think>\n\nIt is 18 C and 14:05 in Paris."},
    {"match": "think first", "text": "<think>\nLet me think about it.\n</think>\n\nForty-two."},
    {"match": "think forever", "text": "<think>\nStill thinking and thinking"},
    {"match": "pythonic please", "text": '[get_weather(city="Oslo", unit="c"), get_time(tz="CET")]'},
    {
        "match": "kimi please",
        "text": (
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
            '{"city": "Rome"}<|tool_call_end|><|tool_calls_section_end|>'
        ),
    },
    {"match": "plugin please", "text": 'Calling.\nCALL get_time {"tz": "UTC"}'},
    {
        "match": "coder please",
        "text": (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nLima\n</parameter>\n</function>\n</tool_call>"
        ),
    },
    {
        "match": "horizon please",
        "text": (
            "<ifm|tool_calls>\n<ifm|tool_call>get_weather\n<ifm|arg_key>city</ifm|arg_key>\n"
            "<ifm|arg_value>Kyiv</ifm|arg_value>\n</ifm|tool_call>\n</ifm|tool_calls>"
        ),
    },
    {
        "match": "hunyuan please",
        "text": "<tool_calls>\n<tool_call>get_time<arg_key>tz</arg_key><arg_value>EET</arg_value></tool_call>\n</tool_calls>",
    },
    {
        "match": "muse please",
        "text": (
            " to=self<|message|>The weather tool answers this.<|eom|><|start|>assistant to=get_weather<|message|>"
            '<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter name="city">Nairobi'
            "</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eom|>"
        ),
    },
]


@pytest.fixture(scope="module")
def agent_stack(stack_factory, tmp_path_factory):
    """Two mocker workers with the replies above (dyn-tiny: the hermes tool-call parser advertised
    by default, Dynamo's way) behind a frontend with a reasoning parser (vLLM's way)."""
    root = tmp_path_factory.mktemp("replies")
    replies = root / "replies.jsonl"
    replies.write_text("".join(json.dumps(r) + "\n" for r in REPLIES))
    return stack_factory("agents").up("--reasoning-parser", "qwen3", worker_args=("--replies", str(replies)))


def client_for(url: str):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def streamed(stream, reasoning_field: str = "reasoning_content"):
    """content, reasoning (from ``reasoning_field``), tool calls by index and the finish reason of
    a streamed choice, checking OpenAI's shapes on the way."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get(reasoning_field) or ""
        for call in delta.tool_calls or ():
            if call.index not in calls:
                assert call.id and call.type == "function" and call.function.name, call
                calls[call.index] = {
                    "id": call.id,
                    "name": call.function.name,
                    "arguments": call.function.arguments or "",
                }
            else:
                assert call.id is None and call.function.name is None, call
                calls[call.index]["arguments"] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


def test_auto_tool_calls_unary_and_streamed(agent_stack):
    client = client_for(agent_stack.url)
    messages = [{"role": "user", "content": "What are the weather and time in Paris?"}]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER, TIME], max_tokens=200
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check both.\n"
    assert choice.message.model_extra["reasoning_content"] == "\nI need both tools.\n"
    calls = choice.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Paris", "unit": "c"}),
        ("function", "get_time", {"tz": "CET"}),
    ]
    assert len({c.id for c in calls}) == 2
    content, _, scalls, finish = streamed(
        client.chat.completions.create(
            model=MODEL, messages=messages, tools=[WEATHER, TIME], max_tokens=200, stream=True
        )
    )
    assert finish == "tool_calls" and content == "Let me check both.\n"
    assert [(c["name"], json.loads(c["arguments"])) for c in scalls] == [
        (c.function.name, json.loads(c.function.arguments)) for c in calls
    ]


def test_a_whole_tool_loop_to_a_final_answer(agent_stack):
    client = client_for(agent_stack.url)
    messages = [{"role": "user", "content": "What are the weather and time in Paris?"}]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER, TIME], max_tokens=200
    )
    message = first.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    results = {"get_weather": "18 C, sunny", "get_time": "14:05"}
    for call in message.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": results[call.function.name]})
    final = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER, TIME], max_tokens=200
    )
    choice = final.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == "It is 18 C and 14:05 in Paris."
    assert choice.message.model_extra["reasoning_content"] == "\nBoth tools answered.\n"


def test_reasoning_content_unary_streamed_and_cut_off(agent_stack):
    client = client_for(agent_stack.url)
    ask = [{"role": "user", "content": "think first, then answer"}]
    reply = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=100)
    message = reply.choices[0].message
    assert message.content == "Forty-two."
    assert message.model_extra["reasoning_content"] == "\nLet me think about it.\n"
    content, reasoning, _, finish = streamed(
        client.chat.completions.create(model=MODEL, messages=ask, max_tokens=100, stream=True)
    )
    assert (content, reasoning, finish) == ("Forty-two.", "\nLet me think about it.\n", "stop")
    cut = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "think forever"}], max_tokens=4
    )
    assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.content is None
    assert cut.choices[0].message.model_extra["reasoning_content"]


def test_tool_choice_none_renders_tools_but_never_parses(agent_stack):
    client = client_for(agent_stack.url)
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What are the weather and time in Paris?"}],
        tools=[WEATHER, TIME],
        tool_choice="none",
        max_tokens=200,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert "<tool_call>" in choice.message.content


def test_forced_tool_choices_are_valid_calls(agent_stack):
    client = client_for(agent_stack.url)
    ask = [{"role": "user", "content": "anything"}]
    for stream in (False, True):
        kwargs = dict(
            model=MODEL,
            messages=ask,
            tools=[WEATHER, TIME],
            max_tokens=300,
            seed=7,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
        if stream:
            _, _, calls, finish = streamed(client.chat.completions.create(stream=True, **kwargs))
        else:
            choice = client.chat.completions.create(**kwargs).choices[0]
            calls = [
                {"name": c.function.name, "arguments": c.function.arguments}
                for c in choice.message.tool_calls
            ]
            finish = choice.finish_reason
        assert finish == "stop" and [c["name"] for c in calls] == ["get_weather"]
        jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER["function"]["parameters"])
    required = client.chat.completions.create(
        model=MODEL, messages=ask, tools=[WEATHER, TIME], max_tokens=400, tool_choice="required", seed=3
    )
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    schemas = {"get_weather": WEATHER, "get_time": TIME}
    for call in choice.message.tool_calls:
        jsonschema.validate(
            json.loads(call.function.arguments), schemas[call.function.name]["function"]["parameters"]
        )


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "address"],
    "additionalProperties": False,
}


def test_structured_outputs_parse_and_validate(agent_stack):
    client = client_for(agent_stack.url)
    ask = [{"role": "user", "content": "a person"}]
    for seed in range(3):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=ask,
            max_tokens=400,
            seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
        )
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)
    obj = client.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=400, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    choice = client.completions.create(
        model=MODEL,
        prompt="Pick:",
        max_tokens=20,
        extra_body={"guided_choice": ["red", "green (dark)", "a.b*c"]},
    )
    assert choice.choices[0].text in ["red", "green (dark)", "a.b*c"]
    regex = client.completions.create(
        model=MODEL, prompt="Phone:", max_tokens=20, extra_body={"guided_regex": "[0-9]{3}-[0-9]{4}"}
    )
    assert len(regex.choices[0].text) == 8 and regex.choices[0].text[3] == "-"
    grammar = client.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=20, extra_body={"guided_grammar": 'root ::= ("yes" | "no") "!"'}
    )
    assert grammar.choices[0].message.content in ("yes!", "no!")


def test_logprobs_in_openai_shapes(agent_stack):
    client = client_for(agent_stack.url)
    ask = [{"role": "user", "content": "numbers"}]
    off = {"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}  # all content
    reply = client.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=8, logprobs=True, top_logprobs=3, seed=1, extra_body=off
    )
    items = reply.choices[0].logprobs.content
    assert len(items) == 8 and "".join(i.token for i in items) == reply.choices[0].message.content
    for item in items:
        tops = [t.logprob for t in item.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and item.logprob <= 0
        assert bytes(item.bytes).decode(errors="replace") is not None
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ask,
        max_tokens=8,
        logprobs=True,
        top_logprobs=3,
        seed=1,
        stream=True,
        extra_body=off,
    )
    got = [i for c in stream if c.choices and c.choices[0].logprobs for i in c.choices[0].logprobs.content]
    assert [(i.token, i.logprob) for i in got] == [(i.token, i.logprob) for i in items]
    completion = client.completions.create(
        model=MODEL,
        prompt="Tokens and their odds",
        max_tokens=5,
        logprobs=2,
        echo=False,
        seed=1,  # unseeded, the mocker may sample a special token: listed in tokens, skipped in text
        extra_body={"ignore_eos": True, "prompt_logprobs": 1},
    )
    lp = completion.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == 5
    assert "".join(lp.tokens) == completion.choices[0].text
    prompt_lps = completion.choices[0].model_extra["prompt_logprobs"]
    assert len(prompt_lps) == completion.usage.prompt_tokens and prompt_lps[0] is None


def test_reasoning_field_name_reasoning_moves_it_in_messages_and_deltas(agent_stack, stack_factory):
    """``--reasoning-field-name reasoning`` (Dynamo's flag; vLLM's newer field name)."""
    s = stack_factory("fe-reasoning-field")
    s.namespace = agent_stack.namespace
    s.env = agent_stack.env
    url = s.start_frontend("--reasoning-parser", "qwen3", "--reasoning-field-name", "reasoning")
    s.wait_instances(2)
    client = client_for(url)
    ask = [{"role": "user", "content": "think first, then answer"}]
    message = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=100).choices[0].message
    assert message.content == "Forty-two."
    assert message.model_extra == {"reasoning": "\nLet me think about it.\n"}
    stream = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=100, stream=True)
    content, reasoning, _, _ = streamed(stream, "reasoning")
    assert (content, reasoning) == ("Forty-two.", "\nLet me think about it.\n")


@pytest.mark.parametrize(
    "parser, ask, expected",
    [
        (
            "pythonic",
            "pythonic please",
            [("get_weather", {"city": "Oslo", "unit": "c"}), ("get_time", {"tz": "CET"})],
        ),
        ("kimi_k2", "kimi please", [("get_weather", {"city": "Rome"})]),
        ("qwen3_coder", "coder please", [("get_weather", {"city": "Lima"})]),
        ("k2_horizon", "horizon please", [("get_weather", {"city": "Kyiv"})]),
        ("hy_v4", "hunyuan please", [("get_time", {"tz": "EET"})]),  # a parser that takes the tokenizer
        ("muse_glimmer", "muse please", [("get_weather", {"city": "Nairobi"})]),  # and one that reasons too
    ],
)
def test_other_formats_through_the_frontends_own_parser(agent_stack, stack_factory, parser, ask, expected):
    s = stack_factory(f"fe-{parser}")
    s.namespace = agent_stack.namespace
    s.env = agent_stack.env
    url = s.start_frontend("--enable-auto-tool-choice", "--tool-call-parser", parser)
    s.wait_instances(2)
    reply = client_for(url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ask}], tools=[WEATHER, TIME], max_tokens=300
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [
        (c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls
    ] == expected
    if parser == "kimi_k2":
        assert choice.message.tool_calls[0].id == "functions.get_weather:0"
    if parser == "muse_glimmer":
        assert choice.message.model_extra["reasoning_content"] == "The weather tool answers this."


def test_auto_without_a_parser_is_a_400_naming_the_flag(stack_factory, tmp_path):
    model = tmp_path / "plain-model"
    shutil.copytree(TINY_MODEL_DIR, model)  # a model directory of its own: no parser by default
    s = stack_factory("noparser").up(
        "--model-path", str(model), workers=1, worker_args=("--model-path", str(model))
    )
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        client_for(s.url).chat.completions.create(
            model="plain-model", messages=[{"role": "user", "content": "x"}], tools=[WEATHER], max_tokens=4
        )
    assert "--enable-auto-tool-choice" in str(info.value) and "--tool-call-parser" in str(info.value)
    ok = client_for(s.url).chat.completions.create(
        model="plain-model",
        messages=[{"role": "user", "content": "x"}],
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=4,
    )
    assert ok.choices[0].message.content is not None


def test_tool_call_rate_answers_with_schema_valid_calls(stack_factory):
    s = stack_factory("rate").up(workers=1, worker_args=("--tool-call-rate", "1"))
    client = client_for(s.url)
    for seed in range(3):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "go"}],
            tools=[WEATHER, TIME],
            max_tokens=300,
            seed=seed,
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)
    plain = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "go"}], max_tokens=5
    )
    assert not plain.choices[0].message.tool_calls  # no tools offered: no call


PLUGIN = Path(__file__).resolve().parents[1] / "core" / "parsers" / "line_calls_plugin.py"


def test_a_users_parser_plugin_reads_calls(agent_stack, stack_factory):
    s = stack_factory("fe-plugin")
    s.namespace, s.env = agent_stack.namespace, agent_stack.env
    url = s.start_frontend(
        "--tool-parser-plugin", str(PLUGIN), "--tool-call-parser", "line_calls", "--enable-auto-tool-choice"
    )
    s.wait_instances(2)
    reply = client_for(url).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "plugin please"}],
        tools=[WEATHER, TIME],
        max_tokens=100,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Calling.\n"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_time", {"tz": "UTC"})
    ]
