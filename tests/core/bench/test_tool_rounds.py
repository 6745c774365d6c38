"""Tool rounds: a multi-turn run whose server answers with tool calls, against a scripted OpenAI server.

The streamed call shape is OpenAI's (``delta.tool_calls[i]`` with ``index``, ``id``, ``type`` and
``function.name`` first, ``function.arguments`` after), as `dyn serve --tool-call-rate` (dyn-tiny, the
hermes parser) sends it; see ``test_client.py`` for the recorded chunks.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import orjson
import pytest

from dyn.core.bench import workloads
from dyn.core.bench.client import ClientOptions
from dyn.core.bench.metrics import summarize
from dyn.core.bench.runner import LoadSettings, run_load
from dyn.core.bench.tools import tool_result

pytestmark = pytest.mark.anyio

USAGE = {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2}}


@pytest.fixture
def anyio_backend():
    return "asyncio"


def sse(*chunks) -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else orjson.dumps(c)) + b"\n\n" for c in chunks)


def text(words: str) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {"content": words}}]}, USAGE, b"[DONE]")


def calls(*named: tuple[str, str], ids: bool = True) -> bytes:
    """A reply calling each (name, arguments): name first, arguments in two pieces."""
    chunks = []
    for i, (name, arguments) in enumerate(named):
        first = {"index": i, "type": "function", "function": {"name": name, "arguments": arguments[:3]}}
        if ids:
            first["id"] = f"call_srv_{i}"
        chunks += [
            {"choices": [{"index": 0, "delta": {"tool_calls": [first]}}]},
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [{"index": i, "function": {"arguments": arguments[3:]}}]},
                    }
                ]
            },
        ]
    return sse(
        *chunks, {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}, USAGE, b"[DONE]"
    )


class Agentic:
    """Answers each request with ``answer(body)``; records the bodies."""

    def __init__(self, answer: Callable[[dict], bytes]):
        self.answer = answer
        self.bodies: list[dict] = []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = orjson.loads(body)
        self.bodies.append(request)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": self.answer(request)})


def mt(**kw):
    args = dict(
        agents=1,
        lead_turns=2,
        subagents=1,
        subagent_turns=2,
        system_tokens=8,
        turn_tokens=4,
        max_tokens=64,
        tool_pause_s=0.0,
        speculative_prefill=False,
        priority_mix=0.0,
        session_timeout_s=9,
        block_size=4,
        seed=3,
        tools=2,
        max_tool_rounds=4,
        tool_result_tokens=5,
    )
    return workloads.multi_turn(**{**args, **kw})


async def run(workload, server, **load):
    return await run_load(
        workload,
        "http://t",
        ClientOptions(model="m"),
        LoadSettings(concurrency=1, **load),
        transport=httpx.ASGITransport(app=server),
    )


def first_tool(body: dict) -> str:
    return body["tools"][0]["function"]["name"]


async def test_a_call_is_answered_and_the_turn_goes_on_with_a_growing_history():
    # calls when the last message is the user's, answers in text after the tool results
    server = Agentic(
        lambda b: (
            calls((first_tool(b), '{"query": "x"}')) if b["messages"][-1]["role"] == "user" else text("done")
        )
    )
    w = mt()
    out = await run(w, server)
    tools = list(w.units[0].conversations[0].tool_use.tools)
    bodies = server.bodies
    assert len(bodies) == 8 and all(b["tools"] == tools for b in bodies)
    # lead turn 0, its round, the subagent's two turns and their rounds, then lead turn 1 and its round
    rounds = [(r.conversation, r.turn, r.tool_round, r.cls) for r in out.records]
    assert rounds == [
        ("agent0-lead", 0, 0, "lead/normal"),
        ("agent0-lead", 0, 1, "lead/normal/tool-round"),
        ("agent0-sub0", 0, 0, "subagent/normal"),
        ("agent0-sub0", 0, 1, "subagent/normal/tool-round"),
        ("agent0-sub0", 1, 0, "subagent/normal"),
        ("agent0-sub0", 1, 1, "subagent/normal/tool-round"),
        ("agent0-lead", 1, 0, "lead/normal"),
        ("agent0-lead", 1, 1, "lead/normal/tool-round"),
    ]
    turn, round_ = bodies[0]["messages"], bodies[1]["messages"]
    name = tools[0]["function"]["name"]
    assert round_[: len(turn)] == turn  # the history only grows: the prefix stays cacheable
    assert round_[len(turn) :] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_srv_0",
                    "type": "function",
                    "function": {"name": name, "arguments": '{"query": "x"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_srv_0",
            "content": tool_result(w.units[0].conversations[0].tool_use, "agent0-lead", 0, 0, 0, name),
        },
    ]
    assert len(round_[-1]["content"].split()) == 5  # --tool-result-tokens words
    lead_next = bodies[6]["messages"]
    assert lead_next[: len(round_)] == round_
    assert lead_next[len(round_)]["content"] == "done" and lead_next[-1]["role"] == "user"
    # a round continues its turn's session without repeating the turn's action
    assert [b["nvext"].get("session_control") for b in bodies[2:6]] == [
        {"session_id": bodies[2]["nvext"]["session_control"]["session_id"], "action": "open", "timeout": 9},
        {"session_id": bodies[2]["nvext"]["session_control"]["session_id"]},
        {"session_id": bodies[2]["nvext"]["session_control"]["session_id"], "action": "close"},
        {"session_id": bodies[2]["nvext"]["session_control"]["session_id"]},
    ]
    s = summarize(out.records)
    assert (s.tool_calls, s.tool_rounds, s.invalid_tool_calls, s.failed) == (4, 4, 0, 0)
    assert set(s.ttft_by_class) == {
        "lead/normal",
        "lead/normal/tool-round",
        "subagent/normal",
        "subagent/normal/tool-round",
    }


async def test_rounds_stop_at_the_limit_with_every_call_answered():
    # always two parallel calls, no ids from the server
    server = Agentic(lambda b: calls((first_tool(b), "{}"), (first_tool(b), '{"a": 1}'), ids=False))
    out = await run(mt(subagents=0, max_tool_rounds=2), server)
    assert [(r.turn, r.tool_round) for r in out.records] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    turn1 = server.bodies[3]["messages"]
    roles = [m["role"] for m in turn1]
    # system, user, then 3 x (assistant with 2 calls, 2 tool results), then the next user message
    assert roles == ["system", "user"] + ["assistant", "tool", "tool"] * 3 + ["user"]
    ids = [c["id"] for m in turn1 if m["role"] == "assistant" for c in m["tool_calls"]]
    assert ids == [f"call_0_{r}_{i}" for r in range(3) for i in range(2)]
    assert [m["tool_call_id"] for m in turn1 if m["role"] == "tool"] == ids
    assert summarize(out.records).tool_calls == 12


async def test_tool_rounds_count_against_the_request_bound():
    server = Agentic(lambda b: calls((first_tool(b), "{}")))
    out = await run(mt(agents=2, subagents=0, lead_turns=1, max_tool_rounds=3), server, max_requests=3)
    # the first run took 1 turn + 3 rounds = 4 requests, so the second (1 scripted request) never starts
    assert [r.conversation for r in out.records] == ["agent0-lead"] * 4


async def test_a_call_with_broken_arguments_ends_the_conversation():
    server = Agentic(lambda b: calls((first_tool(b), '{"query": "x"')))
    out = await run(mt(), server)
    (only,) = out.records  # the lead's first turn: no round, no subagent, no next turn
    assert only.error == "tool_arguments" and only.invalid_tool_calls == 1
    s = summarize(out.records)
    assert s.errors == {"tool_arguments": 1} and s.invalid_tool_calls == 1 and s.tool_rounds == 0


async def test_without_tools_requests_are_as_before_and_calls_are_not_answered():
    server = Agentic(lambda b: calls(("f", "{}")))
    w = mt(tools=0)
    assert all(c.tool_use is None for u in w.units for c in u.conversations)
    out = await run(w, server)
    assert len(out.records) == 4 and all(r.tool_round == 0 for r in out.records)
    for body in server.bodies:
        assert set(body) == {
            "model",
            "max_tokens",
            "stream",
            "stream_options",
            "ignore_eos",
            "nvext",
            "messages",
        }
        assert all(set(m) == {"role", "content"} for m in body["messages"])
    assert server.bodies[-1]["messages"][2] == {"role": "assistant", "content": ""}
