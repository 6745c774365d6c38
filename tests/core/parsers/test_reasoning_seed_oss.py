"""Seed-OSS reasoning (core/parsers/reasoning/think.py, ``seed_oss``): thinking switched off and
a prompt that opened the section (the rest is in test_reasoning_think.py)."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS

Seed = REASONING_PARSERS.get("seed_oss")

# Seed-OSS-36B-Instruct (the model card's chat template): "<seed:bos>assistant\n" then the model's
# "<seed:think>...</seed:think>" and answer; vLLM 0.32 reads it as Qwen3 with <seed:...> tags
PROMPT = "<seed:bos>user\nSolve 2x = 10.<seed:eos><seed:bos>assistant\n"


def test_name_and_special_tokens():
    assert Seed.name == "seed_oss" and Seed.needs_special_tokens


def test_thinking_off_is_content(check_splits):
    got = check_splits(lambda: Seed(PROMPT, {"enable_thinking": False}), "x = 5.</seed:think>")
    assert (got.reasoning, got.content) == ("", "x = 5.</seed:think>")


def test_opened_by_the_prompt_then_answer(check_splits):
    got = check_splits(lambda: Seed(PROMPT + "<seed:think>"), "Divide by 2.</seed:think>x = 5.")
    assert (got.reasoning, got.content) == ("Divide by 2.", "x = 5.")
    got = check_splits(lambda: Seed(PROMPT), "<seed:think>Divide by 2.</seed:think>\n\nx = 5.</seed:think>")
    assert (got.reasoning, got.content) == ("Divide by 2.", "x = 5.")
