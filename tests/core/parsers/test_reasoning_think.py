"""The ``<think>`` family (core/parsers/reasoning/think.py): deepseek_r1, deepseek_v3, qwen3, glm45,
basic, step3/step3p5, olmo3, seed_oss, on outputs of their models, whole and split everywhere."""

from __future__ import annotations

import pytest

from dyn.core.parsers.events import Reasoning
from dyn.core.parsers.reasoning import REASONING_PARSERS


def parser(name: str, prompt_text: str | None = None, **kwargs):
    """A factory for ``check_splits``/``parse``: a fresh parser per run."""
    cls = REASONING_PARSERS.get(name)
    return lambda: cls(prompt_text, kwargs or None)


# Qwen3-0.6B served by vLLM, asked for the time in New York with a get_current_time_nyc tool:
# the recorded stream of Dynamo's lib/llm/tests/data/vllm/qwen3-0.6B/
# chat_completion_stream_2bd5b0c6-*.json (reasoning and the text around it as recorded; the call
# body in the Hermes format Qwen3 writes, Qwen function-calling docs).
QWEN3_REASONING = (
    "\nOkay, the user is asking for the current time in New York. Let me check the tools available. "
    "There's a function called get_current_time_nyc, and it doesn't require any parameters. So I just "
    "need to call that function. The location is New York, and since there's no unit specified, I can "
    "leave that out. So the tool call should be straightforward. I'll make sure to format it correctly "
    "in JSON inside the tool_call tags.\n"
)
QWEN3_CALL = '<tool_call>\n{"name": "get_current_time_nyc", "arguments": {}}\n</tool_call>'
QWEN3_OUTPUT = "<think>" + QWEN3_REASONING + "</think>\n\n" + QWEN3_CALL

# DeepSeek-R1: the template ends the prompt with "<｜Assistant｜><think>\n", so the model writes
# only "</think>" (DeepSeek-R1 model card, "Usage Recommendations"; vLLM docs
# features/reasoning_outputs.md use the 9.11-vs-9.8 question).
R1_PROMPT = "<｜begin▁of▁sentence｜><｜User｜>9.11 and 9.8, which is greater?<｜Assistant｜><think>\n"
R1_OUTPUT = (
    "Okay, so I need to figure out whether 9.11 is greater than 9.8. Both have 9 in the ones place, "
    "so I compare the decimals: 0.11 versus 0.8, which is 0.80. Since 0.80 is more than 0.11, 9.8 is "
    "greater.\n</think>\n\n**Answer:** 9.8 is greater than 9.11."
)
R1_REASONING = R1_OUTPUT[: R1_OUTPUT.index("</think>")]


def test_names_in_both_spellings():
    for name in (
        "deepseek_r1",
        "deepseek-r1",
        "qwen3",
        "glm45",
        "glm47",
        "basic",
        "step3",
        "step3p5",
        "olmo3",
        "seed_oss",
        "deepseek_v3",
        "mimo",
        "qwen3-thinking",
    ):
        assert REASONING_PARSERS.get(name) is not None
    assert REASONING_PARSERS.get("glm45") is REASONING_PARSERS.get("glm47")


# --- deepseek_r1 -----------------------------------------------------------------------------


def test_deepseek_r1_reasoning_then_content(check_splits):
    got = check_splits(parser("deepseek_r1", R1_PROMPT), R1_OUTPUT)
    assert got.reasoning == R1_REASONING
    assert got.content == "**Answer:** 9.8 is greater than 9.11."


def test_deepseek_r1_written_start_tag_and_unknown_prompt(check_splits):
    # older R1 templates leave "<think>" to the model; without a prompt the output is reasoning
    # from the first character all the same
    got = check_splits(parser("deepseek_r1"), "<think>\n" + R1_OUTPUT)
    assert got.reasoning == "\n" + R1_REASONING
    assert got.content == "**Answer:** 9.8 is greater than 9.11."


