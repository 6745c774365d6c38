"""Mistral's reasoning: ``[THINK]`` ... ``[/THINK]`` control tokens (Magistral Small/Medium 2506+,
vLLM's and Dynamo's ``mistral``).

As vLLM reads it, a section exists only where the model opens it with ``[THINK]``: text before
it and after ``[/THINK]`` is content, an output without ``[THINK]`` is all content, and a
``[/THINK]`` without one is dropped. Dynamo's ``mistral`` instead treats the output as reasoning
from the first token (force-reasoning); we follow vLLM, since Magistral writes ``[THINK]``
itself. A section cut off by ``max_tokens`` stays reasoning.
"""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import TaggedReasoningParser


@REASONING_PARSERS.register("mistral")
class MistralReasoningParser(TaggedReasoningParser):
    """Magistral's ``[THINK]`` sections (see the module)."""

    needs_special_tokens = True  # [THINK] and [/THINK] are control tokens, dropped when skipped
    start_tags = ("[THINK]",)
    end_tags = ("[/THINK]",)
    drops_stray_end = True
