"""What the frontend answers over HTTP when it serves: the read-only endpoints, SSE framing, unary
bodies, worker failures, routing headers, ``max_inflight`` admission and client disconnects, in
process over fake workers (``conftest.py``) whose replies are scripted token ids of dyn's
embedded ``dyn-tiny``.

The shapes are OpenAI's (API reference, "Chat Completions" and "Completions", the streaming
``chat.completion.chunk`` events ending with ``data: [DONE]``), as vLLM serves them
(vllm/entrypoints/openai/chat_completion/serving.py); the metric names are Dynamo's
``dynamo_frontend_*`` (ai-dynamo/dynamo lib/llm/src/http/service/metrics.rs); ``/health`` lists the
live instances as Dynamo's frontend does, 503 with none. End-to-end smokes of the same paths,
with real processes, stay in tests/integration/.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
import httpx
import openai
import pytest

from dyn.core.messages import GenerateRequest, TokenChunk
from dyn.core.router.config import KvRouterConfig
from tests.core.frontend.conftest import asgi_call
from tests.core.frontend.fake_workers import (
    DEFAULT_TEXT,
    Batch,
    Script,
    endless,
    failing,
    finish,
    first_tokens_text,
    held,
    token_ids,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio

MODEL = "dyn-tiny"
HI = [{"role": "user", "content": "hi"}]
CHAT = {"model": MODEL, "messages": HI, "max_tokens": 50}


def sse_events(r: httpx.Response) -> list[str]:
    """The ``data:`` payloads of an SSE body, checking its framing: every event is one ``data:``
    line followed by a blank line, the last one ``[DONE]``."""
    assert r.headers["content-type"].startswith("text/event-stream"), r.headers
    text = r.text
    assert text.endswith("\n\n"), text[-200:]
    events = text[:-2].split("\n\n")
    for event in events:
        assert event.startswith("data: ") and "\n" not in event, event
    payloads = [e[6:] for e in events]
    assert payloads[-1] == "[DONE]"
    return payloads


# --------------------------------------------------------------------------- read-only endpoints


async def test_models_lists_the_served_model(frontend):
    client = openai.AsyncOpenAI(
        base_url=str(frontend.client.base_url) + "/v1",
        api_key="unused",
        http_client=frontend.client,
        max_retries=0,
    )
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].max_model_len == 131072  # dyn-tiny's context


async def test_health_lists_live_instances_and_live_always_answers(frontend, make_frontend):
    r = await frontend.client.get("/health")
    assert r.status_code == 200
    assert r.json() == {
        "status": "healthy",
        "model": MODEL,
        "models": [MODEL],
        "router_mode": "round-robin",
        "workers": 2,
        "instances": [1, 2],
    }
    async with make_frontend(workers=0) as empty:
        r = await empty.client.get("/health")
        assert r.status_code == 503 and r.json()["instances"] == [] and r.json()["status"] == "unhealthy"
        assert r.json()["reason"] == f"no live worker serves model {MODEL!r}" and r.json()["workers"] == 0
        assert (await empty.client.get("/live")).json() == {"status": "live"}
        head = await empty.client.head("/live")
        assert head.status_code == 200 and head.content == b""


async def test_openapi_describes_the_api(frontend):
    doc = (await frontend.client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"} <= set(
        doc["paths"]
    )
    assert "ChatCompletionRequest" in doc["components"]["schemas"]


async def test_metrics_use_dynamo_names(frontend):
    r = await frontend.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "count", "max_tokens": 2}
    )
    assert r.status_code == 200
    m = await frontend.client.get("/metrics")
    assert m.headers["content-type"].startswith("text/plain")
    for name in (
        "dynamo_frontend_time_to_first_token_seconds_bucket",
        "dynamo_frontend_inter_token_latency_seconds_bucket",
        "dynamo_frontend_request_duration_seconds_count",
        "dynamo_frontend_input_sequence_tokens_sum",
        "dynamo_frontend_output_sequence_tokens_sum",
        "dynamo_frontend_requests_total{",
        "dynamo_frontend_active_requests{",
    ):
        assert name in m.text, name
    assert 'model="dyn-tiny"' in m.text and 'status="success"' in m.text
    assert frontend.metric("dynamo_frontend_output_sequence_tokens_sum") == 2


# --------------------------------------------------------------------------- responses


async def test_a_chat_stream_is_framed_as_sse_and_ends_with_done(frontend):
    r = await frontend.client.post(
        "/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert r.status_code == 200 and r.headers["cache-control"] == "no-cache"
    payloads = sse_events(r)
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == DEFAULT_TEXT
    finals = [
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert finals == ["stop"]
    usage = chunks[-1]
    assert usage["choices"] == []
    (request,) = frontend.fleet.requests
    prompt, completion = len(request.token_ids), len(token_ids(DEFAULT_TEXT))
    assert usage["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def batched(*sizes: int) -> Script:
    """Answer with DEFAULT_TEXT's tokens in batches of ``sizes`` tokens, the ``Finish`` in the last."""
    ids = token_ids(DEFAULT_TEXT)

    async def script(request: GenerateRequest) -> AsyncIterator[Batch]:
        at = 0
        for n in sizes[:-1]:
            yield [TokenChunk(request.request_id, ids[at : at + n])]
            at += n
        yield [TokenChunk(request.request_id, ids[at:]), finish(request, "stop", len(ids))]

    return script


