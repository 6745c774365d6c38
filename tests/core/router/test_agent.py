"""AgentRouter: sticky sessions, the open/bind/close lifecycle, expiry, and cache pinning."""

from __future__ import annotations

import anyio
import pytest

from dyn.core.messages import (
    ControlReply,
    ErrorReply,
    PinPrefixRequest,
    SessionControlRequest,
    WorkerEndpoints,
    WorkerRecord,
)
from dyn.core.router.agent import ENGINE_TIMEOUT_MARGIN_S, AgentRouter, SessionOpenError
from dyn.core.router.policy import Route, Router, RouteRequest, RouteSession, WorkerNotFoundError
from dyn.core.router.pool import Worker
from dyn.core.transport.request_plane import RemoteError

pytestmark = pytest.mark.anyio


class FakeClient:
    def __init__(self, fail_open: bool = False) -> None:
        self.calls: list = []
        self.fail_open = fail_open
        self.in_flight = 0

    async def call(self, message, timeout_s):
        self.calls.append(message)
        if self.fail_open and getattr(message, "action", None) == "open":
            raise RemoteError(ErrorReply(message.request_id, "engine_error", "full"))
        return ControlReply(message.request_id, 1)


def worker(instance_id: int, features=("streaming_sessions", "pin_prefix"), **kw) -> Worker:
    record = WorkerRecord(
        instance_id=instance_id,
        namespace="t",
        model_name="m",
        engine="mocker",
        endpoints=WorkerEndpoints("tcp://127.0.0.1:1"),
        block_size=16,
        total_kv_blocks=64,
        max_num_batched_tokens=256,
        features=list(features),
    )
    return Worker(record, FakeClient(**kw))


class FakePool:
    def __init__(self, *workers: Worker) -> None:
        self.by_id = {w.instance_id: w for w in workers}
        self.model_name = "m"

    def get(self, instance_id):
        return self.by_id.get(instance_id)

    def workers(self):
        return list(self.by_id.values())


class CountingRoute(Route):
    __slots__ = ("freed",)

    def __init__(self, w: Worker, dp_rank=None) -> None:
        super().__init__(w, dp_rank)
        self.freed = 0

    def finished(self) -> None:
        self.freed += 1


class TurnRouter(Router):
    """Routes to the named worker, else to the next worker in turn; records what it saw."""

    mode = "fake"

    def __init__(self, pool) -> None:
        super().__init__(pool)
        self.seen: list[RouteRequest] = []
        self.routes: list[CountingRoute] = []
        self.turn = 0

    async def route(self, request):
        self.seen.append(request)
        if request.instance_id is not None:
            w = self.pool.get(request.instance_id)
            if w is None:
                raise WorkerNotFoundError("gone")
        else:
            workers = self.pool.workers()
            w = workers[self.turn % len(workers)]
            self.turn += 1
        route = CountingRoute(w, 0)
        self.routes.append(route)
        return route


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def setup(*workers, clock=None, cache=False):
    pool = FakePool(*workers)
    inner = TurnRouter(pool)
    agent = AgentRouter(inner, enable_cache_control=cache, clock=clock or Clock())
    return agent, inner


def session(action=None, sid="s1", timeout=60) -> RouteSession:
    return RouteSession(session_id=sid, action=action, timeout=timeout)


def req(session_control=None, pin=None, instance_id=None) -> RouteRequest:
    return RouteRequest(
        request_id="r",
        token_ids=list(range(40)),
        session=session_control,
        pin_ttl_s=pin,
        instance_id=instance_id,
    )


async def drain(agent: AgentRouter) -> None:
    """Run the queued background jobs."""
    async with anyio.create_task_group() as tg:
        await tg.start(agent.background.run)
        await anyio.sleep(0.05)
        tg.cancel_scope.cancel()


async def test_open_calls_the_worker_then_turns_stick_and_close_runs_after_the_stream():
    a, b = worker(1), worker(2)
    agent, inner = setup(a, b)
    route = await agent.route(req(session("open")))
    assert route.session_id == "s1" and route.worker is a
    (opened,) = a.client.calls
    assert opened == SessionControlRequest(opened.request_id, "open", "s1", 60.0 + ENGINE_TIMEOUT_MARGIN_S)
    route.finished()
    for _ in range(3):  # the inner router would alternate; the session keeps them on a
        turn = await agent.route(req(session()))
        assert turn.worker is a and turn.session_id == "s1"
        assert inner.seen[-1].instance_id == 1
        turn.finished()
    closing = await agent.route(req(session("close")))
    assert closing.worker is a and closing.session_id == "s1"
    await drain(agent)
    assert len(a.client.calls) == 1  # nothing is closed before the stream ends
    closing.finished()
    closing.finished()  # idempotent
    await drain(agent)
    assert [c.action for c in a.client.calls] == ["open", "close"]
    assert inner.routes[-1].freed == 1
    after = await agent.route(req(session()))  # unbound now: normal routing, no engine session
    assert after.session_id is None


