"""Token sources: where a request's output tokens come from when they are not uniform random draws.

The scheduler samples ``int(req.rand() * vocab)`` for a request without a source (the default
path pays one attribute test for this module). A request with ``SimRequest.source`` asks it for
every output token instead: ``next_token(req)`` returns a token id, which then goes through the
scheduler's stop rules like a random one, or one of two verdicts:

- ``STOP``: the output is complete (a constraint's grammar accepts it and chose to end); the
  request finishes with reason ``"stop"`` and ``end_token_id`` as its stop token, whatever
  ``ignore_eos`` says (the constraint's end is the end);
- ``FAIL``: the source cannot go on (the grammar engine hit a resource limit); the request
  finishes with reason ``"error"``.

A source draws its randomness from ``req.rand`` only, so the output is a function of the seed.
It is asked once per output position, in order, and never again for a position (preemption keeps
the generated tokens). ``thinks``: under ``--reasoning`` the thinking section comes first and the
source takes over after it (``reasoning.ThinkingFirst``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dyn.plugins.mocker.scheduler import SimRequest

STOP = -1
FAIL = -2


class TokenSource(Protocol):
    end_token_id: int | None
    thinks: bool
    error: str

    def next_token(self, req: SimRequest) -> int: ...


class ScriptedSource:
    """A fixed text's tokens, then ``eos``, then uniform random tokens (only reached when the EOS
    did not end the request: ``ignore_eos`` or ``min_tokens``). Used for ``--replies`` (the
    model's raw output, so ``thinks`` is False) and for tool calls."""

    __slots__ = ("tokens", "eos", "vocab_size", "thinks", "end_token_id", "error", "_next")

    def __init__(self, tokens: Sequence[int], eos: int | None, vocab_size: int, thinks: bool = False) -> None:
        self.tokens = list(tokens)
        if eos is not None:
            self.tokens.append(eos)
        self.eos = eos
        self.vocab_size = vocab_size
        self.thinks = thinks
        self.end_token_id = eos
        self.error = ""
        self._next = 0

    def next_token(self, req: SimRequest) -> int:
        i = self._next
        if i < len(self.tokens):
            self._next = i + 1
            return self.tokens[i]
        return int(req.rand() * self.vocab_size)
