"""Reading MuseGlimmer's messages from text, for the ``muse_glimmer`` tool and reasoning parsers.

A MuseGlimmer turn is a run of assistant messages, each addressed to a recipient (the model's
chat template, ``MUSE_GLIMMER_MM_CHAT_TEMPLATE`` in vLLM's ``transformers_utils/processors/
muse_glimmer.py``): ``<|start|>assistant to=RECIPIENT<|message|>TEXT`` ended by ``<|eom|>`` (the
turn goes on) or ``<|eot|>`` (it is over). The prompt ends with ``<|start|>assistant``, so the
output starts inside the first header (`` to=self<|message|>``). ``self`` is the model's own
reasoning, ``user`` (or no recipient) the answer, anything else a tool, whose message holds the
call in ATEM markup (see ``dyn.core.parsers.tool.muse_glimmer``):

     to=self<|message|>The user wants the weather in Paris.<|eom|><|start|>assistant to=get_weather<|message|><atem:function_calls>
    <atem:invoke name="get_weather">
    <atem:parameter name="city">Paris</atem:parameter>
    </atem:invoke>
    </atem:function_calls><|eom|>

``MessageReader`` turns text arriving in pieces into ``Begin`` (a header was read), ``Text`` (the
next piece of the message), ``End`` (its end marker; empty when the next header or ``<|start|>``
cut it short) and, for an output without any header, ``Plain`` (all of it, at the end). As in
vLLM's ``muse_glimmer`` parsers: a header is ``[<|start|>assistant][ to=NAME]<|message|>``
(NAME of letters, digits, ``_``, ``.``, ``-``); a message also ends where the next header or a
``<|start|>`` begins; text outside the messages (before the first header, after an end marker)
is dropped once the output has a header.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from dyn.core.parsers.text import find_first, marker_tail

START = "<|start|>"
MESSAGE = "<|message|>"
EOM = "<|eom|>"
EOT = "<|eot|>"
MARKERS = (START, MESSAGE, EOM, EOT)
REASONING_RECIPIENT = "self"
USER_RECIPIENT = "user"

_HEADER = re.compile(r"(?:<\|start\|>\s*assistant)?[^\S\n]*(?:to=([A-Za-z0-9_.\-]+))?\Z")
"""A header's text before ``<|message|>`` (searched with ``endpos`` there: the earliest start)."""
_OPEN_HEADER = re.compile(r"[^\S\n]*(?:to=[A-Za-z0-9_.\-]*|to?)?\Z")
"""The end of a message's text that may still become a header's start."""


class Begin(NamedTuple):
    """A message's header was read: its recipient (``None`` when it names none) and its text."""

    recipient: str | None
    header: str


class Text(NamedTuple):
    """The next piece of the current message."""

    text: str


class End(NamedTuple):
    """The current message ended with ``marker`` (``<|eom|>``, ``<|eot|>``, or ``""`` when the
    next header began without one)."""

    marker: str


class Plain(NamedTuple):
    """An output without any header, whole (read once the stream ended)."""

    text: str


MessageEvent = Begin | Text | End | Plain


def is_tool(recipient: str | None) -> bool:
    """Whether a message to ``recipient`` is a tool call."""
    return recipient not in (None, REASONING_RECIPIENT, USER_RECIPIENT)


class MessageReader:
    """MuseGlimmer messages from text that arrives in pieces (see the module)."""

    def __init__(self) -> None:
        self._buf = ""
        self._in_message = False
        self._framed = False
        """A header was read: text outside messages is dropped."""

    def feed(self, text: str) -> list[MessageEvent]:
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[MessageEvent]:
        return self._run(final=True)

    def _run(self, final: bool) -> list[MessageEvent]:
        events: list[MessageEvent] = []
        while True:
            buf = self._buf
            if not self._in_message:  # all of it may still be a header: kept until <|message|>
                at = buf.find(MESSAGE)
                if at < 0:
                    if final:
                        if buf and not self._framed:
                            events.append(Plain(buf))
                        self._buf = ""
                    return events
                head = _HEADER.search(buf, 0, at)
                assert head is not None  # the pattern matches the empty text before <|message|>
                events.append(Begin(head.group(1), buf[head.start() : at + len(MESSAGE)]))
                self._buf = buf[at + len(MESSAGE) :]
                self._in_message = self._framed = True
                continue
            hit = find_first(buf, MARKERS)
            if hit is None:
                ready = buf if final else _settled(buf)
                if ready:
                    events.append(Text(ready))
                self._buf = buf[len(ready) :]
                return events
            at, marker = hit
            if marker == MESSAGE:  # the next header, without an end marker before it
                head = _HEADER.search(buf, 0, at)
                assert head is not None
                at, marker = head.start(), ""
            elif marker == START:
                marker = ""
            if at:
                events.append(Text(buf[:at]))
            events.append(End(marker))
            self._buf = buf[at + len(marker) :]
            self._in_message = False


def _settled(text: str) -> str:
    """The part of a message's text that stays its text whatever comes next: all but a tail that
    may begin a marker or a header."""
    text = text[: len(text) - marker_tail(text, MARKERS)]
    held = _OPEN_HEADER.search(text)
    return text[: held.start()] if held is not None else text
