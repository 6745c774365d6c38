"""Priority conventions: waiting-queue order per flavour, vLLM's preemption victim, priority_order."""

import pytest

from dyn.core.messages import StopConditions
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.priorities import importance, priority_order
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest

MODEL = SimModel(vocab_size=1000, context_length=4096)
PRIORITIES = [5, None, -1, 5, 0]  # request i arrives i-th


def admission_order(**cfg):
    s = Scheduler(MockerConfig(block_size=16, num_gpu_blocks=256, max_num_seqs=1, **cfg), MODEL)
    for i, p in enumerate(PRIORITIES):
        s.add(
            SimRequest(
                i,
                list(range(100 * i, 100 * i + 20)),
                StopConditions(max_tokens=1, ignore_eos=True),
                seed=i,
                priority=p,
            )
        )
    queued = [r.request_id for r in s.waiting()]
    order = []
    while s.has_work:
        order += s.step().started
    assert order == queued  # iteration shows admission order
    return order


@pytest.mark.parametrize(
    "cfg,order",
    [
        ({}, [0, 1, 2, 3, 4]),
        ({"scheduling_policy": "priority"}, [2, 1, 4, 0, 3]),  # smaller first, None = 0, ties by arrival
        ({"engine_type": "sglang"}, [0, 1, 2, 3, 4]),  # priority ignored without --enable-priority-scheduling
        (
            {"engine_type": "sglang", "enable_priority_scheduling": True},
            [0, 3, 4, 2, 1],
        ),  # larger first, None last
        (
            {
                "engine_type": "sglang",
                "enable_priority_scheduling": True,
                "schedule_low_priority_values_first": True,
            },
            [2, 4, 0, 3, 1],
        ),  # smaller first, None still last
        ({"engine_type": "sglang", "schedule_low_priority_values_first": True}, [0, 1, 2, 3, 4]),
    ],
)
def test_waiting_queue_order(cfg, order):
    assert admission_order(**cfg) == order


def first_preempted(**cfg):
    # 7 blocks of 16; three 32-token prompts take 6; the first decode needs a third block each
    s = Scheduler(MockerConfig(block_size=16, num_gpu_blocks=7, **cfg), MODEL)
    for rid, prio in (("a", 0), ("b", 0), ("c", -5)):
        s.add(
            SimRequest(
                rid,
                list(range(ord(rid) * 100, ord(rid) * 100 + 32)),
                StopConditions(max_tokens=20, ignore_eos=True),
                seed=1,
                priority=prio,
            )
        )
    while True:
        r = s.step()
        if r.preempted:
            return s, r.preempted


def test_vllm_priority_preempts_the_largest_priority_then_latest_arrival():
    _, lifo = first_preempted()
    assert lifo == ["c"]  # lifo: the newest, even though it matters most
    s, prio = first_preempted(scheduling_policy="priority")
    assert prio == ["b"]  # max (priority, arrival): (0, 1) beats (0, 0) and (-5, 2)
    assert [r.request_id for r in s.waiting()] == ["b"]
    while s.has_work:
        s.step()
    assert s.kv.num_active_blocks == 0


def test_preempted_request_requeues_by_priority():
    s = Scheduler(MockerConfig(block_size=16, num_gpu_blocks=7, scheduling_policy="priority"), MODEL)
    for rid, prio in (("a", 0), ("b", 0), ("c", -5)):
        s.add(
            SimRequest(
                rid,
                list(range(ord(rid) * 100, ord(rid) * 100 + 32)),
                StopConditions(max_tokens=20, ignore_eos=True),
                seed=1,
                priority=prio,
            )
        )
    s.step()
    s.add(SimRequest("late-urgent", [7] * 20, StopConditions(max_tokens=2), priority=-1))
    s.add(SimRequest("late-same", [8] * 20, StopConditions(max_tokens=2), priority=0))
    while True:
        r = s.step()
        if r.preempted:
            break
    # b (priority 0, arrival 1) goes after the urgent late one and before the later priority-0 one
    assert [q.request_id for q in s.waiting()] == ["late-urgent", "b", "late-same"]


@pytest.mark.parametrize(
    "cfg,order",
    [
        ({}, "lower_first"),
        ({"scheduling_policy": "priority"}, "lower_first"),
        ({"engine_type": "sglang"}, "higher_first"),
        ({"engine_type": "sglang", "enable_priority_scheduling": True}, "higher_first"),
        ({"engine_type": "sglang", "schedule_low_priority_values_first": True}, "lower_first"),
    ],
)
def test_priority_order_follows_the_flavour(cfg, order):
    assert priority_order(MockerConfig(**cfg).validate()) == order


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, {None: 0, 5: 5, -5: -5}),
        ({"enable_priority_scheduling": True}, {None: float("-inf"), 5: 5}),
        # SGLang's PriorityStrategy evicts smaller raw values first even with low-values-first
        ({"schedule_low_priority_values_first": True}, {None: 0, 5: 5, -5: -5}),
        (
            {"enable_priority_scheduling": True, "schedule_low_priority_values_first": True},
            {None: float("inf"), 5: 5},
        ),
    ],
)
def test_eviction_importance_is_sglangs_raw_priority(flags, expected):
    key = importance(MockerConfig(engine_type="sglang", radix_eviction_policy="priority", **flags))
    assert {p: key(p) for p in expected} == expected


def test_no_importance_without_priority_eviction():
    assert importance(MockerConfig(engine_type="sglang")) is None
    assert importance(MockerConfig(radix_eviction_policy="priority")) is None
