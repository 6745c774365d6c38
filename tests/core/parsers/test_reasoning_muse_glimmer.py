"""The muse_glimmer reasoning parser (core/parsers/reasoning/muse_glimmer.py).

Recorded strings: vLLM's tests/tool_parsers/test_muse_glimmer_parsers.py (RAW_ANSWER,
RAW_TOOLCALL, RAW_TRUNCATED, test_plain_content_without_framing_passes_through); checked against
vLLM 0.32's MuseGlimmerReasoningParser.extract_reasoning on the same strings.
"""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.muse_glimmer import MuseGlimmerReasoningParser

MuseGlimmer = REASONING_PARSERS.get("muse_glimmer")
PROMPT = "<|start|>system<|message|>You are a helpful assistant.<|eot|><|start|>user<|message|>Hi<|eot|><|start|>assistant"

ANSWER = (
    " to=self<|message|>Think about it.<|eom|><|start|>assistant to=user<|message|>The answer is 42.<|eot|>"
)
CALL_MESSAGE = (
    "<|start|>assistant to=read.read<|message|>"
    '<atem:function_calls>\n<atem:invoke name="read.read">\n'
    '<atem:parameter name="path">/etc/hostname</atem:parameter>\n'
    "</atem:invoke>\n</atem:function_calls><|eom|>"
)


def parser(prompt_text: str | None = PROMPT):
    return lambda: MuseGlimmer(prompt_text, None)


def test_names():
    assert MuseGlimmer is MuseGlimmerReasoningParser and REASONING_PARSERS.get("muse-glimmer") is MuseGlimmer
    assert MuseGlimmer.needs_special_tokens


def test_reasoning_then_answer(check_splits):
    got = check_splits(parser(), ANSWER)
    assert (got.reasoning, got.content) == ("Think about it.", "The answer is 42.")
    assert check_splits(parser(None), ANSWER) == got


def test_tool_message_stays_as_written(check_splits):
    got = check_splits(
        parser(), " to=self<|message|>I should read the hostname file to answer.<|eom|>" + CALL_MESSAGE
    )
    assert got.reasoning == "I should read the hostname file to answer."
    assert got.content == CALL_MESSAGE


def test_several_reasoning_messages_around_a_call(check_splits):
    text = (
        " to=self<|message|>First I read the file.<|eom|>"
        + CALL_MESSAGE
        + "<|start|>assistant to=self<|message|>Then I answer.<|eom|>"
        "<|start|>assistant to=user<|message|>Done.<|eot|>"
    )
    got = check_splits(parser(), text)
    assert got.reasoning == "First I read the file.\nThen I answer."
    assert got.content == CALL_MESSAGE + "Done."


def test_reasoning_cut_off(check_splits):
    # vLLM RAW_TRUNCATED: max_tokens inside the reasoning, markup quoted in it
    text = (
        " to=self<|message|>Maybe I should call "
        '<atem:function_calls>\n<atem:invoke name="read.read">\n'
        "</atem:invoke>\n</atem:function_calls> but wait"
    )
    got = check_splits(parser(), text)
    assert got.content == "" and got.reasoning == text.removeprefix(" to=self<|message|>")


def test_header_words_in_reasoning_stay_reasoning(check_splits):
    text = " to=self<|message|>Set x to=5, then go to the store.<|eom|> to=user<|message|>x is 5.<|eot|>"
    got = check_splits(parser(), text)
    assert (got.reasoning, got.content) == ("Set x to=5, then go to the store.", "x is 5.")


def test_output_without_framing_is_content(check_splits):
    got = check_splits(parser(), "Just a direct answer.")
    assert (got.reasoning, got.content) == ("", "Just a direct answer.")
    # a header cut off by max_tokens before <|message|>: nothing framed, so content as written
    got = check_splits(parser(), " to=sel")
    assert (got.reasoning, got.content) == ("", " to=sel")
