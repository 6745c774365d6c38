"""--tool-call-parser hf: calls (and reasoning) as the model's tokenizer_config.json
``response_template`` describes them, read with transformers' engine. Templates and model
directories: ``response_templates``. Expected values checked against vLLM 0.32's ``hf`` parser
(``vllm.parser.response_template``) in its venv on the same strings and prompts, except where the
module docstring says dyn differs (a call that does not parse, or is cut off mid-arguments, stays
content: vLLM drops it)."""

from __future__ import annotations

import json

import pytest

from dyn.core.frontend.output import OutputPlan
from dyn.core.frontend.service import _parser
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model import load_model_info
from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.registry import ParserModelError
from dyn.core.parsers.tool import TOOL_PARSERS, Tool
from dyn.core.protocol.errors import ApiError
from tests.core.parsers.response_templates import PROMPT, QWEN3, QWEN35, WEATHER, tokenizer

HF = TOOL_PARSERS.get("hf")
TOOLS = [Tool("get_weather", WEATHER)]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Tokenizer:
    return tokenizer(tmp_path_factory.mktemp("qwen3"), QWEN3)


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory) -> Tokenizer:
    return tokenizer(tmp_path_factory.mktemp("qwen35"), QWEN35)


def maker(tok, prompt=PROMPT, tools=TOOLS):
    return lambda: HF(tools, prompt_text=prompt, tokenizer=tok)


def test_registered_under_vllms_name_taking_the_tokenizer_and_the_prompt():
    assert HF.name == "hf" and HF.takes_tokenizer and HF.emits_reasoning
    HF.check()  # transformers' engine is installed with dyn


def test_reasoning_then_content(qwen3, check_splits):
    got = check_splits(maker(qwen3), "<think>\nThe user wants weather.\n</think>\n\nIt is sunny.<|im_end|>")
    assert (got.reasoning, got.content, got.calls) == ("\nThe user wants weather.\n", "\n\nIt is sunny.", [])


def test_content_then_calls(qwen3, check_splits):
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>'
    )
    got = check_splits(maker(qwen3), text)
    assert got.content == "Let me check."  # the newlines before a call belong to its anchor
    assert got.named_args == [
        ("get_weather", {"city": "Paris", "days": 3}),
        ("get_weather", {"city": "Oslo"}),
    ]
    assert all(c.complete for c in got.calls)
    assert got.calls[0].arguments == '{"city": "Paris", "days": 3}'


def test_arguments_typed_by_the_tools_schema(qwen35, check_splits):
    text = (
        "<think>hmm</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call><|im_end|>"
    )
    got = check_splits(maker(qwen35), text)
    assert (got.reasoning, got.content) == ("hmm", "")
    assert got.named_args == [("get_weather", {"city": "Paris", "days": 3, "metric": True})]
    untyped = check_splits(maker(qwen35, tools=[]), text)  # no schema: the values stay text
    assert untyped.named_args == [("get_weather", {"city": "Paris", "days": "3", "metric": "true"})]


def test_a_call_cut_off_by_max_tokens_stays_content(qwen3, check_splits):
    text = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    got = check_splits(maker(qwen3), text)
    assert (got.content, got.calls) == (text, [])  # vLLM: "Checking." and nothing


def test_a_call_cut_off_after_its_json_is_read(qwen3, check_splits):
    got = check_splits(maker(qwen3), 'Sure.<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}')
    assert (got.content, got.named_args) == ("Sure.", [("get_weather", {"city": "Rome"})])


def test_a_call_that_does_not_parse_stays_content_and_the_next_is_read(qwen3, check_splits):
    bad = '<tool_call>{"name": "get_weather", oops}</tool_call>'
    good = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    got = check_splits(maker(qwen3), f"A{bad}B{good}")
    assert got.content == f"A{bad}B"
    assert got.named_args == [("get_weather", {"city": "Oslo"})]
    for body in ('{"name": "get_weather", "arguments": [1]}', '{"arguments": {}}', "[]"):
        text = f"<tool_call>{body}</tool_call>"
        assert check_splits(maker(qwen3), text).content == text, body


def test_a_prompt_that_opened_the_thinking_section(qwen3, check_splits):
    got = check_splits(maker(qwen3, PROMPT + "<think>\n"), "still thinking</think>\n\nDone.<|im_end|>")
    assert (got.reasoning, got.content) == ("still thinking", "\n\nDone.")
    off = check_splits(maker(qwen3, PROMPT + "<think>\n\n</think>\n\n"), "Plain answer.<|im_end|>")
    assert (off.reasoning, off.content) == ("", "Plain answer.")


