"""Incremental detokenization of one generated stream, with stop strings, as vLLM does it.

Token ids arrive a few at a time; ``push`` returns the text that is safe to show now and ``finish``
what was held back when the stream ends. Decoding uses vLLM's window: the ids since the last
emission point (``read``) are decoded together with the ids of the emission before it (the
prefix), and the new text is the difference, so decoders that depend on the previous token
(SentencePiece's leading space) stay right while each push decodes only a few ids.

Contract:
- Nothing ending in U+FFFD is emitted while more tokens may complete the character (the complete
  characters before it go out at once); ``finish`` emits it as decoded. With no stop string matched, everything pushed plus ``finish`` equals
  ``tokenizer.decode(all_ids, skip_special_tokens)`` (for byte-level BPE tokenizers exactly; the
  window can only differ from a full decode for decoders that are not left-to-right).
- Stop strings: the output ends at the first stop string to complete (ties: the one starting
  first), with the stop string itself only when ``include_stop_str_in_output``; then ``stopped``
  is True, ``stop_reason`` is the string, and pushes return "". The longest tail that could begin
  a stop string (at most len(longest stop) - 1 characters) is held back, so a client never sees
  part of a stop string that then matches, nor anything after one.
- ``spaces_between_special_tokens=False`` (only with ``skip_special_tokens=False``, as in vLLM):
  an added token right after another added token is emitted as its bare content, without the
  separator the decoder puts between them.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from dyn.core.frontend.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"
_PROMPT_TAIL = 6
"""Prompt ids that prime the window (vLLM: INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET + 1)."""
_MAX_HELD_IDS = 32
"""Once this many ids are held for an unfinished character (a real one needs at most 3 more byte
tokens), the next push emits the text anyway: a model that emits invalid bytes forever must not
make every push decode a longer window."""


class IncrementalDetokenizer:
    """Text of one generated stream, a push at a time; not thread-safe (one per stream)."""

    __slots__ = ("stopped", "stop_reason", "_decode", "_skip", "_ids", "_read", "_prefix_text",
                 "_stops", "_include_stop", "_stop_prefixes", "_stop_chars", "_max_hold", "_held",
                 "_added", "_last_added", "_done")

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int] | None = None, *,
                 skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True,
                 stop: Sequence[str] = (), include_stop_str_in_output: bool = False) -> None:
        self.stopped = False
        self.stop_reason: str | None = None
        decode = tokenizer.backend.decode
        self._decode = decode
        self._skip = skip_special_tokens
        self._ids: list[int] = _prompt_tail(decode, prompt_token_ids, skip_special_tokens)
        self._read = len(self._ids)
        self._prefix_text = decode(self._ids, skip_special_tokens=skip_special_tokens) if self._ids else ""

        self._stops = tuple(s for s in stop if s)
        self._include_stop = include_stop_str_in_output
        self._stop_prefixes = frozenset(s[:k] for s in self._stops for k in range(1, len(s)))
        self._stop_chars = frozenset(p[-1] for p in self._stop_prefixes)
        self._max_hold = max((len(s) for s in self._stops), default=1) - 1
        self._held = ""

        joined = skip_special_tokens or spaces_between_special_tokens or not tokenizer.added_tokens
        self._added: dict[int, str] | None = None if joined else tokenizer.added_tokens
        self._last_added = False
        self._done = False

    def push(self, token_ids: Sequence[int]) -> str:
        """Take newly generated ids; return the text to send now (often "", never part of a character)."""
        if self.stopped or self._done or not token_ids:
            return ""
        if self._added is None:
            new = self._step(token_ids, False)
        else:
            new = "".join(self._step_unjoined(t) for t in token_ids)
        return self._emit(new, False) if new else ""

    def finish(self) -> str:
        """The stream has ended: return what was held back (an unfinished character as decoded,
        the tail that could have begun a stop string); later calls return ""."""
        if self.stopped or self._done:
            return ""
        self._done = True
        new = self._step((), True) if len(self._ids) > self._read else ""
        return self._emit(new, True)

    def _step(self, token_ids: Sequence[int], final: bool) -> str:
        ids = self._ids
        before = len(ids)
        ids.extend(token_ids)
        text = self._decode(ids, skip_special_tokens=self._skip)
        prefix_text = self._prefix_text
        if len(text) <= len(prefix_text):
            return ""
        read = self._read
        if text[-1] == _REPLACEMENT and not final and before - read < _MAX_HELD_IDS:
            if len(token_ids) == 1:
                return ""
            # the chunk ends inside a character: step token by token, so the complete part goes out
            # now and the window restarts at the last whole character
            del ids[before:]
            return "".join([self._step((t,), False) for t in token_ids])
        if text.startswith(prefix_text):
            new = text[len(prefix_text):]
        else:  # the decoder rewrote earlier text (not left-to-right): emit the new ids on their own
            new = self._decode(ids[read:], skip_special_tokens=self._skip)
        del ids[:read]
        self._read = len(ids)
        self._prefix_text = self._decode(ids, skip_special_tokens=self._skip)
        return new

    def _step_unjoined(self, token_id: int) -> str:
        new = self._step((token_id,), False)
        content = self._added.get(token_id)  # type: ignore[union-attr]
        if content is not None and self._last_added:
            new = content
        self._last_added = content is not None
        return new

    def _emit(self, new: str, final: bool) -> str:
        stops = self._stops
        if not stops:
            return new
        pending = self._held + new if self._held else new
        match = _first_stop(pending, stops)
        if match is not None:
            stop, start = match
            self.stopped = True
            self.stop_reason = stop
            self._held = ""
            return pending[:start + len(stop)] if self._include_stop else pending[:start]
        hold = 0 if final else self._hold(pending)
        if hold:
            self._held = pending[-hold:]
            return pending[:-hold]
        self._held = ""
        return pending

    def _hold(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        if not text or text[-1] not in self._stop_chars:
            return 0
        prefixes = self._stop_prefixes
        for k in range(min(self._max_hold, len(text)), 0, -1):
            if text[-k:] in prefixes:
                return k
        return 0


def _first_stop(text: str, stops: tuple[str, ...]) -> tuple[str, int] | None:
    """The stop string that completes first in ``text`` and where it starts (ties: earliest start)."""
    best: tuple[str, int] | None = None
    best_end = best_start = 0
    for stop in stops:
        start = text.find(stop)
        if start < 0:
            continue
        end = start + len(stop)
        if best is None or end < best_end or (end == best_end and start < best_start):
            best, best_end, best_start = (stop, start), end, start
    return best


def _prompt_tail(decode: Callable[..., str], prompt_token_ids: Sequence[int] | None,
                 skip_special_tokens: bool) -> list[int]:
    """The last few prompt ids, dropping leading ones until they decode to whole characters; none
    when the prompt ends inside a character (the output then decodes on its own)."""
    if not prompt_token_ids:
        return []
    tail = list(prompt_token_ids[-_PROMPT_TAIL:])
    while tail and _REPLACEMENT in decode(tail, skip_special_tokens=skip_special_tokens):
        del tail[0]
    return tail
