"""``--priority-convention`` in-process: the priority each engine request carries, and the one the
router queue orders by, under each convention (the fake worker advertises vLLM's
``lower_first``). The end-to-end ordering on a vLLM-flavoured mocker is
tests/integration/test_priority_convention.py.

Conventions: ``dyn`` is Dynamo >= 1.1's (ai-dynamo/dynamo#7492: larger ``agent_hints.priority``
is more important, negated for vLLM, the router queue jumps by it); ``dynamo`` is Dynamo 1.0's
(ai-dynamo/dynamo#6348: the value forwarded to vLLM as sent, the router queue not reading it).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.anyio


def _body(priority: int | None = None, hint: int | None = None) -> dict:
    body: dict = {"prompt": "a", "max_tokens": 2}
    if priority is not None:
        body["priority"] = priority
    if hint is not None:
        body["nvext"] = {"agent_hints": {"priority": hint}}
    return body


@pytest.mark.parametrize(
    ("convention", "body", "engine", "queue"),
    [
        ("dyn", _body(hint=10), -10, 10),
        ("dyn", _body(priority=3), 3, None),
        ("dyn", _body(), None, None),
        ("dynamo", _body(hint=10), 10, None),
        ("dynamo", _body(hint=-4), -4, None),
        ("dynamo", _body(priority=3), 3, None),
        ("dynamo", _body(), None, None),
    ],
)
async def test_engine_and_queue_priority_follow_the_convention(
    make_frontend, convention, body, engine, queue
):
    async with make_frontend(priority_convention=convention) as fe:
        router = fe.app.service.router
        seen: list = []
        route_all = router.route_all

        async def spy(requests):
            seen.extend(requests)
            return await route_all(requests)

        router.route_all = spy
        r = await fe.client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert fe.fleet.requests[-1].priority == engine
        assert [q.priority for q in seen] == [queue]


async def test_the_default_convention_is_dyn(frontend):
    assert frontend.app.service.priority_convention == "dyn"
