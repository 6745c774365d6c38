"""The mocker as an engine simulator (``dyn.core.simulator``) for offline trace replay.

``MockerSimulator(config)`` is a ``Simulator``: its workers are the mocker's own ``Scheduler``
(the pass loop, KV cache and timing model ``dyn worker mocker`` runs), driven in the caller's
virtual time instead of by ``MockerEngine``'s loop. What drives them, and with which router, is
the bench's business (``dyn.core.bench.replay``); this module knows nothing of either. With
``--timing-model aic`` every worker reads the same AIConfigurator tables, which ``prepare``
waits for (``aic_timing``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from dyn.core.messages import StopConditions
from dyn.core.simulator import SimEngine
from dyn.plugins.mocker.aic_timing import AicPassTiming, aic_pass_timing
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest


class MockerSimulator:
    """Simulated mocker workers configured by ``config`` (the ``dyn worker mocker`` flags)."""

    name = "mocker"

    def __init__(self, config: MockerConfig | None = None) -> None:
        self.config = config if config is not None else MockerConfig()
        self._timing: AicPassTiming | None = None

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def total_kv_blocks(self) -> int:
        return self.config.num_gpu_blocks

    @property
    def max_num_batched_tokens(self) -> int:
        return self.config.max_num_batched_tokens

    def validate(self) -> MockerSimulator:
        """Return self, or raise ``ValueError`` naming the flag to fix."""
        self.config.validate()
        if self.config.is_pooling:
            raise ValueError("--runner pooling does not apply here: a replay simulates generation")
        return self

    def describe(self) -> dict[str, Any]:
        return msgspec.to_builtins(self.config)

    def prepare(self) -> None:
        """With ``--timing-model aic``, wait for AIConfigurator's tables (``ConfigError`` when
        they cannot be built); the polynomials need nothing."""
        if self.config.uses_aic and self._timing is None:
            self._timing = aic_pass_timing(self.config)

    def engine(self, clock: Callable[[], float], *, vocab_size: int, context_length: int) -> SimEngine:
        # no model directory here: the KV bytes per token of a transfer come from the flag alone
        if self.config.max_model_len is not None:
            context_length = min(context_length, self.config.max_model_len)
        model = SimModel(
            vocab_size=vocab_size,
            context_length=context_length,
            kv_bytes_per_token=self.config.kv_bytes_per_token or 0,
        )
        self.prepare()
        return MockerSimEngine(Scheduler(self.config, model, clock, self._timing))


class MockerSimEngine:
    """One simulated worker: a ``Scheduler`` behind the ``SimEngine`` calls."""

    __slots__ = ("scheduler", "step", "abort", "quiet_passes", "skip_quiet")

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.step = scheduler.step
        self.abort = scheduler.abort
        self.quiet_passes = scheduler.quiet_passes
        self.skip_quiet = scheduler.skip_quiet

    def add(
        self, request_id: str, token_ids: list[int], max_tokens: int, seed: int, *, remote: bool = False
    ) -> None:
        """Queue a request that generates ``max_tokens`` tokens whatever it draws (EOS ignored);
        ``remote``: a disaggregated decode request that receives its prompt's KV first."""
        self.scheduler.add(
            SimRequest(
                request_id,
                token_ids,
                StopConditions(max_tokens=max_tokens, ignore_eos=True),
                seed=seed,
                remote=remote,
            )
        )

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def wake_at(self) -> float | None:
        return self.scheduler.transfer_due
