"""Tool calls as the checkpoint's ``response_template`` describes them (vLLM's ``hf``): the format
is not fixed by the parser but read from the served model's tokenizer_config.json and run through
transformers' engine (``dyn.core.parsers.response_template``, which says what a template must have).

The template needs a ``tool_calls`` field. Content streams as it arrives; when the template has a
``thinking`` field the parser emits its text as ``Reasoning`` too (it then takes the reasoning
parser's place; without one it emits none and the reasoning parser, if any, stays). A tool region
becomes calls when it closes: each ``{"function": {"name", "arguments"}}`` of its value, in order,
as ``ToolCallStart(name)``, ``ToolCallArgs`` (the arguments as one JSON object: the model's JSON
text verbatim when the value keeps it as text, else ``json.dumps`` of the parsed object, values
typed by the request's tool schemas) and ``TOOL_CALL_END``. A call cut off by ``max_tokens`` is
read from what was generated (the region closes at the end), as vLLM does.

``render`` is the base class's: a template describes how to read calls, not how to write them, and
the class has no model to read one from, so the mocker cannot answer in this format.

Where dyn's reading differs from vLLM's (0.32): a region whose value fails to parse, or is not a
list of calls with a name and an object of arguments (vLLM passes other argument values through),
stays content, anchors included (vLLM drops it with a warning), as every dyn parser keeps what it
cannot read; so does a call cut off mid-arguments. The thinking text is reasoning whether or not
``--reasoning-parser hf`` is set (vLLM returns it as content without that flag), and hf combines
with any reasoning parser (vLLM refuses the mix; dyn's reasoning parser then applies only to a
template without ``thinking``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dyn.core.parsers.events import Event
from dyn.core.parsers.response_template import THINKING, TemplateReader, require_engine, serving_template
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolParser


@TOOL_PARSERS.register("hf")
class ResponseTemplateToolParser(ToolParser):
    takes_tokenizer = True
    emits_reasoning = True
    """When the model's template has a ``thinking`` field; an instance without one sets it False."""

    def __init__(
        self, tools: Sequence[Tool] = (), prompt_text: str | None = None, tokenizer: Any = None
    ) -> None:
        """``ParserModelError`` when ``tokenizer``'s model has no usable template (``check_tokenizer``)."""
        super().__init__(tools)
        template = serving_template(tokenizer, "tool")
        self.emits_reasoning = THINKING in template.fields  # type: ignore[misc]  # per model
        self._reader = TemplateReader(template, prompt_text, tools, calls=True)

    @classmethod
    def check(cls) -> None:
        require_engine()

    @classmethod
    def check_tokenizer(cls, tokenizer: Any) -> None:
        serving_template(tokenizer, "tool")

    def feed(self, text: str) -> list[Event]:
        return self._reader.feed(text)

    def finish(self) -> list[Event]:
        return self._reader.finish()
