"""Cohere Command A reasoning (vLLM's ``cohere_command3`` and ``cohere_command4`` reasoning
parsers, which vLLM runs through Cohere's ``cohere_melody`` filter with its ``cmd3`` / ``cmd4``
preset, as it runs the tool parsers of the same names).

Format (the models' chat templates, cohere-ai/melody ``cmd3-hf.jinja`` / ``cmd4-hf.jinja``): the
output is sections between special tokens; ``<|START_THINKING|>`` ... ``<|END_THINKING|>`` is the
reasoning, ``<|START_RESPONSE|>`` ... ``<|END_RESPONSE|>`` (Command 4 also ``<|START_TEXT|>`` ...
``<|END_TEXT|>``) the answer, ``<|START_ACTION|>`` ... ``<|END_ACTION|>`` the tool calls:

    <|START_THINKING|>I have the results.<|END_THINKING|><|START_RESPONSE|>It is sunny in Toronto.<|END_RESPONSE|>

The sections are read exactly as the ``cohere_command3`` / ``cohere_command4`` tool parsers read
them (``dyn.core.parsers.tool.cohere_command``: the answer and the reasoning, citation tags
dropped, Command 4 starting in the reasoning unless the prompt says otherwise); when a tool
parser of that family runs too it reads the reasoning itself and this parser is not used. Run
alone, this parser drops the calls of an action block, as vLLM does when no tool parser is set;
an action block that is no list of calls stays content, markers included, as the tool parser
keeps it (melody drops it).
"""

from __future__ import annotations

from typing import ClassVar

from dyn.core.parsers.events import Event, Reasoning
from dyn.core.parsers.reasoning import REASONING_PARSERS, ReasoningParser
from dyn.core.parsers.tool.cohere_command import (
    CohereCommand3ToolParser,
    CohereCommand4ToolParser,
    CohereCommandToolParser,
)


class CohereCommandReasoningParser(ReasoningParser):
    """The reasoning and the answer of a Cohere Command output, read by ``sections``."""

    needs_special_tokens = True  # the section markers are special tokens (melody needs them)
    sections: ClassVar[type[CohereCommandToolParser]]
    """The tool parser whose reading of the sections this parser shares."""

    def setup(self) -> None:
        super().setup()
        self._sections = self.sections(prompt_text=self.prompt_text)

    def feed(self, text: str) -> list[Event]:
        return _text_only(self._sections.feed(text))

    def finish(self) -> list[Event]:
        return _text_only(self._sections.finish())


def _text_only(events: list[Event]) -> list[Event]:
    """The content and reasoning among ``events`` (a call's events dropped)."""
    return [e for e in events if isinstance(e, str | Reasoning)]


@REASONING_PARSERS.register("cohere_command3")
class CohereCommand3ReasoningParser(CohereCommandReasoningParser):
    """Command A (melody's ``cmd3``): the output starts in the answer."""

    sections = CohereCommand3ToolParser


@REASONING_PARSERS.register("cohere_command4")
class CohereCommand4ReasoningParser(CohereCommandReasoningParser):
    """Command A Reasoning and later (melody's ``cmd4``): the output starts in the reasoning."""

    sections = CohereCommand4ToolParser
