"""OpenBMB MiniCPM-V 4.5+ reasoning (vLLM's ``minicpmv``, parser/minicpmv.py): Qwen3's ``<think>``
sections (``qwen3``), whose template (vLLM's template_minicpmv45.jinja) opens the section
(``<think>\\n``) or closes an empty one; calls are Qwen3-Coder's XML (``qwen3_coder``):

    The user wants a haiku.\\nFirst line: five syllables.</think>Autumn moonlight—\\na worm digs silently

Besides Qwen3's reading:

- The tokenizer decodes some newlines as the two characters ``\\`` ``n``: in reasoning and content
  ``\\n``, ``\\r`` and ``\\r\\n`` become a newline, except inside code (```` ``` ```` fences,
  `` ` `` spans), math (``$``, ``$$``, ``\\(``, ``\\[``) and a run of backslashes; and, since
  here the content still holds the calls for the tool parser, inside ``<tool_call>`` and
  ``<function=`` elements (vLLM applies it to the content without the calls).
- ``<|im_end|>`` and the reserved markers ``<reserved_12>`` ... ``<|reserved_15|>`` are dropped.
- With ``enable_thinking`` false a ``<think>`` section the model writes anyway is dropped,
  reasoning included.
"""

from __future__ import annotations

import re

from dyn.core.parsers.events import Event, Reasoning
from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import Qwen3ReasoningParser
from dyn.core.parsers.tool.content_markers import ContentMarkers

DROPPED = (
    "<|im_end|>",
    *(f"<reserved_{i}>" for i in range(12, 16)),
    *(f"<|reserved_{i}|>" for i in range(12, 16)),
)
_CODE_AND_MATH = {"```": "```", "`": "`", "$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_CALLS = {"<tool_call>": "</tool_call>", "<function=": "</function>"}
_NEWLINES = {"\\r\\n": "\n", "\\n": "\n", "\\r": "\n"}


class EscapedNewlines:
    """Streams text with the escaped newlines turned into newlines outside ``spans`` (opener ->
    closer; text inside is copied), holding back a tail the next piece may change."""

    def __init__(self, spans: dict[str, str]) -> None:
        self.spans = spans
        self._opens = sorted([*spans, *_NEWLINES], key=len, reverse=True)
        self._special = re.compile("[" + re.escape("".join({s[0] for s in self._opens})) + "]")
        self._closer = ""
        self._held = ""

    def feed(self, text: str, final: bool = False) -> str:
        text, self._held = self._held + text, ""
        out: list[str] = []
        at = 0
        while at < len(text):
            if self._closer:
                end = text.find(self._closer, at)
                if end < 0:
                    keep = 0 if final else _prefix_tail(text, at, self._closer)
                    out.append(text[at : len(text) - keep])
                    self._held = text[len(text) - keep :]
                    break
                out.append(text[at : end + len(self._closer)])
                at, self._closer = end + len(self._closer), ""
                continue
            hit = self._special.search(text, at)
            if hit is None:
                out.append(text[at:])
                break
            out.append(text[at : hit.start()])
            at = hit.start()
            rest = text[at:]
            if not final and any(len(o) > len(rest) and o.startswith(rest) for o in self._opens):
                self._held = rest  # maybe a longer opener or escape
                break
            run = len(rest) - len(rest.lstrip("\\"))
            if run > 1:  # a run of backslashes stays as it is
                if not final and run == len(rest):
                    self._held = rest
                    break
                out.append(rest[:run])
                at += run
                continue
            opener = next((o for o in self._opens if rest.startswith(o)), None)
            if opener is None:
                out.append(rest[0])
                at += 1
            elif opener in _NEWLINES:
                out.append("\n")
                at += len(opener)
            else:
                out.append(opener)
                at += len(opener)
                self._closer = self.spans[opener]
        return "".join(out)


def _prefix_tail(text: str, start: int, marker: str) -> int:
    """Length of the longest end of ``text[start:]`` that begins ``marker`` (held back)."""
    for k in range(min(len(marker) - 1, len(text) - start), 0, -1):
        if marker.startswith(text[len(text) - k :]):
            return k
    return 0


@REASONING_PARSERS.register("minicpmv")
class MiniCPMVReasoningParser(Qwen3ReasoningParser):
    drops = DROPPED

    def setup(self) -> None:
        self._hidden = not self.chat_template_kwargs.get("enable_thinking", True)
        if self._hidden:
            # a section opens only where the model writes <think> (as in a constrained output)
            self.constrained = True
        super().setup()
        self._reasoning_markers = ContentMarkers(DROPPED)
        self._reasoning_text = EscapedNewlines(_CODE_AND_MATH)
        self._content_text = EscapedNewlines({**_CODE_AND_MATH, **_CALLS})
        self._reasoning_done = False

    def thinking(self) -> bool:
        return True  # with thinking off, sections are still read (and dropped)

    def opened_by_prompt(self, prompt: str) -> bool | None:
        return None if self._hidden else super().opened_by_prompt(prompt)

    def feed(self, text: str) -> list[Event]:
        return self._recover(super().feed(text), final=False)

    def finish(self) -> list[Event]:
        return self._recover(super().finish(), final=True)

    def _recover(self, events: list[Event], final: bool) -> list[Event]:
        out: list[Event] = []
        for event in events:
            if isinstance(event, Reasoning):
                if not self._hidden:
                    for piece in self._reasoning_markers.apply([event.text]):
                        self._send_reasoning(out, str(piece), final=False)
            elif isinstance(event, str):
                self._end_reasoning(out)
                if text := self._content_text.feed(event):
                    out.append(text)
        if final:
            self._end_reasoning(out)
            if text := self._content_text.feed("", final=True):
                out.append(text)
        return out

    def _send_reasoning(self, out: list[Event], text: str, final: bool) -> None:
        if text := self._reasoning_text.feed(text, final):
            out.append(Reasoning(text))

    def _end_reasoning(self, out: list[Event]) -> None:
        """The reasoning is over (content follows, or the output ended): what it held goes out."""
        if not self._reasoning_done:
            self._reasoning_done = True
            for piece in self._reasoning_markers.apply([], final=True):
                self._send_reasoning(out, str(piece), final=False)
            self._send_reasoning(out, "", final=True)