def test_deepseek_r1_cut_off_by_max_tokens_stays_reasoning(check_splits):
    cut = R1_OUTPUT[:120]
    got = check_splits(parser("deepseek_r1", R1_PROMPT), cut)
    assert got.reasoning == cut and got.content == ""
    # cut inside the end tag: the partial tag is reasoning text, nothing is lost
    got = check_splits(parser("deepseek_r1", R1_PROMPT), R1_REASONING + "</thi")
    assert got.reasoning == R1_REASONING + "</thi" and got.content == ""


def test_deepseek_r1_closed_section_in_prompt_is_content(check_splits):
    # DeepSeek-R1-0528 / V3.1 templates with thinking off close an empty section in the prompt
    prompt = "<｜User｜>Hi<｜Assistant｜></think>"
    got = check_splits(parser("deepseek_r1", prompt), "Hello! How can I help you today?")
    assert got.content == "Hello! How can I help you today?" and got.reasoning == ""


def test_deepseek_v3_needs_thinking_kwarg(check_splits):
    # DeepSeek-V3.1: chat_template_kwargs {"thinking": true} turns thinking on (vLLM's deepseek_v3)
    text = "The user greets me.</think>Hello!"
    assert check_splits(parser("deepseek_v3"), text).content == text
    got = check_splits(parser("deepseek_v3", thinking=True), text)
    assert (got.reasoning, got.content) == ("The user greets me.", "Hello!")
    got = check_splits(parser("deepseek_v3", enable_thinking=True), text)
    assert got.reasoning == "The user greets me."


# --- qwen3 -----------------------------------------------------------------------------------


def test_qwen3_recorded_output_reasoning_then_tool_call(check_splits):
    got = check_splits(parser("qwen3", "<|im_start|>assistant\n"), QWEN3_OUTPUT)
    assert got.reasoning == QWEN3_REASONING
    assert got.content == QWEN3_CALL  # whitespace after </think> dropped, the call is content


def test_qwen3_end_tag_without_start_tag_splits_there(check_splits):
    # Qwen3-4B-Thinking-2507 / Qwen3.5: the template opens "<think>\n", the model writes only
    # "</think>" (Qwen3-4B-Thinking-2507 model card); vLLM's qwen3 splits there even without the
    # prompt, and so do we
    text = QWEN3_REASONING + "</think>\n\nIt is 10:42 AM in New York."
    for prompt in ("<|im_start|>assistant\n<think>\n", None):
        got = check_splits(parser("qwen3", prompt), text)
        assert got.reasoning == QWEN3_REASONING
        assert got.content == "It is 10:42 AM in New York."


def test_qwen3_cut_off_by_max_tokens_stays_reasoning(check_splits):
    got = check_splits(parser("qwen3", "<|im_start|>assistant\n"), QWEN3_OUTPUT[:200])
    assert got.reasoning == QWEN3_OUTPUT[len("<think>") : 200] and got.content == ""


def test_qwen3_thinking_off(check_splits, parse):
    text = "It is 10:42 AM in New York."
    # enable_thinking false: Qwen3's template renders an empty section at the end of the prompt
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    got = check_splits(parser("qwen3", closed, enable_thinking=False), text)
    assert got.content == text and got.reasoning == ""
    # the kwarg alone decides when the prompt is unknown; the output is content verbatim
    qwen3 = REASONING_PARSERS.get("qwen3")
    got = parse(lambda: qwen3(None, {"enable_thinking": False}), ["<think>x</think>y"])
    assert got.content == "<think>x</think>y" and got.reasoning == ""
    # a prompt tail that closes the section wins even when the kwarg is not sent
    got = parse(lambda: qwen3(prompt_text=closed), [text[:5], text[5:]])
    assert got.content == text


