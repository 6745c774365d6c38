"""The gpt_oss reasoning parser (reasoning/gpt_oss.py; vLLM's ``openai_gptoss``) on gpt-oss
Harmony outputs (format: OpenAI's "Harmony response format" guide; recorded strings from
huggingface/transformers tests/utils/test_chat_parsing_utils.py, gpt-oss-20b)."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "openai_harmony", reason="the gpt-oss parsers need openai-harmony (pip install 'dyn[harmony]')"
)

from dyn.core.parsers.reasoning import REASONING_PARSERS

GptOss = REASONING_PARSERS.get("gpt_oss")

# gpt-oss's chat template ends the prompt with the assistant's start
PROMPT = "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant"
# gpt-oss-20b (transformers test_chat_parsing_utils.py, test_gpt_oss_no_tool_call)
REASON_THEN_FINAL = (
    "<|channel|>analysis<|message|>User asks a simple math question: 2+2 = 4. Provide answer."
    "<|end|><|start|>assistant<|channel|>final<|message|>2"
)


def parser(prompt: str | None = PROMPT):
    return lambda: GptOss(prompt)


def test_vllm_spelling_is_registered():
    assert REASONING_PARSERS.get("openai_gptoss") is GptOss and GptOss.needs_special_tokens


def test_analysis_then_final(check_splits):
    got = check_splits(parser(), REASON_THEN_FINAL)
    assert got.reasoning == "User asks a simple math question: 2+2 = 4. Provide answer."
    assert got.content == "2"


def test_preamble_is_content_and_a_call_stays_as_written(check_splits):
    call = (
        "<|start|>assistant<|channel|>commentary to=functions.get_current_weather <|constrain|>json"
        '<|message|>{"location":"San Francisco"}<|call|>'
    )
    text = (
        "<|channel|>analysis<|message|>Need to use function get_current_weather.<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Let me look that up.<|end|>" + call
    )
    got = check_splits(parser(), text)
    assert got.reasoning == "Need to use function get_current_weather."
    assert got.content == "Let me look that up." + call


def test_prompt_decides_where_the_output_starts(check_splits):
    # a template that opened the final channel itself (reasoning off / prefilled answer)
    got = check_splits(parser(PROMPT + "<|channel|>final<|message|>"), "The answer is 4.")
    assert got.content == "The answer is 4." and got.reasoning == ""
    # no prompt: the output starts after <|start|>assistant, or opens its own message
    assert check_splits(parser(None), REASON_THEN_FINAL).content == "2"
    got = check_splits(parser(None), "<|start|>assistant<|channel|>analysis<|message|>hm<|end|>")
    assert got.reasoning == "hm" and got.content == ""


def test_plain_text_is_content(check_splits):
    text = "Just text, no channels; a stray <|end|> token too."
    got = check_splits(parser(), text)
    assert got.content == text and got.reasoning == ""


def test_cut_off_reasoning_stays_reasoning(parse):
    got = parse(parser(), ["<|channel|>analysis<|message|>User asks a simple math"])
    assert got.reasoning == "User asks a simple math" and got.content == ""