async def test_bind_is_router_only_and_requests_without_nvext_pass_through():
    a, b = worker(1), worker(2)
    agent, inner = setup(a, b)
    plain = await agent.route(req())
    assert type(plain) is CountingRoute  # no wrapper on the fast path
    bound = await agent.route(req(session("bind")))
    assert a.client.calls == b.client.calls == [] and bound.session_id is None
    for _ in range(3):
        assert (await agent.route(req(session()))).worker is bound.worker


async def test_a_failed_open_fails_the_request_and_frees_its_booking():
    agent, inner = setup(worker(1, fail_open=True))
    with pytest.raises(SessionOpenError, match="could not open session 's1'"):
        await agent.route(req(session("open")))
    assert inner.routes[0].freed == 1
    assert len(agent.sessions) == 0


async def test_a_worker_without_sessions_gets_a_router_only_binding():
    a, b = worker(1, features=()), worker(2, features=())
    agent, _ = setup(a, b)
    route = await agent.route(req(session("open")))
    assert route.session_id is None and a.client.calls == []
    assert (await agent.route(req(session()))).worker is route.worker


async def test_when_the_bound_worker_is_gone_the_session_is_routed_anew():
    a, b = worker(1), worker(2)
    agent, inner = setup(a, b)
    await agent.route(req(session("open")))
    del inner.pool.by_id[1]
    turn = await agent.route(req(session()))
    assert turn.worker is b and turn.session_id is None


async def test_an_explicit_target_beats_the_session():
    a, b = worker(1), worker(2)
    agent, _ = setup(a, b)
    await agent.route(req(session("bind")))
    assert (await agent.route(req(session(), instance_id=2))).worker is b


async def test_expiry_slides_with_each_turn_and_the_reaper_closes_engine_sessions():
    clock = Clock()
    a, b = worker(1), worker(2)
    agent, _ = setup(a, b, clock=clock)
    await agent.route(req(session("open", timeout=10)))
    await agent.route(req(session("bind", sid="r1", timeout=10)))
    clock.now += 8
    await agent.route(req(session()))  # refreshes s1 only
    clock.now += 5
    agent._reap()
    await drain(agent)
    assert [c.action for c in a.client.calls] == ["open"]  # s1 alive; r1 router-only: no call
    assert agent.sessions.peek("r1") is None and agent.sessions.peek("s1") is not None
    clock.now += 11
    agent._reap()
    await drain(agent)
    assert [c.action for c in a.client.calls] == ["open", "close"]


async def test_cache_control_pins_the_prompt_on_the_same_worker_after_the_stream():
    a, b = worker(1), worker(2)
    agent, _ = setup(a, b, cache=True)
    route = await agent.route(req(pin=3600.0))
    await drain(agent)
    assert route.worker.client.calls == []
    route.finished()
    await drain(agent)
    (pin,) = route.worker.client.calls
    assert isinstance(pin, PinPrefixRequest) and pin.token_ids == list(range(40)) and pin.ttl_s == 3600.0
    off, _ = setup(worker(3))
    plain = await off.route(req(pin=3600.0))  # --enable-cache-control not given: ignored
    plain.finished()
    await drain(off)
    assert plain.worker.client.calls == []


async def test_reopening_an_expired_session_is_not_closed_by_the_stale_expiry():
    clock = Clock()
    agent, _ = setup(worker(1), clock=clock)
    await agent.route(req(session("open", timeout=5)))
    clock.now += 10
    await agent.route(req(session("open", timeout=5)))  # the lookup drops the expired binding
    agent._reap()
    await drain(agent)
    assert [c.action for c in agent.pool.get(1).client.calls] == ["open", "open"]
    assert agent.sessions.peek("s1").engine_backed


async def test_close_and_rebinding_reach_the_worker_that_holds_the_session():
    a, b = worker(1), worker(2)
    agent, _ = setup(a, b)
    await agent.route(req(session("open")))
    closing = await agent.route(req(session("close"), instance_id=2))  # the client names b
    assert closing.worker is b and closing.session_id is None  # b holds no session for it
    closing.finished()
    await drain(agent)
    assert [c.action for c in a.client.calls] == ["open", "close"] and b.client.calls == []
    await agent.route(req(session("open")))  # opened on a again (turn order: b, then a)
    opened_on = [w for w in (a, b) if w.client.calls and w.client.calls[-1].action == "open"]
    await agent.route(req(session("bind")))  # router-only now: the engine session is closed
    await drain(agent)
    assert opened_on[-1].client.calls[-1].action == "close"


