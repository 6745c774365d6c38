"""vLLM-flavour scheduler: budgets, batch limits, preemption, stop rules, determinism, timing."""

import pytest

from dyn.core.kv.events import BlockStored
from dyn.core.messages import StopConditions
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest

MODEL = SimModel(vocab_size=1000, context_length=32768)


def make(model=MODEL, **cfg) -> Scheduler:
    cfg.setdefault("block_size", 16)
    cfg.setdefault("num_gpu_blocks", 4096)
    return Scheduler(MockerConfig(**cfg), model)


def req(rid, prompt_len=64, max_tokens=8, seed=None, first=0, **stop):
    return SimRequest(
        rid,
        list(range(first, first + prompt_len)),
        StopConditions(max_tokens=max_tokens, **stop),
        seed=rid if seed is None else seed,
    )


def drain(s: Scheduler, max_steps=100_000):
    """Run to completion; return (tokens per request, finishes by id, step results)."""
    out, fins, steps = {}, {}, []
    while s.has_work:
        r = s.step()
        steps.append(r)
        assert r.batch_size > 0, "a pass with work scheduled nothing"
        for rid, tok in r.tokens:
            out.setdefault(rid, []).append(tok)
        for f in r.finished:
            fins[f.request_id] = f
        assert len(steps) < max_steps
    return out, fins, steps


def stream(seed, n, vocab=MODEL.vocab_size):
    """The first ``n`` tokens a request with this seed produces when nothing stops it."""
    s = make(model=SimModel(vocab, 32768))
    s.add(req("x", max_tokens=n, seed=seed, ignore_eos=True))
    return drain(s)[0]["x"]


def test_chunked_prefill_respects_budget():
    s = make(max_num_batched_tokens=4096)
    s.add(req("a", prompt_len=10_000, max_tokens=2))
    r1, r2, r3 = s.step(), s.step(), s.step()
    assert [r.prefill_tokens for r in (r1, r2, r3)] == [4096, 4096, 1808]
    assert r1.tokens == [] and r2.tokens == [] and len(r3.tokens) == 1
    assert r1.started == ["a"] and r2.started == [] and r3.started == []
    r4 = s.step()
    assert r4.prefill_tokens == 0 and len(r4.tokens) == 1 and r4.finished[0].reason == "length"
    assert not s.has_work


def test_chunk_shares_budget_with_decodes():
    s = make(max_num_batched_tokens=512)
    s.add(req("a", prompt_len=100, max_tokens=50))
    s.step()
    s.add(req("b", prompt_len=2000, max_tokens=5))
    r = s.step()
    assert r.batch_size == 2 and r.prefill_tokens == 511  # 1 token went to a's decode
    assert [rid for rid, _ in r.tokens] == ["a"]


def test_without_chunked_prefill_prompts_are_never_split():
    s = make(max_num_batched_tokens=256, enable_chunked_prefill=False)
    for i in range(2):
        s.add(req(i, prompt_len=200, max_tokens=3, first=1000 * i))
    r1, r2 = s.step(), s.step()
    assert (r1.prefill_tokens, r1.batch_size) == (200, 1)
    assert (r2.prefill_tokens, r2.batch_size) == (200, 2)  # 1 decode + the second whole prompt
    _, fins, _ = drain(s)
    assert sorted(fins) == [0, 1]


def test_max_num_seqs_limits_the_batch():
    s = make(max_num_seqs=2)
    for i in range(5):
        s.add(req(i, max_tokens=4))
    out, fins, steps = drain(s)
    assert max(r.batch_size for r in steps) == 2
    assert steps[0].started == [0, 1]
    assert all(len(out[i]) == 4 for i in range(5)) and len(fins) == 5


def preemption_run(mode="lifo"):
    # 20 blocks of 16 tokens; each request grows to ceil((64 + 99) / 16) = 11 blocks
    s = make(num_gpu_blocks=20, preemption_mode=mode)
    for i in range(4):
        s.add(req(i, prompt_len=64, max_tokens=100, first=1000 * i))
    out, fins, steps = drain(s)
    return s, out, fins, steps


@pytest.mark.parametrize("mode", ["lifo", "fifo"])
def test_preemption_under_block_pressure(mode):
    s, out, fins, steps = preemption_run(mode)
    assert s.num_preemptions > 0
    assert sum(len(r.preempted) for r in steps) == s.num_preemptions
    for i in range(4):
        assert fins[i].reason == "length" and fins[i].completion_tokens == 100
        assert out[i] == stream(i, 100)  # recompute does not change what is generated
    assert sum(len(r.started) for r in steps) == 4  # a readmission is not a new start
    assert s.kv.num_active_blocks == 0 and s.load().num_preemptions == s.num_preemptions


def test_preemption_is_deterministic():
    _, out1, _, steps1 = preemption_run()
    _, out2, _, steps2 = preemption_run()
    assert out1 == out2
    assert [(r.duration_ms, r.tokens, r.preempted) for r in steps1] == [
        (r.duration_ms, r.tokens, r.preempted) for r in steps2
    ]


