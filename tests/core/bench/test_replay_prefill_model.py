"""Offline replay with ``--router-prefill-load-model aic``: the replay waits for the prefill
table, and rechecks the router queue every 100 ms of virtual time, so that a request leaves the
queue as soon as the predicted prefill ahead of it has decayed, not only at a first token."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dyn.core.bench.replay import ReplaySettings, replay
from dyn.core.bench.trace import TraceRow
from dyn.core.errors import ConfigError
from dyn.core.router import prefill_model
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.prefill_model import AicSetup, PrefillDurations
from dyn.plugins.mocker.simulator import MockerSimulator

SETUP = AicSetup(backend="vllm", system="h200_sxm", model_path="m")
QUEUED = KvRouterConfig(queue_threshold=0.01)  # busy while over 82 prompt tokens are pending
AIC = replace(QUEUED, prefill_load_model="aic", aic_backend="vllm", aic_system="h200_sxm", aic_model_path="m")


class Estimator:
    """Predicts a prefill far shorter than the mocker's (1 us a token)."""

    context_length = 16384

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail

    def prefill_ms(self, new_tokens: int, prefix_tokens: int) -> float:
        if self.fail is not None:
            raise self.fail
        return 0.001 * new_tokens


@pytest.fixture
def shared(monkeypatch, tmp_path):
    """Put ``PrefillDurations`` of ``SETUP`` with the given estimator where the router finds it."""

    def install(**kw) -> PrefillDurations:
        durations = PrefillDurations(SETUP, estimator=lambda s: Estimator(**kw), directory=tmp_path)
        monkeypatch.setitem(prefill_model._SHARED, SETUP, durations.start())
        return durations

    return install


def run(config: KvRouterConfig):
    trace = [
        TraceRow(
            input_length=8000, output_length=4, hash_ids=tuple(range(i * 100, i * 100 + 16)), timestamp_ms=0.0
        )
        for i in range(4)
    ]
    return replay(trace, ReplaySettings(simulator=MockerSimulator(None), num_workers=1, router=config))


def test_queued_requests_leave_at_the_first_recheck_after_the_prefill_ahead_decayed(shared):
    shared()
    static, aic = run(QUEUED), run(AIC)
    ttfts = sorted(r.ttft_s for r in static.records)
    # none: each waits for the first token of the one before it
    assert static.router_queued == aic.router_queued == 3
    assert static.router_queue_s == pytest.approx(sum(ttfts[:3]))
    # aic: the oldest prefill decays in 8 ms, but only the oldest: the second leaves at the
    # 0.1 s recheck, the third at the recheck after the first token (0.165 s): 0.2 s, the
    # fourth at 0.4 s (the second's first token comes at 0.336 s)
    assert ttfts[0] < 0.2 < ttfts[1] < 0.4 < ttfts[2]
    assert aic.router_queue_s == pytest.approx(0.1 + 0.2 + 0.4)
    assert [r.ttft_s for r in run(AIC).records] == [r.ttft_s for r in aic.records]  # deterministic


def test_a_table_that_cannot_be_built_stops_the_replay(shared):
    shared(fail=RuntimeError("context MLA data missing"))
    with pytest.raises(ConfigError, match="context MLA data missing"):
        run(AIC)
