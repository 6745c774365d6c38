"""Structured-output refusals over HTTP (issue 31): a 400 naming the field, in one line, without the
grammar engine's state, whether the frontend's own check refuses the constraint (before routing:
no worker sees it) or a worker does, at once or mid-stream (then the SSE error event says so).

Before, the four constraints below passed the frontend's check and came back from the worker as
500s whose body held llguidance's ``<state>...</state><grammar>...`` dump.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from dyn.core.messages import ErrorReply, GenerateRequest, TokenChunk
from dyn.core.protocol.grammar import refusal
from dyn.core.transport.request_plane import RemoteError
from tests.core.frontend.fake_workers import Batch, failing, token_ids

pytestmark = pytest.mark.anyio

MODEL = "dyn-tiny"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
DOUBLING_LARK = "\n".join(['r0: "a"', *(f"r{i}: r{i - 1} r{i - 1}" for i in range(1, 60)), "start: r59"])
STATE_DUMP = '\n<state>\nTokens: ⟦a⟧\nParser: {}\n</state><grammar>\n{"grammars": []}\n</grammar>'

REFUSED = [
    pytest.param(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}},
        "response_format.json_schema.schema",
        id="self-referencing $ref",
    ),
    pytest.param(
        {
            "guided_json": {
                "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                "$ref": "#/$defs/a",
            }
        },
        "guided_json",
        id="mutually referencing $defs",
    ),
    pytest.param({"guided_regex": "(a{600}){1000}"}, "guided_regex", id="(a{600}){1000}"),
    pytest.param({"guided_grammar": DOUBLING_LARK}, "guided_grammar", id="doubling Lark grammar"),
]


def clean_400(r, param: str | None) -> dict:
    assert r.status_code == 400, r.text[:500]
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    message = error["message"]
    assert "\n" not in message and "<state>" not in message and "<grammar>" not in message, message
    assert "non-verbose" not in message, message
    return error


@pytest.mark.parametrize("fields, param", REFUSED)
async def test_the_frontend_refuses_them_before_routing(frontend, fields, param):
    r = await frontend.client.post("/v1/chat/completions", json={**CHAT, **fields})
    error = clean_400(r, param)
    assert error["message"].startswith(f"{param} cannot be used as a constraint: ")
    assert all(not w.requests for w in frontend.fleet)


async def test_completions_refuse_them_too(frontend):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4, "guided_regex": "(a{900}){1000}"}
    clean_400(await frontend.client.post("/v1/completions", json=body), "guided_regex")


async def test_a_forced_tool_call_names_tool_choice(frontend):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}]
    body = {**CHAT, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "f"}}}
    clean_400(await frontend.client.post("/v1/chat/completions", json=body), "tool_choice")


WORKER_REFUSAL = refusal("it is too complex for the grammar engine's limits (lexer error)") + STATE_DUMP


async def test_a_workers_refusal_is_a_one_line_400_naming_the_field(make_frontend):
    async with make_frontend(script=failing("bad_request", WORKER_REFUSAL)) as fe:
        r = await fe.client.post("/v1/chat/completions", json={**CHAT, "guided_regex": "[a-z]+"})
    error = clean_400(r, "guided_regex")
    assert error["code"] == "bad_request"
    assert error["message"] == refusal("it is too complex for the grammar engine's limits (lexer error)")


def sse_error(r) -> dict:
    assert r.status_code == 200
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return json.loads(events[-2])["error"]


def fails_mid_stream(message: str):
    async def script(request: GenerateRequest) -> AsyncIterator[Batch]:
        yield [TokenChunk(request.request_id, token_ids("aa")[:1])]
        raise RemoteError(ErrorReply(request.request_id, "bad_request", message))

    return script


async def test_a_budget_exceeded_mid_stream_is_an_sse_error_event_naming_the_field(make_frontend):
    message = refusal("mid-output, it is too complex for the grammar engine's limits (too many states)")
    async with make_frontend(script=fails_mid_stream(message + STATE_DUMP)) as fe:
        body = {
            **CHAT,
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
        }
        r = await fe.client.post("/v1/chat/completions", json={**body, "stream": True})
    error = sse_error(r)
    assert error["code"] == "bad_request" and error["param"] == "response_format.json_schema.schema"
    assert error["message"] == message


async def test_a_workers_refusal_of_a_tools_parameters_names_tools(make_frontend):
    message = refusal("no output satisfies it", "edit_file")
    async with make_frontend(script=failing("bad_request", message)) as fe:
        r = await fe.client.post("/v1/chat/completions", json=CHAT)
    assert clean_400(r, "tools")["message"] == message


async def test_other_bad_requests_from_a_worker_stay_unnamed_and_one_line(make_frontend):
    async with make_frontend(script=failing("bad_request", "the prompt is\ntoo long")) as fe:
        r = await fe.client.post("/v1/chat/completions", json={**CHAT, "guided_regex": "[a-z]+"})
    assert clean_400(r, None)["message"] == "the prompt is too long"
