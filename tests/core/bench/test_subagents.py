"""Subagents in ``dyn bench --multi-turn``: ``--subagent-context fork`` starts each subagent from its
lead's conversation so far (so its prompt shares the lead's prefix, the case parent affinity is
for), and ``--agent-ids`` names every conversation and a subagent's parent in the headers agent
harnesses send; against a scripted OpenAI server that records what it was sent."""

from __future__ import annotations

import httpx
import orjson
import pytest

from dyn.core.bench import workloads
from dyn.core.bench.client import ClientOptions
from dyn.core.bench.runner import LoadSettings, run_load

pytestmark = pytest.mark.anyio

REPLY = (
    b"".join(
        b"data: " + orjson.dumps(c) + b"\n\n"
        for c in (
            {"choices": [{"index": 0, "delta": {"content": "done"}}]},
            {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2}},
        )
    )
    + b"data: [DONE]\n\n"
)


@pytest.fixture
def anyio_backend():
    return "asyncio"


class Recorder:
    """Answers every request with ``REPLY``; keeps each request's body and headers."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict, dict[str, str]]] = []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.seen.append((orjson.loads(body), headers))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": REPLY})


def workload(fork: bool):
    return workloads.multi_turn(
        agents=1, lead_turns=2, subagents=1, subagent_turns=2, system_tokens=8, turn_tokens=4,
        max_tokens=4, tool_pause_s=0.0, speculative_prefill=False, priority_mix=0.0,
        session_timeout_s=9, block_size=4, seed=1, fork=fork,
    )  # fmt: skip


async def run(fork: bool, agent_ids: bool) -> Recorder:
    server = Recorder()
    await run_load(
        workload(fork),
        "http://t",
        ClientOptions(model="m", agent_ids=agent_ids),
        LoadSettings(concurrency=1),
        transport=httpx.ASGITransport(app=server),
    )
    return server


async def test_a_forked_subagent_starts_from_its_leads_conversation():
    server = await run(fork=True, agent_ids=False)
    lead_first, sub_first = server.seen[0][0]["messages"], server.seen[1][0]["messages"]
    assert sub_first[: len(lead_first) + 1] == [*lead_first, {"role": "assistant", "content": "done"}]
    assert len(sub_first) == len(lead_first) + 2  # then its own task
    fresh = await run(fork=False, agent_ids=False)
    assert fresh.seen[1][0]["messages"][0] != fresh.seen[0][0]["messages"][0]  # its own system prompt
    w = workload(True)
    lead, sub = w.units[0].conversations
    assert sub.fork and sub.turns[0].blocks[: len(lead.turns[0].blocks)] == lead.turns[0].blocks
    assert w.params["subagent_context"] == "fork" and "subagent_context" not in workload(False).params


async def test_agent_ids_name_the_conversation_and_a_subagents_parent():
    server = await run(fork=False, agent_ids=True)
    lead, sub = server.seen[0][1], server.seen[1][1]
    assert lead["x-dynamo-session-id"].endswith("-agent0-lead") and "x-dynamo-parent-session-id" not in lead
    assert sub["x-dynamo-session-id"].endswith("-agent0-sub0")
    assert sub["x-dynamo-parent-session-id"] == lead["x-dynamo-session-id"]
    assert all("session_control" not in (body.get("nvext") or {}) for body, _ in server.seen)
    plain = await run(fork=False, agent_ids=False)
    assert all("x-dynamo-session-id" not in headers for _, headers in plain.seen)
    assert plain.seen[1][0]["nvext"]["session_control"]["action"] == "open"  # the subagent's engine session
