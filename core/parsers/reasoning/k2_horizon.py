"""IFM K2 Horizon reasoning (vLLM's ``k2_horizon``): a thinking section whose tags depend on the
request's ``reasoning_effort`` (``chat_template_kwargs``), then the answer or a tool-call group.

Format (the model's chat template and vLLM's k2_horizon_reasoning_parser.py): the template ends
the prompt by opening the section with the tag of the effort asked for, ``<ifm|think>`` (``high``,
the default), ``<ifm|think_fast>`` (``medium``) or ``<ifm|think_faster>`` (``low``), and the model
writes the reasoning, the matching end tag, then its answer:

    The user wants Tokyo's weather; I have a get_weather tool.</ifm|think>It's 18°C in Tokyo.

A tool-call group (``<ifm|tool_calls>``, read by the ``k2_horizon`` tool parser) written before
the end tag ends the section too: the group and what follows are content. The output is
reasoning from its first character (a start tag the model writes anyway is dropped) to the end
tag, as R1's reading (``deepseek_r1``) is; reasoning cut off by ``max_tokens`` stays reasoning.

The pair of tags is the one whose start (or end) tag ends the rendered prompt, else the one of
the request's ``reasoning_effort``, else ``high``'s. Where dyn's reading differs from vLLM's:
vLLM rejects a ``reasoning_effort`` other than the three (here the prompt decides, else
``high``); an output with neither the end tag nor a tool-call group is content in vLLM's unary
path (reasoning in its streaming path, and here); the whitespace after the end tag is dropped,
as ``think.py`` says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import TaggedReasoningParser

TOOL_CALLS = "<ifm|tool_calls>"


_TAGS = {
    effort: (f"<ifm|{name}>", f"</ifm|{name}>")
    for effort, name in (("high", "think"), ("medium", "think_fast"), ("low", "think_faster"))
}
"""``reasoning_effort`` -> the section's start and end tags."""


@REASONING_PARSERS.register("k2_horizon")
class K2HorizonReasoningParser(TaggedReasoningParser):
    """K2 Horizon's section, its tags those the prompt ends with, else the effort's (see the module)."""

    starts_in_reasoning = True
    exits = (TOOL_CALLS,)

    def setup(self) -> None:
        start, end = _tags(self.prompt_text or "", self.chat_template_kwargs)
        self.start_tags, self.end_tags = (start,), (end,)
        super().setup()


def _tags(prompt_text: str, chat_template_kwargs: Mapping[str, Any]) -> tuple[str, str]:
    """The tags the prompt ends with, else those of the requested effort, else ``high``'s."""
    tail = prompt_text.rstrip()
    for tags in _TAGS.values():
        if tail.endswith(tags):
            return tags
    effort = chat_template_kwargs.get("reasoning_effort")
    return _TAGS.get(effort, _TAGS["high"]) if isinstance(effort, str) else _TAGS["high"]
