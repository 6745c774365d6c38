"""Mistral's ``[THINK]`` reasoning (core/parsers/reasoning/mistral.py)."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS

Mistral = REASONING_PARSERS.get("mistral")

# Magistral-Small-2509 answering a arithmetic question: "[THINK]" reasoning "[/THINK]" answer (the
# model card's system prompt asks for this layout; [THINK]/[/THINK] are control tokens of its
# tekken tokenizer, vLLM's mistral reasoning parser)
MAGISTRAL_REASONING = (
    "Okay, the user wants 17 * 24. 17 * 20 = 340 and 17 * 4 = 68, so the total is 340 + 68 = 408."
)
MAGISTRAL_OUTPUT = "[THINK]" + MAGISTRAL_REASONING + "[/THINK]17 × 24 = **408**."


def test_special_tokens_kept():
    assert Mistral.needs_special_tokens


def test_reasoning_then_content(check_splits):
    got = check_splits(Mistral, MAGISTRAL_OUTPUT)
    assert (got.reasoning, got.content) == (MAGISTRAL_REASONING, "17 × 24 = **408**.")


def test_cut_off_stays_reasoning(check_splits):
    got = check_splits(Mistral, MAGISTRAL_OUTPUT[:70])
    assert got.reasoning == MAGISTRAL_OUTPUT[len("[THINK]") : 70] and got.content == ""


def test_no_reasoning_is_content(check_splits):
    # Mistral-Small without the thinking system prompt answers directly
    assert check_splits(Mistral, "17 × 24 = 408.").content == "17 × 24 = 408."


def test_content_before_section_and_stray_end(check_splits):
    # as vLLM: text before [THINK] is content; a [/THINK] without [THINK] is dropped
    got = check_splits(Mistral, "Let me see. [THINK]17*24[/THINK]408")
    assert (got.reasoning, got.content) == ("17*24", "Let me see. 408")
    got = check_splits(Mistral, "408[/THINK] is the answer")
    assert (got.reasoning, got.content) == ("", "408 is the answer")


def test_prompt_tail(parse):
    # a template that opens the section (Magistral with a "[THINK]"-ending prefix)
    got = parse(lambda: Mistral(prompt_text="[INST]17*24?[/INST][THINK]"), ["17*24=408", "[/THINK]", "408"])
    assert (got.reasoning, got.content) == ("17*24=408", "408")
