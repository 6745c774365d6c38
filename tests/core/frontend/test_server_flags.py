"""Issue 18 item 5, in-process: vLLM's server flags on the frontend's app.

Where each expected shape comes from (vLLM, vllm-project/vllm):

- ``--response-role``: ``OpenAIServingChat.get_chat_request_role`` (``serving_chat.py``): the
  role of the answer when ``add_generation_prompt`` is true, in the unary message and the first
  streamed delta.
- ``--return-tokens-as-token-ids``: ``_get_decoded_token`` and ``_create_chat_logprobs`` /
  ``_create_completion_logprobs`` (``chat_completion/serving.py``, ``completion/serving.py``):
  every token string of ``logprobs`` (chosen and top) is ``f"token_id:{token_id}"``.
- ``--enable-prompt-tokens-details``: ``usage.prompt_tokens_details`` (``PromptTokenUsageInfo``
  with ``cached_tokens``) only with the flag; without it vLLM's field is null.
- ``--root-path``: vLLM sets FastAPI's ``app.root_path`` (``api_server.py build_app``) and
  passes nothing to uvicorn, so Starlette routes ``/PREFIX/x`` and ``/x`` alike, and FastAPI's
  ``/openapi.json`` lists ``servers: [{"url": PREFIX}]``.
- ``--disable-fastapi-docs``: ``FastAPI(openapi_url=None, docs_url=None, redoc_url=None)``.
- ``--enable-log-requests`` / ``--max-log-len``: ``RequestLogger.log_inputs``
  (``entrypoints/serve/utils/request_logger.py``): ``Received request ID: params: ...`` at info,
  ``Request ID details: prompt: ..., prompt_token_ids: ...`` at debug, both cut to max_log_len.

The fake workers answer dyn-tiny's tokens (``tests/core/frontend/fake_workers.py``).
"""

from __future__ import annotations

import json
import logging
import ssl

import anyio
import openai
import pytest

from dyn.core.errors import ConfigError
from dyn.core.frontend.server import FrontendSettings, build_app
from dyn.core.frontend.tls import TlsSettings
from dyn.core.messages import Finish, GenerateRequest, TokenChunk, TokenLogprobs, Usage
from dyn.core.model.info import TINY_MODEL_DIR
from tests.core.frontend.conftest import BASE_URL
from tests.core.frontend.fake_workers import held, reply, token_ids

pytestmark = pytest.mark.anyio

HELLO = [{"role": "user", "content": "Hello!"}]
ANSWER = token_ids("Paris is the capital.")
CACHED = 4


def with_logprobs(cached: int = CACHED):
    """A worker that answers ANSWER's tokens, each with the logprobs asked for (the chosen token
    first among the top ones, then the next id), and reports ``cached`` prompt tokens cached."""

    async def script(request: GenerateRequest):
        limit = request.stop.max_tokens or len(ANSWER)
        out = ANSWER[:limit]
        for token in out:
            lps = []
            if request.logprobs is not None:
                top = [token, token + 1][: request.logprobs]
                lps = [TokenLogprobs(-0.25, top, [-0.25, -2.0][: len(top)])]
            yield [TokenChunk(request.request_id, [token], lps)]
        yield [Finish(request.request_id, "length", Usage(len(request.token_ids), len(out), cached))]

    return script


def sse_events(text: str) -> list[dict]:
    return [
        json.loads(line[len("data: ") :])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


# --------------------------------------------------------------------------- --response-role


async def test_response_role_names_the_answer_unary_and_streamed(make_frontend):
    async with make_frontend(response_role="model") as fe:
        r = await fe.client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 3})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["role"] == "model"
        r = await fe.client.post(
            "/v1/chat/completions", json={"messages": HELLO, "max_tokens": 3, "stream": True}
        )
        first = sse_events(r.text)[0]
        assert first["choices"][0]["delta"] == {"role": "model", "content": ""}
        # without a generation prompt the last message's role wins, as before
        r = await fe.client.post(
            "/v1/chat/completions",
            json={"messages": HELLO, "max_tokens": 3, "add_generation_prompt": False},
        )
        assert r.json()["choices"][0]["message"]["role"] == "user"


async def test_the_default_response_role_is_assistant(frontend):
    r = await frontend.client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2})
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


# --------------------------------------------------------------------------- token ids


def _labels(ids: list[int]) -> list[str]:
    return [f"token_id:{t}" for t in ids]


