"""Streaming sessions: turn 1 through the prefix cache, later turns appending to held KV outside it."""

import random

import pytest

from dyn.core.kv.events import BlockRemoved, BlockStored
from dyn.core.messages import StopConditions
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest

BS = 16
MODEL = SimModel(vocab_size=1000, context_length=4096)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(num_gpu_blocks=64, **cfg) -> Scheduler:
    s = Scheduler(
        MockerConfig(
            engine_type="sglang",
            enable_streaming_session=True,
            block_size=BS,
            num_gpu_blocks=num_gpu_blocks,
            **cfg,
        ),
        MODEL,
        clock=FakeClock(),
    )
    return s


def check(s: Scheduler):
    kv = s.kv
    assert kv.num_free >= 0 and kv.num_active_blocks >= 0 and kv.num_cached_inactive >= 0
    assert kv.num_free + kv.num_active_blocks + kv.num_cached_inactive == kv.num_blocks


def add(s, rid, prompt, n_out, session="s1", seed=None):
    s.add(
        SimRequest(
            rid,
            list(prompt),
            StopConditions(max_tokens=n_out, ignore_eos=True),
            seed=hash(rid) % 1000 if seed is None else seed,
            session_id=session,
        )
    )


def drain(s: Scheduler):
    out, fins, steps = {}, {}, []
    while s.has_work:
        r = s.step()
        check(s)
        steps.append(r)
        for rid, tok in r.tokens:
            out.setdefault(rid, []).append(tok)
        for f in r.finished:
            fins[f.request_id] = f
        assert len(steps) < 10_000
    return out, fins, steps


def stored(steps):
    return [h for r in steps for e in r.events if isinstance(e, BlockStored) for h in e.block_hashes]


P1 = list(range(100, 140))  # 40 tokens


def two_turns(s, extra=20, n2=5):
    assert s.sessions.open("s1", 60)
    add(s, "t1", P1, 10)
    out1, fins1, steps1 = drain(s)
    p2 = P1 + out1["t1"] + list(range(900, 900 + extra))
    add(s, "t2", p2, n2)
    out2, fins2, steps2 = drain(s)
    return p2, (out1, fins1, steps1), (out2, fins2, steps2)


def test_turn_one_uses_the_prefix_cache_and_its_kv_stays_with_the_slot():
    s = make()
    assert s.sessions.open("s1", 60) and not s.sessions.open("s1", 60)
    add(s, "t1", P1, 10)
    _, fins, steps = drain(s)
    assert fins["t1"].cached_tokens == 0
    assert len(stored(steps)) == 3  # 49 computed tokens: 3 full blocks stored as usual
    load = s.load()
    assert (load.num_sessions, load.session_held_tokens) == (1, 49)
    assert s.kv.num_active_blocks == 4 and s.kv.num_cached_inactive == 0  # held, not released


