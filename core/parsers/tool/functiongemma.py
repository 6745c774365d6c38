"""Google FunctionGemma tool calls (vLLM's ``functiongemma``): google/functiongemma-270m-it.

Format (the model's chat template, its ``format_argument`` macro; vLLM's
functiongemma_tool_parser.py): each call between ``<start_function_call>`` and
``<end_function_call>`` (special tokens) is ``call:NAME{...}``, the arguments written as Gemma 4
writes them (``gemma4``) with ``<escape>`` (a special token, no escaping inside) around strings
instead of ``<|"|>``: ``key:value`` pairs joined by ``,``, keys bare, numbers and booleans as they
are, objects ``{key:value,...}`` and arrays ``[value,...]``. Text around the calls is content.

    <start_function_call>call:get_weather{location:<escape>London<escape>,days:3}<end_function_call>

So the body is read by ``Gemma4ToolParser`` with ``<escape>`` standing for its string quote:
the call starts once ``call:NAME{`` is read, its arguments stream one member per complete
``key:value``, a string or bare value is typed by the tool's schema where it lists the parameter.

Where dyn's reading differs from vLLM's: vLLM reads only ``key:<escape>text<escape>`` pairs
(found anywhere in the braces, nested ones flattened into the top level) and turns each text
into the JSON it spells, else keeps it as text, schema or not; bare values (``days:3``) and the
structure of nested objects and arrays are lost there. Here bare values and nesting are read as
the template writes them, and an escaped string stays text unless the schema asks for another
type (``<escape>42<escape>`` for a ``string`` parameter is ``"42"``, where vLLM gives ``42``).
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.events import Event
from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.gemma4 import QUOTE, Gemma4ToolParser, format_value

CALL_START = "<start_function_call>"
CALL_END = "<end_function_call>"
ESCAPE = "<escape>"


@TOOL_PARSERS.register("functiongemma")
class FunctionGemmaToolParser(Gemma4ToolParser):
    call_start = CALL_START
    call_end = CALL_END
    needs_special_tokens = True  # vLLM's adjust_request: the markers and <escape> are special tokens

    def call_events(self, body: str, *, complete: bool, final: bool) -> list[Event]:
        # Gemma 4's reader with <escape> as its quote (a partial <escape> only ever ends the body,
        # so indexes into the translated body stay put as it grows)
        return super().call_events(body.replace(ESCAPE, QUOTE), complete=complete, final=final)

    def raw_call(self, body: str, complete: bool = True) -> str:
        return super().raw_call(body.replace(QUOTE, ESCAPE), complete)

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        return "".join(
            f"{CALL_START}call:{c.name}{format_value(c.args).replace(QUOTE, ESCAPE)}{CALL_END}" for c in calls
        )
