"""Reasoning parsers: a model's text -> reasoning and content, one module per format family.

Contract of a ``ReasoningParser`` (one instance per choice, fed in order): ``feed(text)`` returns
the events the piece completes, ``Reasoning`` and content ``str``
(``dyn.core.parsers.events``); ``finish()`` what is left when the stream ends. Joined, the
events are the same for every way of splitting the text. Reasoning cut off by ``max_tokens``
stays reasoning. The parser is told the rendered prompt (``prompt_text``: a template that opens
the thinking section itself, or closes it when thinking is off, decides where the output
starts) and the request's ``chat_template_kwargs``, and whether the output was constrained.

Names follow vLLM's ``--reasoning-parser`` and Dynamo's ``--dyn-reasoning-parser``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from dyn.core.parsers.registry import Registry
from dyn.core.parsers.stream import StreamParser

REASONING_PARSERS: Registry[ReasoningParser] = Registry("reasoning parser", __name__)


class ReasoningParser(StreamParser):
    """Base of the reasoning parsers (see the module's contract). Subclasses build their state
    in ``setup`` (called at the end of ``__init__``, the request already stored), so that they
    need not repeat the constructor's signature."""

    takes_tokenizer: ClassVar[bool] = False
    """The parser reads the served model's tokenizer (its ``response_template``, say): the
    frontend builds it with ``tokenizer=`` the model's ``dyn.core.frontend.tokenizer.Tokenizer``."""

    def __init__(
        self,
        prompt_text: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        *,
        constrained: bool = False,
        tokenizer: Any = None,
    ) -> None:
        self.prompt_text = prompt_text
        self.tokenizer = tokenizer
        """The served model's tokenizer, given to a parser that ``takes_tokenizer`` (else None)."""
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.constrained = constrained
        """The engine held the output to a grammar from its first token (structured outputs, a
        forced tool call): a format that would start in reasoning starts in content instead,
        unless the output opens the section itself or the prompt did."""
        self.setup()

    def setup(self) -> None:
        """Build the parser's state from ``prompt_text``, ``chat_template_kwargs`` and
        ``constrained`` (nothing by default); overrides call ``super().setup()`` first."""
