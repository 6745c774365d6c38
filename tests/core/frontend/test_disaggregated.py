"""Disaggregated serving through the frontend (``dyn.core.router.disagg``, ``dyn.core.frontend.prefill``),
in-process over fake workers that keep the prefill/decode contract of ``dyn.core.messages.KvTransfer``:
the prefill request, the descriptor its worker answers with, the decode request that carries it,
both worker ids in ``nvext.worker_id``, the 503 for an empty pool, a prefill worker's failure, the
routing targets, and conditional disaggregation."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dyn.core.messages import GenerateRequest, KvTransfer, TokenChunk
from dyn.core.router.config import ConditionalDisagg, KvRouterConfig
from dyn.core.transport.request_plane import WorkerUnavailable
from tests.core.frontend.conftest import CHAT
from tests.core.frontend.fake_workers import DEFAULT_TEXT, Batch, finish, reply, token_ids

pytestmark = pytest.mark.anyio


def prefiller(instance_id: int) -> object:
    """A prefill worker: one token, then a ``Finish`` with its transfer descriptor."""

    async def script(request: GenerateRequest) -> AsyncIterator[Batch]:
        assert request.kv_transfer == KvTransfer(phase="prefill")
        yield [TokenChunk(request.request_id, token_ids("x")[:1])]
        done = finish(request, "length", 1)
        done.kv_transfer = KvTransfer("decode", instance_id, len(request.token_ids), '{"k": 1}')
        yield [done]

    return script


def dead(request: GenerateRequest) -> AsyncIterator[Batch]:
    """A worker whose connection is gone."""

    async def script() -> AsyncIterator[Batch]:
        raise WorkerUnavailable("worker went away")
        yield []

    return script()


def roles(**by_id: str) -> dict[int, dict[str, str]]:
    return {int(i[1:]): {"disaggregation_mode": mode} for i, mode in by_id.items()}


async def chat(fe, **extra):
    body = {"model": fe.app.service.model_name, "messages": CHAT, "max_tokens": 8, **extra}
    return await fe.client.post("/v1/chat/completions", json=body)


@pytest.mark.parametrize("mode", ["round-robin", "kv"])
async def test_prefill_then_decode_with_the_descriptor_and_both_ids(make_frontend, mode):
    async with make_frontend(workers=2, records=roles(w1="prefill", w2="decode"), router_mode=mode) as fe:
        fe.fleet[1].script = prefiller(1)
        response = await chat(fe, nvext={"extra_fields": ["worker_id", "timing"]})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["nvext"]["timing"]["kv_transfer_estimated_latency_ms"] >= 0
        (prefill,) = fe.fleet[1].requests
        assert prefill.stop.max_tokens == 1 and prefill.logprobs is None
        (decode,) = fe.fleet[2].requests
        assert decode.kv_transfer == KvTransfer("decode", 1, len(prefill.token_ids), '{"k": 1}')
        assert decode.token_ids == prefill.token_ids and decode.stop.max_tokens == 8
        assert body["choices"][0]["message"]["content"] == reply_text(8)
        ids = body["nvext"]["worker_id"]
        assert (ids["prefill_worker_id"], ids["decode_worker_id"]) == (1, 2)


def reply_text(tokens: int) -> str:
    from tests.core.frontend.fake_workers import first_tokens_text

    return first_tokens_text(DEFAULT_TEXT, tokens)


async def test_streamed_tokens_come_from_the_decode_worker(make_frontend):
    async with make_frontend(workers=2, records=roles(w1="prefill", w2="decode")) as fe:
        fe.fleet[1].script = prefiller(1)
        body = {"model": fe.app.service.model_name, "messages": CHAT, "max_tokens": 5, "stream": True}
        async with fe.client.stream("POST", "/v1/chat/completions", json=body) as response:
            text = "".join([line async for line in response.aiter_lines()])
        assert response.status_code == 200
        assert '"x"' not in text  # the prefill worker's token is dropped
        assert fe.fleet[2].requests[0].kv_transfer is not None


@pytest.mark.parametrize(("live", "empty"), [("prefill", "decode"), ("decode", "prefill")])
async def test_an_empty_pool_is_a_503_that_names_it(make_frontend, live, empty):
    async with make_frontend(workers=1, records=roles(w1=live)) as fe:
        response = await chat(fe)
        assert response.status_code == 503, response.text
        message = response.json()["error"]["message"]
        assert f"no {empty} worker is live" in message and f"--disaggregation-mode {empty}" in message
        assert "Retry-After" in response.headers
        # /health tells the truth: no request could be served (issue 31: it said healthy)
        health = await fe.client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        assert f"no {empty} worker is live" in health.json()["reason"]


async def test_with_conditional_disaggregation_an_empty_prefill_pool_is_degraded(make_frontend):
    """Short or cached prompts stay on their decode worker: requests are served, some refused."""
    config = KvRouterConfig(conditional_disagg=True)
    async with make_frontend(
        workers=1, records=roles(w1="decode"), router_mode="kv", router_config=config
    ) as fe:
        health = await fe.client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert "no live prefill worker" in health.json()["degraded"][0]


async def test_a_dead_prefill_worker_fails_over_to_another(make_frontend):
    async with make_frontend(workers=3, records=roles(w1="prefill", w2="decode", w3="prefill")) as fe:
        fe.fleet[1].script = prefiller(1)
        fe.fleet[3].script = dead
        for _ in range(2):  # one of the two lands on worker 3 first, whatever the rotation
            response = await chat(fe)
            assert response.status_code == 200, response.text
        assert fe.fleet[3].requests  # it was tried, and failed
        assert [r.kv_transfer.source_instance_id for r in fe.fleet[2].requests] == [1, 1]


async def test_without_a_working_prefill_worker_the_decode_worker_prefills(make_frontend):
    async with make_frontend(workers=2, records=roles(w1="prefill", w2="decode")) as fe:
        fe.fleet[1].script = dead
        response = await chat(fe, nvext={"extra_fields": ["worker_id"]})
        assert response.status_code == 200, response.text
        (decode,) = fe.fleet[2].requests
        assert decode.kv_transfer is None  # prefilled locally: nothing was lost
        ids = response.json()["nvext"]["worker_id"]
        assert ids["prefill_worker_id"] == ids["decode_worker_id"] == 2


async def test_a_prefill_worker_without_a_descriptor_is_treated_as_failed(make_frontend):
    async with make_frontend(workers=2, records=roles(w1="prefill", w2="decode")) as fe:
        fe.fleet[1].script = reply()  # serves the request whole, no KvTransfer
        response = await chat(fe)
        assert response.status_code == 200, response.text
        assert fe.fleet[2].requests[0].kv_transfer is None


async def test_named_prefill_and_decode_workers(make_frontend):
    records = roles(w1="prefill", w2="decode", w3="prefill", w4="decode")
    async with make_frontend(workers=4, records=records) as fe:
        for i in (1, 3):
            fe.fleet[i].script = prefiller(i)
        for _ in range(2):
            response = await fe.client.post(
                "/v1/chat/completions",
                json={"model": fe.app.service.model_name, "messages": CHAT, "max_tokens": 2},
                headers={"x-prefill-instance-id": "3", "x-worker-instance-id": "4"},
            )
            assert response.status_code == 200, response.text
        assert len(fe.fleet[3].requests) == len(fe.fleet[4].requests) == 2
        assert not fe.fleet[1].requests and not fe.fleet[2].requests
        response = await chat(fe, nvext={"prefill_worker_id": 2})  # a decode worker
        assert response.status_code == 404, response.text


async def test_a_prefill_worker_named_for_an_aggregated_model_is_a_400(make_frontend):
    async with make_frontend(workers=1) as fe:
        response = await chat(fe, nvext={"prefill_worker_id": 1})
        assert response.status_code == 400
        assert "no disaggregated workers" in response.json()["error"]["message"]


async def test_conditional_disaggregation_keeps_short_prompts_on_the_decode_worker(make_frontend):
    config = KvRouterConfig(
        conditional_disagg=True,
        conditional_disagg_config=ConditionalDisagg(eff_isl_threshold=64, eff_isl_ratio_threshold=1.01),
    )
    async with make_frontend(
        workers=2, records=roles(w1="prefill", w2="decode"), router_mode="kv", router_config=config
    ) as fe:
        fe.fleet[1].script = prefiller(1)
        assert (await chat(fe)).status_code == 200  # a short prompt: prefilled where it decodes
        assert not fe.fleet[1].requests and fe.fleet[2].requests[-1].kv_transfer is None
        long_chat = [{"role": "user", "content": "word " * 200}]
        assert (await chat(fe, messages=long_chat)).status_code == 200
        assert len(fe.fleet[1].requests) == 1 and fe.fleet[2].requests[-1].kv_transfer is not None
        counted = "dyn_router_disaggregated_requests_total"
        assert fe.metric(counted, 'prefill="local"') == fe.metric(counted, 'prefill="remote"') == 1
        assert 'worker_id="1",worker_type="prefill"' in fe.app.service.metrics.render().decode()


async def test_an_aggregated_model_is_routed_as_before(make_frontend):
    async with make_frontend(workers=2) as fe:
        response = await chat(fe, nvext={"extra_fields": ["worker_id"]})
        assert response.status_code == 200
        (request,) = fe.fleet.requests
        assert request.kv_transfer is None
        ids = response.json()["nvext"]["worker_id"]
        assert ids["prefill_worker_id"] == ids["decode_worker_id"]
