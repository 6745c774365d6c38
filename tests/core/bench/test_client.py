"""The load client against a scripted OpenAI server (ASGI, through httpx's real streaming path)."""

from __future__ import annotations

import socket

import anyio
import httpx
import orjson
import pytest

from dyn.core.bench import workloads
from dyn.core.bench.client import ClientOptions, ToolCall, ToolCallDeltas, chat_body, completion_body, send
from dyn.core.bench.metrics import RequestRecord
from dyn.core.bench.runner import LoadSettings, arrival_times, run_load
from dyn.core.bench.workloads import Conversation, Turn, Unit, Workload

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def sse(*chunks) -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else orjson.dumps(c)) + b"\n\n" for c in chunks)


def chat_chunk(text):
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


USAGE = {
    "choices": [],
    "usage": {"prompt_tokens": 20, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 16}},
    "nvext": {"worker_id": {"decode_worker_id": 42}, "timing": {"prefill_wait_time_ms": 7.5}},
}


class Server:
    """Answers each POST with the next scripted (status, body); records the request bodies."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.bodies: list[dict] = []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        assert (b"content-type", b"application/json") in scope["headers"]
        self.bodies.append({"path": scope["path"], **orjson.loads(body)})
        status, payload = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": payload})


async def one(server, body=None):
    options = ClientOptions(model="m")
    record = RequestRecord(conversation="c", group="g", start_s=0.0, end_s=0.0)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=server), base_url="http://t") as client:
        reply = await send(
            client,
            "/v1/chat/completions",
            body or chat_body(options, [{"role": "user", "content": "hi"}], 3, None),
            record,
            anyio.current_time,
            anyio.current_time(),
            options,
        )
    return reply


async def test_a_stream_fills_every_field():
    stream = sse(
        {"choices": [{"delta": {"role": "assistant"}}]},
        chat_chunk("a"),
        chat_chunk("b"),
        chat_chunk("c"),
        USAGE,
        b"[DONE]",
    )
    reply = await one(Server((200, stream)))
    r = reply.record
    assert reply.text == "abc" and r.error is None
    assert r.ttft_s is not None and r.ttft_s >= 0 and len(r.itl_s) == 2
    assert (r.prompt_tokens, r.cached_tokens, r.output_tokens) == (20, 16, 3)
    assert r.worker == "42" and r.queue_s == pytest.approx(0.0075)
    assert r.end_s >= r.start_s


@pytest.mark.parametrize(
    "answer, kind, detail",
    [
        ((503, orjson.dumps({"error": {"message": "no workers"}})), "http_503", "no workers"),
        ((200, sse(chat_chunk("a"), {"error": {"message": "engine died"}})), "server_error", "engine died"),
        ((200, sse(chat_chunk("a"))), "stream", "without [DONE]"),
        ((200, b"data: {not json\n\n"), "stream", "malformed"),
    ],
)
async def test_failures_get_a_kind_and_the_servers_message(answer, kind, detail):
    r = (await one(Server(answer))).record
    assert r.error == kind and detail in r.detail


async def test_connection_refused_is_connect():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = ClientOptions(model="m", timeout_s=5)
    record = RequestRecord(conversation="c", group="g", start_s=0.0, end_s=0.0)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        reply = await send(
            client,
            "/v1/completions",
            completion_body(options, [1, 2], 1, None),
            record,
            anyio.current_time,
            anyio.current_time(),
            options,
        )
    assert reply.record.error == "connect"


def test_bodies_carry_nvext_only_when_asked():
    on = chat_body(ClientOptions(model="m"), [], 5, {"agent_hints": {"priority": 1}})
    assert on["nvext"] == {"agent_hints": {"priority": 1}, "extra_fields": ["worker_id", "timing"]}
    assert on["stream"] and on["stream_options"] == {"include_usage": True} and on["ignore_eos"]
    off = completion_body(ClientOptions(model="m", nvext=False, ignore_eos=False), [3], 5, None)
    assert "nvext" not in off and "ignore_eos" not in off and off["prompt"] == [3]
    hinted = completion_body(
        ClientOptions(model="m", nvext=False), [3], 5, {"session_control": {"session_id": "s"}}
    )
    assert hinted["nvext"] == {"session_control": {"session_id": "s"}}


OK_STREAM = sse(chat_chunk("x"), chat_chunk("y"), USAGE, b"[DONE]")


async def test_history_grows_and_children_finish_before_the_parents_next_turn():
    w = workloads.multi_turn(
        agents=1,
        lead_turns=2,
        subagents=1,
        subagent_turns=2,
        system_tokens=8,
        turn_tokens=4,
        max_tokens=2,
        tool_pause_s=0,
        speculative_prefill=False,
        priority_mix=0,
        session_timeout_s=9,
        block_size=4,
        seed=0,
    )
    server = Server((200, OK_STREAM))
    out = await run_load(
        w,
        "http://t",
        ClientOptions(model="m"),
        LoadSettings(concurrency=1),
        transport=httpx.ASGITransport(app=server),
    )
    assert len(out.records) == 4 and not out.interrupted
    order = [(b["messages"][0]["content"][:20], len(b["messages"])) for b in server.bodies]
    lead_system = server.bodies[0]["messages"][0]["content"][:20]
    # lead turn 1, subagent turns 1 and 2, then lead turn 2 with the reply of turn 1 in its history
    assert [o[0] == lead_system for o in order] == [True, False, False, True]
    assert [o[1] for o in order] == [2, 2, 4, 4]
    assert server.bodies[2]["messages"][2] == {"role": "assistant", "content": "xy"}
    assert server.bodies[1]["nvext"]["session_control"]["action"] == "open"
    assert server.bodies[2]["nvext"]["session_control"]["action"] == "close"


def simple(n, start=None):
    def unit(i):
        turns = (Turn(max_tokens=1, blocks=(i,), user="u"), Turn(max_tokens=1, blocks=(i,), user="v"))
        return Unit(
            start_s=None if start is None else start * i,
            conversations=(Conversation(key=f"c{i}", group="g", turns=turns),),
        )

    return Workload(name="t", block_size=1, params={}, units=tuple(unit(i) for i in range(n)))


async def test_a_failed_turn_ends_its_conversation_and_bounds_stop_new_units():
    server = Server((503, b"{}"))
    out = await run_load(
        simple(3),
        "http://t",
        ClientOptions(model="m"),
        LoadSettings(concurrency=2),
        transport=httpx.ASGITransport(app=server),
    )
    assert len(out.records) == 3 and all(r.error == "http_503" and r.turn == 0 for r in out.records)
    server = Server((200, OK_STREAM))
    out = await run_load(
        simple(5),
        "http://t",
        ClientOptions(model="m"),
        LoadSettings(concurrency=1, max_requests=3),
        transport=httpx.ASGITransport(app=server),
    )
    assert len(out.records) == 4  # units of 2 requests: the second unit starts at 2 < 3, the third not


def test_arrival_models():
    w = simple(4, start=0.5)
    assert [a for a, _ in arrival_times(w, LoadSettings())] == [0.0, 0.5, 1.0, 1.5]
    assert arrival_times(w, LoadSettings(concurrency=2)) is None
    poisson = [a for a, _ in arrival_times(w, LoadSettings(request_rate=10.0, seed=1))]
    assert poisson[0] == 0.0 and poisson == sorted(poisson) and len(set(poisson)) == 4
    assert poisson == [a for a, _ in arrival_times(w, LoadSettings(request_rate=10.0, seed=1))]
    with pytest.raises(ValueError, match="not both"):
        LoadSettings(concurrency=1, request_rate=1.0).validate()


class Slow:
    """A chunk every ``gap`` seconds, ``n`` of them."""

    def __init__(self, gap, n):
        self.gap, self.n = gap, n

    async def __call__(self, scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(self.n):
            await anyio.sleep(self.gap)
            await send({"type": "http.response.body", "body": sse(chat_chunk("a")), "more_body": True})
        await send({"type": "http.response.body", "body": sse(USAGE, b"[DONE]")})


async def test_the_timeout_bounds_the_whole_request_not_each_read():
    options = ClientOptions(model="m", timeout_s=0.3)
    record = RequestRecord(conversation="c", group="g", start_s=0.0, end_s=0.0)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=Slow(0.1, 20)), base_url="http://t"
    ) as client:
        reply = await send(
            client,
            "/v1/completions",
            completion_body(options, [1], 1, None),
            record,
            anyio.current_time,
            anyio.current_time(),
            options,
        )
    assert reply.record.error == "timeout" and "0.3" in reply.record.detail


@pytest.mark.parametrize(
    "usage",
    [
        {"choices": [], "usage": 5},
        {"choices": [], "usage": {"prompt_tokens": 3, "prompt_tokens_details": [1]}},
        {"choices": [], "usage": {"completion_tokens": "x"}},
        {"choices": [], "nvext": [1]},
        {"choices": [], "nvext": {"timing": [1]}},
    ],
)
async def test_malformed_usage_or_nvext_is_a_stream_error_not_a_crash(usage):
    r = (await one(Server((200, sse(chat_chunk("a"), usage, b"[DONE]"))))).record
    assert r.error == "stream" and "malformed" in r.detail


async def test_a_server_without_cached_token_details_reports_none():
    usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}}
    r = (await one(Server((200, sse(chat_chunk("a"), usage, b"[DONE]"))))).record
    assert r.error is None and r.prompt_tokens == 9 and r.cached_tokens is None


async def test_open_loop_and_trace_bounds_do_not_wait_for_the_next_arrival():
    far = simple(2, start=3600.0)  # the second unit is due in an hour
    server = Server((200, OK_STREAM))
    out = await run_load(
        far,
        "http://t",
        ClientOptions(model="m"),
        LoadSettings(duration_s=5.0),
        transport=httpx.ASGITransport(app=server),
    )
    assert len(out.records) == 2  # the first unit's two turns; the hour-later unit never starts
    out = await run_load(
        far,
        "http://t",
        ClientOptions(model="m"),
        LoadSettings(max_requests=2),
        transport=httpx.ASGITransport(app=server),
    )
    assert len(out.records) == 2


async def test_session_ids_are_unique_to_each_run():
    w = workloads.multi_turn(
        agents=1,
        lead_turns=2,
        subagents=1,
        subagent_turns=2,
        system_tokens=8,
        turn_tokens=4,
        max_tokens=2,
        tool_pause_s=0,
        speculative_prefill=False,
        priority_mix=0,
        session_timeout_s=9,
        block_size=4,
        seed=0,
    )
    ids = []
    for _ in range(2):
        server = Server((200, OK_STREAM))
        await run_load(
            w,
            "http://t",
            ClientOptions(model="m"),
            LoadSettings(concurrency=1),
            transport=httpx.ASGITransport(app=server),
        )
        ids.append(
            {
                b["nvext"]["session_control"]["session_id"]
                for b in server.bodies
                if "session_control" in b.get("nvext", {})
            }
        )
    assert len(ids[0]) == len(ids[1]) == 1 and ids[0] != ids[1]
    assert next(iter(ids[0])).endswith("-agent0-sub0")


# A streamed call as `dyn serve --tool-call-rate 1.0` (dyn-tiny, hermes parser) sent it, ids shortened:
# id, type and name with the first argument piece, the rest of the arguments in the next delta (OpenAI's
# streaming shape, README "Agents"; the openai SDK's lib/streaming/_deltas.py accumulates it by index).
CALL_START = {
    "choices": [
        {
            "index": 0,
            "delta": {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_f7cc",
                        "type": "function",
                        "function": {"name": "search_docs", "arguments": '{"query":'},
                    }
                ]
            },
        }
    ]
}
CALL_REST = {
    "choices": [
        {
            "index": 0,
            "delta": {
                "tool_calls": [
                    {"index": 0, "function": {"arguments": '". neededtab>","limit":10,"scope":"docs"}'}}
                ]
            },
        }
    ]
}
CALL_FINISH = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}


def test_tool_call_deltas_are_put_together_by_index():
    deltas = ToolCallDeltas()
    # two parallel calls, interleaved; the second call's name split in two; two pieces of one call
    # in a single chunk (the openai SDK merges those too)
    deltas.feed(
        [{"index": 0, "id": "a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]
    )
    deltas.feed(
        [{"index": 1, "id": "b", "type": "function", "function": {"name": "list_", "arguments": '{"d'}}]
    )
    deltas.feed(
        [{"index": 0, "function": {"arguments": '{"city": '}}, {"index": 1, "function": {"name": "orders"}}]
    )
    deltas.feed(
        [
            {"index": 0, "id": "ignored", "function": {"arguments": '"Paris"}'}},
            {"index": 1, "function": {"arguments": 'ays": 3'}},
            {"index": 1, "function": {"arguments": "}"}},
        ]
    )
    a, b = deltas.calls()
    assert (a.index, a.id, a.name, a.arguments) == (0, "a", "get_weather", '{"city": "Paris"}')
    assert (b.index, b.id, b.name, b.arguments) == (1, "b", "list_orders", '{"days": 3}')
    assert a.valid and b.valid
    assert not ToolCall(0, arguments='{"query":').valid and not ToolCall(0, arguments="[1]").valid
    assert not ToolCall(0, arguments="").valid
    positional = ToolCallDeltas()
    positional.feed([{"id": "x", "function": {"name": "f", "arguments": "{}"}}])  # no index: its position
    assert positional.calls()[0].index == 0 and positional.calls()[0].valid


async def test_a_streamed_tool_call_is_the_replys_call_and_its_first_token():
    server = Server(
        (
            200,
            sse(
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                CALL_START,
                CALL_REST,
                CALL_FINISH,
                USAGE,
                b"[DONE]",
            ),
        )
    )
    reply = await one(
        server,
        chat_body(
            ClientOptions(model="m"),
            [{"role": "user", "content": "hi"}],
            64,
            None,
            [{"type": "function", "function": {"name": "search_docs"}}],
        ),
    )
    r = reply.record
    assert r.error is None and reply.text == ""
    assert [(c.id, c.name, orjson.loads(c.arguments)) for c in reply.tool_calls] == [
        ("call_f7cc", "search_docs", {"query": ". neededtab>", "limit": 10, "scope": "docs"})
    ]
    assert (r.tool_calls, r.invalid_tool_calls) == (1, 0)
    assert r.ttft_s is not None and len(r.itl_s) == 1  # the call's chunks are output: no content at all
    assert server.bodies[0]["tools"][0]["function"]["name"] == "search_docs"


async def test_a_call_cut_off_by_max_tokens_is_a_tool_arguments_error():
    # dyn serve --tool-call-rate 1.0 with max_tokens 24: the call starts, then "length" ends it
    cut = {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_61ad",
                            "type": "function",
                            "function": {"name": "search_docs", "arguments": '{"query'},
                        }
                    ]
                },
            }
        ]
    }
    length = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    reply = await one(Server((200, sse(cut, length, USAGE, b"[DONE]"))))
    r = reply.record
    assert r.error == "tool_arguments" and (r.tool_calls, r.invalid_tool_calls) == (1, 1)
    assert "search_docs" in r.detail and "not a JSON object" in r.detail


@pytest.mark.parametrize(
    "calls",
    [
        {"index": 0},  # not a list
        [{"index": "0", "function": {"name": "f"}}],  # index not an integer
        [{"index": 0, "function": {"name": 3}}],  # name not a string
        [{"index": 0, "function": ["f"]}],  # function not an object
    ],
)
async def test_malformed_tool_call_deltas_are_a_stream_error(calls):
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": calls}}]}
    r = (await one(Server((200, sse(chunk, b"[DONE]"))))).record
    assert r.error == "stream" and "malformed" in r.detail


def test_tools_are_offered_only_when_there_are_some():
    assert "tools" not in chat_body(ClientOptions(model="m"), [], 5, None)
    assert "tools" not in chat_body(ClientOptions(model="m"), [], 5, None, ())
    assert chat_body(ClientOptions(model="m"), [], 5, None, ({"type": "function"},))["tools"] == [
        {"type": "function"}
    ]