def test_a_prompt_tail_held_as_a_possible_anchor_is_not_output(qwen3, check_splits):
    # "\n" ends the prompt: the engine holds it (it may begin "\n<tool_call>"), then reads it as content
    got = check_splits(maker(qwen3, PROMPT + "Sure,\n"), " here.<|im_end|>")
    assert got.content == " here."
    got = check_splits(
        maker(qwen3, PROMPT + "Sure,\n"), '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    )
    assert (got.content, got.named_args) == ("", [("f", {})])


def test_without_a_thinking_field_the_reasoning_parser_stays(tmp_path):
    template = json.loads(json.dumps(QWEN3))
    del template["fields"]["thinking"]
    tok = tokenizer(tmp_path, template)
    assert not HF([], tokenizer=tok).emits_reasoning
    plan = OutputPlan(
        reasoning=REASONING_PARSERS.get("qwen3"),
        tool_parser=HF,
        tools=tuple(TOOLS),
        prompt_text=PROMPT,
        tokenizer=tok,
    )
    out = plan.new()
    out.push('<think>why</think>ok<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>')
    out.finish()
    content, reasoning, calls = out.message()
    assert (content, reasoning, [c.function.name for c in calls]) == ("ok", "why", ["get_weather"])


def test_the_output_plan_gives_the_prompt_and_the_tokenizer(qwen3):
    plan = OutputPlan(
        reasoning=REASONING_PARSERS.get("qwen3"),
        tool_parser=HF,
        tools=tuple(TOOLS),
        prompt_text=PROMPT + "<think>\n",
        tokenizer=qwen3,
    )
    text = 'plan</think>\n\nOK.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    out = plan.new()
    deltas = [out.push(text[i : i + 3]) for i in range(0, len(text), 3)] + [out.finish()]
    content, reasoning, calls = out.message()
    assert (content, reasoning) == ("\n\nOK.", "plan")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert out.finish_reason("stop") == "tool_calls"
    assert [d.tool_calls[0].name for d in deltas if d and d.tool_calls] == ["get_weather"]


def test_a_model_without_a_response_template_is_refused_with_what_to_fix(tmp_path):
    tiny = Tokenizer.from_model(load_model_info(None, None))
    assert tiny.response_template is None
    with pytest.raises(
        ParserModelError,
        match=r"--tool-call-parser hf needs a response_template in the model's tokenizer_config.json",
    ):
        HF.check_tokenizer(tiny)
    with pytest.raises(ParserModelError, match="needs a response_template"):
        HF([], prompt_text=PROMPT, tokenizer=tiny)
    with pytest.raises(ApiError, match="needs a response_template") as info:
        _parser(TOOL_PARSERS, "hf", tiny)  # a worker advertises hf: the request gets the reason
    assert info.value.status == 500


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda t: t["fields"].pop("tool_calls"), r"needs a response_template with a 'tool_calls' field"),
        (lambda t: t.pop("start_anchor"), r"cannot use the response_template of .*start_anchor"),
        (lambda t: t["fields"].update(citations={"open": "<cite>"}), r"fields \['citations'\]"),
        (lambda t: t["fields"]["thinking"].update(content="json"), "'thinking' field is not plain text"),
        (  # the leftover text would all be one call
            lambda t: (
                t["fields"]["tool_calls"].pop("open_pattern"),
                t["fields"]["content"].update(open="<a>"),
            ),
            "'tool_calls' field has no open anchor",
        ),
        (lambda t: t.update(version=2), "Unsupported response_template version"),
    ],
)
def test_a_template_the_parser_cannot_use_is_refused(tmp_path, change, words):
    template = json.loads(json.dumps(QWEN3))
    change(template)
    tok = tokenizer(tmp_path, template)
    with pytest.raises(ParserModelError, match=words):
        HF.check_tokenizer(tok)


def test_a_malformed_template_still_loads_the_model(tmp_path):
    tok = tokenizer(tmp_path, "not an object")
    assert tok.response_template == "not an object"
    with pytest.raises(ParserModelError, match="must be a dict"):
        HF.check_tokenizer(tok)


def test_render_is_not_built():
    with pytest.raises(NotImplementedError, match="cannot write calls"):
        HF.render([])


def test_long_output_keeps_the_engine_buffer_bounded(qwen3):
    """200,000 characters in 4-character pieces: the engine's buffer stays bounded (transformers
    5.24 alone keeps and copies the whole output at every piece)."""
    for text in (
        "<think>" + "abc " * 50_000,
        "a b\n" * 50_000,
        '<tool_call>{"name": "get_weather", "arguments": {"city": "' + "abcd" * 50_000 + '"}}</tool_call>',
    ):
        parser = maker(qwen3)()
        for i in range(0, len(text), 4):
            parser.feed(text[i : i + 4])
            assert len(parser._reader._engine._buffer) < 20_000
        parser.finish()
