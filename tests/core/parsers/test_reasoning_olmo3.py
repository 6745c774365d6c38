"""OLMo 3 reasoning (core/parsers/reasoning/think.py, ``olmo3``): cut-off and content-only
outputs (reasoning then content is in test_reasoning_think.py)."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS

Olmo3 = REASONING_PARSERS.get("olmo3")

# OLMo-3-7B-Think: plain-text tags, the template may write "<think>" itself (vLLM's olmo3 parser)
PROMPT = "<|im_start|>user\nWhat is 12 * 12?<|im_end|>\n<|im_start|>assistant\n<think>"
REASONING = "Okay, 12 times 12. 12 * 10 = 120 and 12 * 2 = 24, so 144."


def test_reasoning_then_answer_after_an_opening_prompt(check_splits):
    got = check_splits(lambda: Olmo3(PROMPT), REASONING + "</think>12 * 12 = **144**.")
    assert (got.reasoning, got.content) == (REASONING, "12 * 12 = **144**.")


def test_cut_off_stays_reasoning(check_splits):
    # vLLM streams such an output as reasoning (its unary path returns it as content)
    got = check_splits(lambda: Olmo3(None), "<think>" + REASONING[:25])
    assert (got.reasoning, got.content) == (REASONING[:25], "")


def test_content_only_after_a_closed_section(check_splits):
    got = check_splits(lambda: Olmo3(PROMPT + "</think>"), "144")
    assert (got.reasoning, got.content) == ("", "144")
