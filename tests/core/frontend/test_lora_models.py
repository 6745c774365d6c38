"""LoRA adapters as models (issue 18 item 4), in-process over fake workers: each adapter a worker
advertises (``WorkerRecord.loras``) is listed in ``/v1/models`` with its base model as ``parent``
and its path as ``root`` (vLLM's ``serving_models.py`` lists adapters so), and a request naming it
goes to a worker that holds it, carrying the adapter's name to the engine and the router."""

from __future__ import annotations

import pytest

from tests.core.frontend.conftest import CHAT

pytestmark = pytest.mark.anyio

MODEL = "dyn-tiny"
LORAS = {2: {"loras": {"sql": "/adapters/sql"}}, 3: {"loras": {"sql": "/adapters/sql", "chat": "/a/chat"}}}


async def test_adapters_are_listed_with_their_base_model_as_parent(make_frontend):
    async with make_frontend(workers=3, records=LORAS) as fe:
        cards = {m["id"]: m for m in (await fe.client.get("/v1/models")).json()["data"]}
        assert sorted(cards) == ["chat", MODEL, "sql"]
        assert cards["sql"]["parent"] == MODEL and cards["sql"]["root"] == "/adapters/sql"
        assert cards[MODEL]["parent"] is None
        health = (await fe.client.get("/health")).json()
        assert health["instances"] == [1, 2, 3]  # once each, though workers 2 and 3 hold adapters


async def test_a_request_for_an_adapter_runs_on_a_worker_that_holds_it_with_its_name(make_frontend):
    async with make_frontend(workers=3, records=LORAS) as fe:
        for model, holders in (("sql", {2, 3}), ("chat", {3})):
            for _ in range(4):
                r = await fe.client.post("/v1/chat/completions", json={"model": model, "messages": CHAT})
                assert r.status_code == 200, r.text
                assert r.json()["model"] == model  # vLLM answers with the adapter's name
            ran = {w.instance_id for w in fe.fleet if any(q.lora_name == model for q in w.requests)}
            assert ran == holders
        before = len(fe.fleet.requests)
        base = await fe.client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert base.status_code == 200
        (new,) = [q for q in fe.fleet.requests if q.lora_name is None]
        assert len(fe.fleet.requests) == before + 1 and new.request_id


async def test_embeddings_with_an_adapter_are_refused(make_frontend):
    async with make_frontend(workers=3, records=LORAS) as fe:
        r = await fe.client.post("/v1/embeddings", json={"model": "sql", "input": "hi"})
        assert r.status_code == 400 and "LoRA adapter" in r.json()["error"]["message"]
