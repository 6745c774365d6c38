"""StepFun reasoning (core/parsers/reasoning/think.py): step3 and step3p5, which vLLM 0.32 reads
differently (step3p5 with Qwen3's tool calls)."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS

Step3 = REASONING_PARSERS.get("step3")
Step3p5 = REASONING_PARSERS.get("step3p5")

# Step-3.5-Flash: the template always ends the prompt with "<think>\n"; the model writes
# "\n</think>\n" and answers, or calls tools in Qwen3's XML format (vLLM's step3p5 parser)
PROMPT = "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\n"
REASONING = "The user wants the weather in Paris. I have get_weather(city); call it."
CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


def test_names_are_two_readings():
    assert (Step3.name, Step3p5.name) == ("step3", "step3p5")
    assert Step3 is not Step3p5


def test_step3p5_reasoning_then_call_or_answer(check_splits):
    got = check_splits(lambda: Step3p5(PROMPT), REASONING + "\n</think>\n" + CALL)
    assert (got.reasoning, got.content) == (REASONING, CALL)
    got = check_splits(lambda: Step3p5(PROMPT), REASONING + "\n</think>\nIt's 14°C in Paris.")
    assert (got.reasoning, got.content) == (REASONING, "It's 14°C in Paris.")


def test_step3p5_tool_call_inside_the_section_ends_it(check_splits):
    got = check_splits(lambda: Step3p5(PROMPT), REASONING + "\n" + CALL)
    assert (got.reasoning, got.content) == (REASONING, CALL)


def test_step3p5_cut_off_stray_end_and_thinking_switch_ignored(check_splits):
    got = check_splits(lambda: Step3p5(PROMPT), REASONING[:33])
    assert (got.reasoning, got.content) == (REASONING[:33], "")
    got = check_splits(lambda: Step3p5(PROMPT), "Done.\n</think>\nSunny.</think>")
    assert (got.reasoning, got.content) == ("Done.", "Sunny.")
    got = check_splits(lambda: Step3p5(None, {"enable_thinking": False}), "Done.\n</think>\nSunny.")
    assert (got.reasoning, got.content) == ("Done.", "Sunny.")


def test_step3_keeps_a_later_end_tag_and_tool_call_tags_stay_reasoning(check_splits):
    got = check_splits(lambda: Step3(None), "Add them.</think>2 + 2 = 4 </think>")
    assert (got.reasoning, got.content) == ("Add them.", "2 + 2 = 4 </think>")
    got = check_splits(lambda: Step3(None), "Hm <tool_call>")
    assert (got.reasoning, got.content) == ("Hm <tool_call>", "")


def test_content_only_after_a_closed_prompt(check_splits):
    for cls in (Step3, Step3p5):
        got = check_splits(lambda cls=cls: cls("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "Hi!")
        assert (got.reasoning, got.content) == ("", "Hi!")
