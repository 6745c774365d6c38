"""Inkling reasoning (vLLM's ``inkling``): the ``<|content_thinking|>`` blocks of Inkling's typed
blocks (see ``dyn.core.parsers.tool.inkling`` for the format):

    <|content_thinking|>I should check the weather.<|end_message|><|message_model|>
    <|content_text|>Let me check.<|end_message|>

Thinking blocks are reasoning and the visible blocks content, their markers dropped; a call block
stays content, markers included (the ``inkling`` tool parser reads calls and reasoning together
and takes this parser's place when the request has tools). Where the output starts follows the
rendered prompt, as the tool parser reads it.
"""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS, ReasoningParser
from dyn.core.parsers.tool.inkling import InklingBlocks


@REASONING_PARSERS.register("inkling")
class InklingReasoningParser(InklingBlocks, ReasoningParser):
    needs_special_tokens = True  # every marker is a special token
    reads_calls = False

    def setup(self) -> None:
        super().setup()
        self.start_blocks(self.prompt_text)