async def test_return_tokens_as_token_ids_in_chat_unary_and_streamed(make_frontend):
    want = ANSWER[:4]
    async with make_frontend(return_tokens_as_token_ids=True, script=with_logprobs()) as fe:
        body = {"messages": HELLO, "max_tokens": 4, "logprobs": True, "top_logprobs": 2}
        r = await fe.client.post("/v1/chat/completions", json=body)
        content = r.json()["choices"][0]["logprobs"]["content"]
        assert [e["token"] for e in content] == _labels(want)
        assert [[t["token"] for t in e["top_logprobs"]] for e in content] == [
            _labels([t, t + 1]) for t in want
        ]
        assert content[0]["logprob"] == -0.25
        # the text itself is unchanged: only the logprob token names are ids
        assert r.json()["choices"][0]["message"]["content"] == fe.app.service.preprocessor.tokenizer.decode(
            want
        )
        r = await fe.client.post("/v1/chat/completions", json={**body, "stream": True})
        streamed = [
            e["token"]
            for ev in sse_events(r.text)
            for c in ev["choices"]
            if c.get("logprobs")
            for e in c["logprobs"]["content"]
        ]
        assert streamed == _labels(want)


async def test_return_tokens_as_token_ids_in_completions_unary_and_streamed(make_frontend):
    want = ANSWER[:3]
    async with make_frontend(return_tokens_as_token_ids=True, script=with_logprobs()) as fe:
        body = {"prompt": "The capital of France:", "max_tokens": 3, "logprobs": 1}
        r = await fe.client.post("/v1/completions", json=body)
        lp = r.json()["choices"][0]["logprobs"]
        assert lp["tokens"] == _labels(want)
        assert lp["top_logprobs"] == [{f"token_id:{t}": -0.25} for t in want]
        text = r.json()["choices"][0]["text"]
        # offsets still index the choice's text
        assert lp["text_offset"][0] == 0 and lp["text_offset"][-1] < len(text)
        r = await fe.client.post("/v1/completions", json={**body, "stream": True})
        streamed = [
            t
            for ev in sse_events(r.text)
            for c in ev["choices"]
            if c.get("logprobs")
            for t in c["logprobs"]["tokens"]
        ]
        assert streamed == _labels(want)


async def test_tokens_are_text_without_the_flag(make_frontend):
    async with make_frontend(script=with_logprobs()) as fe:
        r = await fe.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "logprobs": 0})
        tokens = r.json()["choices"][0]["logprobs"]["tokens"]
        assert tokens and not any(t.startswith("token_id:") for t in tokens)


# --------------------------------------------------------------------------- usage details