def test_lifo_preempts_the_newest_and_readmits_it_first():
    s = make(num_gpu_blocks=20)
    for i in range(4):
        s.add(req(i, prompt_len=64, max_tokens=100, first=1000 * i))
    while True:
        r = s.step()
        if r.preempted:
            break
    assert r.preempted[0] == 3
    assert next(s.waiting()).request_id == r.preempted[-1]


def test_prefix_cache_hit_reduces_prefill_and_is_reported():
    s = make()
    s.add(req("a", prompt_len=100, max_tokens=2))
    _, _, steps_a = drain(s)
    s.add(req("b", prompt_len=100, max_tokens=2))
    r = s.step()
    assert r.prefill_tokens == 100 - 96
    assert not any(isinstance(e, BlockStored) for e in r.events)
    _, fins, _ = drain(s)
    assert fins["b"].cached_tokens == 96
    assert fins["b"].prompt_tokens == 100


def test_fully_cached_prompt_computes_its_last_block():
    s = make()
    s.add(req("a", prompt_len=64, max_tokens=1))
    drain(s)
    s.add(req("b", prompt_len=64, max_tokens=1))
    r = s.step()
    assert r.prefill_tokens == 16 and len(r.tokens) == 1
    assert r.finished[0].cached_tokens == 48


def test_decode_fills_and_stores_blocks():
    s = make()
    s.add(req("a", prompt_len=10, max_tokens=40))
    _, _, steps = drain(s)
    ev = [e for r in steps for e in r.events if isinstance(e, BlockStored)]
    # 10 + 40 tokens, the last never computed: 49 computed -> 3 full blocks, one per event
    assert [len(e.block_hashes) for e in ev] == [1, 1, 1]
    assert ev[1].parent_block_hash == ev[0].block_hashes[0]
    assert ev[0].token_ids[:10] == list(range(10))


def test_max_tokens_none_is_capped_by_context_length():
    s = make(model=SimModel(vocab_size=1000, context_length=80))
    s.add(req("a", prompt_len=64, max_tokens=None))
    out, fins, _ = drain(s)
    assert len(out["a"]) == 16 and fins["a"].reason == "length"


def find_repeated_token(tokens):
    """(token, first index, second index) for a token that appears twice, first at index >= 2."""
    for j, t in enumerate(tokens):
        if j >= 2 and t not in tokens[:j] and t in tokens[j + 1 :]:
            return t, j, tokens.index(t, j + 1)
    raise AssertionError("no repeated token; pick another seed")


def stop_run(seed, model, n=60, **stop):
    s = make(model=model)
    s.add(req("r", max_tokens=n, seed=seed, **stop))
    out, fins, _ = drain(s)
    return out.get("r", []), fins["r"]


def test_eos_ignore_eos_stop_tokens_and_min_tokens():
    vocab, seed = 20, 12345
    base = stream(seed, 60, vocab)
    t, j, j2 = find_repeated_token(base)
    with_eos = SimModel(vocab_size=vocab, context_length=32768, eos_token_ids=frozenset({t}))

    out, fin = stop_run(seed, with_eos)
    assert out == base[:j] and fin.reason == "stop" and fin.stop_token_id == t
    assert fin.completion_tokens == j + 1  # the stop token counts in usage, not in output

    out, fin = stop_run(seed, with_eos, ignore_eos=True)
    assert out == base and fin.reason == "length" and fin.stop_token_id is None

    out, fin = stop_run(seed, with_eos, ignore_eos=True, stop_token_ids=[t])
    assert out == base[:j] and fin.reason == "stop" and fin.stop_token_id == t

    no_eos = SimModel(vocab_size=vocab, context_length=32768)
    out, fin = stop_run(seed, no_eos, stop_token_ids=[t])
    assert out == base[:j] and fin.stop_token_id == t

    # before min_tokens outputs the token is just output; the next occurrence stops
    out, fin = stop_run(seed, with_eos, min_tokens=j + 1)
    assert out == base[:j2] and fin.reason == "stop" and fin.stop_token_id == t


def test_tokens_are_deterministic_by_seed():
    s = make()
    s.add(req("a", seed=7, max_tokens=32))
    s.add(req("b", seed=7, max_tokens=32, first=500))
    s.add(req("c", seed=8, max_tokens=32))
    out, _, _ = drain(s)
    assert out["a"] == out["b"] == stream(7, 32)
    assert out["a"] != out["c"]
    assert all(0 <= t < MODEL.vocab_size for t in out["a"] + out["c"])


def test_abort_frees_blocks():
    s = make(enable_prefix_caching=False)
    s.add(req("a", prompt_len=100, max_tokens=50))
    s.add(req("b", prompt_len=100, max_tokens=50))
    s.step()
    assert s.kv.num_active_blocks > 0
    assert s.abort("a") and s.abort("b")
    assert not s.abort("a")
    assert s.kv.num_active_blocks == 0 and s.kv.num_free == s.kv.num_blocks
    assert not s.has_work and s.num_running == 0 and s.step().batch_size == 0


