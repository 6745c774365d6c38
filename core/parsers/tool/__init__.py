"""Tool-call parsers: a model's text -> content and tool calls, one module per format family.

Contract of a ``ToolParser`` (one instance per choice, fed in order):

- ``feed(text)`` takes the next piece of the choice's text and returns the events it completes
  (``dyn.core.parsers.events``): content ``str``, ``ToolCallStart``, ``ToolCallArgs``,
  ``TOOL_CALL_END``. Text that might begin a call marker is held back until the next piece
  decides; ``finish()`` returns what is left when the stream ends (a call cut off by
  ``max_tokens`` has a start and maybe arguments but no end).
- Joining the events gives the same content and calls for every way of splitting the text into
  pieces (the tests feed each recorded output whole and at every split point).
- A call's arguments, joined, are one JSON object as text: the model's own JSON where its format
  writes JSON (verbatim), else built from its format (XML parameters, Python keywords) with
  ``json.dumps``. A call body that cannot be read is returned as content, markers included.
- ``render(calls)`` writes calls the way a model of this family does, so that the parser reads
  them back (the mocker answers in the format of its parser with it).

A ``--tool-parser-plugin`` file registers its own parsers: dyn's (a ``ToolParser`` subclass with
``@TOOL_PARSERS.register``), or vLLM's where vLLM is installed (``_vllm_plugin`` adapts them).

Names follow vLLM's ``--tool-call-parser`` and Dynamo's ``--dyn-tool-call-parser``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dyn.core.parsers.registry import Registry
from dyn.core.parsers.stream import StreamParser

TOOL_PARSERS: Registry[ToolParser] = Registry("tool-call parser", __name__)


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the request offers: its name and its parameters' JSON Schema."""

    name: str
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One complete call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str | None = None

    @property
    def args(self) -> Any:
        return json.loads(self.arguments)


class ToolParser(StreamParser):
    """Base of the tool-call parsers (see the module's contract)."""

    takes_tokenizer: ClassVar[bool] = False
    """The parser reads token ids, the vocabulary (a vLLM plugin's, ``_vllm_plugin``) or the model's
    metadata (``hf``: its ``response_template``): the frontend builds it with ``tokenizer=`` the
    served model's ``dyn.core.frontend.tokenizer.Tokenizer``."""
    emits_reasoning: ClassVar[bool] = False
    """The format carries reasoning too (Harmony): this parser also emits ``Reasoning`` events
    and takes the place of the reasoning parser of the same family."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        self.tools = {t.name: t for t in tools}

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        raise NotImplementedError(f"the {cls.name} parser cannot write calls")
