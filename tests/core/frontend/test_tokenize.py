"""``POST /tokenize`` and ``POST /detokenize`` in-process, with vLLM's shapes.

The request and response shapes follow vLLM's ``entrypoints/openai/protocol.py``
(``TokenizeCompletionRequest``, ``TokenizeChatRequest``, ``TokenizeResponse``,
``DetokenizeRequest``, ``DetokenizeResponse``) and ``serving_tokenization.py``; the model is dyn's
embedded ``dyn-tiny`` (its tokenizer and chat template).
"""

from __future__ import annotations

import pytest

from tests.core.frontend.conftest import CHAT as MESSAGES

pytestmark = pytest.mark.anyio


async def test_tokenize_a_prompt_returns_vllms_fields(frontend, tokenizer):
    r = await frontend.client.post("/tokenize", json={"prompt": "Hello, world"})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = tokenizer.encode("Hello, world", add_special_tokens=True)
    info = frontend.app.service.preprocessor.info
    assert body == {
        "count": len(expected),
        "max_model_len": info.context_length,
        "tokens": expected,
        "token_strs": None,
    }
    r = await frontend.client.post(
        "/tokenize", json={"prompt": "Hello, world", "add_special_tokens": False, "return_token_strs": True}
    )
    body = r.json()
    plain = tokenizer.encode("Hello, world", add_special_tokens=False)
    assert body["tokens"] == plain
    assert body["token_strs"] == [tokenizer.id_to_token(t) for t in plain]


async def test_tokenize_messages_equals_the_prompt_a_chat_completion_sends(frontend):
    r = await frontend.client.post("/tokenize", json={"messages": MESSAGES})
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    chat = await frontend.client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4})
    assert chat.status_code == 200, chat.text
    assert frontend.fleet.requests[-1].token_ids == tokens
    assert chat.json()["usage"]["prompt_tokens"] == r.json()["count"] == len(tokens)


async def test_tokenize_messages_follows_the_template_options(frontend):
    async def tokens(**fields) -> list[int]:
        r = await frontend.client.post("/tokenize", json={"messages": MESSAGES, **fields})
        assert r.status_code == 200, r.text
        return r.json()["tokens"]

    with_prompt = await tokens()
    without = await tokens(add_generation_prompt=False)
    assert with_prompt != without and with_prompt[: len(without)] == without
    r = await frontend.client.post(
        "/tokenize",
        json={"messages": MESSAGES, "add_generation_prompt": True, "continue_final_message": True},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": "a", "messages": MESSAGES}, "messages"),
        ({"messages": []}, "messages"),
        ({"prompt": 5}, "prompt"),
        ({"messages": MESSAGES, "chat_template": "{{ 1 }}"}, "chat_template"),
        ({"prompt": "a", "model": "not-served"}, "model"),
    ],
)
async def test_tokenize_refuses_malformed_requests_naming_the_field(frontend, body, param):
    r = await frontend.client.post("/tokenize", json=body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param


async def test_tokenize_is_bounded_by_max_prompt_bytes(make_frontend):
    async with make_frontend(limits=_limits(max_prompt_bytes=64)) as fe:
        r = await fe.client.post("/tokenize", json={"prompt": "x" * 65})
        assert r.status_code == 400 and "--max-prompt-bytes" in r.json()["error"]["message"]
        r = await fe.client.post("/tokenize", json={"messages": [{"role": "user", "content": "x" * 80}]})
        assert r.status_code == 400 and "--max-prompt-bytes" in r.json()["error"]["message"]


async def test_detokenize_round_trips_and_keeps_special_tokens(frontend, tokenizer):
    ids = tokenizer.encode("Hello, world", add_special_tokens=True)
    r = await frontend.client.post("/detokenize", json={"tokens": ids})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": tokenizer.decode(ids, skip_special_tokens=False)}
    eos = tokenizer.token_to_id(tokenizer.eos_token)
    r = await frontend.client.post("/detokenize", json={"tokens": [eos]})
    assert r.json()["prompt"] == tokenizer.eos_token


@pytest.mark.parametrize("field", ["vocab", "negative", "too_many"])
async def test_detokenize_refuses_ids_outside_the_vocabulary_or_context(frontend, field):
    info = frontend.app.service.preprocessor.info
    tokens = {
        "vocab": [1, info.vocab_size],
        "negative": [-1],
        "too_many": [1] * (info.context_length + 1),
    }[field]
    r = await frontend.client.post("/detokenize", json={"tokens": tokens})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("tokens")


async def test_tokenize_needs_json_and_post(frontend):
    r = await frontend.client.post("/tokenize", content=b"prompt=a")
    assert r.status_code == 415
    r = await frontend.client.get("/detokenize")
    assert r.status_code == 405


async def test_the_api_key_covers_both_endpoints(make_frontend):
    async with make_frontend(api_key="sekrit") as fe:
        for path, body in (("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [1]})):
            r = await fe.client.post(path, json=body)
            assert r.status_code == 401
            r = await fe.client.post(path, json=body, headers={"Authorization": "Bearer sekrit"})
            assert r.status_code == 200, r.text


def _limits(**fields):
    from dyn.core.frontend.limits import RequestLimits

    return RequestLimits(**fields)