def test_abort_waiting_request():
    s = make(max_num_seqs=1)
    s.add(req("a"))
    s.add(req("b"))
    s.step()
    assert s.num_waiting == 1 and s.abort("b") and s.num_waiting == 0
    out, _, _ = drain(s)
    assert list(out) == ["a"]


def test_pass_duration_matches_polynomials():
    s = make(num_gpu_blocks=100)
    s.add(req("a", prompt_len=1000, max_tokens=3))
    r1 = s.step()
    # prefill only: 4.209989e-07*1000^2 + 1.518344e-02*1000 + 16.50142
    assert r1.duration_ms == pytest.approx(32.1058589)
    r2 = s.step()
    # decode only, 1001 tokens in 63 of 100 blocks: -25.74*0.63^2 + 54.01*0.63 + 5.74
    assert r2.duration_ms == pytest.approx(29.550094)
    assert s.load().kv_usage == pytest.approx(0.63)


def test_mixed_pass_charges_prefill_and_decode():
    s = make(num_gpu_blocks=200, speedup_ratio=2.0, decode_speedup_ratio=5.0)
    s.add(req("a", prompt_len=1000, max_tokens=3))
    s.step()
    s.add(req("b", prompt_len=1000, max_tokens=3, first=5000))
    r = s.step()
    assert r.batch_size == 2 and r.prefill_tokens == 1000
    # 63 + 63 blocks of 200: u = 0.63; prefill / 2 + decode / (2 * 5)
    assert r.duration_ms == pytest.approx(32.1058589 / 2 + 29.550094 / 10)


def test_add_rejects_bad_requests():
    s = make(model=SimModel(vocab_size=10, context_length=100))
    with pytest.raises(ValueError):
        s.add(SimRequest("e", []))
    with pytest.raises(ValueError):
        s.add(req("long", prompt_len=100))
    with pytest.raises(ValueError):
        s.add(req("zero", max_tokens=0))
    s.add(req("ok"))
    with pytest.raises(ValueError):
        s.add(req("ok"))


def test_load_snapshot():
    s = make(max_num_seqs=1, num_gpu_blocks=100)
    s.add(req("a", prompt_len=64))
    s.add(req("b", prompt_len=64))
    s.step()
    load = s.load()
    assert (load.num_running, load.num_waiting, load.total_blocks) == (1, 1, 100)
    # 64 computed tokens; the sampled token gets its slot in the next pass
    assert load.active_blocks == 4 and load.kv_usage == pytest.approx(0.04)


@pytest.mark.parametrize(
    "mode,chunked,budget",
    [("lifo", True, 96), ("fifo", True, 96), ("lifo", False, 256), ("fifo", False, 256)],
)
def test_random_workload_keeps_cache_and_events_consistent(mode, chunked, budget):
    """A router mirroring the events always agrees with the cache; outputs match the seeds."""
    import random

    rnd = random.Random(f"{mode}{chunked}")
    s = make(
        block_size=8,
        num_gpu_blocks=40,
        max_num_batched_tokens=budget,
        preemption_mode=mode,
        enable_chunked_prefill=chunked,
        max_num_seqs=6,
    )
    prefixes = [[rnd.randrange(1000) for _ in range(40)] for _ in range(3)]
    want = {}
    mirror: set[int] = set()
    out: dict = {}
    pending = list(range(30))
    steps = 0
    while pending or s.has_work:
        if pending and rnd.random() < 0.5:
            i = pending.pop()
            tail = [rnd.randrange(1000) for _ in range(rnd.randrange(0, 60))]
            prompt = rnd.choice(prefixes)[: rnd.randrange(1, 41)] + tail
            n = rnd.randrange(1, 60)
            s.add(SimRequest(i, prompt, StopConditions(max_tokens=n), seed=i))
            want[i] = n
        r = s.step()
        steps += 1
        for e in r.events:
            if isinstance(e, BlockStored):
                assert e.parent_block_hash is None or e.parent_block_hash in mirror
                assert not mirror.intersection(e.block_hashes), "stored twice"
                assert len(e.token_ids) == len(e.block_hashes) * 8
                mirror.update(e.block_hashes)
            else:
                assert mirror.issuperset(e.block_hashes), "removed unknown block"
                mirror.difference_update(e.block_hashes)
        for rid, tok in r.tokens:
            out.setdefault(rid, []).append(tok)
        kv = s.kv
        assert kv.num_free + kv.num_active_blocks + kv.num_cached_inactive == kv.num_blocks
        assert mirror == set(kv.cached_hashes())
        assert steps < 20_000
    assert s.num_preemptions > 0
    for i, n in want.items():
        assert out[i] == stream(i, n)
    assert s.kv.num_active_blocks == 0