async def test_prompt_tokens_details_on_by_default_and_off_on_request(make_frontend):
    body = {"messages": HELLO, "max_tokens": 2}
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with make_frontend(script=with_logprobs()) as fe:
        r = await fe.client.post("/v1/chat/completions", json=body)
        assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": CACHED}
        r = await fe.client.post("/v1/chat/completions", json=stream)
        assert sse_events(r.text)[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": CACHED}
    async with make_frontend(script=with_logprobs(), enable_prompt_tokens_details=False) as fe:
        for path, req in (
            ("/v1/chat/completions", body),
            ("/v1/completions", {"prompt": "a longer prompt than four tokens", "max_tokens": 2}),
        ):
            r = await fe.client.post(path, json=req)
            usage = r.json()["usage"]
            assert usage["prompt_tokens_details"] is None and usage["prompt_tokens"] > 0
        r = await fe.client.post("/v1/chat/completions", json=stream)
        assert sse_events(r.text)[-1]["usage"]["prompt_tokens_details"] is None
        # the cached-tokens metric does not depend on what the response shows
        assert fe.metric("dynamo_frontend_cached_tokens_sum") == 3 * CACHED


# --------------------------------------------------------------------------- root path, docs


async def test_root_path_serves_prefixed_and_plain_paths(make_frontend):
    async with make_frontend(root_path="/llm/", api_key="sk-test") as fe:
        auth = {"Authorization": "Bearer sk-test"}
        for path in ("/llm/v1/models", "/v1/models"):
            r = await fe.client.get(path, headers=auth)
            assert r.status_code == 200, (path, r.text)
            assert r.json()["data"][0]["id"] == fe.app.service.model_name
        # the key is needed under the prefix too, /health stays open under it
        assert (await fe.client.get("/llm/v1/models")).status_code == 401
        assert (await fe.client.get("/llm/health")).status_code == 200
        r = await fe.client.post(
            "/llm/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, headers=auth
        )
        assert r.status_code == 200, r.text
        # a path that only starts with the prefix's letters is not under it
        assert (await fe.client.get("/llmx/v1/models", headers=auth)).status_code == 404
        for path in ("/openapi.json", "/llm/openapi.json"):
            doc = (await fe.client.get(path, headers=auth)).json()
            assert doc["servers"] == [{"url": "/llm"}]
            assert "/v1/chat/completions" in doc["paths"]


async def test_without_root_path_the_document_names_no_servers(frontend):
    doc = (await frontend.client.get("/openapi.json")).json()
    assert "servers" not in doc


async def test_disable_fastapi_docs_makes_the_document_a_404(make_frontend):
    async with make_frontend(disable_fastapi_docs=True) as fe:
        for path in ("/openapi.json", "/docs", "/redoc"):
            r = await fe.client.get(path)
            assert r.status_code == 404, path
            assert "no route" in r.json()["error"]["message"]
        assert (await fe.client.get("/v1/models")).status_code == 200


# --------------------------------------------------------------------------- request log


def _records(caplog, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "dyn.core.frontend.request_log" and text in r.getMessage()]


async def test_requests_are_logged_with_params_and_the_cut_prompt(make_frontend, caplog):
    caplog.set_level(logging.DEBUG, logger="dyn.core.frontend.request_log")
    async with make_frontend(enable_log_requests=True, max_log_len=10) as fe:
        r = await fe.client.post(
            "/v1/completions",
            json={"prompt": "abcdefghijklmnopqrstuvwxyz", "max_tokens": 3, "temperature": 0.5},
            headers={"x-request-id": "req-42"},
        )
        assert r.status_code == 200, r.text
    received = _records(caplog, "Received request req-42")
    assert len(received) == 1
    record = received[0]
    assert record.levelno == logging.INFO
    assert record.params["temperature"] == 0.5 and record.params["max_tokens"] == 3
    details = _records(caplog, "Request req-42 details")
    assert len(details) == 1 and details[0].levelno == logging.DEBUG
    assert details[0].prompt == "abcdefghij"
    assert len(details[0].prompt_token_ids) == 10


async def test_a_batch_logs_each_prompt_and_info_level_hides_the_prompt(make_frontend, caplog):
    caplog.set_level(logging.INFO, logger="dyn.core.frontend.request_log")
    async with make_frontend(enable_log_requests=True) as fe:
        await fe.client.post(
            "/v1/completions", json={"prompt": ["one", "two"], "max_tokens": 1}, headers={"x-request-id": "b"}
        )
    assert [r.request_id for r in _records(caplog, "Received request")] == ["b-0", "b-1"]
    assert not _records(caplog, "details")


async def test_requests_are_not_logged_by_default(frontend, caplog):
    caplog.set_level(logging.DEBUG, logger="dyn.core.frontend.request_log")
    await frontend.client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 1})
    assert not _records(caplog, "request")


# --------------------------------------------------------------------------- bad settings


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"root_path": "llm"}, "--root-path"),
        ({"response_role": " "}, "--response-role"),
        (
            {"reasoning_field_name": "thoughts"},
            "--reasoning-field-name must be one of reasoning_content, reasoning",
        ),
        ({"max_log_len": -1, "enable_log_requests": True}, "--max-log-len"),
        ({"uvicorn_log_level": "loud"}, "--uvicorn-log-level"),
        # dyn-tiny has no response_template: the hf parsers say what the model lacks at start
        ({"reasoning_parser": "hf"}, "--reasoning-parser hf needs a response_template in the model's"),
        (
            {"tool_call_parser": "hf", "enable_auto_tool_choice": True},
            "--tool-call-parser hf needs a response_template in the model's",
        ),
    ],
)
def test_bad_settings_are_config_errors(tmp_path, settings, words):
    from dyn.core.config import DiscoveryConfig

    with pytest.raises(ConfigError, match=words):
        build_app(FrontendSettings(discovery=DiscoveryConfig(namespace="bad", dir=str(tmp_path)), **settings))


def test_tls_flags_are_checked_together():
    assert TlsSettings.from_flags(None, None, None, 0) is None
    with pytest.raises(ConfigError, match="--ssl-certfile"):
        TlsSettings.from_flags("key.pem", None, None, 0)
    with pytest.raises(ConfigError, match="--ssl-ca-certs"):
        TlsSettings.from_flags("key.pem", "cert.pem", None, 2)
    with pytest.raises(ConfigError, match="need HTTPS"):
        TlsSettings.from_flags(None, None, "ca.pem", 0)
    with pytest.raises(ConfigError, match="0 .* 1 .* 2"):
        TlsSettings.from_flags("key.pem", "cert.pem", "ca.pem", 3)
    tls = TlsSettings.from_flags("key.pem", "cert.pem", "ca.pem", 2)
    assert tls is not None and tls.uvicorn_options()["ssl_cert_reqs"] == ssl.CERT_REQUIRED


