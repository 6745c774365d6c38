"""The router queue: policy keys, priority jumps, stable order, removal, the busy test."""

from __future__ import annotations

import pytest

from dyn.core.router.queue import RouterQueue, all_busy, priority_jump, queue_key


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def drain(queue: RouterQueue) -> list[object]:
    out = []
    while len(queue):
        out.append(queue.pop())
    return out


def test_priority_jump_sources():
    assert priority_jump(3, 9.0) == 3.0
    assert priority_jump(-2, 9.0) == 0.0  # a negative priority is no jump, not a fallback
    assert priority_jump(None, 1.5) == 1.5
    assert priority_jump(None, None) == 0.0
    assert isinstance(priority_jump(2, None), float)


def test_keys_per_policy():
    assert (
        queue_key("fcfs", priority_jump=2.0, arrival_offset_secs=5.0, isl_tokens=1, max_cached_tokens=0)
        == -3.0
    )
    assert (
        queue_key("lcfs", priority_jump=-4.0, arrival_offset_secs=5.0, isl_tokens=1, max_cached_tokens=0)
        == 5.0
    )
    assert (
        queue_key("wspt", priority_jump=1.0, arrival_offset_secs=5.0, isl_tokens=1000, max_cached_tokens=600)
        == 2.0 / 400
    )
    assert (
        queue_key("wspt", priority_jump=0.0, arrival_offset_secs=0.0, isl_tokens=10, max_cached_tokens=64)
        == 1.0
    )
    with pytest.raises(ValueError):
        queue_key("sjf", priority_jump=0, arrival_offset_secs=0, isl_tokens=1, max_cached_tokens=0)


def test_fcfs_orders_by_arrival_and_priority_means_seconds_earlier():
    clock = FakeClock()
    q = RouterQueue("fcfs", clock)
    q.push("first", isl_tokens=10)
    clock.t += 1.0
    q.push("second", isl_tokens=10)
    clock.t += 1.0
    q.push("jumps 1.5 s", priority_jump=1.5, isl_tokens=10)  # effective arrival 0.5 s
    clock.t += 1.0
    q.push("jumps 10 s", priority_jump=10.0, isl_tokens=10)
    assert drain(q) == ["jumps 10 s", "first", "jumps 1.5 s", "second"]


def test_lcfs_serves_newest_first():
    clock = FakeClock()
    q = RouterQueue("lcfs", clock)
    for name in ("a", "b", "c"):
        q.push(name, isl_tokens=1)
        clock.t += 1.0
    q.push("old but urgent", priority_jump=0.0, isl_tokens=1)
    assert drain(q) == ["old but urgent", "c", "b", "a"]


def test_wspt_favours_short_uncached_work_and_ignores_arrival():
    clock = FakeClock()
    q = RouterQueue("wspt", clock)
    q.push("long", isl_tokens=8000)
    clock.t += 5.0
    q.push("short", isl_tokens=200)
    q.push("long but cached", isl_tokens=8000, max_cached_tokens=7950)
    q.push("medium urgent", isl_tokens=1000, priority_jump=9.0)  # (1+9)/1000 = 1/100
    assert drain(q) == ["long but cached", "medium urgent", "short", "long"]


def test_latency_sensitivity_fallback_orders_like_a_priority():
    clock = FakeClock()
    q = RouterQueue("fcfs", clock)
    q.push("plain", priority_jump=priority_jump(None, None), isl_tokens=1)
    clock.t += 2.0
    q.push("sensitive", priority_jump=priority_jump(None, 3.0), isl_tokens=1)
    assert drain(q) == ["sensitive", "plain"]


def test_equal_keys_leave_in_push_order():
    q = RouterQueue("fcfs", FakeClock())
    for i in range(50):
        q.push(i, isl_tokens=1)
    assert drain(q) == list(range(50))
    w = RouterQueue("wspt", FakeClock())
    for i in range(20):
        w.push(i, isl_tokens=100)
    assert drain(w) == list(range(20))


def test_remove_peek_and_pending_tokens():
    q = RouterQueue("fcfs", FakeClock())
    assert q.peek() is None and q.pop() is None and q.peek_entry() is None
    a = q.push("a", isl_tokens=10)
    q.push("b", isl_tokens=20)
    c = q.push("c", isl_tokens=30)
    assert len(q) == 3 and q.pending_isl_tokens == 60 and q.peek() == "a"
    assert q.remove(a) and not q.remove(a)
    assert q.peek() == "b" and len(q) == 2 and q.pending_isl_tokens == 50
    assert q.remove(c)
    assert drain(q) == ["b"] and q.pending_isl_tokens == 0
    assert not q.remove(c)


def test_many_removals_keep_the_queue_consistent():
    q = RouterQueue("fcfs", FakeClock())
    entries = [q.push(i, isl_tokens=1) for i in range(500)]
    for e in entries[:-3]:
        q.remove(e)
    assert len(q) == 3 and drain(q) == [497, 498, 499]


def test_entry_remembers_when_it_was_queued():
    clock = FakeClock(50.0)
    q = RouterQueue("fcfs", clock)
    clock.t = 57.0
    entry = q.push("x", isl_tokens=3, priority_jump=1.0, max_cached_tokens=2)
    assert (entry.enqueued_at, entry.payload, entry.isl_tokens) == (57.0, "x", 3)
    assert entry.key == 1.0 - 7.0


def test_unknown_policy_is_a_bug():
    with pytest.raises(ValueError, match="fcfs"):
        RouterQueue("random", FakeClock())


def test_all_busy_needs_every_rank_over_the_threshold():
    assert all_busy([200, 300], 1.0, [100, 100])
    assert not all_busy([200, 100], 1.0, [100, 100])  # equal is not over
    assert not all_busy([200, 50], 0.5, [100, 200])
    assert all_busy([51], 0.5, [100])
    assert not all_busy([], 1.0, [])  # nobody eligible: route and fail, do not wait
    assert not all_busy([5_000_000], 0.5, [None])  # default capacity 10,000,000
    assert all_busy([1], 16.0, [0])  # a rank with no capacity is busy with any load


def test_a_group_entry_is_keyed_by_one_request_and_counts_all_of_them():
    q = RouterQueue("wspt", FakeClock())
    group = q.push("group", isl_tokens=100, requests=128, tokens=128 * 100)
    q.push("short", isl_tokens=50)
    assert len(q) == 2 and q.pending_requests == 129 and q.pending_isl_tokens == 12_850
    assert group.key == queue_key(
        "wspt", priority_jump=0.0, arrival_offset_secs=0.0, isl_tokens=100, max_cached_tokens=0.0
    )
    assert q.peek() == "short"  # Smith's rule per request: the group is not 128 times longer
    assert q.remove(group) and q.pending_requests == 1 and q.pending_isl_tokens == 50
    assert drain(q) == ["short"] and q.pending_requests == 0