class StartCountingRoute(CountingRoute):
    __slots__ = ("starts",)

    def __init__(self, w: Worker, dp_rank=None) -> None:
        super().__init__(w, dp_rank)
        self.starts = 0

    def started(self) -> None:
        self.starts += 1


async def test_route_all_hands_the_group_to_the_inner_router_and_pins_each_member():
    agent, inner = setup(worker(1), worker(2), cache=True)
    groups = []

    async def route_all(requests):
        groups.append(requests)
        return [StartCountingRoute(inner.pool.get(1 + i % 2), 0) for i, _ in enumerate(requests)]

    inner.route_all = route_all
    members = [RouteRequest(request_id=f"c{i}", token_ids=list(range(40)), pin_ttl_s=60.0) for i in range(3)]
    routes = await agent.route_all(members)
    assert groups == [members] and inner.seen == []  # one call, as one unit
    for route in routes:
        route.started()
        route.finished()
    assert [r.inner.starts for r in routes] == [1, 1, 1]
    await drain(agent)
    pins = [c for w in (1, 2) for c in agent.pool.get(w).client.calls]
    assert len(pins) == 3 and all(isinstance(p, PinPrefixRequest) for p in pins)


async def test_route_all_of_one_request_keeps_its_session_and_a_session_group_is_a_bug():
    agent, inner = setup(worker(1), worker(2))
    (route,) = await agent.route_all([req(session("open"))])
    assert route.session_id == "s1" and len(inner.seen) == 1
    with pytest.raises(ValueError, match="single choice"):
        await agent.route_all([req(session()), req()])


# ---------------------------------------------------------------------------- parent affinity


def agent_req(trajectory=None, parent=None, session_control=None, instance_id=None) -> RouteRequest:
    return RouteRequest(
        request_id="r",
        token_ids=list(range(40)),
        trajectory=trajectory,
        parent=parent,
        session=session_control,
        affinity="soft" if session_control is not None else None,
        instance_id=instance_id,
    )


async def test_a_subagents_first_request_goes_where_its_parent_ran_and_later_ones_route_anew():
    agent, inner = setup(worker(1), worker(2), worker(3))
    lead = await agent.route(agent_req("lead"))  # turn order: worker 1
    assert lead.worker.instance_id == 1
    first = await agent.route(agent_req("sub", parent="lead"))
    assert first.worker.instance_id == 1 and inner.seen[-1].instance_id == 1
    later = await agent.route(agent_req("sub", parent="lead"))  # it has a place of its own now
    assert inner.seen[-1].instance_id is None and later.worker.instance_id == 2
    unknown = await agent.route(agent_req("orphan", parent="nobody"))
    assert inner.seen[-1].instance_id is None and unknown.worker.instance_id == 3


async def test_a_subagent_session_binds_on_its_parents_worker():
    agent, inner = setup(worker(1), worker(2))
    await agent.route(agent_req("lead"))  # worker 1
    await agent.route(agent_req("other"))  # worker 2: the next in turn
    child = await agent.route(agent_req("child", parent="lead", session_control=session(sid="child")))
    assert child.worker.instance_id == 1 and agent.sessions.peek("child").instance_id == 1
    again = await agent.route(agent_req("child", parent="lead", session_control=session(sid="child")))
    assert again.worker.instance_id == 1  # its own binding


async def test_parent_affinity_gives_way_to_a_named_worker_an_overloaded_parent_and_the_flag():
    agent, inner = setup(worker(1), worker(2))
    await agent.route(agent_req("lead"))  # worker 1
    named = await agent.route(agent_req("a", parent="lead", instance_id=2))
    assert named.worker.instance_id == 2
    agent.pool.get(1).client.in_flight = 20  # more than SOFT_SLACK above worker 2's 0
    agent.pool.get(2).client.in_flight = 0
    await agent.route(agent_req("b", parent="lead"))
    assert inner.seen[-1].instance_id is None
    agent.pool.get(1).client.in_flight = 0
    off, inner = setup(worker(1), worker(2))
    off.parent_affinity = False
    await off.route(agent_req("lead"))
    await off.route(agent_req("c", parent="lead"))
    assert inner.seen[-1].instance_id is None


async def test_placements_are_bounded(monkeypatch):
    from dyn.core.router import agent as agent_module

    monkeypatch.setattr(agent_module, "MAX_PLACEMENTS", 3)
    agent, _ = setup(worker(1))
    for i in range(10):
        await agent.route(agent_req(f"a{i}"))
    assert list(agent._placed) == ["a7", "a8", "a9"]
