"""Several models behind one ``dyn frontend`` (issue 18 item 3), with real processes: mocker
workers of two models, a KV-routing frontend, the openai client. Each model is routed within its
own workers and has its own KV index, fed by its own workers' events; ``--served-model-name a b``
is given as vLLM takes it."""

from __future__ import annotations

import httpx
import pytest

from tests.waiting import poll_until

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
PROMPT = "An agent's long shared context: " + "the tool returned a result. " * 60


@pytest.fixture(scope="module")
def two_models(stack_factory):
    """The frontend's own model (alias ``tiny``) on one worker, model ``second`` (alias ``2nd``)
    on two; yields ``(stack, own worker ids, second's worker ids)``."""
    stack = stack_factory("models")
    stack.worker("--block-size", "16")
    stack.start_frontend("--router-mode", "kv", "--served-model-name", MODEL, "tiny")
    own = stack.wait_instances(1)
    stack.worker("--block-size", "16", "--served-model-name", "second", "2nd", count=2)
    everyone = stack.wait_instances(3)
    return stack, set(own), set(everyone) - set(own)


def _client(url: str):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)


def _complete(url: str, model: str) -> tuple[str, int, float]:
    """``(answering model, worker id, the router's predicted cached share)`` of ``PROMPT``."""
    reply = _client(url).completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=2,
        extra_body={"nvext": {"extra_fields": ["worker_id", "timing"]}},
    )
    nvext = reply.model_extra["nvext"]
    return reply.model, nvext["worker_id"]["decode_worker_id"], nvext["timing"]["kv_hit_rate"]


def test_models_lists_both_models_under_every_name(two_models):
    stack, _, _ = two_models
    listed = poll_until(
        lambda: (
            (ids := sorted(m.id for m in _client(stack.url).models.list().data))
            == ["2nd", MODEL, "second", "tiny"]
            and ids
        ),
        20,
        "both models and their aliases in /v1/models",
    )
    assert listed


def test_each_model_routes_within_its_workers_with_its_own_kv_index(two_models):
    stack, own, second = two_models
    model, worker, _ = _complete(stack.url, "tiny")
    assert (model, worker in own) == (MODEL, True)
    model, worker, hit = _complete(stack.url, "2nd")
    assert (model, worker in second, hit) == ("second", True, 0.0)  # cached on the other model only
    holder = worker
    poll_until(
        lambda: _complete(stack.url, "second")[2] > 0.8 or None,
        10,
        "the second model's router to index its worker's blocks",
    )
    assert _complete(stack.url, "second")[1] == holder


def test_a_model_no_worker_serves_is_a_404(two_models):
    stack, _, _ = two_models
    r = httpx.post(stack.url + "/v1/completions", json={"model": "third", "prompt": "hi"}, timeout=10)
    assert r.status_code == 404
    assert "'second'" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def lora_stack(stack_factory):
    """Mocker workers simulating adapters ``sql`` (both) and ``chat`` (one) of dyn-tiny."""
    stack = stack_factory("loras")
    stack.worker("--block-size", "16", "--lora-modules", "sql=/adapters/sql", "chat=/adapters/chat")
    stack.worker("--block-size", "16", "--lora-modules", "sql=/adapters/sql")
    stack.start_frontend("--router-mode", "kv")
    stack.wait_instances(2)
    return stack


def test_simulated_adapters_are_models_with_a_cache_of_their_own(lora_stack):
    url = lora_stack.url
    listed = poll_until(
        lambda: (
            {m.id: m.parent for m in _client(url).models.list().data}
            if len(_client(url).models.list().data) == 3
            else None
        ),
        20,
        "the adapters in /v1/models",
    )
    assert listed == {MODEL: None, "sql": MODEL, "chat": MODEL}
    assert _complete(url, "sql")[2] == 0.0
    poll_until(lambda: _complete(url, "sql")[2] > 0.8 or None, 10, "the adapter's blocks to be indexed")
    assert _complete(url, "chat")[2] == 0.0  # the same prompt under another adapter: other blocks
