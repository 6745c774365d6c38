"""The tag machine (core/parsers/reasoning/think.py, ``TaggedReasoningParser``): content before a
section in formats that look for no marker after it, a section's label, markers dropped from the
content, and a format's own reading of the prompt."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import TaggedReasoningParser


def test_content_before_a_section_is_the_same_however_split(check_splits):
    # granite and hunyuan_a13b look for no marker after their section; text before one that the
    # model opens late must not skip the start-tag search when it arrives in pieces
    granite = REASONING_PARSERS.get("granite")
    text = "Sure. Here is my thought process: 2 + 2 is 4. Here is my response: 4."
    got = check_splits(lambda: granite(None, {"thinking": True}), text)
    assert (got.reasoning, got.content) == (" 2 + 2 is 4. ", "Sure. 4.")
    hunyuan = REASONING_PARSERS.get("hunyuan_a13b")
    got = check_splits(lambda: hunyuan(None), "Ok.\n<think>\nAdd.\n</think>\n<answer>\n4\n</answer>")
    assert (got.reasoning, got.content) == ("Add.", "Ok.\n4")


class Labelled(TaggedReasoningParser):
    start_tags = ("<s>",)
    end_tags = ("</s>",)
    section_label = "note:"
    drops = ("[x]",)
    reopens = True

    def opened_by_prompt(self, prompt: str) -> bool | None:
        return True if prompt.endswith("OPEN") else super().opened_by_prompt(prompt)


def test_label_drops_and_prompt_reading(check_splits):
    got = check_splits(lambda: Labelled(None), "a[x]b<s>note:one</s>c[x]<s>two</s>d")
    assert (got.reasoning, got.content) == ("onetwo", "abcd")
    got = check_splits(lambda: Labelled(None), "<s>note")  # a label cut off is reasoning
    assert (got.reasoning, got.content) == ("note", "")
    got = check_splits(lambda: Labelled("OPEN"), "note:one</s>[x]c")
    assert (got.reasoning, got.content) == ("one", "c")
    got = check_splits(lambda: Labelled("x</s>"), "a[x]<s>b</s>")  # closed prompt: verbatim but drops
    assert (got.reasoning, got.content) == ("", "a<s>b</s>")
