"""Google Gemma 4 reasoning (vLLM's ``gemma4``): a thought channel,
``<|channel>thought\\n`` ... ``<channel|>``, then the answer or ``<|tool_call>`` calls.

The model opens the channel itself (a system turn with ``<|think|>`` asks it to think), so the
output is content until ``<|channel>`` opens a section; the channel's name, ``thought\\n``, is
dropped, and so is the whitespace before ``<channel|>``. A ``<|tool_call>`` written inside the
section ends it (the call is content, for the tool parser). After the section a later
``<|channel>`` opens another one and a stray ``<channel|>`` is dropped. An output that begins with
``thought\\n`` (the opener was not kept in the text) is reasoning from there, as vLLM reads it.

The prompt: one that leaves a channel open (its last ``<|channel>`` not followed by
``<channel|>``, ``<|tool_call>``, ``<|turn>`` or ``<|tool_response>``: a template continuing
after a tool response) starts the output in reasoning; one that ends with an empty, closed
channel (``<|channel>thought\\n<channel|>``, the larger models' template with thinking off)
makes the output content, verbatim. ``enable_thinking`` itself changes nothing here: the markers
say where the reasoning is.
"""

from __future__ import annotations

from dyn.core.parsers.events import Event
from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import TaggedReasoningParser

_CHANNEL_START = "<|channel>"
_CHANNEL_END = "<channel|>"
_LABEL = "thought\n"
_CLOSERS = (_CHANNEL_END, "<|tool_call>", "<|turn>", "<|tool_response>")
"""What ends a channel the prompt opened: the channel's end, a call, a new turn."""


@REASONING_PARSERS.register("gemma4")
class Gemma4ReasoningParser(TaggedReasoningParser):
    """Gemma 4's thought channel (see the module)."""

    needs_special_tokens = True  # <|channel>, <channel|> and <|tool_call> are special tokens
    start_tags = (_CHANNEL_START,)
    end_tags = (_CHANNEL_END,)
    section_label = _LABEL
    exits = ("<|tool_call>",)
    reopens = True
    drops_stray_end = True
    trims_reasoning_end = True

    def opened_by_prompt(self, prompt: str) -> bool | None:
        at = prompt.rfind(_CHANNEL_START)
        if at >= 0 and not any(closer in prompt[at:] for closer in _CLOSERS):
            return True
        return super().opened_by_prompt(prompt)

    def _open(self, events: list[Event], final: bool) -> bool:
        if self._at_start:
            buf = self._buf
            if buf.startswith(_LABEL):
                self._enter_reasoning()
                return True
            if not final and _LABEL.startswith(buf):
                return False
        return super()._open(events, final)
