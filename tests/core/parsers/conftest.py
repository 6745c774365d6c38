"""Fixtures for parser tests: run a parser over pieces of a text and join what it emitted.

``parse(make, pieces)`` feeds a fresh parser (``make()``) the pieces in order, then
``finish()``, and joins the events into a ``Parsed``. ``check_splits(make, text)`` parses
``text`` whole, character by character, and split in two at every index (and in three at a
stride), asserts every way gives the same ``Parsed``, and returns it: a streamed response then
carries exactly what the unary one does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from dyn.core.parsers.events import Reasoning, ToolCallArgs, ToolCallEnd, ToolCallStart


@dataclass
class Call:
    name: str
    arguments: str = ""
    complete: bool = False
    id: str | None = None

    @property
    def args(self):
        return json.loads(self.arguments)


@dataclass
class Parsed:
    content: str = ""
    reasoning: str = ""
    calls: list[Call] = field(default_factory=list)

    @property
    def named_args(self) -> list[tuple[str, object]]:
        """(name, decoded arguments) of every call, for comparisons that ignore JSON spacing."""
        return [(c.name, c.args) for c in self.calls]


def join(events) -> Parsed:
    out = Parsed()
    for event in events:
        if isinstance(event, str):
            out.content += event
        elif isinstance(event, Reasoning):
            out.reasoning += event.text
        elif isinstance(event, ToolCallStart):
            assert not out.calls or out.calls[-1].complete, "a call started before the previous one ended"
            out.calls.append(Call(event.name, id=event.id))
        elif isinstance(event, ToolCallArgs):
            assert out.calls and not out.calls[-1].complete, "arguments outside a call"
            out.calls[-1].arguments += event.text
        elif isinstance(event, ToolCallEnd):
            assert out.calls and not out.calls[-1].complete, "an end outside a call"
            out.calls[-1].complete = True
        else:
            raise AssertionError(f"unexpected event {event!r}")
    return out


def _parse(make, pieces) -> Parsed:
    parser = make()
    events = []
    for piece in pieces:
        got = parser.feed(piece)
        assert all(e != "" for e in got), "empty content event"
        events.extend(got)
    events.extend(parser.finish())
    return join(events)


def _check_splits(make, text: str, stride: int = 5) -> Parsed:
    whole = _parse(make, [text])
    assert _parse(make, list(text)) == whole, "character by character differs from whole"
    for i in range(len(text) + 1):
        got = _parse(make, [text[:i], text[i:]])
        assert got == whole, (
            f"split at {i} ({text[:i][-20:]!r} | {text[i:][:20]!r}) differs: {got} != {whole}"
        )
    # three pieces grow with the square of the length: a longer text takes a longer stride, about
    # 40 first cuts (a 380-character gpt-oss text was 2,000 parses and 11 s)
    stride = max(stride, len(text) // 40)
    for i in range(0, len(text) + 1, stride):
        for j in range(i, len(text) + 1, stride + 2):
            assert _parse(make, [text[:i], text[i:j], text[j:]]) == whole, f"split at {i}, {j} differs"
    return whole


@pytest.fixture
def parse():
    return _parse


@pytest.fixture
def check_splits():
    return _check_splits
