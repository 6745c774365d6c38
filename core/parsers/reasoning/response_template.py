"""Reasoning as the checkpoint's ``response_template`` describes it (vLLM's ``hf``): the served
model's tokenizer_config.json names the ``thinking`` field's anchors, and transformers' engine reads
the output with it (``dyn.core.parsers.response_template``, which says what a template must have).

The template needs a ``thinking`` field; its text is ``Reasoning``. The rendered prompt decides
where the output starts (a template that opened the thinking section, or closed it when thinking
is off, leaves the engine inside or past it), not ``chat_template_kwargs`` nor ``constrained``.
Everything else is content: ``content`` regions' text (their anchors dropped) and ``tool_calls``
regions verbatim, anchors included, so that a tool-call parser reads the calls after it (as
vLLM's adapter passes tool regions through when it parses no calls). Text outside every region
of a template that has no field for it is dropped, as in vLLM.

Where dyn differs from vLLM (0.32): vLLM runs ``--reasoning-parser hf`` only with
``--tool-call-parser hf`` or none; dyn runs it before any tool-call parser.
"""

from __future__ import annotations

from dyn.core.parsers.events import Event
from dyn.core.parsers.reasoning import REASONING_PARSERS, ReasoningParser
from dyn.core.parsers.response_template import TemplateReader, require_engine, serving_template


@REASONING_PARSERS.register("hf")
class ResponseTemplateReasoningParser(ReasoningParser):
    takes_tokenizer = True

    def setup(self) -> None:
        """``ParserModelError`` when the model has no usable template (``check_tokenizer``)."""
        super().setup()
        self._reader = TemplateReader(
            serving_template(self.tokenizer, "reasoning"), self.prompt_text, calls=False
        )

    @classmethod
    def check(cls) -> None:
        require_engine()

    @classmethod
    def check_tokenizer(cls, tokenizer: object) -> None:
        serving_template(tokenizer, "reasoning")

    def feed(self, text: str) -> list[Event]:
        return self._reader.feed(text)

    def finish(self) -> list[Event]:
        return self._reader.finish()
