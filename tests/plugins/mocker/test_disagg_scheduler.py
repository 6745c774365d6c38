"""The scheduler's disaggregated decode path on a controlled clock: the KV transfer wait (Dynamo's
mocker formula, reference 7.4: tokens x kv_bytes_per_token / bandwidth, divided by the speedup
ratio), the local prefix it does not transfer, KV events, other requests running meanwhile, the
first token, and aborts mid-transfer (vLLM's WAITING_FOR_REMOTE_KVS, vllm/v1/core/sched/scheduler.py)."""

import pytest

from dyn.core.kv.events import BlockStored
from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.core.messages import StopConditions
from dyn.plugins.mocker.config import MAX_TRANSFER_S, MockerConfig
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest
from dyn.plugins.mocker.timing import prefill_ms
from dyn.plugins.mocker.transfer import transfer_seconds

BS = 16
BPT = 1_000_000  # 1 MB of KV per token: 100 tokens at 10 GB/s take 10 ms


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(clock, bpt=BPT, **cfg) -> Scheduler:
    cfg.setdefault("block_size", BS)
    cfg.setdefault("num_gpu_blocks", 256)
    cfg.setdefault("kv_transfer_bandwidth", 10.0)
    return Scheduler(MockerConfig(**cfg), SimModel(1000, 32768, kv_bytes_per_token=bpt), clock)


def req(rid, prompt, max_tokens=6, remote=False, seed=7):
    return SimRequest(
        rid, prompt, StopConditions(max_tokens=max_tokens, ignore_eos=True), seed=seed, remote=remote
    )


def stored(results):
    return [h for r in results for e in r.events if isinstance(e, BlockStored) for h in e.block_hashes]


def run(s: Scheduler, clock: Clock, limit=1000):
    """Steps until idle, jumping the clock to the next transfer when nothing runs."""
    tokens, fins, results = {}, {}, []
    while s.has_work:
        r = s.step()
        results.append(r)
        for rid, t in r.tokens:
            tokens.setdefault(rid, []).append(t)
        for f in r.finished:
            fins[f.request_id] = f
        if not r.batch_size and s.transfer_due is not None:
            clock.now = s.transfer_due
        assert len(results) < limit
    return tokens, fins, results


@pytest.mark.parametrize(("bandwidth", "speedup"), [(10.0, 1.0), (10.0, 4.0), (2.5, 1.0), (100.0, 0.5)])
def test_decode_request_waits_the_transfer_time_then_computes_one_token(bandwidth, speedup):
    clock = Clock()
    s = make(clock, kv_transfer_bandwidth=bandwidth, speedup_ratio=speedup)
    prompt = list(range(100))
    s.add(req("d", prompt, remote=True))
    first = s.step()
    wait = 100 * BPT / (bandwidth * 1e9) / speedup
    assert first.started == ["d"] and first.batch_size == 0 and not first.tokens
    assert s.num_receiving == 1 and s.num_waiting == 1 and s.load().num_waiting == 1
    assert s.transfer_due == pytest.approx(clock.now + wait)
    assert s.transfer_time(100) == pytest.approx(wait)

    clock.now += wait * 0.999
    early = s.step()
    assert early.batch_size == 0 and not early.tokens and s.num_receiving == 1

    clock.now = s.transfer_due
    landed = s.step()
    assert s.num_receiving == 0
    # only the last prompt token is computed, timed as a decode step (no prefill pass's constant)
    assert landed.prefill_tokens == 0 and len(landed.tokens) == 1
    assert landed.duration_ms < prefill_ms(1) / speedup
    want = sequence_hashes(block_hashes(prompt, BS))
    assert stored([landed]) == want  # the 6 received full blocks enter the prefix cache


def test_other_requests_run_while_a_transfer_is_in_flight():
    clock = Clock()
    s = make(clock, kv_transfer_bandwidth=0.001)  # 100 tokens: 0.1 s
    s.add(req("a", list(range(5000, 5040)), max_tokens=50))
    s.step()
    s.add(req("d", list(range(100)), remote=True))
    decoded = 0
    for _ in range(10):
        r = s.step()
        clock.now += 0.001
        decoded += sum(1 for rid, _ in r.tokens if rid == "a")
        assert all(rid == "a" for rid, _ in r.tokens)
    assert decoded == 10 and s.num_receiving == 1 and s.num_running == 1


def test_a_locally_cached_prefix_is_not_transferred_and_counts_as_cached():
    clock = Clock()
    s = make(clock)
    shared = list(range(3 * BS))
    s.add(req("agg", shared + [900, 901]))
    _, _, earlier = run(s, clock)
    assert stored(earlier) == sequence_hashes(block_hashes(shared, BS))

    prompt = shared + list(range(2000, 2000 + 2 * BS + 5))  # 3 cached + 2 new full blocks + 5
    s.add(req("d", prompt, remote=True))
    start = s.step()
    assert start.started == ["d"]
    assert s.transfer_due == pytest.approx(clock.now + s.transfer_time(len(prompt) - 3 * BS))
    tokens, fins, later = run(s, clock)
    assert fins["d"].cached_tokens == 3 * BS and fins["d"].prompt_tokens == len(prompt)
    assert len(tokens["d"]) == 6
    assert stored(later) == sequence_hashes(block_hashes(prompt, BS))[3:]  # only the received blocks