def test_qwen3_model_written_empty_section(check_splits):
    # Qwen3-8B with "/no_think" in the user turn writes an empty section itself (Qwen3 model card,
    # "Advanced Usage: Switching Between Thinking and Non-Thinking Mode via User Input")
    got = check_splits(parser("qwen3", "<|im_start|>assistant\n"), "<think>\n\n</think>\n\nHello there!")
    assert got.reasoning == "\n\n" and got.content == "Hello there!"


def test_qwen35_tool_call_inside_open_section_ends_it(check_splits):
    # Qwen3.5 sometimes starts a tool call before closing its section (vLLM PR #35687)
    call = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
        "</tool_call>"
    )
    opened = "<|im_start|>assistant\n<think>\n"
    got = check_splits(parser("qwen3", opened), "I should check the weather.\n" + call)
    assert got.reasoning == "I should check the weather.\n" and got.content == call


def test_qwen3_second_end_tag_is_dropped(check_splits):
    got = check_splits(parser("qwen3"), "plan</think>\n\nanswer</think> done")
    assert (got.reasoning, got.content) == ("plan", "answer done")


# --- glm45 -----------------------------------------------------------------------------------

# GLM-4.5: "<|assistant|>" ends the prompt and the model writes "\n<think>...</think>\n" and its
# answer (GLM-4.5 chat template renders past turns the same way; zai-org/GLM-4.5 model card)
GLM_OUTPUT = (
    "\n<think>The user wants the weather in Beijing; I should call get_weather with city Beijing."
    "</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n</tool_call>"
)


def test_glm45_reasoning_then_tool_call(check_splits):
    got = check_splits(parser("glm45", "<|user|>\nWeather in Beijing?<|assistant|>"), GLM_OUTPUT)
    assert got.reasoning == (
        "The user wants the weather in Beijing; I should call get_weather with city Beijing."
    )
    assert got.content.startswith("<tool_call>get_weather\n<arg_key>city")


def test_glm45_interleaved_thinking_opens_again(check_splits):
    text = "<think>first</think>\n<tool_call>f\n</tool_call>\n<think>second</think>\nDone."
    got = check_splits(parser("glm45"), text)
    assert got.reasoning == "firstsecond"
    assert got.content == "<tool_call>f\n</tool_call>\nDone."


def test_glm_thinking_off_and_prompt_tails(check_splits, parse):
    # GLM-4.5 with thinking off closes an empty section in the prompt ("\n<think></think>")
    got = check_splits(parser("glm45", "<|assistant|>\n<think></think>"), "Beijing is sunny today.")
    assert got.content == "Beijing is sunny today." and got.reasoning == ""
    got = check_splits(parser("glm45", thinking=False), "Beijing is sunny today.")
    assert got.content == "Beijing is sunny today."
    # GLM-4.7 opens the section itself ("<|assistant|><think>")
    got = parse(
        lambda: REASONING_PARSERS.get("glm47")(prompt_text="<|assistant|><think>"),
        ["Sunny, I ", "think.</think>", "Sunny."],
    )
    assert (got.reasoning, got.content) == ("Sunny, I think.", "Sunny.")


# --- basic (Dynamo) --------------------------------------------------------------------------


def test_basic_waits_for_the_start_tag(check_splits):
    assert check_splits(parser("basic"), "No thinking here. 2 < 3.").content == "No thinking here. 2 < 3."
    got = check_splits(parser("basic"), QWEN3_OUTPUT)
    assert got.reasoning == QWEN3_REASONING and got.content == QWEN3_CALL
    # content before a section, a second section, and a stray end tag (Dynamo's basic)
    got = check_splits(parser("basic"), "Sure. <think>a</think>b<think>c</think>d</think>e")
    assert (got.reasoning, got.content) == ("ac", "Sure. bde")


def test_basic_prompt_that_opens_the_section(parse):
    got = parse(
        lambda: REASONING_PARSERS.get("basic")(prompt_text="<|im_start|>assistant\n<think>\n"),
        ["thinking", "</think>", "answer"],
    )
    assert (got.reasoning, got.content) == ("thinking", "answer")