@pytest.mark.parametrize(
    "sizes, writes",
    [
        ((len(token_ids(DEFAULT_TEXT)),), [["role", "text", "finish", "usage", "[DONE]"]]),
        ((1, 2, 3), [["role", "text"], ["text"], ["text", "finish", "usage", "[DONE]"]]),
    ],
)
async def test_a_stream_writes_its_events_with_the_tokens_they_wait_for(make_frontend, sizes, writes):
    """The role event goes out with the first text; text from the batch that carries the
    ``Finish`` goes out with the final event, the usage and ``[DONE]``: one write each."""
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with make_frontend(workers=1, script=batched(*sizes)) as fe:
        sent = await asgi_call(fe.app, "POST", "/v1/chat/completions", json.dumps(body).encode())
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    bodies = [m for m in sent[1:] if m["body"]]
    assert [m.get("more_body", False) for m in bodies] == [True] * (len(writes) - 1) + [False]

    def kind(payload: str) -> str:
        if payload == "[DONE]":
            return payload
        choices = json.loads(payload)["choices"]
        if not choices:
            return "usage"
        delta = choices[0]["delta"]
        return "role" if "role" in delta else "finish" if choices[0]["finish_reason"] else "text"

    events = [[kind(e.removeprefix("data: ")) for e in m["body"].decode().split("\n\n") if e] for m in bodies]
    assert events == writes
    text = "".join(
        json.loads(e.removeprefix("data: "))["choices"][0]["delta"].get("content", "")
        for m in bodies
        for e in m["body"].decode().split("\n\n")
        if e.startswith("data: {") and json.loads(e.removeprefix("data: "))["choices"]
    )
    assert text == DEFAULT_TEXT


async def test_a_unary_chat_answer_has_the_text_and_usage(frontend):
    r = await frontend.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == first_tokens_text(DEFAULT_TEXT, 3)
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 3


