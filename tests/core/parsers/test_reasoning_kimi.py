"""Kimi reasoning (core/parsers/reasoning/kimi.py): ``kimi`` (◁think▷) and ``kimi_k2``/``kimi_k25``."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS


def parser(name: str, prompt_text: str | None = None, **kwargs):
    cls = REASONING_PARSERS.get(name)
    return lambda: cls(prompt_text, kwargs or None)


# Kimi-VL-A3B-Thinking describing an image: "◁think▷" reasoning "◁/think▷" answer (the format of
# moonshotai/Kimi-VL-A3B-Thinking's model card and Dynamo's/SGLang's kimi parser)
KIMI_VL_OUTPUT = (
    "◁think▷Got it, let's look at the image. It shows a red panda sitting on a wooden branch with "
    "green leaves behind it, so the animal is a red panda.◁/think▷The image shows a red panda resting "
    "on a tree branch."
)
KIMI_VL_REASONING = KIMI_VL_OUTPUT[len("◁think▷") : KIMI_VL_OUTPUT.index("◁/think▷")]

# Kimi K2 Thinking / K2.5: "<think>" reasoning, then a tool-call section (moonshotai/Kimi-K2-Thinking
# tool-calling guide; vLLM's kimi_k2 parsers)
K2_CALL = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Beijing"}<|tool_call_end|><|tool_calls_section_end|>'
)
K2_REASONING = "The user wants today's weather in Beijing. I'll call get_weather with city Beijing."


def test_kimi_names():
    assert REASONING_PARSERS.get("kimi_k2") is REASONING_PARSERS.get("kimi_k25")
    assert REASONING_PARSERS.get("kimi") is not REASONING_PARSERS.get("kimi_k2")


def test_kimi_vl_reasoning_then_content(check_splits):
    got = check_splits(parser("kimi"), KIMI_VL_OUTPUT)
    assert got.reasoning == KIMI_VL_REASONING
    assert got.content == "The image shows a red panda resting on a tree branch."


def test_kimi_cut_off_and_no_reasoning(check_splits):
    cut = KIMI_VL_OUTPUT[:60]
    got = check_splits(parser("kimi"), cut)
    assert got.reasoning == cut[len("◁think▷") :] and got.content == ""
    # Kimi-VL-A3B-Instruct (no thinking) and <think> tags are plain content to this parser
    text = "The image shows a red panda. <think>not a Kimi tag</think>"
    got = check_splits(parser("kimi"), text)
    assert got.content == text and got.reasoning == ""


def test_k2_reasoning_then_tool_call_section(check_splits):
    got = check_splits(parser("kimi_k2"), "<think>" + K2_REASONING + "</think>" + K2_CALL)
    assert (got.reasoning, got.content) == (K2_REASONING, K2_CALL)


def test_k2_tool_section_before_end_tag_ends_reasoning(check_splits):
    # K2 may open its tool-call section without closing the thinking first (vLLM's kimi_k2)
    got = check_splits(parser("kimi_k2"), "<think>" + K2_REASONING + "\n" + K2_CALL)
    assert got.reasoning == K2_REASONING  # whitespace before the end of the section dropped
    assert got.content == K2_CALL


def test_k2_cut_off_stays_reasoning(check_splits):
    got = check_splits(parser("kimi_k2"), "<think>" + K2_REASONING[:50])
    assert got.reasoning == K2_REASONING[:50] and got.content == ""


def test_k25_prompt_tails_and_thinking_kwarg(check_splits, parse):
    # Kimi-K2.5's template opens "<think>" after "<|im_middle|>" in thinking mode and writes an
    # empty "<think></think>" with thinking off (chat_template_kwargs {"thinking": false})
    opened = "<|im_assistant|>assistant<|im_middle|><think>"
    got = check_splits(parser("kimi_k25", opened), K2_REASONING + "</think>Sunny, 25°C.")
    assert (got.reasoning, got.content) == (K2_REASONING, "Sunny, 25°C.")
    closed = "<|im_assistant|>assistant<|im_middle|><think></think>"
    got = check_splits(parser("kimi_k25", closed, thinking=False), "Sunny, 25°C.")
    assert (got.reasoning, got.content) == ("", "Sunny, 25°C.")
    got = parse(lambda: REASONING_PARSERS.get("kimi_k2")(None, {"thinking": False}), ["Sunny", ", 25°C."])
    assert (got.reasoning, got.content) == ("", "Sunny, 25°C.")
