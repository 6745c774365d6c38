"""Reasoning followed by an answer wrapped in tags: Tencent Hunyuan-A13B
(``<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>``, vLLM's ``hunyuan_a13b``, SGLang's
``hunyuan``) and Baidu ERNIE-4.5 thinking models (``...\\n</think>\\n\\n<response>\\n...\\n</response>``
or plain content after ``</think>``, vLLM's ``ernie45``).

The answer tags and the newlines inside and after them are dropped, as are the newlines around the
reasoning of Hunyuan's section. Hunyuan's section must be opened by the model (its "fast
thinking" output writes an empty one); ERNIE's starts at the first character (its template
opens it). vLLM keeps ERNIE's newlines inside ``<response>`` in its unary path and drops them
when streaming; we drop them in both.
"""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import TaggedReasoningParser


@REASONING_PARSERS.register("hunyuan_a13b", "hunyuan")
class HunyuanA13BReasoningParser(TaggedReasoningParser):
    """Hunyuan-A13B-Instruct (see the module)."""

    trims_reasoning_start = True
    trims_reasoning_end = True
    answer_tags = ("<answer>", "</answer>")


@REASONING_PARSERS.register("ernie45")
class Ernie45ReasoningParser(TaggedReasoningParser):
    """ERNIE-4.5-21B-A3B-Thinking (see the module)."""

    starts_in_reasoning = True
    answer_tags = ("<response>", "</response>")
