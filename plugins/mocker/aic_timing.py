"""The mocker's ``--timing-model aic``: a pass takes what AIConfigurator predicts for the GPU
system, engine, model and parallelism of the ``--aic-*`` flags (``AicSetup``).

A pass's raw time (before ``--speedup-ratio``) is the sum of

- its prefill part: for each request prefilling in it, the predicted prefill of its ``n`` new
  tokens after the ``c`` it already holds (prefix-cache hit, host-tier onboarding, earlier
  chunks, a streaming session's KV), from the (new x cached) table the KV router's
  ``--router-prefill-load-model ais`` reads (``PrefillDurations``);
- its decode part, when some request decodes in it: one predicted decode step of ``b`` requests
  whose KV holds their mean context (tokens computed before this step), from a (batch x
  context) table built the same way (``DecodeDurations``).

The prefill part is divided by ``speedup_ratio``, the decode part by ``speedup_ratio *
decode_speedup_ratio``, as the polynomials are. Each request's prefill is AIConfigurator's
estimate for a batch of one: a pass that prefills several requests is charged each one's weight
reads, where an engine reads the weights once for the whole batch (for Qwen3-32B on h200_sxm,
AIConfigurator's own estimate for 4 prompts of 512 new tokens is 6 % below the sum of 4 single
ones, of 128 tokens half of it), and a mixed pass is the prefill part plus the decode part, not
one fused step.

``aic_pass_timing(config)`` reads or builds both tables of the config's setup (one per setup per
process, shared with a KV router of the same process) and waits for them: a mocker whose table
cannot be built does not start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from dyn.core.errors import ConfigError

if TYPE_CHECKING:
    from dyn.plugins.mocker.config import MockerConfig

USE = ("--timing-model aic", "--timing-model polynomial")
"""What needs AIConfigurator here, and what to use without it."""


class PrefillLookup(Protocol):
    """Predicted prefill seconds (``dyn.core.router.prefill_model.PrefillDurations``)."""

    def expected_secs(self, new_tokens: int, prefix_tokens: int) -> float | None: ...


class DecodeLookup(Protocol):
    """Predicted decode step seconds (``dyn.core.router.prefill_model.DecodeDurations``)."""

    def step_secs(self, batch: int, context: float) -> float | None: ...


class AicPassTiming:
    """Pass times from a prefill and a decode lookup (see the module docstring); in ms."""

    __slots__ = ("_decode", "_prefill")

    def __init__(self, prefill: PrefillLookup, decode: DecodeLookup) -> None:
        self._prefill = prefill
        self._decode = decode

    def prefill_ms(self, new_tokens: int, computed_tokens: int) -> float:
        """Unscaled time to prefill one request's ``new_tokens`` after the ``computed_tokens``
        it holds; 0 for no new tokens (or a lookup without a table)."""
        secs = self._prefill.expected_secs(new_tokens, computed_tokens)
        return 0.0 if secs is None else secs * 1000.0

    def decode_ms(self, batch: int, context_tokens: int) -> float:
        """Unscaled time of one decode step of ``batch`` requests whose KV holds
        ``context_tokens`` tokens in all; 0 for no request (or a lookup without a table)."""
        if batch <= 0:
            return 0.0
        secs = self._decode.step_secs(batch, context_tokens / batch)
        return 0.0 if secs is None else secs * 1000.0

    def pass_ms(
        self,
        prefill_ms: float,
        decode_batch: int,
        decode_context_tokens: int,
        speedup_ratio: float = 1.0,
        decode_speedup_ratio: float = 1.0,
    ) -> float:
        """A pass's simulated time: ``prefill_ms`` (the sum of its requests' ``prefill_ms``)
        divided by ``speedup_ratio``, plus the decode step of ``decode_batch`` requests holding
        ``decode_context_tokens`` in all, divided by both ratios (a ratio <= 0: no scaling)."""
        sr = speedup_ratio if speedup_ratio > 0 else 1.0
        t = prefill_ms / sr
        if decode_batch:
            dsr = decode_speedup_ratio if decode_speedup_ratio > 0 else 1.0
            t += self.decode_ms(decode_batch, decode_context_tokens) / (sr * dsr)
        return t


def aic_pass_timing(config: MockerConfig) -> AicPassTiming:
    """The timing of ``config``'s ``--aic-*`` setup, once both tables are ready (read from the
    disk cache, or built: about a second or two the first time). ``ConfigError``: AIConfigurator
    is not installed (the error names the extra), does not know the setup, or cannot build a
    table (the error says which and why)."""
    from dyn.core.router.prefill_model import (
        AicSetup,
        DecodeTable,
        PrefillTable,
        check_setup,
        shared_decode_durations,
        shared_durations,
    )

    setup = AicSetup.from_config(config)
    check_setup(setup, tables=(PrefillTable, DecodeTable), use=USE)
    prefill, decode = shared_durations(setup), shared_decode_durations(setup)
    for durations in (prefill, decode):
        if durations.wait() is None:
            raise ConfigError(durations.error or f"the AIC {durations.kind} table could not be built")
    return AicPassTiming(prefill, decode)
