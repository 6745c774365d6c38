"""Thinking sections (Dynamo mocker's ``--reasoning``) and the ``max_thinking_tokens`` cap.

Dynamo (``lib/mocker``'s ``ReasoningConfig::num_thinking_tokens``): a request whose output may run
to ``max_tokens`` gets a thinking section of ``floor(max_tokens * thinking_ratio)`` tokens, clamped
to ``[2, max_tokens]`` (none when that floor is 0 or ``max_tokens < 2``); output token 0 is
``start_thinking_token_id``, token ``len - 1`` is ``end_thinking_token_id`` and the others are
sampled as usual. ``max_tokens`` here is the scheduler's effective limit (the request's, capped by
the context and the KV cache).

``GenerateRequest.max_thinking_tokens = N`` caps the tokens between the two boundaries: once N
were emitted the next token is the end token (N = 0 gives start then end). Without ``--reasoning``
it has no effect.

The boundaries are forced inside the scheduler's sampler, so the sequence's tokens, its KV blocks
and its events agree with what the client sees; the request still draws from its own RNG at
every position, so the other tokens do not change. A forced token goes through the stop rules like
any other (choose boundary ids that are not EOS).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dyn.plugins.mocker.config import ReasoningConfig


def thinking_length(cfg: ReasoningConfig, max_tokens: int) -> int:
    """Tokens of the thinking section, boundaries included (Dynamo's rule)."""
    if max_tokens < 2:
        return 0
    raw = math.floor(max_tokens * cfg.thinking_ratio)
    if raw == 0:
        return 0
    return min(max(raw, 2), max_tokens)


def end_index(cfg: ReasoningConfig, max_tokens: int, max_thinking_tokens: int | None) -> int:
    """Output position of the end token, or 0 when there is no thinking section."""
    n = thinking_length(cfg, max_tokens)
    if n == 0:
        return 0
    end = n - 1
    if max_thinking_tokens is not None and max_thinking_tokens + 1 < end:
        end = max_thinking_tokens + 1
    return end


def forced_draws(
    draw: Callable[[], float], vocab_size: int, start_id: int, end_id: int, end: int
) -> Callable[[], float]:
    """Wrap a request's ``draw`` (uniform in [0, 1), mapped to ``int(u * vocab_size)``) so that
    draw 0 yields ``start_id`` and draw ``end`` yields ``end_id``. The draw count is the output
    position: every draw either outputs a token or ends the request, and preemption keeps the
    generated tokens."""
    start_u = (start_id + 0.5) / vocab_size
    end_u = (end_id + 0.5) / vocab_size
    position = 0

    def draw_forced() -> float:
        nonlocal position
        i = position
        position += 1
        u = draw()
        if i == 0:
            return start_u
        if i == end:
            return end_u
        return u

    return draw_forced


class ThinkingFirst:
    """A token source (``sources``) behind a thinking section: output positions up to ``end``
    (the end token's) are drawn as usual, with the boundaries forced by ``forced_draws``; the
    wrapped source writes the rest (a reasoning model thinks, then answers under the constraint)."""

    __slots__ = ("source", "end", "vocab_size")
    thinks = True

    def __init__(self, source, end: int, vocab_size: int) -> None:
        self.source = source
        self.end = end
        self.vocab_size = vocab_size

    @property
    def end_token_id(self) -> int | None:
        return self.source.end_token_id

    @property
    def error(self) -> str:
        return self.source.error

    def next_token(self, req) -> int:
        if req.num_output <= self.end:
            return int(req.rand() * self.vocab_size)
        return self.source.next_token(req)
