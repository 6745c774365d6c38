"""IBM Granite 3.2/3.3 reasoning: plain-text markers instead of tags (vLLM's and Dynamo's
``granite``).

With ``chat_template_kwargs: {"thinking": true}`` the template asks the model to write its
thoughts after "Here is my thought process:" and its answer after "Here is my response:";
quantized models were seen writing "Here's" instead, so both spellings mark either end, as in
vLLM's and Dynamo's parsers. Without the first marker the output is content; a section the
model never closes (``max_tokens``) stays reasoning, as vLLM streams it (its unary path returns
such an output as content instead). The whitespace after the response marker is dropped.
"""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import TaggedReasoningParser


@REASONING_PARSERS.register("granite")
class GraniteReasoningParser(TaggedReasoningParser):
    """Granite's "thought process" / "response" markers (see the module)."""

    start_tags = ("Here is my thought process:", "Here's my thought process:")
    end_tags = ("Here is my response:", "Here's my response:")