def test_appending_turn_reuses_held_kv_outside_the_prefix_cache():
    s = make()
    p2, (_, _, steps1), (_, fins2, steps2) = two_turns(s)
    assert fins2["t2"].cached_tokens == 49  # prompt + output of turn 1, less its last token
    assert steps2[0].prefill_tokens == len(p2) - 49
    assert stored(steps2) == []  # new blocks stay outside the prefix cache
    assert set(s.kv.cached_hashes()) == set(stored(steps1))
    assert s.load().session_held_tokens == len(p2) + 5 - 1
    assert s.kv.num_active_blocks == -(-(len(p2) + 4) // BS)
    # another request with the same tokens only finds turn 1's stored blocks
    add(s, "other", p2, 1, session=None)
    _, fins, _ = drain(s)
    assert fins["other"].cached_tokens == 48


def test_a_prompt_that_is_not_an_append_restarts_the_slot():
    s = make()
    s.sessions.open("s1", 60)
    add(s, "t1", P1, 10)
    drain(s)
    forked = P1[:20] + [7] * 30  # shares one full block with turn 1
    add(s, "t2", forked, 4)
    _, fins, steps = drain(s)
    assert fins["t2"].cached_tokens == 16  # the turn-1 path: a prefix-cache hit only
    assert stored(steps)  # and it stores its blocks again
    assert s.load().session_held_tokens == len(forked) + 3
    assert s.kv.num_cached_inactive == 2  # turn 1's other blocks were released to the cache


def test_a_resent_reply_that_tokenizes_differently_keeps_the_common_whole_blocks():
    s = make()
    p2, _, (_, fins2, _) = two_turns(s, extra=40, n2=4)  # the slot holds p2 + 3 outputs
    held_blocks = (len(p2) + 3) // BS
    # turn 3 resends turn 2's prompt, then a reply whose ids differ from what was generated
    p3 = p2 + [5, 6, 7] * 10 + list(range(700, 720))
    add(s, "t3", p3, 2)
    _, fins3, steps3 = drain(s)
    assert fins3["t3"].cached_tokens == len(p2) // BS * BS
    assert len(p2) // BS <= held_blocks
    assert not stored(steps3)  # still outside the prefix cache
    assert s.load().session_held_tokens == len(p3) + 1
    check(s)


def test_close_frees_the_slot_kv_into_the_ordinary_cache():
    s = make()
    two_turns(s)
    assert s.sessions.close("s1") and not s.sessions.close("s1")
    assert s.kv.num_active_blocks == 0
    assert s.kv.num_cached_inactive == 3  # turn 1's stored blocks, now evictable; the rest freed
    assert (s.load().num_sessions, s.load().session_held_tokens) == (0, 0)
    check(s)


def test_close_while_a_turn_runs_takes_effect_when_it_ends():
    s = make()
    s.sessions.open("s1", 60)
    add(s, "t1", P1, 10)
    s.step()
    assert s.sessions.close("s1")
    assert s.load().num_sessions == 0 and s.kv.num_active_blocks > 0
    drain(s)
    assert s.kv.num_active_blocks == 0
    add(s, "after", P1, 2)  # the session is gone: an ordinary request
    drain(s)
    assert s.kv.num_active_blocks == 0 and s.load().num_sessions == 0


def test_unknown_session_is_served_as_an_ordinary_request():
    s = make()
    add(s, "x", P1, 3, session="never-opened")
    _, fins, _ = drain(s)
    assert fins["x"].reason == "length" and s.kv.num_active_blocks == 0


def test_sessions_off_ignore_session_id():
    s = Scheduler(MockerConfig(block_size=BS, num_gpu_blocks=64), MODEL)
    assert s.sessions is None
    add(s, "x", P1, 3)
    drain(s)
    assert s.kv.num_active_blocks == 0 and s.load().num_sessions == 0


def test_second_concurrent_turn_is_ordinary():
    s = make()
    s.sessions.open("s1", 60)
    add(s, "a", P1, 5)
    add(s, "b", P1, 5)
    drain(s)
    assert s.load().session_held_tokens == 44
    assert s.kv.num_active_blocks == 3  # only a's 44 tokens are held


def test_idle_slot_is_reaped_after_its_timeout_but_not_while_a_turn_runs():
    s = make()
    clock = s.kv.clock
    s.sessions.open("s1", 10)
    add(s, "t1", P1, 10)
    s.step()
    clock.now += 100  # past the deadline, but a turn runs
    s.step()
    assert "s1" in s.sessions
    drain(s)
    clock.now += 9.9
    assert s.sessions.reap_due() == 0 and "s1" in s.sessions
    clock.now += 0.2
    assert s.sessions.reap_due() == 1 and "s1" not in s.sessions
    assert s.kv.num_active_blocks == 0


def test_reopen_refreshes_the_timeout():
    s = make()
    clock = s.kv.clock
    s.sessions.open("s1", 10)
    clock.now += 8
    assert not s.sessions.open("s1", 10)
    clock.now += 8
    assert s.sessions.reap_due() == 0
    clock.now += 3
    assert s.sessions.reap_due() == 1


def test_reaping_happens_in_the_pass_loop():
    s = make()
    clock = s.kv.clock
    s.sessions.open("s1", 5)
    add(s, "t1", P1, 3)
    drain(s)
    clock.now += 6
    add(s, "other", [1] * 20, 1, session=None)
    s.step()
    assert "s1" not in s.sessions


def test_aborting_a_turn_leaves_the_slot_as_before():
    s = make()
    two_turns(s)
    held, active = s.load().session_held_tokens, s.kv.num_active_blocks
    p3 = s.sessions.slot("s1").seq.tokens + [5] * 40
    add(s, "t3", p3, 50)
    s.step()
    s.step()
    assert s.kv.num_active_blocks > active
    assert s.abort("t3")
    assert (s.load().session_held_tokens, s.kv.num_active_blocks) == (held, active)
    check(s)
    add(s, "t4", p3, 2)
    _, fins, _ = drain(s)
    assert fins["t4"].cached_tokens == held


def test_session_kv_survives_eviction_pressure():
    s = make(num_gpu_blocks=16)
    s.sessions.open("s1", 600)
    add(s, "t1", P1, 10)
    drain(s)
    held_blocks = list(s.kv.cached_hashes())
    evicted = set()
    for i in range(8):  # each ordinary request fills 5 blocks and evicts older ordinary ones
        add(s, f"o{i}", range(10_000 * (i + 1), 10_000 * (i + 1) + 70), 2, session=None)
        _, _, steps = drain(s)
        evicted |= {h for r in steps for e in r.events if isinstance(e, BlockRemoved) for h in e.block_hashes}
    assert evicted and not evicted & set(held_blocks)
    assert all(s.kv.is_cached(h) for h in held_blocks)
    slot = s.sessions.slot("s1")
    add(s, "t2", slot.seq.tokens + [1] * 30, 2)
    _, fins, _ = drain(s)
    assert fins["t2"].cached_tokens == 49


@pytest.mark.parametrize("mode", ["lifo", "fifo"])
def test_preempted_session_turn_keeps_the_slot_kv(mode):
    def run(num_gpu_blocks):
        s = make(num_gpu_blocks=num_gpu_blocks, preemption_mode=mode)
        s.sessions.open("s1", 600)
        add(s, "t1", P1, 10, seed=1)
        out1, _, _ = drain(s)
        p2 = P1 + out1["t1"] + list(range(900, 930))
        if mode == "lifo":
            add(s, "x", range(5000, 5050), 60, session=None, seed=2)
            add(s, "t2", p2, 40, seed=3)
        else:
            add(s, "t2", p2, 40, seed=3)
            add(s, "x", range(5000, 5050), 60, session=None, seed=2)
        out, fins, steps = drain(s)
        return s, out, fins, steps, len(p2)

    _, out_free, _, steps_free, _ = run(64)
    assert not any(r.preempted for r in steps_free)
    s, out, fins, steps, n2 = run(12)
    assert "t2" in [rid for r in steps for rid in r.preempted]
    assert out["t2"] == out_free["t2"] and out["x"] == out_free["x"]
    assert fins["t2"].cached_tokens == 49
    assert s.load().session_held_tokens == n2 + 39
    assert s.kv.num_active_blocks == -(-(n2 + 39) // BS)
    assert s.sessions.close("s1") and s.kv.num_active_blocks == 0
    check(s)


def test_random_workload_with_sessions_pins_and_priorities_keeps_accounting():
    """Sessions, pins, priority eviction, preemption and aborts together: the event mirror always
    matches the cache, blocks are never lost or double-freed, and everything frees at the end."""
    rnd = random.Random(7)
    s = Scheduler(
        MockerConfig(
            engine_type="sglang",
            enable_streaming_session=True,
            radix_eviction_policy="priority",
            enable_priority_scheduling=True,
            block_size=8,
            num_gpu_blocks=48,
            max_num_batched_tokens=96,
            max_num_seqs=6,
        ),
        MODEL,
        clock=FakeClock(),
    )
    clock = s.kv.clock
    mirror: set[int] = set()
    prefixes = [[rnd.randrange(1000) for _ in range(40)] for _ in range(3)]
    sessions = ["s0", "s1", "s2", "s3"]
    preempted = session_preempted = appended = 0
    for step in range(3000):
        roll = rnd.random()
        if roll < 0.05:
            s.sessions.open(rnd.choice(sessions), rnd.choice([0.5, 5.0]))
        elif roll < 0.07:
            s.sessions.close(rnd.choice(sessions))
        elif roll < 0.1:
            s.kv.pin_prefix(rnd.choice(prefixes)[: rnd.randrange(8, 41)], rnd.choice([0.2, 2.0]))
        elif roll < 0.3 and s.num_running + s.num_waiting < 10:
            sid = rnd.choice([None, *sessions])
            slot = s.sessions.slot(sid) if sid else None
            if slot is not None and slot.seq is not None and slot.held_len < 150 and rnd.random() < 0.8:
                prompt = slot.seq.tokens[: slot.held_len]
                appended += 1
            else:
                prompt = rnd.choice(prefixes)[: rnd.randrange(1, 41)]
            prompt = prompt + [rnd.randrange(1000) for _ in range(rnd.randrange(1, 30))]
            s.add(
                SimRequest(
                    f"r{step}",
                    prompt,
                    StopConditions(max_tokens=rnd.randrange(1, 60)),
                    seed=step,
                    priority=rnd.choice([None, -1, 0, 3]),
                    session_id=sid,
                )
            )
        elif roll < 0.32 and s.has_work:
            s.abort(rnd.choice([q.request_id for q in (*s.running(), *s.waiting())]))
        clock.now += 0.05
        if not s.has_work:
            continue
        r = s.step()
        preempted += len(r.preempted)
        session_preempted += sum(1 for q in s.waiting() if q.request_id in r.preempted and q.base_blocks)
        for e in r.events:
            if isinstance(e, BlockStored):
                assert e.parent_block_hash is None or e.parent_block_hash in mirror
                assert not mirror.intersection(e.block_hashes)
                mirror.update(e.block_hashes)
            else:
                assert mirror.issuperset(e.block_hashes)
                mirror.difference_update(e.block_hashes)
        check(s)
        assert mirror == set(s.kv.cached_hashes())
    assert preempted > 0 and session_preempted > 0 and appended > 20
    for sid in sessions:
        s.sessions.close(sid)
    for q in [*s.running(), *s.waiting()]:
        s.abort(q.request_id)
    assert s.kv.num_active_blocks == 0 and s.load().session_held_tokens == 0
    check(s)


def test_waiting_turns_holding_lent_kv_cannot_block_each_other():
    s = make(num_gpu_blocks=10)
    s.sessions.open("a", 60)
    s.sessions.open("b", 60)
    add(s, "a1", list(range(100, 164)), 2, session="a")  # 5 blocks held by a
    drain(s)
    add(s, "b1", list(range(200, 248)), 2, session="b")  # 4 blocks held by b
    drain(s)
    # a2 needs 3 more blocks with 1 free; b2 fits but waits behind a2
    add(s, "a2", s.sessions.slot("a").seq.tokens[:65] + list(range(500, 540)), 2, session="a")
    add(s, "b2", s.sessions.slot("b").seq.tokens[:49] + list(range(600, 605)), 2, session="b")
    s.sessions.close("a")  # the last turns: closes wait for them to end
    s.sessions.close("b")
    _, fins, _ = drain(s)
    assert set(fins) == {"a2", "b2"}
    check(s)
