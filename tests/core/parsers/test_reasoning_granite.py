"""IBM Granite's text-marker reasoning (core/parsers/reasoning/granite.py)."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS

Granite = REASONING_PARSERS.get("granite")

# granite-3.2-8b-instruct with chat_template_kwargs {"thinking": true}: the template's system prompt
# asks for thoughts after "Here is my thought process:" and the answer after "Here is my response:"
# (ibm-granite/granite-3.2-8b-instruct model card, "Reasoning"; vLLM's granite parser)
GRANITE_REASONING = (
    '\n1. The user asks how many r\'s are in "strawberry".\n'
    "2. Spelling it out: s-t-r-a-w-b-e-r-r-y. The letter r appears at positions 3, 8 and 9.\n"
    "3. So there are three.\n\n"
)
GRANITE_OUTPUT = (
    "Here is my thought process:"
    + GRANITE_REASONING
    + 'Here is my response:\n\nThe word "strawberry" contains **3** r\'s.'
)


def test_reasoning_then_content(check_splits):
    got = check_splits(Granite, GRANITE_OUTPUT)
    assert got.reasoning == GRANITE_REASONING
    assert got.content == 'The word "strawberry" contains **3** r\'s.'


def test_heres_variants(check_splits):
    # quantized Granite models were seen writing "Here's" (vLLM's and Dynamo's granite parsers)
    got = check_splits(Granite, "Here's my thought process: check units. Here is my response: 5 km.")
    assert (got.reasoning, got.content) == (" check units. ", "5 km.")
    got = check_splits(Granite, "Here is my thought process: x Here's my response: y")
    assert (got.reasoning, got.content) == (" x ", "y")


def test_cut_off_stays_reasoning(check_splits):
    cut = GRANITE_OUTPUT[:90]
    got = check_splits(Granite, cut)
    assert got.reasoning == cut[len("Here is my thought process:") :] and got.content == ""
    # cut in the middle of the response marker: nothing is lost
    got = check_splits(Granite, "Here is my thought process: x Here is my resp")
    assert got.reasoning == " x Here is my resp"


def test_without_thinking_all_content(check_splits):
    # thinking off: Granite answers directly; "Here is" alone is ordinary text
    text = "Here is a short answer: strawberry has 3 r's. Here is my response to your follow-up too."
    got = check_splits(Granite, text)
    assert (got.reasoning, got.content) == ("", text)


def test_case_sensitive_markers(parse):
    text = "here is my thought process: lowercase. here is my response: answer."
    prompt = "<|start_of_role|>assistant<|end_of_role|>"
    assert parse(lambda: Granite(prompt_text=prompt), [text]).content == text
