"""Helpers for parsing text that arrives in pieces: markers split across pieces, and where a JSON
value ends before all of it has arrived."""

from __future__ import annotations

import re
from collections.abc import Sequence


def marker_tail(text: str, markers: Sequence[str]) -> int:
    """Length of the longest end of ``text`` that could be the start of one of ``markers`` (a
    proper prefix of it): the part to hold back until the next piece tells whether it is one."""
    best = 0
    if not text:
        return 0
    last = text[-1]
    for marker in markers:
        k = min(len(marker) - 1, len(text))
        while k > best:
            if marker[k - 1] == last and text.endswith(marker[:k]):
                best = k
                break
            k -= 1
    return best


def split_held(text: str, markers: Sequence[str], final: bool) -> tuple[str, str]:
    """``text`` split into what can be passed on now and what to hold back: the tail that may
    begin one of ``markers`` (``marker_tail``), or nothing when ``final`` (the stream ended)."""
    keep = 0 if final else marker_tail(text, markers)
    return text[: len(text) - keep], text[len(text) - keep :]


def find_first(text: str, markers: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest occurrence of any of ``markers`` in ``text[start:]``: (index, marker)."""
    best: tuple[int, str] | None = None
    for marker in markers:
        i = text.find(marker, start)
        if i >= 0 and (best is None or i < best[0] or (i == best[0] and len(marker) > len(best[1]))):
            best = (i, marker)
    return best


_STRUCTURE = re.compile(r'[{}\[\]"]')
_STRING_STOP = re.compile(r'["\\]')
_SCALAR_END = re.compile(r"[,}\]\s]")


class JsonScanner:
    """Finds where one JSON value ends in text that arrives in pieces, without parsing it.

    Call ``scan(text)`` with the whole text so far, the value starting at ``text[0]`` or after
    leading whitespace; it resumes where the previous call stopped and returns the index just
    past the value's end, or -1 while the value is still open. Only the structure is tracked
    (brackets, strings, escapes), so malformed JSON is found later, by ``json.loads``.
    """

    __slots__ = ("pos", "depth", "in_string", "escape", "started", "scalar", "end")

    def __init__(self) -> None:
        self.pos = 0
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.started = False
        self.scalar = False
        self.end = -1

    def scan(self, text: str) -> int:
        if self.end >= 0:
            return self.end
        pos, n = self.pos, len(text)
        if not self.started:
            while pos < n and text[pos] in " \t\r\n":
                pos += 1
            if pos == n:
                self.pos = pos
                return -1
            self.started = True
            first = text[pos]
            if first not in '{["':
                self.scalar = True
        if self.scalar:
            match = _SCALAR_END.search(text, pos)
            if match is None:
                self.pos = n
                return -1
            self.end = match.start()
            return self.end
        while pos < n:
            if self.in_string:
                if self.escape:
                    self.escape = False
                    pos += 1
                    continue
                match = _STRING_STOP.search(text, pos)
                if match is None:
                    pos = n
                    break
                pos = match.end()
                if match.group() == "\\":
                    self.escape = True
                    continue
                self.in_string = False
                if self.depth == 0:
                    self.end = pos
                    return pos
                continue
            match = _STRUCTURE.search(text, pos)
            if match is None:
                pos = n
                break
            pos = match.end()
            char = match.group()
            if char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth <= 0:
                    self.end = pos
                    return pos
        self.pos = pos
        return -1
