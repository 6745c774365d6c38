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

import bisect
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dyn.plugins.mocker.scheduler import SimRequest

STOP = -1
FAIL = -2


class TokenSource(Protocol):
    # read-only members (properties), so that a wrapper such as ``reasoning.ThinkingFirst`` that
    # forwards them is one too; no caller sets them
    @property
    def end_token_id(self) -> int | None: ...
    @property
    def thinks(self) -> bool: ...
    @property
    def error(self) -> str: ...

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


class BiasedSource:
    """Tokens sampled under a request's ``logit_bias`` and ``allowed_token_ids``: the mocker's
    logits are all equal, so with a bias ``b`` per token (0 where none is given) a token is drawn
    with probability proportional to ``exp(b / temperature)`` among the allowed tokens (the whole
    vocabulary when none are listed), and greedy (``temperature`` 0) takes one of the highest-bias
    tokens. A bias of -100 thus bans a token and +100 all but forces it, as on a real model whose
    logits differ by less than that. Building it costs one pass over the ids given; each token
    then costs a binary search."""

    __slots__ = ("end_token_id", "thinks", "error", "_biased", "_cumulative", "_plain", "_plain_weight")

    def __init__(
        self,
        logit_bias: dict[int, float] | None,
        allowed_token_ids: Sequence[int] | None,
        temperature: float | None,
        vocab_size: int,
    ) -> None:
        self.end_token_id: int | None = None
        self.thinks = False
        self.error = ""
        bias = {token: b for token, b in (logit_bias or {}).items() if b != 0.0}
        if allowed_token_ids is not None:
            biased = [(token, bias[token]) for token in allowed_token_ids if token in bias]
            plain = _Tokens.listed([token for token in allowed_token_ids if token not in bias])
        else:
            biased = sorted(bias.items())
            plain = _Tokens.all_but(vocab_size, [token for token, _ in biased])
        top = max([b for _, b in biased] + ([0.0] if plain.count else []))
        if temperature == 0:  # greedy: the highest-bias tokens only, drawn uniformly
            biased = [(token, 1.0) for token, b in biased if b == top]
            plain_weight = 1.0 if top == 0.0 else 0.0
        else:  # weights relative to the largest, so none overflows
            t = 1.0 if temperature is None else temperature
            biased = [(token, math.exp((b - top) / t)) for token, b in biased]
            plain_weight = math.exp(-top / t)
        self._biased = [token for token, _ in biased]
        self._cumulative = list(itertools.accumulate(weight for _, weight in biased))
        self._plain = plain
        self._plain_weight = plain_weight

    def next_token(self, req: SimRequest) -> int:
        biased_total = self._cumulative[-1] if self._cumulative else 0.0
        plain_total = self._plain.count * self._plain_weight
        u = req.rand() * (biased_total + plain_total)
        if u < biased_total or not plain_total:
            i = bisect.bisect_right(self._cumulative, u)
            return self._biased[min(i, len(self._biased) - 1)]
        return self._plain.pick(min(int((u - biased_total) / self._plain_weight), self._plain.count - 1))


class _Tokens:
    """A set of token ids drawn by index: a list, or the vocabulary but some ids."""

    __slots__ = ("count", "_listed", "_shifts")

    def __init__(self, count: int, listed: list[int] | None, shifts: list[int]) -> None:
        self.count = count
        self._listed = listed
        self._shifts = shifts

    @classmethod
    def listed(cls, tokens: list[int]) -> _Tokens:
        return cls(len(tokens), tokens, [])

    @classmethod
    def all_but(cls, vocab_size: int, excluded: list[int]) -> _Tokens:
        """``range(vocab_size)`` without ``excluded`` (sorted, distinct): the ``i``-th is ``i``
        plus the number of excluded ids at or below it, found by bisecting ``excluded[k] - k``."""
        return cls(vocab_size - len(excluded), None, [token - k for k, token in enumerate(excluded)])

    def pick(self, i: int) -> int:
        if self._listed is not None:
            return self._listed[i]
        return i + bisect.bisect_right(self._shifts, i)
