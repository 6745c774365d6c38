"""--reasoning-parser hf: reasoning from the ``thinking`` field of the model's tokenizer_config.json
``response_template``, everything else content, tool regions verbatim. Templates and model
directories: ``response_templates``. Expected values checked against vLLM 0.32's ``hf`` reasoning
parser alone (``vllm.parser.response_template``, no tool-call parser) in its venv on the same
strings and prompts: they agree."""

from __future__ import annotations

import json

import pytest

from dyn.core.frontend.output import OutputPlan
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model import load_model_info
from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.registry import ParserModelError
from dyn.core.parsers.tool import TOOL_PARSERS, Tool
from tests.core.parsers.response_templates import PROMPT, QWEN3, QWEN35, tokenizer

HF = REASONING_PARSERS.get("hf")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Tokenizer:
    return tokenizer(tmp_path_factory.mktemp("qwen3"), QWEN3)


def maker(tok, prompt=PROMPT):
    return lambda: HF(prompt, tokenizer=tok)


def test_registered_under_vllms_name_taking_the_tokenizer():
    assert HF.name == "hf" and HF.takes_tokenizer
    HF.check()


def test_reasoning_then_content(qwen3, check_splits):
    got = check_splits(maker(qwen3), "<think>\nThe user wants weather.\n</think>\n\nIt is sunny.<|im_end|>")
    assert (got.reasoning, got.content) == ("\nThe user wants weather.\n", "\n\nIt is sunny.")


def test_tool_regions_stay_content_verbatim(qwen3, check_splits):
    calls = '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    got = check_splits(maker(qwen3), f"<think>go</think>Let me check.{calls}<|im_end|>")
    assert (got.reasoning, got.content) == ("go", f"Let me check.{calls}")
    cut = 'A<tool_call>{"name": "get_weather", "argu'
    assert check_splits(maker(qwen3), cut).content == cut


def test_a_prompt_that_opened_or_closed_the_thinking_section(qwen3, check_splits):
    got = check_splits(maker(qwen3, PROMPT + "<think>\n"), "still thinking</think>\n\nDone.<|im_end|>")
    assert (got.reasoning, got.content) == ("still thinking", "\n\nDone.")
    cut = check_splits(maker(qwen3, PROMPT + "<think>\n"), "thinking until max_tokens")
    assert (cut.reasoning, cut.content) == ("thinking until max_tokens", "")
    off = check_splits(maker(qwen3, PROMPT + "<think>\n\n</think>\n\n"), "Plain answer.<|im_end|>")
    assert (off.reasoning, off.content) == ("", "Plain answer.")


def test_another_tool_call_parser_reads_the_calls_after_it(tmp_path):
    tok = tokenizer(tmp_path, QWEN35)
    plan = OutputPlan(
        reasoning=HF,
        tool_parser=TOOL_PARSERS.get("qwen3_coder"),
        tools=(Tool("get_weather", {"type": "object", "properties": {"days": {"type": "integer"}}}),),
        prompt_text=PROMPT,
        tokenizer=tok,
    )
    out = plan.new()
    text = "<think>hmm</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    for i in range(0, len(text), 5):
        out.push(text[i : i + 5])
    out.finish()
    content, reasoning, calls = out.message()
    assert reasoning == "hmm"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"days": 3})
    ]


def test_a_model_without_a_response_template_or_thinking_is_refused(tmp_path):
    tiny = Tokenizer.from_model(load_model_info(None, None))
    with pytest.raises(
        ParserModelError, match="--reasoning-parser hf needs a response_template in the model's"
    ):
        HF.check_tokenizer(tiny)
    with pytest.raises(ParserModelError, match="needs a response_template"):
        HF(PROMPT, tokenizer=tiny)
    template = json.loads(json.dumps(QWEN3))
    del template["fields"]["thinking"]
    with pytest.raises(ParserModelError, match="needs a response_template with a 'thinking' field"):
        HF.check_tokenizer(tokenizer(tmp_path, template))


def test_long_output_keeps_the_engine_buffer_bounded(qwen3):
    """200,000 characters in 4-character pieces: the engine's buffer stays bounded."""
    for text in ("<think>" + "abc " * 50_000, "a b\n" * 50_000):
        parser = maker(qwen3)()
        for i in range(0, len(text), 4):
            parser.feed(text[i : i + 4])
            assert len(parser._reader._engine._buffer) < 20_000
        parser.finish()
