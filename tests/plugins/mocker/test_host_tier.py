"""The mocker's host KV tier (``--num-host-kv-blocks``): offloading on eviction and its events,
the tier's own LRU bound, onboarding counted as cached and charged its transfer time, and no
change at all without it."""

from __future__ import annotations

import random

import anyio
import pytest

from dyn.core.kv.events import BlockRemoved, BlockStored, StorageTier, tier_of
from dyn.core.kv.hashing import block_hashes, extend_sequence_hash, sequence_hashes
from dyn.core.messages import Finish, GenerateRequest, SamplingParams, StopConditions
from dyn.core.model import load_model_info
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.engine import MockerEngine
from dyn.plugins.mocker.host_tier import HOST_MEDIUM
from dyn.plugins.mocker.kv_cache import KvBlockManager, KvSequence
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest
from dyn.plugins.mocker.timing import prefill_ms

BS = 4
MODEL = SimModel(vocab_size=1000, context_length=32768)


def compute(m: KvBlockManager, tokens) -> KvSequence:
    """Admit a sequence as the scheduler does (device hit, then host onboarding) and compute it."""
    seq = KvSequence(list(tokens))
    hit = m.match_prefix(seq)
    onboard = m.match_host(seq, hit)
    if onboard:
        assert m.allocate_onboarding(seq, len(tokens), hit, onboard)
    else:
        assert m.allocate(seq, len(tokens), hit)
    m.commit(seq, len(tokens))
    return seq


def host_events(events):
    return [e for e in events if tier_of(e.medium) is StorageTier.HOST_PINNED]


def device_events(events):
    return [e for e in events if tier_of(e.medium) is StorageTier.DEVICE]


def chain(tokens, bs=BS):
    return sequence_hashes(block_hashes(tokens, bs))


def test_an_evicted_chain_is_offloaded_and_published_as_one_host_store():
    m = KvBlockManager(4, BS, host_blocks=8)
    a = list(range(100, 112))  # 3 full blocks
    m.release(compute(m, a))
    m.drain_events()
    m.release(compute(m, list(range(500, 516))))  # 4 blocks: evicts all of a
    events = m.drain_events()
    ha = chain(a)
    removed, stored = device_events(events)[:2]
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == ha[::-1]  # tail first
    assert isinstance(stored, BlockStored) and stored.block_hashes == chain(range(500, 516))
    (host,) = host_events(events)
    assert isinstance(host, BlockStored) and host.medium == HOST_MEDIUM == "CPU_PINNED"
    assert host.block_hashes == ha and host.parent_block_hash is None
    assert host.token_ids == a and host.block_size == BS
    assert sorted(m.host.hashes()) == sorted(ha)
    assert not any(m.is_cached(h) for h in ha)


def test_a_partly_evicted_chain_names_its_device_parent():
    m = KvBlockManager(4, BS, host_blocks=8)
    a = list(range(100, 112))
    m.release(compute(m, a))
    m.drain_events()
    compute(m, list(range(500, 508)))  # 2 blocks: 1 free, then a's last block
    (host,) = host_events(m.drain_events())
    ha = chain(a)
    assert host.block_hashes == [ha[2]] and host.parent_block_hash == ha[1]
    assert host.token_ids == a[8:12]
    assert m.is_cached(ha[1]) and not m.is_cached(ha[2])


def test_the_host_tier_is_an_lru_of_its_own_size():
    m = KvBlockManager(3, BS, host_blocks=4)
    mirror: set[int] = set()
    for i in range(12):
        m.release(compute(m, list(range(1000 * i, 1000 * i + 12))))
        for e in host_events(m.drain_events()):
            if isinstance(e, BlockStored):
                assert not mirror.intersection(e.block_hashes)
                mirror.update(e.block_hashes)
            else:
                assert isinstance(e, BlockRemoved) and mirror.issuperset(e.block_hashes)
                mirror.difference_update(e.block_hashes)
        assert len(m.host) <= 4
    assert mirror == set(m.host.hashes()) and len(mirror) == 4
    # the four most recently evicted: sequence 10's chain (3 blocks) and sequence 9's first block
    assert set(m.host.hashes()) == {*chain(range(10_000, 10_012)), chain(range(9000, 9012))[0]}


def test_onboarding_stores_on_device_keeps_the_host_copy_and_refreshes_it():
    m = KvBlockManager(4, BS, host_blocks=8)
    a = list(range(100, 113))  # 3 full blocks + 1 token
    m.release(compute(m, a))
    m.release(compute(m, list(range(500, 516))))  # a's blocks go to the host tier
    m.drain_events()
    seq = KvSequence(list(a))
    assert m.match_prefix(seq) == 0 and m.match_host(seq, 0) == 3
    assert m.allocate_onboarding(seq, len(a), 0, 3)
    events = m.drain_events()
    ha, hb = chain(a), chain(range(500, 516))
    assert [e.block_hashes for e in device_events(events) if isinstance(e, BlockStored)] == [ha]
    assert all(m.is_cached(h) for h in ha) and seq.num_registered == 3
    # the host copies stay, now the most recently used, the chain's head last of all
    assert m.host.hashes() == [*hb[::-1], *ha[::-1]]  # b's went in tail first too
    assert [e.block_hashes for e in host_events(events)] == [hb]  # b's evicted blocks


