"""Workload generators: deterministic by seed, shared prefixes really shared, shapes as promised."""

from __future__ import annotations

import pytest

from dyn.core.bench import workloads
from dyn.core.bench.spec import WorkloadSpec
from dyn.core.bench.trace import TraceRow


def ps(**kw):
    args = dict(
        problems=3, samples=4, system_tokens=100, problem_tokens=40, max_tokens=8, block_size=16, seed=1
    )
    return workloads.parallel_sampling(**{**args, **kw})


def test_parallel_sampling_bursts_share_system_prompt_and_problem():
    w = ps()
    assert len(w.units) == 3 and w.num_requests == 12 and w.grouped
    systems = {c.system for u in w.units for c in u.conversations}
    assert len(systems) == 1 and len(next(iter(systems)).split()) == 7 * 16  # ceil(100/16) blocks of words
    for unit in w.units:
        users = {c.turns[0].user for c in unit.conversations}
        groups = {c.group for c in unit.conversations}
        assert len(users) == 1 and len(groups) == 1  # siblings: the same prompt, one group
    assert len({u.conversations[0].turns[0].user for u in w.units}) == 3
    assert ps() == w and ps(seed=2) != w  # deterministic by seed
    shape = workloads.shape(w)
    # 12 prompts of 7 + 3 blocks; misses: 7 system blocks once, 3 problem blocks per problem
    assert shape["theoretical_hit_rate"] == pytest.approx(1 - (7 + 9) / 120)
    assert shape["requests"] == 12 and shape["units"] == 3


def test_prefix_groups_share_the_ratio_of_the_prompt():
    w = workloads.prefix_groups(groups=2, per_group=3, isl=64, ratio=0.5, max_tokens=4, block_size=8, seed=0)
    by_group: dict[str, list] = {}
    for unit in w.units:
        (conv,) = unit.conversations
        by_group.setdefault(conv.group, []).append(conv.turns[0])
    assert sorted(by_group) == ["group-0", "group-1"]
    for turns in by_group.values():
        prefixes = {t.user.split()[:32].__repr__() for t in turns}
        assert len(prefixes) == 1  # 4 blocks x 8 words shared
        assert len({t.user for t in turns}) == 3
        assert all(t.blocks[:4] == turns[0].blocks[:4] and len(t.blocks) == 8 for t in turns)
    assert workloads.shape(w)["theoretical_hit_rate"] == pytest.approx((2 * 2 * 4) / (6 * 8))
    with pytest.raises(ValueError, match="ratio"):
        workloads.prefix_groups(groups=1, per_group=1, isl=8, ratio=1.5, max_tokens=1, block_size=8, seed=0)


def mt(**kw):
    args = dict(
        agents=3,
        lead_turns=3,
        subagents=2,
        subagent_turns=2,
        system_tokens=64,
        turn_tokens=16,
        max_tokens=8,
        tool_pause_s=0.1,
        speculative_prefill=True,
        priority_mix=0.5,
        session_timeout_s=30,
        block_size=16,
        seed=4,
    )
    return workloads.multi_turn(**{**args, **kw})


def test_multi_turn_lead_subagents_sessions_and_hints():
    w = mt()
    assert w == mt()
    for unit in w.units:
        lead, *subs = unit.conversations
        assert lead.parent is None and len(lead.turns) == 3 and len(subs) == 2
        assert [s.after_turn for s in subs] == [0, 1] and all(s.parent == lead.key for s in subs)
        # growing history: each turn's block model extends the previous one's
        for a, b in zip(lead.turns, lead.turns[1:]):
            assert b.blocks[: len(a.blocks)] == a.blocks and len(b.blocks) > len(a.blocks)
        assert lead.turns[0].delay_s == 0.0 and all(t.delay_s >= 0 for t in lead.turns)
        assert "session_control" not in (lead.turns[0].nvext or {})
        for sub in subs:
            controls = [t.nvext["session_control"] for t in sub.turns]
            assert controls[0] == {"session_id": sub.key, "action": "open", "timeout": 30}
            assert controls[-1] == {"session_id": sub.key, "action": "close"}
        hints = [t.nvext["agent_hints"] for t in lead.turns]
        assert [h.get("speculative_prefill", False) for h in hints] == [True, True, False]
        assert len({h["priority"] for h in hints}) == 1 and lead.cls.startswith("lead/")
    priorities = {u.conversations[0].turns[0].nvext["agent_hints"]["priority"] for u in w.units}
    assert priorities <= {0, workloads.HIGH_PRIORITY}
    plain = mt(speculative_prefill=False, priority_mix=0.0, subagents=0)
    assert all(t.nvext is None for t in plain.turns())
    with pytest.raises(ValueError, match="subagents"):
        mt(subagents=3)
    one_turn = mt(subagent_turns=1, speculative_prefill=False, priority_mix=0.0)
    subs = [c for u in one_turn.units for c in u.conversations if c.parent is not None]
    assert subs and all(t.nvext is None for c in subs for t in c.turns)  # no session to open or close


def test_trace_workload_orders_units_and_keeps_sessions_together():
    rows = [
        TraceRow(input_length=8, output_length=2, hash_ids=(1, 2), timestamp_ms=2000.0),
        TraceRow(input_length=4, output_length=0, hash_ids=(1,), timestamp_ms=1000.0, session_id="s"),
        TraceRow(input_length=8, output_length=3, hash_ids=(1, 3), session_id="s", delay_ms=500.0),
    ]
    w = workloads.from_trace(rows, block_size=4, vocab_size=100, speedup=2.0, seed=0)
    assert [u.start_s for u in w.units] == [0.5, 1.0] and w.timed
    session = w.units[0].conversations[0]
    assert [t.delay_s for t in session.turns] == [0.0, 0.25]
    assert [t.max_tokens for t in session.turns] == [1, 3]  # output_length 0 still asks for one token
    first, second = session.turns
    assert second.prompt_ids[:4] == first.prompt_ids == w.units[1].conversations[0].turns[0].prompt_ids[:4]
    assert workloads.shape(w)["theoretical_hit_rate"] == pytest.approx(2 / 5)
    with pytest.raises(ValueError, match="speedup"):
        workloads.from_trace(rows, block_size=4, vocab_size=100, speedup=0, seed=0)


def test_spec_builds_each_kind_and_rejects_unknown(tmp_path):
    for kind in ("parallel-sampling", "multi-turn", "prefix"):
        assert WorkloadSpec(kind=kind, problems=2, agents=2, groups=2, per_group=2).build().num_requests > 0
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}\n')
    w = WorkloadSpec(kind="trace", trace=str(trace)).build()
    assert w.block_size == 512 and len(w.units[0].conversations[0].turns[0].prompt_ids) == 600
    with pytest.raises(ValueError, match="unknown workload"):
        WorkloadSpec(kind="nope").build()
