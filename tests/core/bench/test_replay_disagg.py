"""Disaggregated offline replay (``dyn bench replay --offline --num-prefill-workers P
--num-decode-workers D``): the real two-stage router (``dyn.core.router.disagg``) over simulated
mocker prefill and decode workers, the decode workers receiving each prompt's KV in virtual time
(Dynamo's replay has the same mode: ``--num-prefill-workers`` / ``--num-decode-workers``)."""

from __future__ import annotations

import pytest

from dyn.core.bench.replay import ReplaySettings, replay
from dyn.core.bench.trace import TraceRow
from dyn.core.errors import ConfigError
from dyn.core.router.config import ConditionalDisagg, KvRouterConfig
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.simulator import MockerSimulator

LLAMA_8B_KV = 131072  # bytes per token: 32 layers x 2 x 8 KV heads x 128 x 2 bytes


def rows(n: int = 24) -> list[TraceRow]:
    """Long prompts with short outputs, and short prompts with long ones, interleaved."""
    return [
        TraceRow(
            input_length=2048 if i % 2 else 128,
            output_length=4 if i % 2 else 48,
            hash_ids=tuple(range(1000 * i, 1000 * i + (4 if i % 2 else 1))),
            timestamp_ms=20.0 * i,
        )
        for i in range(n)
    ]


def settings(bandwidth: float = 64.0, router: KvRouterConfig | None = None, **kw) -> ReplaySettings:
    mocker = MockerConfig(
        block_size=16, kv_transfer_bandwidth=bandwidth, kv_bytes_per_token=LLAMA_8B_KV, speedup_ratio=1.0
    )
    fields = {"num_prefill_workers": 2, "num_decode_workers": 2, **kw}
    return ReplaySettings(
        simulator=MockerSimulator(mocker), trace_block_size=512, router=router or KvRouterConfig(), **fields
    )


def test_every_request_is_decoded_on_a_decode_worker():
    result = replay(rows(), settings())
    assert len(result.records) == 24 and all(r.error is None for r in result.records)
    assert {r.worker for r in result.records} <= {"2", "3"}  # workers 0, 1 prefill; 2, 3 decode
    assert all(r.output_tokens == (4 if r.prompt_tokens == 2048 else 48) for r in result.records)
    assert result.duplicate_prefill_blocks == 0  # received blocks are not counted as prefill twice


def test_the_transfer_shows_in_the_time_to_first_token():
    fast = {r.conversation: r.ttft_s for r in replay(rows(), settings(bandwidth=0.0)).records}
    slow = {r.conversation: r.ttft_s for r in replay(rows(), settings(bandwidth=1.0)).records}
    # 2048 tokens x 128 KiB at 1 GB/s is about 0.27 s more before the first token
    long = [c for c in fast if int(c[1:]) % 2]
    assert all(slow[c] - fast[c] > 0.2 for c in long)


def test_conditional_disaggregation_keeps_short_prompts_off_the_transfer():
    conditional = KvRouterConfig(
        conditional_disagg=True,
        conditional_disagg_config=ConditionalDisagg(eff_isl_threshold=1024, eff_isl_ratio_threshold=1.01),
    )
    plain = {r.conversation: r.ttft_s for r in replay(rows(), settings(bandwidth=1.0)).records}
    local = {
        r.conversation: r.ttft_s for r in replay(rows(), settings(bandwidth=1.0, router=conditional)).records
    }
    short = [c for c in plain if int(c[1:]) % 2 == 0]
    assert sum(local[c] for c in short) < sum(plain[c] for c in short)


def test_the_same_seed_gives_the_same_records():
    first, second = replay(rows(), settings()), replay(rows(), settings())
    assert [(r.worker, r.ttft_s, r.end_s) for r in first.records] == [
        (r.worker, r.ttft_s, r.end_s) for r in second.records
    ]


def test_one_role_alone_is_refused():
    with pytest.raises(ConfigError, match="both --num-prefill-workers and --num-decode-workers"):
        settings(num_decode_workers=0).validate()
