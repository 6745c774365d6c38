"""Offline replay of the mocker with ``--timing-model aic``: a tiny trace on simulated H200s and
L40Ss (Meta-Llama-3.1-8B, vLLM) from the real AIConfigurator's tables: each request, alone on its
worker, takes exactly the tables' prefill to its first token and their decode step per token
after it, and the L40S is several times slower."""

from __future__ import annotations

import pytest

from dyn.core.bench.replay import ReplaySettings, replay
from dyn.core.bench.trace import TraceRow
from dyn.core.errors import ConfigError
from dyn.core.router.prefill_model import AicSetup, shared_decode_durations, shared_durations
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.simulator import MockerSimulator
from dyn.plugins.mocker.timing import prefill_ms

pytest.importorskip("aiconfigurator_core")

MODEL = "meta-llama/Meta-Llama-3.1-8B"
PROMPTS = (1024, 4096, 2048, 8192)
OUTPUT = 4


@pytest.fixture(autouse=True)
def cold_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


def trace() -> list[TraceRow]:
    """One request every 5 s, each prompt its own blocks of 512: none waits for another."""
    rows, first = [], 0
    for i, tokens in enumerate(PROMPTS):
        blocks = tokens // 512
        rows.append(
            TraceRow(
                input_length=tokens,
                output_length=OUTPUT,
                hash_ids=tuple(range(first, first + blocks)),
                timestamp_ms=5000.0 * i,
            )
        )
        first += blocks
    return rows


def run(mocker: MockerConfig):
    result = replay(trace(), ReplaySettings(simulator=MockerSimulator(mocker), num_workers=1))
    assert not [r for r in result.records if r.error]
    return sorted(result.records, key=lambda r: r.start_s)


def aic(system: str) -> MockerConfig:
    return MockerConfig(timing_model="aic", aic_backend="vllm", aic_system=system, aic_model_path=MODEL)


def test_a_trace_takes_the_tables_times_on_each_gpu():
    ttft = {}
    for system in ("h200_sxm", "l40s"):
        records = run(aic(system))
        setup = AicSetup(backend="vllm", system=system, model_path=MODEL)
        prefill, decode = shared_durations(setup), shared_decode_durations(setup)
        for record, tokens in zip(records, PROMPTS, strict=True):
            assert record.ttft_s == pytest.approx(prefill.expected_secs(tokens, 0), rel=1e-9)
            steps = [decode.step_secs(1, tokens + k) for k in range(OUTPUT - 1)]
            assert record.itl_s == pytest.approx(steps, rel=1e-9)
        ttft[system] = [r.ttft_s for r in records]
    polynomial = [r.ttft_s for r in run(MockerConfig())]
    assert polynomial == pytest.approx([prefill_ms(n) / 1000 for n in PROMPTS])
    # an L40S has about a fifth of an H200's dense bf16 compute: its prefills take several times longer
    assert all(slow > 2.5 * fast for slow, fast in zip(ttft["l40s"], ttft["h200_sxm"], strict=True))
    assert len({*ttft["h200_sxm"], *ttft["l40s"], *polynomial}) == 3 * len(PROMPTS)


def test_a_setup_aiconfigurator_does_not_know_stops_the_replay_before_it_starts():
    with pytest.raises(ConfigError, match="--aic-system 'h201_sxm': AIConfigurator has performance data"):
        run(aic("h201_sxm"))
