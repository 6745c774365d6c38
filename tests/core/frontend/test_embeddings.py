"""``POST /v1/embeddings`` in-process: shapes, bounds and routing over fake workers.

The request and response shapes follow OpenAI's embeddings reference (input as a string, strings,
token ids or lists of them; ``encoding_format`` float | base64; ``dimensions``; ``usage`` with
``prompt_tokens`` and ``total_tokens``) and vLLM's extras as its
``vllm/entrypoints/pooling/embed/protocol.py`` and ``pooling/base/protocol.py`` (0.32) declare them
(``messages``, ``truncate_prompt_tokens``, ``add_special_tokens``, ``endianness``); the
Matryoshka refusal's wording is vLLM's ``PoolingParams`` check (``vllm/pooling_params.py``). The
model is dyn's embedded ``dyn-tiny``; the fake workers answer ``fake_vector(ids)`` per input.
"""

from __future__ import annotations

import base64
import struct

import pytest

from dyn.core.engine import FEATURE_EMBED, FEATURE_POOLING_ONLY
from dyn.core.frontend.limits import RequestLimits
from dyn.core.messages import ErrorReply
from dyn.core.protocol.embeddings import MAX_EMBED_TOKENS
from tests.core.frontend.conftest import CHAT as MESSAGES
from tests.core.frontend.fake_workers import fake_vector

pytestmark = pytest.mark.anyio

EMBED = [FEATURE_EMBED]
POOLING = [FEATURE_EMBED, FEATURE_POOLING_ONLY]


async def post(fe, body: dict):
    return await fe.client.post("/v1/embeddings", json=body)


