"""Several models behind one frontend (issue 18 item 3): the frontend serves its own model and
every model a worker registers, each request routed within its model's workers, under each of the
model's names (vLLM's ``--served-model-name a b``: any name is accepted, the first is the model's
own and is the ``model`` of every answer; vLLM 0.x ``serving_models.py`` lists one card per name).
"""

from __future__ import annotations

import anyio
import openai
import pytest

from tests.core.frontend.conftest import BASE_URL, CHAT

pytestmark = pytest.mark.anyio

MODEL = "dyn-tiny"
OTHER = {3: {"model_name": "other", "aliases": ["other-alias"]}, 4: {"model_name": "other"}}


def _openai(fe) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=BASE_URL + "/v1", api_key="unused", http_client=fe.client, max_retries=0
    )


async def _served(fe, model: str | None, count: int = 4) -> list[int]:
    """The instance ids that served ``count`` chat requests for ``model``."""
    before = {w.instance_id: len(w.requests) for w in fe.fleet}
    for _ in range(count):
        body = {"messages": CHAT, "max_tokens": 2, **({"model": model} if model else {})}
        r = await fe.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
    return sorted(w.instance_id for w in fe.fleet if len(w.requests) > before[w.instance_id])


async def test_models_lists_every_served_model_under_each_name(make_frontend):
    async with make_frontend(workers=4, records=OTHER, aliases=("tiny",)) as fe:
        models = await _openai(fe).models.list()
        assert sorted(m.id for m in models.data) == ["dyn-tiny", "other", "other-alias", "tiny"]
        health = (await fe.client.get("/health")).json()
        assert health["instances"] == [1, 2, 3, 4] and health["model"] == MODEL


async def test_each_request_routes_within_its_models_workers(make_frontend):
    async with make_frontend(workers=4, records=OTHER) as fe:
        assert await _served(fe, "other") == [3, 4]
        assert await _served(fe, "other-alias") == [3, 4]
        assert await _served(fe, MODEL) == [1, 2]
        assert await _served(fe, None) == [1, 2]  # no model: the frontend's own


async def test_an_answer_names_the_models_own_name_whichever_name_was_asked(make_frontend):
    async with make_frontend(workers=4, records=OTHER, aliases=("tiny",)) as fe:
        client = _openai(fe)
        for asked, named in (("tiny", MODEL), ("other-alias", "other"), ("other", "other")):
            reply = await client.chat.completions.create(model=asked, messages=CHAT, max_tokens=2)
            assert reply.model == named
            tokens = (await fe.client.post("/tokenize", json={"model": asked, "prompt": "hi"})).json()
            assert tokens["count"] > 0


async def test_a_model_nobody_serves_is_a_404_that_lists_the_served_ones(make_frontend):
    async with make_frontend(workers=4, records=OTHER) as fe:
        r = await fe.client.post("/v1/chat/completions", json={"model": "gpt-4", "messages": CHAT})
        assert r.status_code == 404
        error = r.json()["error"]
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert "'dyn-tiny'" in error["message"] and "'other'" in error["message"]
        assert r.headers["x-request-id"]


async def test_a_model_whose_directory_does_not_load_here_is_a_404_saying_why(make_frontend, tmp_path):
    records = {3: {"model_name": "elsewhere", "model_path": str(tmp_path / "not-here")}}
    async with make_frontend(workers=3, records=records) as fe:
        r = await fe.client.post("/v1/completions", json={"model": "elsewhere", "prompt": "hi"})
        assert r.status_code == 404
        message = r.json()["error"]["message"]
        assert "cannot serve it" in message and "not-here" in message and "no such directory" in message
        assert [m["id"] for m in (await fe.client.get("/v1/models")).json()["data"]] == [MODEL]
        assert await _served(fe, MODEL, 2) == [1, 2]


async def test_an_alias_that_names_another_model_is_ignored(make_frontend):
    records = {3: {"model_name": "other", "aliases": [MODEL, "fine"]}}
    async with make_frontend(workers=3, records=records) as fe:
        assert await _served(fe, MODEL) == [1, 2]
        assert await _served(fe, "fine") == [3]


async def test_a_model_is_listed_while_it_has_live_workers(make_frontend):
    async with make_frontend(workers=3, records={3: {"model_name": "other"}}) as fe:
        assert "other" in [m["id"] for m in (await fe.client.get("/v1/models")).json()["data"]]
        await fe.pool.store.delete(3)
        other = next(m for m in fe.app.models.models() if m.name == "other")
        for _ in range(200):
            if not len(other.pool):
                break
            await anyio.sleep(0.02)
        assert [m["id"] for m in (await fe.client.get("/v1/models")).json()["data"]] == [MODEL]


async def test_a_record_names_at_most_max_names_aliases(make_frontend):
    from dyn.core.model.names import MAX_NAMES

    many = [f"alias-{i}" for i in range(MAX_NAMES * 10)]
    async with make_frontend(workers=3, records={3: {"model_name": "other", "aliases": many}}) as fe:
        listed = [m["id"] for m in (await fe.client.get("/v1/models")).json()["data"]]
        assert len(listed) == 2 + MAX_NAMES and "alias-0" in listed and many[-1] not in listed