async def test_a_completions_stream_with_n_ends_every_choice(frontend):
    r = await frontend.client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "import os", "max_tokens": 5, "n": 2, "stream": True},
    )
    chunks = [json.loads(p) for p in sse_events(r)[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    finished = {c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]}
    assert finished == {0, 1}
    assert len(frontend.fleet.requests) == 2


async def test_round_robin_spreads_requests_and_a_named_worker_gets_them(frontend):
    for _ in range(4):
        assert (await frontend.client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert [len(w.requests) for w in frontend.fleet] == [2, 2]
    r = await frontend.client.post("/v1/chat/completions", json=CHAT, headers={"x-worker-instance-id": "2"})
    assert r.status_code == 200 and len(frontend.fleet[2].requests) == 3
    r = await frontend.client.post("/v1/chat/completions", json={**CHAT, "nvext": {"backend_instance_id": 1}})
    assert r.status_code == 200 and len(frontend.fleet[1].requests) == 3


async def test_an_unknown_worker_instance_is_404(frontend):
    r = await frontend.client.post(
        "/v1/chat/completions", json=CHAT, headers={"x-worker-instance-id": "12345"}
    )
    assert r.status_code == 404, r.text
    assert frontend.fleet.requests == []


@pytest.mark.parametrize("stream", [False, True])
async def test_no_workers_is_503_with_retry_after(make_frontend, stream):
    async with make_frontend(workers=0) as fe:
        r = await fe.client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1" and "no worker" in r.json()["error"]["message"]


async def test_direct_routing_needs_a_target_that_exists(make_frontend):
    async with make_frontend(workers=1, router_mode="direct") as fe:
        r = await fe.client.post("/v1/chat/completions", json=CHAT, headers={"x-worker-instance-id": "9"})
        assert r.status_code == 404, r.text
        r = await fe.client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "nvext.backend_instance_id"
        r = await fe.client.post("/v1/chat/completions", json=CHAT, headers={"x-worker-instance-id": "1"})
        assert r.status_code == 200 and len(fe.fleet[1].requests) == 1


@pytest.mark.parametrize("code, status", [("engine_error", 500), ("bad_request", 400)])
async def test_a_worker_error_is_an_openai_error_unary_and_an_error_event_streamed(frontend, code, status):
    frontend.fleet.script_all(failing(code, "the engine says no"))
    r = await frontend.client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == status, r.text
    assert "the engine says no" in r.json()["error"]["message"]
    r = await frontend.client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 200  # the stream had started: the error is its last event
    payloads = sse_events(r)
    assert "the engine says no" in json.loads(payloads[-2])["error"]["message"]


# --------------------------------------------------------------------------- admission and disconnects


async def test_beyond_max_inflight_a_request_is_503_at_once_and_counted(make_frontend):
    release = anyio.Event()
    async with make_frontend(workers=1, max_inflight=2, script=held(release)) as fe:
        answers: list[httpx.Response] = []

        async def ask() -> None:
            answers.append(await fe.client.post("/v1/chat/completions", json=CHAT))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            tg.start_soon(ask)
            await wait_until(lambda: fe.fleet[1].in_flight == 2, 10, "two requests in flight")
            r = await fe.client.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
            assert "--max-inflight" in r.json()["error"]["message"]
            assert fe.metric("dynamo_frontend_requests_rejected_total", 'reason="max_inflight"') == 1
            assert len(fe.fleet[1].requests) == 2
            release.set()
        assert [a.status_code for a in answers] == [200, 200]
        assert (await fe.client.post("/v1/chat/completions", json=CHAT)).status_code == 200


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": HI, "stream": True}),
        ("/v1/completions", {"model": MODEL, "prompt": "stream forever", "stream": True, "n": 2}),
    ],
)
async def test_a_client_that_leaves_mid_stream_cancels_its_engine_requests(make_frontend, path, body):
    async with make_frontend(workers=2, script=endless()) as fe:
        sent = await asgi_call(
            fe.app,
            "POST",
            path,
            json.dumps(body).encode(),
            [(b"x-request-id", b"walk-away")],
            leave_after=lambda sent: len(sent) >= 4,
        )
        assert sent[0]["status"] == 200
        cancelled = sorted(fe.fleet.cancelled)
        assert cancelled == sorted(r.request_id for r in fe.fleet.requests) and cancelled
        assert all(rid.startswith("walk-away") for rid in cancelled)
        assert all(w.in_flight == 0 for w in fe.fleet)
        assert fe.metric("dynamo_frontend_client_disconnects_total") == 1


async def test_a_client_that_leaves_a_unary_request_cancels_it(make_frontend):
    async with make_frontend(workers=1, script=endless()) as fe:
        leave = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: asgi_call(
                    fe.app,
                    "POST",
                    "/v1/chat/completions",
                    json.dumps({"model": MODEL, "messages": HI}).encode(),
                    leave=leave,
                )
            )
            await wait_until(lambda: fe.fleet[1].in_flight == 1, 10, "the request to reach its worker")
            leave.set()
        assert fe.fleet.cancelled == [fe.fleet.requests[0].request_id]
        assert fe.metric("dynamo_frontend_client_disconnects_total") == 1


async def test_a_client_that_leaves_while_queued_leaves_the_router_queue(make_frontend):
    """A KV router that queues every request while its one worker has any prefill in flight
    (threshold 0.0001 of its batch budget): the blocker is never answered (a held worker), the
    second request queues, and its client leaving takes it out of the queue."""
    queued = "dynamo_frontend_router_queue_pending_requests"
    config = KvRouterConfig(queue_threshold=0.0001, unstarted_booking_secs=None)
    async with make_frontend(
        workers=1, router_mode="kv", router_config=config, script=held(anyio.Event())
    ) as fe:
        leave_blocker, leave_waiter = anyio.Event(), anyio.Event()
        blocker = json.dumps({"model": MODEL, "prompt": [7] * 1000, "max_tokens": 1, "stream": True}).encode()
        waiter = json.dumps({"model": MODEL, "prompt": [9] * 50, "max_tokens": 1}).encode()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: asgi_call(fe.app, "POST", "/v1/completions", blocker, leave=leave_blocker))
            await wait_until(lambda: fe.fleet[1].in_flight == 1, 10, "the blocker to reach its worker")
            tg.start_soon(lambda: asgi_call(fe.app, "POST", "/v1/completions", waiter, leave=leave_waiter))
            await wait_until(lambda: fe.metric(queued) == 1, 10, "the second request to queue")
            leave_waiter.set()
            await wait_until(lambda: fe.metric(queued) == 0, 3, "the queued request to leave the queue")
            assert len(fe.fleet[1].requests) == 1  # the waiter never reached the worker
            leave_blocker.set()
        assert fe.metric("dynamo_frontend_client_disconnects_total") == 2