def test_decode_output_equals_the_aggregated_output():
    prompt = list(range(300, 300 + 77))
    agg_clock, dec_clock = Clock(), Clock()
    agg = make(agg_clock)
    agg.add(req("r", prompt, max_tokens=30, seed=11))
    agg_tokens, agg_fins, _ = run(agg, agg_clock)
    dec = make(dec_clock)
    dec.add(req("r", prompt, max_tokens=30, seed=11, remote=True))
    dec_tokens, dec_fins, dec_results = run(dec, dec_clock)
    assert dec_tokens == agg_tokens and len(dec_tokens["r"]) == 30
    a, d = agg_fins["r"], dec_fins["r"]
    assert (d.reason, d.prompt_tokens, d.completion_tokens) == (
        a.reason,
        a.prompt_tokens,
        a.completion_tokens,
    )
    assert sum(r.prefill_tokens for r in dec_results) == 0  # the prompt was received, bar one decode step


def test_zero_bandwidth_transfers_at_once_in_the_same_pass():
    clock = Clock()
    s = make(clock, kv_transfer_bandwidth=0.0)
    s.add(req("d", list(range(50)), remote=True))
    r = s.step()
    assert r.started == ["d"] and len(r.tokens) == 1 and r.prefill_tokens == 0
    assert s.transfer_due is None and s.num_receiving == 0


def test_one_transfer_is_capped():
    clock = Clock()
    s = make(clock, kv_transfer_bandwidth=1e-9, speedup_ratio=10.0)
    assert s.transfer_time(10**6) == pytest.approx(MAX_TRANSFER_S / 10.0)
    assert transfer_seconds(10**6, BPT, 1e-9, 0.0) == MAX_TRANSFER_S  # a ratio <= 0 does not scale
    assert transfer_seconds(100, 0, 64.0, 1.0) == 0.0  # no bytes per token: no wait


@pytest.mark.parametrize("cached_prefix", [False, True])
def test_abort_during_the_transfer_frees_what_it_allocated(cached_prefix):
    clock = Clock()
    s = make(clock, kv_transfer_bandwidth=1e-6)
    shared = list(range(2 * BS))
    if cached_prefix:
        s.add(req("agg", shared + [7]))
        run(s, clock)
    inactive = s.kv.num_cached_inactive
    s.add(req("d", shared + list(range(500, 500 + 3 * BS)), remote=True))
    s.step()
    assert s.num_receiving == 1 and s.kv.num_active_blocks == 5  # the whole prompt's blocks
    assert s.abort("d")
    assert not s.has_work and s.num_receiving == 0 and s.transfer_due is None
    assert s.kv.num_active_blocks == 0 and s.kv.num_cached_inactive == inactive
    assert s.kv.num_free + inactive == s.kv.num_blocks
    clock.now += 100.0
    after = s.step()  # the aborted transfer never lands
    assert not after.events and not after.tokens and not s.abort("d")


def test_a_received_request_can_still_be_preempted_and_recomputes_from_its_cached_blocks():
    clock = Clock()
    s = make(clock, num_gpu_blocks=8, kv_transfer_bandwidth=0.0)
    s.add(req("d", list(range(4 * BS + 3)), max_tokens=40, remote=True))
    first = s.step()
    assert first.tokens and first.tokens[0][0] == "d"
    s.add(req("b", list(range(900, 900 + 2 * BS)), max_tokens=40))
    tokens, fins, results = run(s, clock)
    tokens["d"].insert(0, first.tokens[0][1])
    assert fins["d"].completion_tokens == 40 and fins["b"].completion_tokens == 40
    assert any(r.preempted for r in results)
    solo = make(Clock(), num_gpu_blocks=64, kv_transfer_bandwidth=0.0)
    solo.add(req("d", list(range(4 * BS + 3)), max_tokens=40))
    assert run(solo, Clock())[0]["d"] == tokens["d"]  # preemption keeps the output


def test_a_received_request_behind_a_head_that_does_not_fit_gives_its_blocks_back():
    clock = Clock()
    s = make(clock, num_gpu_blocks=10, scheduling_policy="priority")
    r = SimRequest(
        "r", list(range(100)), StopConditions(max_tokens=4, ignore_eos=True), priority=5, remote=True
    )
    s.add(r)
    s.step()  # its 7 blocks are allocated, the transfer is in flight
    s.add(SimRequest("h", list(range(500, 580)), StopConditions(max_tokens=4, ignore_eos=True), priority=0))
    assert not s.step().started  # h needs 6 blocks, 3 are free
    clock.now = s.transfer_due
    tokens, fins, _ = run(s, clock)  # r lands behind h (priority 0 goes first) and yields its KV
    assert len(tokens["h"]) == 4 and len(tokens["r"]) == 4
    assert fins["r"].cached_tokens == 0 and s.kv.num_active_blocks == 0
