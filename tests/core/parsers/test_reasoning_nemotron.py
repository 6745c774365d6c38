"""NVIDIA Nemotron reasoning (core/parsers/reasoning/nemotron.py): nemotron_deci and nemotron_v3
(= nemotron, nano_v3, nemotron3, nemotron_nano, ...)."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS

Deci = REASONING_PARSERS.get("nemotron_deci")
V3 = REASONING_PARSERS.get("nemotron_v3")

# Llama-3.3-Nemotron-Super-49B served by vLLM, asked for Tokyo's weather in Celsius with a
# get_weather tool: the recorded stream of Dynamo's lib/llm/tests/data/vllm/nemotron-49b/
# chat_completion_stream_3d40f925-*.json (reasoning and the text around it as recorded; the call in
# the <TOOLCALL> JSON format of Dynamo's nemotron_deci tool parser)
DECI_REASONING = (
    "\nOkay, the user is asking for the weather in Tokyo in Celsius. Let me check the tools available. "
    "There's a function called get_weather that takes location and unit as parameters. The location "
    'should be a string like "Tokyo, JP" maybe, but the user just said Tokyo. The unit needs to be '
    '"celsius" as per the enum. I need to make sure to format the location correctly. Since the user '
    "didn't specify the country, but Tokyo is a major city, the function might handle it with just "
    '"Tokyo". But sometimes weather APIs require the country code. However, the example given in the '
    "tool's parameters was \"San Francisco, CA\", which includes the state. But for Tokyo, maybe it's "
    'better to include the country code, like "Tokyo, Japan" or "Tokyo, JP". But the user didn\'t '
    'specify, so maybe just "Tokyo" is sufficient. The function might handle it. Alternatively, if the '
    "function requires more specific location, but since the user didn't provide more details, I should "
    'proceed with "Tokyo". The unit is definitely "celsius" as per the user\'s request. So the tool '
    'call should be get_weather with location "Tokyo" and unit "celsius".\n'
)
DECI_CALL = (
    '<TOOLCALL>[{"name": "get_weather", "arguments": {"location": "Tokyo", "unit": "celsius"}}]</TOOLCALL>'
)
DECI_OUTPUT = "<think>" + DECI_REASONING + "</think>\n\n" + DECI_CALL

# NVIDIA-Nemotron-3-Nano-30B-A3B: the template ends the prompt with "<think>\n" (thinking on) or
# "<think></think>" (enable_thinking false); calls use the Qwen3-Coder XML format
# (nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 model card and its nano_v3_reasoning_parser.py)
NANO_OPEN = "<|im_start|>assistant\n<think>\n"
NANO_CLOSED = "<|im_start|>assistant\n<think></think>"
NANO_REASONING = "The user wants 12 squared. 12 * 12 = 144."
NANO_CALL = (
    "<tool_call>\n<function=calculator>\n<parameter=expression>\n12**2\n</parameter>\n</function>\n"
    "</tool_call>"
)


def test_names():
    for name in ("nemotron", "nano_v3", "nemotron3", "nemotron_3", "nemotron_nano", "nemotron_nano_v2"):
        assert REASONING_PARSERS.get(name) is V3
    assert Deci is not V3


def test_deci_recorded_output(check_splits):
    got = check_splits(Deci, DECI_OUTPUT)
    assert got.reasoning == DECI_REASONING
    assert got.content == DECI_CALL


def test_deci_thinking_off_and_cut_off(check_splits):
    # "detailed thinking off": no section, all content
    text = "It's 18°C in Tokyo right now."
    assert check_splits(Deci, text).content == text
    got = check_splits(Deci, DECI_OUTPUT[:150])
    assert got.reasoning == DECI_OUTPUT[len("<think>") : 150] and got.content == ""


def test_v3_reasoning_then_content(check_splits):
    got = check_splits(lambda: V3(NANO_OPEN), NANO_REASONING + "\n</think>\n12² = 144.")
    assert (got.reasoning, got.content) == (NANO_REASONING, "12² = 144.")


def test_v3_tool_call_ends_reasoning(check_splits):
    got = check_splits(lambda: V3(NANO_OPEN), NANO_REASONING + "\n" + NANO_CALL)
    assert (got.reasoning, got.content) == (NANO_REASONING, NANO_CALL)
    got = check_splits(lambda: V3(NANO_OPEN), NANO_REASONING + "\n</think>\n\n" + NANO_CALL)
    assert (got.reasoning, got.content) == (NANO_REASONING, NANO_CALL)


def test_v3_cut_off_stays_reasoning(check_splits):
    got = check_splits(lambda: V3(NANO_OPEN), NANO_REASONING[:25])
    assert (got.reasoning, got.content) == (NANO_REASONING[:25], "")


def test_v3_thinking_off(check_splits, parse):
    got = check_splits(lambda: V3(NANO_CLOSED, {"enable_thinking": False}), "12² = 144.")
    assert (got.reasoning, got.content) == ("", "12² = 144.")
    got = parse(lambda: V3(None, {"enable_thinking": False}), ["12² ", "= 144."])
    assert (got.reasoning, got.content) == ("", "12² = 144.")


def test_v3_force_nonempty_content(check_splits, parse):
    # vLLM's nemotron_v3: with force_nonempty_content an output that left no content gives its
    # reasoning as the content too (a stream has sent it as reasoning already)
    forced = {"force_nonempty_content": True}
    got = check_splits(lambda: V3(NANO_OPEN, forced), NANO_REASONING + "\n</think>\n")
    assert (got.reasoning, got.content) == (NANO_REASONING, NANO_REASONING)
    got = parse(lambda: V3(NANO_OPEN, {"force_nonempty_content": True}), [NANO_REASONING, "</think>144"])
    assert (got.reasoning, got.content) == (NANO_REASONING, "144")
    got = parse(lambda: V3(NANO_OPEN), [NANO_REASONING, "\n</think>\n"])
    assert (got.reasoning, got.content) == (NANO_REASONING, "")
