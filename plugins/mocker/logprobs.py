"""Synthetic log-probabilities: deterministic, self-consistent, and blind to sampling.

The mocker has no model, so a position's distribution is made up from a hash of (seed, domain,
position), never from the request's RNG: asking for logprobs does not change which tokens are
sampled. At each position:

- the chosen token's rank is 1 with probability 0.7, else uniform in ``2..k + 3`` (so it sometimes
  falls outside a top-``k`` list);
- the probabilities of ranks 1, 2, ... are stick-breaking fractions of what is left (rank 1 takes
  35-95 %, each next one 15-85 % of the rest, capped by the previous), so they are sorted, each
  ``logprob`` is below 0 and they sum to at most 1;
- the top list holds ranks ``1..k``: the chosen token at its rank when it is within ``k``, other
  token ids (distinct, drawn from the hash) elsewhere; ``TokenLogprobs.rank`` is the chosen rank.

Output positions count from the first output token; prompt positions (``domain`` "prompt") from the
first prompt token, whose entry is ``None`` (nothing precedes it).

Cost: about 4 µs per position for ``k`` <= 1 and 40 µs for ``k`` = 20 (2-core VM); the engine
computes a long prompt's values in a worker thread so its pass loop keeps running.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import xxhash

from dyn.core.messages import TokenLogprobs

MAX_TOP = 1024
"""Most alternatives per position (more are clamped: each costs a draw)."""
_MASK64 = (1 << 64) - 1
_OUTPUT = 0x6F7574707574
_PROMPT = 0x70726F6D7074


class _Draws:
    """splitmix64 from a 64-bit key: a few cheap uniform draws per position (seeding a
    ``random.Random`` per position costs more than the draws)."""

    __slots__ = ("state",)

    def __init__(self, key: int) -> None:
        self.state = key

    def __call__(self) -> float:
        self.state = z = (self.state + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return ((z ^ (z >> 31)) >> 11) * (1.0 / (1 << 53))


def _key(seed: int, domain: int, position: int) -> int:
    return xxhash.xxh64_intdigest(b"%d:%d:%d" % (seed & _MASK64, domain, position))


def position_logprobs(
    seed: int, position: int, token: int, k: int, vocab_size: int, domain: int = _OUTPUT
) -> TokenLogprobs:
    """The logprobs of ``token`` at output ``position`` with a top-``k`` list."""
    k = max(0, min(k, MAX_TOP, vocab_size - 1))
    draw = _Draws(_key(seed, domain, position))
    u = draw()
    rank = 1 if u < 0.7 else 2 + int((u - 0.7) / 0.3 * (k + 2))
    ranks = max(rank, k)
    probs = []
    p = 0.35 + 0.6 * draw()
    left = 1.0 - p
    probs.append(p)
    for _ in range(ranks - 1):
        p = min(p, left * (0.15 + 0.7 * draw()))
        left -= p
        probs.append(p)
    logprobs = [math.log(x) if x > 0 else -9999.0 for x in probs]
    top_ids: list[int] = []
    if k:
        used = {token}
        for r in range(1, k + 1):
            if r == rank:
                top_ids.append(token)
                continue
            other = int(draw() * vocab_size)
            while other in used:
                other = (other + 1) % vocab_size
            used.add(other)
            top_ids.append(other)
    return TokenLogprobs(logprobs[rank - 1], top_ids, logprobs[:k], rank)


def output_logprobs(
    seed: int, start: int, token_ids: Sequence[int], k: int, vocab_size: int
) -> list[TokenLogprobs]:
    """``position_logprobs`` of ``token_ids`` output at positions ``start``, ``start + 1``, ..."""
    return [position_logprobs(seed, start + i, t, k, vocab_size) for i, t in enumerate(token_ids)]


def prompt_logprobs(
    seed: int, token_ids: Sequence[int], k: int, vocab_size: int
) -> list[TokenLogprobs | None]:
    """One entry per prompt token, the first ``None``."""
    out: list[TokenLogprobs | None] = [None]
    out.extend(position_logprobs(seed, i, t, k, vocab_size, _PROMPT) for i, t in enumerate(token_ids) if i)
    return out
