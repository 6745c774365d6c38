"""Reasoning then a tag-wrapped answer (core/parsers/reasoning/answer.py): hunyuan_a13b, ernie45."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS

Hunyuan = REASONING_PARSERS.get("hunyuan_a13b")
Ernie = REASONING_PARSERS.get("ernie45")

# Hunyuan-A13B-Instruct: "<think>\n...\n</think>\n<answer>\n...\n</answer>" (tencent/Hunyuan-A13B-Instruct
# model card, which parses its output with "<think>(.*?)</think>" and "<answer>(.*?)</answer>";
# vLLM's hunyuan_a13b parser docstring)
HUNYUAN_REASONING = "The user asks for the capital of Australia. It is Canberra, not Sydney."
HUNYUAN_OUTPUT = (
    "<think>\n" + HUNYUAN_REASONING + "\n</think>\n<answer>\nThe capital of Australia is Canberra.\n</answer>"
)
# ERNIE-4.5-21B-A3B-Thinking: "...\n</think>\n\n<response>\n...\n</response>\n" or plain content
# after "</think>" (vLLM's ernie45 parser docstring)
ERNIE_REASONING = "The user wants 15% of 80. 0.15 * 80 = 12.\n"
ERNIE_OUTPUT = ERNIE_REASONING + "</think>\n\n<response>\n15% of 80 is **12**.\n</response>\n"


def test_names():
    assert REASONING_PARSERS.get("hunyuan") is Hunyuan


def test_hunyuan_reasoning_then_answer(check_splits):
    got = check_splits(Hunyuan, HUNYUAN_OUTPUT)
    assert (got.reasoning, got.content) == (HUNYUAN_REASONING, "The capital of Australia is Canberra.")


def test_hunyuan_fast_thinking_empty_section(check_splits):
    # "/no_think": the model writes an empty section, then the answer
    got = check_splits(Hunyuan, "<think>\n\n</think>\n<answer>\nCanberra.\n</answer>")
    assert (got.reasoning, got.content) == ("", "Canberra.")


def test_hunyuan_cut_off(check_splits):
    got = check_splits(Hunyuan, HUNYUAN_OUTPUT[:40])
    assert got.reasoning == HUNYUAN_OUTPUT[len("<think>\n") : 40] and got.content == ""
    # cut inside the answer: what was written stays content
    cut = HUNYUAN_OUTPUT[: HUNYUAN_OUTPUT.index("Canberra.\n</answer>")]
    got = check_splits(Hunyuan, cut)
    assert (got.reasoning, got.content) == (HUNYUAN_REASONING, "The capital of Australia is ")


def test_hunyuan_without_tags_is_content(check_splits):
    assert check_splits(Hunyuan, "Canberra.").content == "Canberra."


def test_ernie_reasoning_then_wrapped_response(check_splits):
    got = check_splits(Ernie, ERNIE_OUTPUT)
    assert (got.reasoning, got.content) == (ERNIE_REASONING, "15% of 80 is **12**.")


def test_ernie_plain_content_and_cut_off(check_splits):
    got = check_splits(Ernie, ERNIE_REASONING + "</think>\n15% of 80 is 12.")
    assert (got.reasoning, got.content) == (ERNIE_REASONING, "15% of 80 is 12.")
    got = check_splits(Ernie, ERNIE_REASONING[:20])
    assert (got.reasoning, got.content) == (ERNIE_REASONING[:20], "")


def test_ernie_prompt_that_closes_the_section(parse):
    got = parse(
        lambda: Ernie(prompt_text="<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        ["<response>\n12\n</response>"],
    )
    assert (got.reasoning, got.content) == ("", "12")