def test_logprob_labels_are_vllms():
    from dyn.core.frontend.logprobs import token_id_label

    assert token_id_label(0) == "token_id:0" and token_id_label(128009) == "token_id:128009"


async def test_a_quiet_stream_gets_keep_alive_comments_that_clients_skip(make_frontend):
    """vLLM's ``--sse-keep-alive-interval``: while the request waits for its first token, the
    head and a ``: keep-alive`` comment go out every interval; the openai SDK skips them."""
    gate = anyio.Event()
    body = {"model": "dyn-tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with make_frontend(
        workers=1, script=held(gate, reply("Hello there")), sse_keep_alive_interval=1
    ) as fe:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _set_after(gate, 1.5))
            r = await fe.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.text.startswith(": keep-alive\n\n"), r.text[:80]
        data = [e for e in r.text.split("\n\n") if e.startswith("data: {")]
        text = "".join(
            json.loads(e[6:])["choices"][0]["delta"].get("content") or "" for e in data if '"choices":[{' in e
        )
        assert text == "Hello there" and r.text.endswith("data: [DONE]\n\n")
        gate = anyio.Event()
        fe.fleet.script_all(held(gate, reply("Hello there")))
        client = openai.AsyncOpenAI(
            base_url=BASE_URL + "/v1", api_key="x", http_client=fe.client, max_retries=0
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _set_after(gate, 1.5))
            stream = await client.chat.completions.create(**body)
            pieces = [
                c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content
            ]
        assert "".join(pieces) == "Hello there"


async def _set_after(event: anyio.Event, delay_s: float) -> None:
    await anyio.sleep(delay_s)
    event.set()


def data_chunks(text: str) -> list[dict]:
    return [json.loads(e[6:]) for e in text.strip().split("\n\n") if e.startswith("data: {")]


async def test_continuous_usage_stats_put_the_running_usage_in_every_chunk(make_frontend):
    """vLLM's ``stream_options.continuous_usage_stats`` (with ``include_usage``): every choice
    chunk carries the prompt's tokens and the choice's tokens so far, and the last one agrees
    with the final usage chunk; ``--enable-force-include-usage`` gives both to every stream."""
    chat = {"model": "dyn-tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    both = {"include_usage": True, "continuous_usage_stats": True}
    async with make_frontend(workers=1, script=reply("Hello there, friend")) as fe:
        completion = {"model": "dyn-tiny", "prompt": "hi", "stream": True}
        for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
            body = {**body, "stream_options": both}
            chunks = data_chunks((await fe.client.post(path, json=body)).text)
            *per_choice, final = chunks
            assert final["choices"] == [] and all(c["choices"] for c in per_choice)
            counts = [c["usage"]["completion_tokens"] for c in per_choice]
            assert counts == sorted(counts) and counts[-1] == final["usage"]["completion_tokens"] > 0
            assert {c["usage"]["prompt_tokens"] for c in chunks} == {final["usage"]["prompt_tokens"]}
        alone = {**chat, "stream_options": {"continuous_usage_stats": True}}  # needs include_usage
        assert all(
            "usage" not in c
            for c in data_chunks((await fe.client.post("/v1/chat/completions", json=alone)).text)
        )
    async with make_frontend(workers=1, script=reply("Hello there"), enable_force_include_usage=True) as fe:
        chunks = data_chunks((await fe.client.post("/v1/chat/completions", json=chat)).text)
        assert all("usage" in c for c in chunks) and chunks[-1]["choices"] == []


async def test_tokenizer_info_is_served_behind_the_vllm_flag(make_frontend):
    """vLLM's ``GET /tokenizer_info``: the tokenizer's configuration without file paths, added
    tokens as their text, its class, and the served ``--chat-template``; off, a 404."""
    config = json.loads((TINY_MODEL_DIR / "tokenizer_config.json").read_text())
    async with make_frontend(workers=1) as fe:
        assert (await fe.client.get("/tokenizer_info")).status_code == 404
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    async with make_frontend(workers=1, enable_tokenizer_info_endpoint=True, chat_template=template) as fe:
        r = await fe.client.get("/tokenizer_info")
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["chat_template"] == template and info["tokenizer_class"]
    assert "vocab_file" not in info and "merges_file" not in info
    for key, value in config.items():
        if key not in (
            "chat_template",
            "added_tokens_decoder",
            "vocab_file",
            "merges_file",
            "tokenizer_class",
        ):
            assert info[key] == value, key
    for token_id, token in config.get("added_tokens_decoder", {}).items():
        assert info["added_tokens_decoder"][token_id] == token["content"]