# --- step3, step3p5, olmo3, seed_oss ---------------------------------------------------------


def test_step3_everything_before_end_tag_is_reasoning(check_splits):
    # Step-3 writes only "</think>" (vLLM's step3 parser docstring)
    got = check_splits(parser("step3"), "The user asks for 2+2, which is 4.</think>2 + 2 = 4.")
    assert (got.reasoning, got.content) == ("The user asks for 2+2, which is 4.", "2 + 2 = 4.")
    assert check_splits(parser("step3"), "cut off mid-thou").reasoning == "cut off mid-thou"


def test_step3p5_drops_newlines_around_end_tag(check_splits):
    # Step-3.5 writes "\n</think>\n" (vLLM's step3p5 parser)
    got = check_splits(parser("step3p5"), "Reason carefully.\n</think>\nFinal answer.")
    assert (got.reasoning, got.content) == ("Reason carefully.", "Final answer.")


def test_olmo3_with_or_without_start_tag(check_splits):
    # OLMo 3 Think writes plain-text tags; its template may write "<think>" itself (vLLM's olmo3)
    for text in ("<think>Let me add them.</think>The sum is 5.", "Let me add them.</think>The sum is 5."):
        got = check_splits(parser("olmo3"), text)
        assert (got.reasoning, got.content) == ("Let me add them.", "The sum is 5.")


# Seed-OSS-36B-Instruct with a thinking budget: budget notes inside the section (the model card's
# "thinking_budget" example output, ByteDance-Seed/Seed-OSS-36B-Instruct)
SEED_OUTPUT = (
    "<seed:think>Got it, let's solve 3x + 5 = 20. Subtract 5: 3x = 15, so x = 5.\n"
    "<seed:cot_budget_reflect>I have used 40 tokens, and there are 472 tokens remaining for use."
    "</seed:cot_budget_reflect>\nCheck: 3*5 + 5 = 20. Correct.</seed:think>"
    "To solve 3x + 5 = 20, subtract 5 and divide by 3: **x = 5**."
)


def test_seed_oss_budget_notes_stay_reasoning(check_splits):
    got = check_splits(parser("seed_oss"), SEED_OUTPUT)
    assert got.reasoning.startswith("Got it") and "<seed:cot_budget_reflect>" in got.reasoning
    assert got.reasoning.endswith("Correct.")
    assert got.content == "To solve 3x + 5 = 20, subtract 5 and divide by 3: **x = 5**."
    cut = check_splits(parser("seed_oss"), SEED_OUTPUT[:60])
    assert cut.reasoning == SEED_OUTPUT[len("<seed:think>") : 60] and cut.content == ""


def test_seed_oss_tool_call_ends_section(check_splits):
    call = (
        "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n"
        "</seed:tool_call>"
    )
    got = check_splits(parser("seed_oss"), "<seed:think>Need the weather." + call)
    assert (got.reasoning, got.content) == ("Need the weather.", call)


# --- the machine -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3", "glm45", "basic", "seed_oss"])
def test_empty_output_and_whitespace_only(parse, name):
    assert parse(parser(name), []).content == "" and parse(parser(name), []).reasoning == ""
    closed = "assistant\n" + REASONING_PARSERS.get(name).end_tags[0] + "\n\n"
    got = parse(parser(name, closed), ["  "])
    assert got.content == "  "


def test_events_are_streamed_not_buffered():
    # reasoning and content reach the client as they come; only a possible tag is held back
    p = REASONING_PARSERS.get("qwen3")("<|im_start|>assistant\n<think>\n")
    assert p.feed("Let me think") == [Reasoning("Let me think")]
    assert p.feed(" about it </thi") == [Reasoning(" about it ")]
    assert p.feed("nk>\n\nYes") == ["Yes"]
    assert p.feed(", sure.") == [", sure."]
    assert p.finish() == []
