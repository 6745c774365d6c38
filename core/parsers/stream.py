"""What every streaming parser is (``StreamParser``, the base of the tool-call and the reasoning
parsers), and the usual way to write one (``BufferedParser``).

A parser is fed a choice's text piece by piece (``feed``) and told when it ends (``finish``);
each call returns the events (``dyn.core.parsers.events``) that the text so far completes.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from dyn.core.parsers.events import Event


class StreamParser(abc.ABC):
    """Base of ``ToolParser`` and ``ReasoningParser``: the registered name, whether the format's
    markers are special tokens, ``check`` and the ``feed``/``finish`` pair."""

    name: ClassVar[str] = ""
    needs_special_tokens: ClassVar[bool] = False
    """The format's markers are special tokens: the frontend keeps them in the text it parses
    (``skip_special_tokens=False``, as vLLM's parsers ask with ``adjust_request``)."""

    @classmethod
    def check(cls) -> None:
        """Raise ``ParserUnavailable`` when this parser cannot run here (servers call it at start)."""
        return  # every parser can run unless it says otherwise

    @classmethod
    def check_tokenizer(cls, tokenizer: Any) -> None:
        """Raise ``ParserModelError`` (``dyn.core.parsers.registry``) when this parser cannot read
        the output of the model ``tokenizer`` (the served model's
        ``dyn.core.frontend.tokenizer.Tokenizer``) belongs to; the frontend calls it at start for
        the parsers its flags name and per request for one a worker advertises."""
        return  # a format fixed by the parser suits every model

    @abc.abstractmethod
    def feed(self, text: str) -> list[Event]:
        """The events the text so far completes, ``text`` the next piece."""

    def finish(self) -> list[Event]:
        return []


class BufferedParser(StreamParser):
    """A parser that keeps the text it has not decided yet in ``_buf`` and reads it with ``_run``.

    ``feed`` appends the piece to ``_buf`` and runs ``_run(final=False)``; ``finish`` runs
    ``_run(final=True)``. ``_run`` returns the events the buffered text completes and leaves in
    ``_buf`` only what the next piece may still change (a tail that may begin a marker, a call
    still open); with ``final`` it must settle everything. Mix it in before the parser's family
    base (``class P(BufferedParser, ToolParser)``); a ``feed`` with a fast path for plain text
    calls ``super().feed`` for the rest.
    """

    _buf: str = ""
    """The text fed and not yet read (empty at the start)."""

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[Event]:
        return self._run(final=True)

    @abc.abstractmethod
    def _run(self, final: bool) -> list[Event]:
        """Read ``_buf`` (see the class docstring)."""
