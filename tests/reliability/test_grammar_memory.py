"""Issue 31, bounded grammars: ``guided_regex: (a{K}){1000}`` with a new K each time, against a real
``dyn frontend`` and a real ``dyn worker mocker`` process.

Before: every K around 300 was accepted and left 100-140 MB in the worker for good (the compiled
grammar was cached and llguidance's lexer grew while sampling, ~1.3 s of CPU); from K ~600 the
first mask failed after ~0.9 s and ~180 MB, the client got a 500 with llguidance's parser state,
and the memory stayed (the failed grammar was cached, and glibc kept what was freed). Now the
lexer's fuel refuses K >= 49 in ~50 ms; smaller K are accepted, and the worker's grammar cache
holds them within its byte bound. Each process must end within 50 MB of its resident memory at
the start (after one constrained request has built each one's grammar compiler, a fixed cost).

The worker's own bound is tested without the frontend's check too: constraints go straight to
the worker over its request plane, refused ones and accepted ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import httpx
import pytest

from dyn.core.discovery.file_store import FileDiscoveryStore
from dyn.core.messages import Finish, GenerateRequest, OutputConstraint, StopConditions
from dyn.core.transport.request_plane import RemoteError, WorkerClient

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
GROWTH_MB = 50
ACCEPTED = range(10, 49)
"""The K the limits accept (``tests/perf/bench_grammar.py --fuel``: 48 is the largest)."""


@pytest.fixture(scope="module")
def grammar_stack(stack_factory):
    return stack_factory("grammar").up(workers=1)


def _rss_mb(pid: int) -> float:
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _chat(url: str, regex: str, max_tokens: int = 4) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "guided_regex": regex,
    }
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)


def _attack(k: int) -> str:
    return "(a{%d}){1000}" % k


DOUBLING_LARK = "\n".join(['r0: "a"', *(f"r{i}: r{i - 1} r{i - 1}" for i in range(1, 60)), "start: r59"])


@pytest.mark.parametrize(
    "fields, param",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"$ref": "#"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                "guided_json": {
                    "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                    "$ref": "#/$defs/a",
                }
            },
            "guided_json",
        ),
        ({"guided_regex": "(a{600}){1000}"}, "guided_regex"),
        ({"guided_grammar": DOUBLING_LARK}, "guided_grammar"),
    ],
)
def test_the_engines_refusals_are_one_line_400s_naming_the_field(grammar_stack, fields, param):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}
    r = httpx.post(grammar_stack.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text[:300]  # was a 500 carrying llguidance's <state> dump
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(
        f"{param} cannot be used as a constraint: "
    )
    assert "\n" not in error["message"] and "<state>" not in error["message"], error


@pytest.mark.long
def test_two_hundred_distinct_attacks_leave_frontend_and_worker_within_bounds(grammar_stack):
    s = grammar_stack
    worker_pid = s.procs[0].proc.pid
    frontend_pid = s.frontend.proc.pid
    assert _chat(s.url, "[a-z]{3}").status_code == 200  # each process builds its compiler once
    start = {"worker": _rss_mb(worker_pid), "frontend": _rss_mb(frontend_pid)}

    refused = [k for k in range(49, 2000, 12)][: 200 - len(ACCEPTED)]
    accepted = 0
    for k in [*ACCEPTED, *refused]:
        r = _chat(s.url, _attack(k))
        if k in ACCEPTED:
            assert r.status_code == 200, (k, r.text[:300])
            assert set(r.json()["choices"][0]["message"]["content"]) <= {"a"}
            accepted += 1
            continue
        assert r.status_code == 400, (k, r.text[:300])
        error = r.json()["error"]
        assert error["param"] == "guided_regex"
        assert "too complex for the grammar engine's limits" in error["message"]
        assert "\n" not in error["message"] and "<state>" not in error["message"]
    assert accepted == len(ACCEPTED) and accepted + len(refused) == 200

    grown = {
        name: _rss_mb(pid) - start[name] for name, pid in (("worker", worker_pid), ("frontend", frontend_pid))
    }
    assert all(mb < GROWTH_MB for mb in grown.values()), grown
    assert httpx.get(s.url + "/live").status_code == 200


def test_attacks_sent_straight_to_the_worker_are_refused_in_bounded_memory(grammar_stack):
    """No frontend check: the worker compiles every constraint itself."""
    s = grammar_stack
    worker_pid = s.procs[0].proc.pid
    (record,) = anyio.run(FileDiscoveryStore(s.root / "discovery", s.namespace).list)
    outcomes: dict[int, str] = {}

    async def send_all() -> None:
        async with WorkerClient(record.endpoints.request) as client:
            await send(client, OutputConstraint("regex", "[a-z]{3}"), "warm")
            start = _rss_mb(worker_pid)
            for k in [*range(300, 2300, 50), *range(11, 49, 2)]:
                outcomes[k] = await send(client, OutputConstraint("regex", _attack(k)), f"direct-{k}")
            outcomes[0] = round(_rss_mb(worker_pid) - start, 1)

    async def send(client: WorkerClient, constraint: OutputConstraint, rid: str) -> str:
        request = GenerateRequest(rid, [1, 2, 3, 4], stop=StopConditions(max_tokens=4), constraint=constraint)
        try:
            with anyio.fail_after(30):
                replies = [m async for m in client.generate(request)]
        except RemoteError as exc:
            assert exc.code == "bad_request", exc
            message = exc.reply.message
            assert message.startswith("the constraint cannot be enforced: it is too complex"), message
            assert "\n" not in message and "<state>" not in message
            return "refused"
        assert isinstance(replies[-1], Finish), replies
        return "served"

    anyio.run(send_all)
    grown = outcomes.pop(0)
    assert {k for k, v in outcomes.items() if v == "served"} == set(range(11, 49, 2))
    assert {k for k, v in outcomes.items() if v == "refused"} == set(range(300, 2300, 50))
    assert grown < GROWTH_MB, grown