async def test_a_string_is_tokenized_as_a_prompt_and_embedded_once(make_frontend, tokenizer):
    async with make_frontend(workers=1, features={1: POOLING}) as fe:
        r = await post(fe, {"input": "Hello, world", "model": "dyn-tiny", "user": "u-1"})
        assert r.status_code == 200, r.text
        body = r.json()
        ids = tokenizer.encode("Hello, world", add_special_tokens=True)
        assert fe.fleet[1].embeds[-1].prompts == [ids]
        assert body["object"] == "list" and body["model"] == "dyn-tiny"
        assert body["id"].startswith("embd-") and isinstance(body["created"], int)
        assert body["data"] == [{"index": 0, "embedding": fake_vector(ids), "object": "embedding"}]
        assert body["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids)}


async def test_every_input_shape_gives_one_vector_per_input_in_order(make_frontend, tokenizer):
    texts = ["one", "two words", "three words here"]
    ids = [tokenizer.encode(t, add_special_tokens=True) for t in texts]
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        cases = [
            (texts, ids),
            ([5, 6, 7], [[5, 6, 7]]),
            ([[5, 6], [7], [8, 9, 10]], [[5, 6], [7], [8, 9, 10]]),
        ]
        for value, expected in cases:
            r = await post(fe, {"input": value})
            assert r.status_code == 200, (value, r.text)
            data = r.json()["data"]
            assert [d["index"] for d in data] == list(range(len(expected)))
            assert [d["embedding"] for d in data] == [fake_vector(e) for e in expected]
            assert r.json()["usage"]["prompt_tokens"] == sum(len(e) for e in expected)
            assert fe.fleet[1].embeds[-1].prompts == expected  # all inputs in one request
        r = await post(fe, {"input": "plain", "add_special_tokens": False})
        assert fe.fleet[1].embeds[-1].prompts == [tokenizer.encode("plain", add_special_tokens=False)]


async def test_base64_is_float32_in_native_order_and_endianness_is_honoured(make_frontend):
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        r = await post(fe, {"input": [3, 4, 5], "encoding_format": "base64"})
        assert r.status_code == 200, r.text
        raw = base64.b64decode(r.json()["data"][0]["embedding"])
        assert list(struct.unpack("<4f", raw)) == fake_vector([3, 4, 5])  # every CI host is little-endian
        r = await post(fe, {"input": [3, 4, 5], "encoding_format": "base64", "endianness": "big"})
        raw = base64.b64decode(r.json()["data"][0]["embedding"])
        assert list(struct.unpack(">4f", raw)) == fake_vector([3, 4, 5])


async def test_messages_are_rendered_as_tokenize_renders_them_without_a_generation_prompt(make_frontend):
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        tok = await fe.client.post("/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False})
        expected = tok.json()["tokens"]
        r = await post(fe, {"messages": MESSAGES})
        assert r.status_code == 200, r.text
        assert fe.fleet[1].embeds[-1].prompts == [expected]
        assert len(r.json()["data"]) == 1
        # vLLM 0.32 also reads one conversation given as `input`
        r = await post(fe, {"input": MESSAGES})
        assert r.status_code == 200, r.text
        assert fe.fleet[1].embeds[-1].prompts == [expected]
        with_prompt = await fe.client.post("/tokenize", json={"messages": MESSAGES})
        r = await post(fe, {"messages": MESSAGES, "add_generation_prompt": True})
        assert fe.fleet[1].embeds[-1].prompts == [with_prompt.json()["tokens"]] != [expected]


async def test_truncate_prompt_tokens_keeps_the_last_tokens_as_vllm(make_frontend):
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        r = await post(fe, {"input": [[1, 2, 3, 4, 5], [6, 7]], "truncate_prompt_tokens": 3})
        assert r.status_code == 200, r.text
        assert fe.fleet[1].embeds[-1].prompts == [[3, 4, 5], [6, 7]]
        r = await post(
            fe, {"input": [1, 2, 3, 4, 5], "truncate_prompt_tokens": 2, "truncation_side": "right"}
        )
        assert fe.fleet[1].embeds[-1].prompts == [[1, 2]]
        context = fe.app.service.preprocessor.info.context_length
        r = await post(fe, {"input": list(range(1, 11)) * (context // 10 + 1), "truncate_prompt_tokens": -1})
        assert r.status_code == 200, r.text
        assert len(fe.fleet[1].embeds[-1].prompts[0]) == context
        r = await post(fe, {"input": [1, 2], "truncate_prompt_tokens": context + 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"
        assert "cannot be greater than max_model_len" in r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/embeddings", "/pooling"])
async def test_use_activation_false_asks_the_worker_for_the_output_before_its_activation(make_frontend, path):
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        plain = await fe.client.post(path, json={"model": "dyn-tiny", "input": "x"})
        raw = await fe.client.post(path, json={"model": "dyn-tiny", "input": "x", "use_activation": False})
        asked = fe.fleet[1].embeds
    assert plain.status_code == raw.status_code == 200, raw.text
    assert [a.activation for a in asked] == [True, False]


@pytest.mark.parametrize(
    "body,param,words",
    [
        ({"input": "x", "dimensions": 64}, "dimensions", "does not support Matryoshka"),
        ({}, "input", "either 'input'"),
        ({"input": "x", "messages": MESSAGES}, "input", "either 'input'"),
        ({"input": []}, "input", "empty list"),
        ({"input": ""}, "input", "empty string"),
        ({"input": ["a", ""]}, "input[1]", "empty string"),
        ({"input": [[1], []]}, "input[1]", "no token ids"),
        ({"input": ["a", [1]]}, "input[1]", "wrong shape"),
        ({"input": [[1], [2, "x"]]}, "input[1]", "wrong shape"),
        ({"input": [1, 99999]}, "input[1]", "not in the vocabulary"),
        ({"input": [[1], [2, 99999]]}, "input[1][1]", "not in the vocabulary"),
        ({"input": "x", "encoding_format": "binary"}, "encoding_format", ""),
        ({"input": "x", "embed_dtype": "float16"}, "embed_dtype", ""),
        ({"input": "x", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens", ""),
        ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "embed nothing"),
        ({"messages": []}, None, ""),
        ({"messages": [[None, None]]}, "messages[0]", ""),
        ({"input": [{"role": "user", "content": "hi"}, [1]]}, "input[0]", "wrong shape"),
        ({"messages": MESSAGES, "add_generation_prompt": True, "continue_final_message": True}, None, ""),
    ],
)
async def test_bad_requests_are_400s_that_name_the_field(make_frontend, body, param, words):
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        r = await post(fe, body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        if param is not None:
            assert error["param"] == param, error
        assert words in error["message"]
        assert fe.fleet[1].embeds == []


async def test_every_input_is_bounded_by_count_context_bytes_and_total_tokens(make_frontend):
    async with make_frontend(
        workers=1, features={1: EMBED}, limits=RequestLimits(max_prompts=4, max_prompt_bytes=64)
    ) as fe:
        r = await post(fe, {"input": [[1]] * 5})
        assert r.status_code == 400 and "--max-prompts" in r.json()["error"]["message"]
        r = await post(fe, {"input": ["x" * 40, "y" * 40]})
        assert r.status_code == 400 and "--max-prompt-bytes" in r.json()["error"]["message"]
        context = fe.app.service.preprocessor.info.context_length
        r = await post(fe, {"input": [[1], [1] * (context + 1)]})
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "input[1]"
        assert error["code"] == "context_length_exceeded" and "truncate_prompt_tokens" in error["message"]
        assert fe.fleet[1].embeds == []
    per_input = MAX_EMBED_TOKENS // 40 + 1
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        r = await post(fe, {"input": [[1] * per_input] * 40})
        assert r.status_code == 400 and "split the inputs" in r.json()["error"]["message"]
        assert fe.fleet[1].embeds == []


async def test_the_model_is_checked_like_every_endpoint(make_frontend):
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        r = await post(fe, {"input": "x", "model": "gpt-4"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


async def test_only_workers_that_embed_get_embeddings_least_busy_first(make_frontend):
    async with make_frontend(workers=3, features={2: EMBED, 3: EMBED}) as fe:
        for _ in range(6):
            r = await post(fe, {"input": "x"})
            assert r.status_code == 200, r.text
        assert fe.fleet[1].embeds == []
        assert len(fe.fleet[2].embeds) == len(fe.fleet[3].embeds) == 3  # idle workers taken in turn


async def test_generate_only_workers_answer_404_and_no_worker_503(make_frontend):
    async with make_frontend(workers=2) as fe:
        r = await post(fe, {"input": "x"})
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert (
            "does not support the Embeddings API" in error["message"]
            and "--runner pooling" in error["message"]
        )
    async with make_frontend(workers=0) as fe:
        r = await post(fe, {"input": "x"})
        assert r.status_code == 503 and r.headers["retry-after"]


async def test_pooling_workers_refuse_generation_with_404(make_frontend):
    async with make_frontend(workers=2, features={1: POOLING, 2: POOLING}) as fe:
        r = await fe.client.post("/v1/chat/completions", json={"messages": MESSAGES})
        assert r.status_code == 404 and "Chat Completions" in r.json()["error"]["message"]
        r = await fe.client.post("/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 404 and "--runner pooling" in r.json()["error"]["message"]
        assert fe.fleet.requests == []


async def test_engine_errors_keep_their_status(make_frontend):
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        fe.fleet[1].embed_error = ErrorReply("", "bad_request", "the prompt does not fit the KV cache")
        r = await post(fe, {"input": "x"})
        assert r.status_code == 400 and "KV cache" in r.json()["error"]["message"]
        fe.fleet[1].embed_error = ErrorReply("", "engine_error", "boom")
        r = await post(fe, {"input": "x"})
        assert r.status_code == 500 and "boom" in r.json()["error"]["message"]


async def test_embeddings_count_under_max_inflight(make_frontend):
    async with make_frontend(workers=1, features={1: EMBED}, max_inflight=1) as fe:
        fe.app.inflight = 1  # one generation in progress
        r = await post(fe, {"input": "x"})
        assert r.status_code == 503 and "--max-inflight" in r.json()["error"]["message"]
        fe.app.inflight = 0
        r = await post(fe, {"input": "x"})
        assert r.status_code == 200 and fe.app.inflight == 0
