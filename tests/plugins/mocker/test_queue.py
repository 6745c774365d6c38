"""Waiting queues: FIFO with preempted requests in front; priority heap by (key, arrival)."""

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from dyn.plugins.mocker.priorities import LEAST
from dyn.plugins.mocker.queue import FifoQueue, PriorityQueue


@dataclass(eq=False)
class Req:
    priority: int | None
    arrival: int


def test_fifo_puts_preempted_requests_in_front():
    q = FifoQueue()
    a, b, c = Req(None, 0), Req(None, 1), Req(None, 2)
    q.push(a)
    q.push(b)
    q.push_preempted(c)
    assert list(q) == [c, a, b] and q.peek() is c
    q.remove(a)
    assert [q.pop(), q.pop()] == [c, b] and q.peek() is None and len(q) == 0


def key(p):
    """SGLang's default: larger first, None last."""
    return LEAST if p is None else -p


@given(st.lists(st.one_of(st.none(), st.integers(-5, 5)), max_size=30), st.data())
def test_priority_queue_pops_by_key_then_arrival(priorities, data):
    q = PriorityQueue(key)
    reqs = [Req(p, i) for i, p in enumerate(priorities)]
    for r in reqs:
        q.push(r)
    removed = data.draw(st.sets(st.sampled_from(reqs))) if reqs else set()
    for r in removed:
        q.remove(r)
    want = sorted((r for r in reqs if r not in removed), key=lambda r: (key(r.priority), r.arrival))
    assert list(q) == want
    got = []
    while q.peek() is not None:
        assert q.peek() is want[len(got)]
        got.append(q.pop())
    assert got == want
