"""Session identity from the headers agents send: one session id per request, bound to a worker
by ``--router-session-affinity`` (soft by default, hard, off), shown in ``nvext.timing``, refused
when malformed."""

from __future__ import annotations

import anyio
import pytest

from dyn.core.frontend.session_identity import session_ids
from dyn.core.protocol.errors import ApiError
from dyn.core.router.agent import SOFT_SLACK
from dyn.core.router.sessions import SessionAffinity
from tests.core.frontend.fake_workers import held, reply

pytestmark = pytest.mark.anyio


async def _chat(fe, headers: dict[str, str] | None = None, **body):
    response = await fe.client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body},
        headers=headers or {},
    )
    assert response.status_code == 200, response.text
    return response.json()


def _served_by(fe) -> list[int]:
    """Each worker's request count, by instance id."""
    return [len(worker.requests) for worker in fe.fleet]


@pytest.mark.parametrize(
    "header",
    [
        "x-dynamo-session-id",
        "X-Claude-Code-Session-Id",
        "session-id",
        "session_id",
        "x-session-id",
        "x-session-affinity",
    ],
)
async def test_every_agent_header_keeps_a_session_on_one_worker(make_frontend, header):
    async with make_frontend(workers=2) as fe:  # round-robin would alternate the workers
        for _ in range(4):
            await _chat(fe, {header: "agent-1"})
        assert sorted(_served_by(fe)) == [0, 4]


async def test_without_a_session_requests_spread(make_frontend):
    async with make_frontend(workers=2) as fe:
        for _ in range(4):
            await _chat(fe)
        assert _served_by(fe) == [2, 2]


async def test_off_ignores_the_header(make_frontend):
    from dyn.core.frontend.session_identity import SessionAffinity as Affinity

    async with make_frontend(workers=2, session_affinity=Affinity("off")) as fe:
        for _ in range(4):
            await _chat(fe, {"x-dynamo-session-id": "agent-1"})
        assert _served_by(fe) == [2, 2]


async def test_the_session_id_is_in_nvext_timing(make_frontend):
    async with make_frontend(workers=1) as fe:
        body = await _chat(fe, {"x-claude-code-session-id": "cc-7"}, nvext={"extra_fields": ["timing"]})
        assert body["nvext"]["timing"]["session_id"] == "cc-7"


@pytest.mark.parametrize("value", ["", "has space", "x" * 257])
async def test_a_malformed_session_id_is_a_400_naming_the_header(make_frontend, value):
    async with make_frontend(workers=1) as fe:
        response = await fe.client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}]},
            headers={"x-dynamo-session-id": value},
        )
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "x-dynamo-session-id"


def test_the_first_header_present_wins_and_the_parent_is_read():
    headers = {
        b"session-id": b"codex-1",
        b"x-dynamo-session-id": b"dyn-1",
        b"x-dynamo-parent-session-id": b"p",
    }
    assert session_ids(headers) == ("dyn-1", "p")
    assert session_ids({}) == (None, None)
    with pytest.raises(ApiError):
        session_ids({b"x-dynamo-parent-session-id": b"bad id"})
    for parent in (b"x-claude-code-parent-agent-id", b"x-codex-parent-thread-id", b"x-parent-session-id"):
        assert session_ids({parent: b"lead"}) == (None, "lead")


@pytest.mark.parametrize(
    ("headers", "nvext"),
    [
        ({"x-dynamo-session-id": "sub-1", "x-claude-code-parent-agent-id": "lead-1"}, None),
        (
            {},
            {
                "agent_context": {
                    "workflow_type_id": "t",
                    "workflow_id": "w",
                    "program_id": "sub-1",
                    "parent_program_id": "lead-1",
                }
            },
        ),
    ],
)
async def test_a_subagents_first_request_goes_to_the_worker_its_parent_used(make_frontend, headers, nvext):
    """Round-robin would send the subagent to the other worker; parent affinity sends it where
    the lead ran, and ``--no-router-parent-affinity`` does not."""
    for affinity, together in ((True, True), (False, False)):
        async with make_frontend(workers=2, parent_affinity=affinity) as fe:
            await _chat(fe, {"x-dynamo-session-id": "lead-1"} if nvext is None else {}, **_lead_body(nvext))
            extra = {"nvext": nvext} if nvext is not None else {}
            await _chat(fe, headers, **extra)
            assert sorted(_served_by(fe)) == ([0, 2] if together else [1, 1])


def _lead_body(nvext: dict | None) -> dict:
    if nvext is None:
        return {}
    lead = {"workflow_type_id": "t", "workflow_id": "w", "program_id": "lead-1"}
    return {"nvext": {"agent_context": lead}}


@pytest.mark.parametrize(("mode", "moves"), [("soft", True), ("hard", False)])
async def test_soft_affinity_gives_way_to_an_overloaded_worker_and_hard_does_not(make_frontend, mode, moves):
    from dyn.core.frontend.session_identity import SessionAffinity as Affinity

    release = anyio.Event()
    async with make_frontend(workers=2, session_affinity=Affinity(mode)) as fe:
        await _chat(fe, {"x-dynamo-session-id": "busy"})
        bound = next(w for w in fe.fleet if w.requests)
        other = next(w for w in fe.fleet if w is not bound)
        bound.script = held(release, reply())
        load = 2 * SOFT_SLACK + 2
        async with anyio.create_task_group() as tg:
            for _ in range(load):  # requests of no session, pinned there: the bound worker is busy
                tg.start_soon(
                    lambda: fe.client.post(
                        "/v1/chat/completions",
                        json={
                            "messages": [{"role": "user", "content": "load"}],
                            "nvext": {"backend_instance_id": bound.instance_id},
                        },
                    )
                )
            try:
                with anyio.fail_after(10):
                    while bound.in_flight < load:
                        await anyio.sleep(0.01)
                if moves:
                    await _chat(fe, {"x-dynamo-session-id": "busy"})
                    assert len(other.requests) == 1
                    await _chat(fe, {"x-dynamo-session-id": "busy"})  # bound anew where it went
                    assert len(other.requests) == 2
                else:
                    tg.start_soon(lambda: _chat(fe, {"x-dynamo-session-id": "busy"}))
                    with anyio.fail_after(10):
                        while bound.in_flight < load + 1:
                            await anyio.sleep(0.01)
                    assert not other.requests
            finally:  # a failed assertion must not leave the load waiting
                release.set()


def test_the_session_map_is_bounded_least_recently_used_first():
    now = [0.0]
    sessions = SessionAffinity(lambda: now[0], max_sessions=2)
    sessions.bind("a", 1, None, 60, engine_backed=True)
    sessions.bind("b", 1, None, 60, engine_backed=False)
    sessions.resolve("a")  # a is now the most recently used
    sessions.bind("c", 2, None, 60, engine_backed=False)
    assert len(sessions) == 2
    assert sessions.peek("b") is None and sessions.peek("a") is not None
    assert [sid for sid, _ in sessions.expire()] == ["b"]  # handed over like an expired one
