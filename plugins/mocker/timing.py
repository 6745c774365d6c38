"""Dynamo mocker's polynomial timing model for one forward pass (reference 7.4); times in ms.

- prefill: ``4.209989e-07*N^2 + 1.518344e-02*N + 16.50142`` for ``N`` new prefill tokens in the
  pass (cached prefix excluded), 0 when ``N == 0``;
- decode: ``-25.74*u^2 + 54.01*u + 5.74`` for KV utilization ``u`` in [0, 1], at least 1 ms,
  charged only when some request decodes in the pass;
- prefill time is divided by ``speedup_ratio``, decode time by
  ``speedup_ratio * decode_speedup_ratio``; a ratio <= 0 means no scaling by that ratio.
"""

from __future__ import annotations

PREFILL_A = 4.209989e-07
PREFILL_B = 1.518344e-02
PREFILL_C = 16.50142
DECODE_A = -25.74
DECODE_B = 54.01
DECODE_C = 5.74
DECODE_FLOOR_MS = 1.0


def prefill_ms(new_tokens: int) -> float:
    """Unscaled prefill time of a pass computing ``new_tokens`` prompt tokens."""
    if new_tokens <= 0:
        return 0.0
    n = float(new_tokens)
    return PREFILL_A * n * n + PREFILL_B * n + PREFILL_C


def decode_ms(kv_usage: float) -> float:
    """Unscaled decode time at KV utilization ``kv_usage`` (clamped to [0, 1]); at least 1 ms."""
    u = 0.0 if kv_usage < 0.0 else 1.0 if kv_usage > 1.0 else kv_usage
    t = DECODE_A * u * u + DECODE_B * u + DECODE_C
    return t if t > DECODE_FLOOR_MS else DECODE_FLOOR_MS


def pass_ms(
    prefill_tokens: int,
    decoding: bool,
    kv_usage: float,
    speedup_ratio: float = 1.0,
    decode_speedup_ratio: float = 1.0,
) -> float:
    """Simulated duration of one pass: scaled prefill time plus, if ``decoding``, scaled decode time."""
    sr = speedup_ratio if speedup_ratio > 0 else 1.0
    t = prefill_ms(prefill_tokens) / sr
    if decoding:
        dsr = decode_speedup_ratio if decode_speedup_ratio > 0 else 1.0
        t += decode_ms(kv_usage) / (sr * dsr)
    return t
