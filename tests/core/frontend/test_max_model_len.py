"""A worker's --max-model-len at the frontend: the model is served with the smallest context its live
workers advertise (``WorkerRecord.context_length``) when that is below the model's own, so a request
over it is a 400 in vLLM's words before it is routed, and /v1/models and /tokenize report it; when
that worker leaves, the model's own context is back."""

from __future__ import annotations

import pytest

from dyn.core.frontend.limits import RequestLimits
from dyn.core.frontend.preprocessor import Preprocessor
from dyn.core.model.info import load_model_info
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio
MODEL = "dyn-tiny"
OWN = load_model_info(None, None).context_length


def test_cap_context_takes_the_smaller_and_lifts_with_none() -> None:
    info = load_model_info(None, None)
    pre = Preprocessor(info, limits=RequestLimits())
    pre.cap_context(1024)
    assert pre.info.context_length == 1024 and pre.model_info is info
    assert (pre.info.name, pre.info.vocab_size) == (info.name, info.vocab_size)
    pre.cap_context(OWN * 2)  # above the model's own: the model's own
    assert pre.info.context_length == OWN
    pre.cap_context(512)
    pre.cap_context(None)
    assert pre.info is info


async def _max_model_len(fe) -> int:
    r = await fe.client.get("/v1/models")
    return r.json()["data"][0]["max_model_len"]


async def test_the_smallest_advertised_context_is_served(make_frontend):
    records = {1: {"context_length": 1024}, 2: {"context_length": 4096}}
    async with make_frontend(workers=2, records=records) as fe:
        await wait_until(lambda: len(fe.pool) == 2, 10, "both workers")
        assert await _max_model_len(fe) == 1024
        over = await fe.client.post(
            "/v1/completions", json={"model": MODEL, "prompt": [5] * 1000, "max_tokens": 100}
        )
        assert over.status_code == 400
        error = over.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert error["message"].startswith(
            "This model's maximum context length is 1024 tokens. However, you requested 1100 tokens "
            "(1000 in the messages, 100 in the completion)."
        )
        assert not fe.fleet.requests  # refused before it was routed
        fits = await fe.client.post(
            "/v1/completions", json={"model": MODEL, "prompt": [5] * 900, "max_tokens": 100}
        )
        assert fits.status_code == 200, fits.text
        tokenized = await fe.client.post("/tokenize", json={"model": MODEL, "prompt": "hi"})
        assert tokenized.json()["max_model_len"] == 1024

        await fe.pool.store.delete(1)
        await wait_until(lambda: len(fe.pool) == 1, 10, "worker 1 gone")
        assert await _max_model_len(fe) == 4096
        await fe.pool.store.delete(2)
        await wait_until(lambda: len(fe.pool) == 0, 10, "every worker gone")
        assert await _max_model_len(fe) == OWN


async def test_workers_that_advertise_no_context_leave_the_models_own(make_frontend):
    async with make_frontend(workers=2) as fe:
        await wait_until(lambda: len(fe.pool) == 2, 10, "both workers")
        assert await _max_model_len(fe) == OWN
