"""Tencent Hunyuan Hy3 and HYV4 reasoning (vLLM's ``hy_v3`` and ``hy_v4``): ``<think>`` ...
``</think>``, then the answer (or a ``<tool_calls>`` section, the tool parser's).

The chat templates (tencent/Hy3-preview's and later) switch thinking with ``reasoning_effort``:
``no_think`` closes an empty section at the end of the prompt (``<think></think>``), ``low`` or
``high`` opens one (``<think>``), so the model writes only the end tag:

    The user wants the weather in Beijing, so I should call get_weather.</think>
    It is sunny in Beijing today.

The output is read as ``think.py`` reads tagged reasoning: the prompt's tail decides where it
starts; else the request's ``chat_template_kwargs["reasoning_effort"]`` does (``no_think``: all
content), its default being each template's (``no_think`` for Hy3, ``high`` for HYV4); then the
output is reasoning from its first character up to the end tag, reasoning that never ends stays
reasoning.

Some checkpoints give the tags a suffix (``<think:opensource>``); like vLLM, the parser reads it
from the served model's vocabulary (``hy_v3.token_suffix``), and without a tokenizer from the
rendered prompt, whose last think tag carries it (without either the tags have none). vLLM also takes the effort from the request's top-level
``reasoning_effort``, which it merges into the template kwargs, as dyn's Responses API does with
``reasoning.effort``; otherwise the reading is ``think.py``'s, with its general differences.
"""

from __future__ import annotations

import re
from typing import ClassVar

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import TaggedReasoningParser
from dyn.core.parsers.tool.hy_v3 import token_suffix

_THINK_TAG = re.compile(r"</?think(:[^\s>]+)?>")


def prompt_suffix(prompt: str) -> str:
    """The suffix of the last think tag in ``prompt`` (``":opensource"``); ``""`` without one."""
    suffixes = _THINK_TAG.findall(prompt)
    return suffixes[-1] if suffixes else ""


class HyReasoningParser(TaggedReasoningParser):
    """HY's thinking section, its tags with the suffix of the served model's vocabulary (else of
    the rendered prompt's last think tag)."""

    takes_tokenizer = True
    starts_in_reasoning = True
    default_effort: ClassVar[str] = "no_think"
    """The ``reasoning_effort`` the template assumes when the request gives none."""

    def setup(self) -> None:
        if self.tokenizer is not None:
            suffix = token_suffix(self.tokenizer)
        else:
            suffix = prompt_suffix(self.prompt_text or "")
        self.start_tags, self.end_tags = (f"<think{suffix}>",), (f"</think{suffix}>",)
        super().setup()

    def thinking(self) -> bool:
        effort = self.chat_template_kwargs.get("reasoning_effort") or self.default_effort
        return effort != "no_think"


@REASONING_PARSERS.register("hy_v3")
class HyV3ReasoningParser(HyReasoningParser):
    """Hy3 (tencent/Hy3-preview): thinking is off unless ``reasoning_effort`` says otherwise."""


@REASONING_PARSERS.register("hy_v4")
class HyV4ReasoningParser(HyReasoningParser):
    """HYV4: thinking is on (``reasoning_effort`` ``high``) unless it is ``no_think``."""

    default_effort = "high"