def test_blocks_being_onboarded_are_not_dropped_to_make_room():
    m = KvBlockManager(4, BS, host_blocks=3)
    a = list(range(100, 113))
    m.release(compute(m, a))
    m.release(compute(m, list(range(500, 516))))  # b's blocks evict a's; a's stay in the tier
    m.drain_events()
    ha = chain(a)
    assert set(m.host.hashes()) == set(ha)
    seq = KvSequence(list(a))
    assert m.match_host(seq, 0) == 3
    assert m.allocate_onboarding(seq, len(a), 0, 3)  # evicts b's 4 blocks: no room to offload them
    events = m.drain_events()
    assert not host_events(events)
    assert set(m.host.hashes()) == set(ha) and all(m.is_cached(h) for h in ha)
    m.release(seq)
    m.release(compute(m, list(range(700, 716))))  # evicts a's blocks again: already held
    assert not host_events(m.drain_events())
    c = list(range(900, 916))
    m.release(compute(m, c))  # offloads the previous 4 blocks: the protection is over
    assert set(m.host.hashes()) == set(chain(range(700, 716))[:3])


def test_host_matching_leaves_the_last_token_to_compute_and_stops_at_a_gap():
    m = KvBlockManager(4, BS, host_blocks=8)
    a = list(range(100, 112))
    m.release(compute(m, a))
    m.release(compute(m, list(range(500, 516))))
    assert m.match_host(KvSequence(list(a)), 0) == 2  # 12 tokens: the third block is computed
    assert m.match_host(KvSequence(a + [7]), 0) == 3
    assert m.match_host(KvSequence(a + [7]), 1) == 2
    assert m.match_host(KvSequence(a[:4] + [9] * 8 + [7]), 0) == 1
    assert KvBlockManager(4, BS).match_host(KvSequence(a + [7]), 0) == 0


# --------------------------------------------------------------------------- the scheduler


def make(**cfg) -> Scheduler:
    cfg.setdefault("block_size", 16)
    return Scheduler(MockerConfig(**cfg), MODEL)


def req(rid, prompt, max_tokens=2):
    return SimRequest(rid, list(prompt), StopConditions(max_tokens=max_tokens, ignore_eos=True), seed=1)


def run(s: Scheduler):
    steps = []
    while s.has_work:
        steps.append(s.step())
        assert len(steps) < 10_000
    return steps


PROMPT = list(range(100, 200))  # 6 full blocks of 16 + 4 tokens


def evicted_then_asked_again(**cfg):
    """``PROMPT`` runs, an unrelated prompt takes the whole device cache, then ``PROMPT`` is
    asked again: its first pass's result and its finish."""
    s = make(num_gpu_blocks=8, **cfg)
    s.add(req("a", PROMPT))
    run(s)
    s.add(req("flood", range(5000, 5120), max_tokens=1))
    run(s)
    s.add(req("again", PROMPT))
    first = s.step()
    (fin,) = [f for step in [first, *run(s)] for f in step.finished]
    return first, fin


def test_a_host_hit_is_cached_and_costs_its_transfer_time():
    first, fin = evicted_then_asked_again(num_host_kv_blocks=64, host_kv_transfer_ms_per_block=2.5)
    assert first.onboarded_blocks == 6 and first.prefill_tokens == 4
    assert fin.cached_tokens == 96
    assert first.duration_ms == pytest.approx(prefill_ms(4) + 6 * 2.5)
    stored = [e for e in device_events(first.events) if isinstance(e, BlockStored)]
    assert stored[0].block_hashes == chain(PROMPT, 16)[:6]


def test_transfer_time_is_scaled_by_the_speedup_ratio_and_defaults_from_pcie():
    first, _ = evicted_then_asked_again(num_host_kv_blocks=64, speedup_ratio=4.0)
    per_block = 16 * 131072 / 25e9 * 1e3  # a 2 MiB block at 25 GB/s: 0.084 ms
    assert first.duration_ms == pytest.approx((prefill_ms(4) + 6 * per_block) / 4.0)
    recompute, fin = evicted_then_asked_again(speedup_ratio=4.0)
    assert recompute.prefill_tokens == 100 and fin.cached_tokens == 0
    assert recompute.duration_ms == pytest.approx(prefill_ms(100) / 4.0)
    assert recompute.duration_ms > first.duration_ms


def test_a_small_host_tier_keeps_chain_heads_and_onboards_them_whole():
    # 4 host blocks: a's chain goes in tail first, so its head survives the rest of a's eviction;
    # then the flood's evicted blocks find no room beside the 4 being onboarded and are not stored
    first, fin = evicted_then_asked_again(num_host_kv_blocks=4, host_kv_transfer_ms_per_block=1.0)
    assert first.onboarded_blocks == 4 and fin.cached_tokens == 64 and first.prefill_tokens == 36
    assert first.duration_ms == pytest.approx(prefill_ms(36) + 4.0)
    assert not host_events(first.events)


