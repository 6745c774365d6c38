"""H Company Holo2 reasoning (vLLM's ``holo2``, which vLLM reads with DeepSeek V3's parser in
thinking mode): DeepSeek-R1's ``<think>`` ... ``</think>`` (``deepseek_v3`` in ``think.py``), the
section on unless the request switches it off.

Holo2's chat template (the models are Qwen3-VL based) opens the section in the prompt when its
``thinking`` argument is on, the default, so the model writes only the end tag:

    The search box is at the top of the page; I will click it.</think>
    Click the search box at (512, 88).

Thinking is on unless ``chat_template_kwargs`` set ``thinking`` or ``enable_thinking`` (then on
when either is true), as in vLLM; then the output is all content. The prompt's tail decides
first, as ``think.py`` describes.
"""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import DeepSeekV3ReasoningParser


@REASONING_PARSERS.register("holo2")
class Holo2ReasoningParser(DeepSeekV3ReasoningParser):
    """DeepSeek V3's reading with thinking on by default (a key given as null counts as unset)."""

    thinking_default = True

    def thinking(self) -> bool:
        given = [v for k in self.thinking_keys if (v := self.chat_template_kwargs.get(k)) is not None]
        return any(bool(v) for v in given) if given else self.thinking_default