def workload(s: Scheduler, seed: int, n: int = 40):
    """A random shared-prefix workload: per pass its duration, events, tokens, finishes (with
    their cached tokens) and blocks onboarded."""
    rnd = random.Random(seed)
    prefixes = [[rnd.randrange(1000) for _ in range(48)] for _ in range(4)]
    trace, pending = [], list(range(n))
    while pending or s.has_work:
        if pending and rnd.random() < 0.5:
            i = pending.pop()
            prompt = rnd.choice(prefixes)[: rnd.randrange(1, 49)] + [rnd.randrange(1000) for _ in range(20)]
            s.add(SimRequest(i, prompt, StopConditions(max_tokens=rnd.randrange(1, 30)), seed=i))
        r = s.step()
        finished = [(f.request_id, f.cached_tokens) for f in r.finished]
        trace.append((r.duration_ms, r.events, r.tokens, finished, r.onboarded_blocks))
    return trace


@pytest.mark.parametrize(
    "cfg",
    [
        {"num_host_kv_blocks": 0, "host_kv_transfer_ms_per_block": 7.0},
        {"num_host_kv_blocks": 1000},  # a cache that never evicts never offloads
    ],
)
def test_without_evictions_or_with_zero_blocks_nothing_changes(cfg):
    base = dict(block_size=8, max_num_batched_tokens=96, max_num_seqs=6)
    blocks = 40 if not cfg["num_host_kv_blocks"] else 4000
    plain = workload(make(num_gpu_blocks=blocks, **base), seed=3)
    tiered = workload(make(num_gpu_blocks=blocks, **base, **cfg), seed=3)
    assert tiered == plain
    if not cfg["num_host_kv_blocks"]:
        assert any(isinstance(e, BlockRemoved) for step in plain for e in step[1])  # it did evict


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_workload_keeps_both_tiers_and_their_events_consistent(seed):
    s = make(
        block_size=8, num_gpu_blocks=30, num_host_kv_blocks=25, max_num_batched_tokens=96, max_num_seqs=6
    )
    device: set[int] = set()
    host: set[int] = set()
    onboarded = 0
    for _, events, _, _, onboarded_blocks in workload(s, seed, n=60):
        onboarded += onboarded_blocks
        for e in events:
            mirror = host if tier_of(e.medium) is StorageTier.HOST_PINNED else device
            if isinstance(e, BlockStored):
                assert not mirror.intersection(e.block_hashes), "stored twice"
                assert len(e.token_ids) == 8 * len(e.block_hashes)
                parent = e.parent_block_hash
                for h, local in zip(e.block_hashes, block_hashes(e.token_ids, 8), strict=True):
                    assert h == extend_sequence_hash(parent, local)  # the router can chain it
                    parent = h
                mirror.update(e.block_hashes)
            else:
                assert mirror.issuperset(e.block_hashes), "removed an unknown block"
                mirror.difference_update(e.block_hashes)
        assert len(host) <= 25
    assert device == set(s.kv.cached_hashes()) and host == set(s.kv.host.hashes())
    kv = s.kv
    assert kv.num_free + kv.num_active_blocks + kv.num_cached_inactive == kv.num_blocks
    assert onboarded > 0  # the workload did come back to offloaded prefixes


def test_config_checks_the_host_flags():
    with pytest.raises(ValueError, match="--num-host-kv-blocks"):
        MockerConfig(num_host_kv_blocks=-1).validate()
    with pytest.raises(ValueError, match="prefix caching"):
        MockerConfig(num_host_kv_blocks=8, enable_prefix_caching=False).validate()
    with pytest.raises(ValueError, match="--host-kv-transfer-ms-per-block"):
        MockerConfig(host_kv_transfer_ms_per_block=float("nan")).validate()
    assert MockerConfig(block_size=16).host_transfer_ms_per_block == pytest.approx(0.0839, abs=1e-4)
    assert MockerConfig(host_kv_transfer_ms_per_block=0.0).host_transfer_ms_per_block == 0.0


@pytest.mark.anyio
async def test_the_live_engine_reports_host_hits_as_cached_and_publishes_host_events():
    published = []
    cfg = MockerConfig(block_size=16, num_gpu_blocks=8, num_host_kv_blocks=32, speedup_ratio=1000)
    eng = MockerEngine(cfg, load_model_info(None, None), lambda evs, dp: published.extend(evs))

    async def finish(rid, prompt):
        stop = StopConditions(max_tokens=2, ignore_eos=True)
        return [m async for m in eng.generate(GenerateRequest(rid, prompt, SamplingParams(seed=1), stop))][-1]

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(eng.run)
            await finish("a", PROMPT)
            await finish("flood", list(range(5000, 5120)))
            again = await finish("again", PROMPT)
            tg.cancel_scope.cancel()
    assert isinstance(again, Finish) and again.usage.cached_tokens == 96
    hosted = {h for e in host_events(published) if isinstance(e, BlockStored) for h in e.block_hashes}
    assert hosted >= set(chain(PROMPT, 16)[:6])
