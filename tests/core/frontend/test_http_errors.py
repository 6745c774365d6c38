"""Every client mistake gets OpenAI's error shape and the right status, never a 500: the frontend's
HTTP contract, in process over fake workers (``conftest.py``).

The error body is OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (OpenAI API reference,
"Error codes"; vLLM's ``ErrorResponse`` in vllm/entrypoints/openai/engine/protocol.py). Dynamo 1.6.1
answers a non-JSON Content-Type with 415 (its ``ensure_json_content_type``, shown in
ai-dynamo/dynamo pull request 13268's table). The model is dyn's embedded ``dyn-tiny`` (vocabulary
4096, context 131072). What only a real HTTP server shows (its parser refusing control characters in
a header, curl) stays in tests/reliability/test_http_inputs.py.
"""

from __future__ import annotations

import time

import httpx
import msgspec
import openai
import pytest

from dyn.core.protocol.openai import ChatCompletionRequest, CompletionRequest

pytestmark = pytest.mark.anyio

MODEL = "dyn-tiny"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MESSAGES = b'"messages":[{"role":"user","content":"hi"}]'
HUGE = b"100000000000000000000000"  # > 2**64
JSON_TYPE = {"content-type": "application/json"}


def openai_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text[:500]
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert set(error) == {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param, error
    return error


async def post_raw(fe, path: str, body: bytes, headers: dict | None = None) -> httpx.Response:
    return await fe.client.post(path, content=body, headers={**JSON_TYPE, **(headers or {})})


# --------------------------------------------------------------------------- request bodies


@pytest.mark.parametrize(
    "body, param",
    [
        ({**CHAT, "max_tokens": "many"}, "max_tokens"),
        ({**CHAT, "messages": "hello"}, "messages"),
        ({**CHAT, "temperature": 7}, "temperature"),
        ({**CHAT, "n": 0}, "n"),
        ({**CHAT, "messages": [{"content": "no role"}]}, "messages[0].role"),
        ({**CHAT, "use_beam_search": True, "n": 11}, "n"),
        ({**CHAT, "guided_json": {"type": "strng"}}, "guided_json"),
        ({**CHAT, "guided_regex": "a(b"}, "guided_regex"),
        ({**CHAT, "response_format": {"type": "xml"}}, "response_format.type"),
        ({**CHAT, "guided_choice": ["a"], "guided_regex": "a"}, "guided_choice"),
        ({**CHAT, "top_logprobs": 2}, "top_logprobs"),
        ({**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({**CHAT, "tool_choice": "required"}, "tool_choice"),
        (
            {
                **CHAT,
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "tool_choice.function.name",
        ),
        ({**CHAT, "nvext": {"backend_instance_id": "seven"}}, "nvext.backend_instance_id"),
        ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
        ({**CHAT, "add_generation_prompt": True, "continue_final_message": True}, "continue_final_message"),
        ({k: v for k, v in CHAT.items() if k != "messages"}, "messages"),
    ],
)
async def test_bad_request_bodies_are_400_naming_the_field(frontend, body, param):
    openai_error(await frontend.client.post("/v1/chat/completions", json=body), 400, param)
    assert frontend.fleet.requests == []


async def test_malformed_json_is_400(frontend):
    openai_error(
        await post_raw(frontend, "/v1/chat/completions", b'{"model": "dyn-tiny", "messages": ['), 400
    )
    openai_error(await post_raw(frontend, "/v1/completions", b"not json"), 400)


async def test_unknown_model_is_404_naming_it(frontend):
    r = await frontend.client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-17"})
    assert "gpt-17" in openai_error(r, 404, "model")["message"]


async def test_prompt_over_the_context_is_400(frontend):
    context = 131072  # dyn-tiny's
    r = await frontend.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": [5] * (context + 1), "max_tokens": 4}
    )
    assert f"maximum context length is {context}" in openai_error(r, 400)["message"]
    r = await frontend.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": [5] * 8000, "max_tokens": context - 7999}
    )
    assert f"you requested {context + 1} tokens" in openai_error(r, 400)["message"]


PROBES = [  # issue 16's probe: (name, endpoint, body, the param the 400 names)
    ("seed above 2**64", "/v1/chat/completions", b"{" + MESSAGES + b',"seed":' + HUGE + b"}", "seed"),
    ("seed above int64", "/v1/chat/completions", b"{" + MESSAGES + b',"seed":9223372036854775808}', "seed"),
    ("seed below int64", "/v1/chat/completions", b"{" + MESSAGES + b',"seed":-9223372036854775809}', "seed"),
    ("top_k above 2**64", "/v1/chat/completions", b"{" + MESSAGES + b',"top_k":' + HUGE + b"}", "top_k"),
    (
        "priority above 2**64",
        "/v1/chat/completions",
        b"{" + MESSAGES + b',"priority":' + HUGE + b"}",
        "priority",
    ),
    (
        "priority below int32",
        "/v1/chat/completions",
        b"{" + MESSAGES + b',"priority":-2147483649}',
        "priority",
    ),
    (
        "agent_hints.priority above 2**64",
        "/v1/chat/completions",
        b"{" + MESSAGES + b',"nvext":{"agent_hints":{"priority":' + HUGE + b"}}}",
        "nvext.agent_hints.priority",
    ),
    (
        "stop_token_ids above 2**64",
        "/v1/chat/completions",
        b"{" + MESSAGES + b',"stop_token_ids":[1,' + HUGE + b"]}",
        "stop_token_ids[1]",
    ),
    (
        "stop_token_ids negative",
        "/v1/chat/completions",
        b"{" + MESSAGES + b',"stop_token_ids":[-5]}',
        "stop_token_ids[0]",
    ),
    (
        "max_tokens above 2**64",
        "/v1/chat/completions",
        b"{" + MESSAGES + b',"max_tokens":' + HUGE + b"}",
        "max_tokens",
    ),
    ("n above 2**64", "/v1/chat/completions", b"{" + MESSAGES + b',"n":' + HUGE + b"}", "n"),
    (
        "min_tokens above 2**64",
        "/v1/chat/completions",
        b"{" + MESSAGES + b',"min_tokens":' + HUGE + b"}",
        "min_tokens",
    ),
    (
        "truncate_prompt_tokens above 2**64",
        "/v1/chat/completions",
        b"{" + MESSAGES + b',"truncate_prompt_tokens":' + HUGE + b"}",
        "truncate_prompt_tokens",
    ),
    (
        "session timeout above 2**64",
        "/v1/chat/completions",
        b"{"
        + MESSAGES
        + b',"nvext":{"session_control":{"session_id":"s","action":"open","timeout":'
        + HUGE
        + b"}}}",
        "nvext.session_control.timeout",
    ),
    (
        "cache_control ttl above 2**64",
        "/v1/chat/completions",
        b"{" + MESSAGES + b',"nvext":{"cache_control":{"type":"ephemeral","ttl":' + HUGE + b"}}}",
        "nvext.cache_control.ttl",
    ),
    (
        "dp_rank negative",
        "/v1/chat/completions",
        b"{" + MESSAGES + b',"nvext":{"dp_rank":-1}}',
        "nvext.dp_rank",
    ),
    ("completions seed above 2**64", "/v1/completions", b'{"prompt":"hi","seed":' + HUGE + b"}", "seed"),
    (
        "completions logprobs above 2**64",
        "/v1/completions",
        b'{"prompt":"hi","logprobs":' + HUGE + b"}",
        "logprobs",
    ),
    (
        "invalid UTF-8 in the content",
        "/v1/chat/completions",
        b'{"messages":[{"role":"user","content":"\xff\xfe"}]}',
        None,
    ),
    (
        "invalid UTF-8 in request_id",
        "/v1/chat/completions",
        b"{" + MESSAGES + b',"request_id":"a\xc3"}',
        None,
    ),
    (
        "lone surrogate in request_id",
        "/v1/chat/completions",
        b"{" + MESSAGES + rb',"request_id":"\ud800"}',
        None,
    ),
    (
        "lone surrogate in the content",
        "/v1/chat/completions",
        b'{"messages":[{"role":"user","content":"a\\udc00b"}]}',
        None,
    ),
    (
        "control character in request_id",
        "/v1/chat/completions",
        b"{" + MESSAGES + rb',"request_id":"a\u0001b"}',
        "request_id",
    ),
    (
        "newline in request_id",
        "/v1/chat/completions",
        b"{" + MESSAGES + rb',"request_id":"a\nb"}',
        "request_id",
    ),
    (
        "non-latin-1 request_id",
        "/v1/chat/completions",
        b"{" + MESSAGES + rb',"request_id":"\u4e2d"}',
        "request_id",
    ),
    (
        "request_id of 10,000 characters",
        "/v1/chat/completions",
        b"{" + MESSAGES + b',"request_id":"' + b"r" * 10_000 + b'"}',
        "request_id",
    ),
    ("empty body", "/v1/chat/completions", b"", None),
    ("null body", "/v1/chat/completions", b"null", None),
    ("array body", "/v1/completions", b"[]", None),
    ("string body", "/v1/completions", b'"prompt"', None),
    ("number body", "/v1/completions", b"1e999", None),
]


@pytest.mark.parametrize("name, path, body, param", PROBES, ids=[p[0] for p in PROBES])
async def test_probe_bodies_are_400_with_an_openai_error(frontend, name, path, body, param):
    openai_error(await post_raw(frontend, path, body), 400, param)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"messages":[{"role":"user","content":"hi"}],"x":' + b"[" * 100_000,
        b'{"messages":[{"role":"user","content":' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"}]}",
    ],
    ids=["bare", "in an unknown field", "in a message"],
)
async def test_deeply_nested_json_is_a_quick_400(frontend, body):
    started = time.perf_counter()
    openai_error(await post_raw(frontend, "/v1/chat/completions", body), 400)
    assert time.perf_counter() - started < 5
    assert (await frontend.client.get("/live")).status_code == 200


def _wrong_types(kind: type[msgspec.Struct], required: bytes) -> list[tuple[str, bytes]]:
    """For every field of ``kind``, the request with that field set to values of the wrong JSON
    type for most fields (an object, a string, nested arrays, a huge float); ``required`` (which
    holds ``max_tokens``: 2, so accepted cases stay short) comes first, the field last (when it
    is one of ``required``'s, the later key wins)."""
    cases = []
    for field in kind.__struct_fields__:
        for value in (b'{"wrong":[1,{"x":null}]}', b'"not-this"', b"[[[]]]", b"-1.5e300"):
            cases.append(
                (f"{field}={value.decode()}", b"{" + required + b',"' + field.encode() + b'":' + value + b"}")
            )
    return cases


WRONG_TYPES = [
    ("/v1/chat/completions", *case)
    for case in _wrong_types(ChatCompletionRequest, MESSAGES + b',"max_tokens":2')
]
WRONG_TYPES += [
    ("/v1/completions", *case) for case in _wrong_types(CompletionRequest, b'"prompt":"hi","max_tokens":2')
]


async def test_wrong_json_types_in_every_field_are_answered_without_a_server_error(frontend):
    """One frontend for all ~600 cases (a parametrized test would build one per case)."""
    for path, name, body in WRONG_TYPES:
        r = await post_raw(frontend, path, body)
        assert 200 <= r.status_code < 500, (path, name, r.text[:300])
        if r.status_code >= 400:
            openai_error(r, r.status_code)


# --------------------------------------------------------------------------- routes and methods


async def test_unknown_routes_are_404_and_wrong_methods_405(frontend):
    openai_error(await frontend.client.get("/v1/nothing"), 404)
    openai_error(await frontend.client.get("/v1/chat/completions"), 405)
    openai_error(await frontend.client.post("/health", json={}), 405)
    openai_error(await frontend.client.delete("/v1/models"), 405)


ROUTES = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/v1/embeddings",
    "/v1/",
    "/v1",
    "/health",
    "/live",
    "/metrics",
    "/openapi.json",
    "/kv/query",
    "/",
    "/%ff",
    "/v1/chat/completions/x",
]


@pytest.mark.parametrize("router_mode", ["round-robin", "kv"])  # kv serves /kv/ too
async def test_every_route_and_method_is_answered_without_a_server_error(make_frontend, router_mode):
    async with make_frontend(router_mode=router_mode) as fe:
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"):
            for route in ROUTES:
                body = b"" if method in ("GET", "HEAD", "OPTIONS") else b'{"prompt":"hi","max_tokens":1}'
                r = await fe.client.request(method, route, content=body, headers=JSON_TYPE)
                assert r.status_code < 500, (method, route, r.text[:300])
                if r.status_code >= 400 and method != "HEAD":
                    if route.startswith("/kv/") and router_mode == "kv":  # dyn indexer's views
                        assert isinstance(r.json()["error"], str), r.text
                    else:
                        openai_error(r, r.status_code)


async def test_the_openai_client_raises_typed_errors(frontend):
    client = openai.AsyncOpenAI(
        base_url=str(frontend.client.base_url) + "/v1",
        api_key="x",
        max_retries=0,
        http_client=frontend.client,
    )
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], n=500)
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


# --------------------------------------------------------------------------- content type


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonp",
        "application/vnd.api+json",
        "",
    ],
)
async def test_a_body_that_is_not_declared_json_is_415(frontend, content_type):
    body = b"{" + MESSAGES + b',"max_tokens":2}'
    request = frontend.client.build_request("POST", "/v1/chat/completions", content=body)
    if content_type is not None:  # httpx sends none for raw content
        request.headers["content-type"] = content_type
    error = openai_error(await frontend.client.send(request), 415)
    assert "Content-Type: application/json" in error["message"]
    if content_type == "application/x-www-form-urlencoded":
        assert "curl -d" in error["message"]
    assert frontend.fleet.requests == []


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "APPLICATION/JSON;charset=UTF-8",
        "application/json ; charset=utf-8",
    ],
)
async def test_json_content_types_are_accepted_in_any_case_with_parameters(frontend, content_type):
    r = await frontend.client.post(
        "/v1/completions", content=b'{"prompt":"hi","max_tokens":2}', headers={"content-type": content_type}
    )
    assert r.status_code == 200, r.text


# --------------------------------------------------------------------------- x-request-id


@pytest.mark.parametrize(
    "value", [b"caf\xe9", "中文".encode(), b"a b", b"x" * 300], ids=["latin-1", "utf-8", "space", "too long"]
)
async def test_an_x_request_id_that_cannot_be_echoed_is_a_400_naming_it(frontend, value):
    r = await post_raw(frontend, "/v1/chat/completions", b"{" + MESSAGES + b"}", {"x-request-id": value})
    openai_error(r, 400, "x-request-id")


async def test_a_valid_x_request_id_is_echoed_byte_for_byte(frontend):
    rid = "req-2026_11.23:abc/DEF+~!"
    r = await post_raw(
        frontend, "/v1/chat/completions", b"{" + MESSAGES + b',"max_tokens":2}', {"x-request-id": rid}
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == rid
    assert r.json()["id"].endswith(rid)


async def test_the_request_id_comes_from_the_header_else_the_body_else_fresh(frontend):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    r = await frontend.client.post("/v1/completions", json=body, headers={"x-request-id": "abc-123"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "abc-123"
    assert r.json()["id"] == "cmpl-abc-123"
    r = await frontend.client.post("/v1/completions", json={**body, "request_id": "from-body"})
    assert r.headers["x-request-id"] == "from-body" and r.json()["id"] == "cmpl-from-body"
    r = await frontend.client.post("/v1/completions", json=body)
    fresh = r.headers["x-request-id"]
    assert len(fresh) >= 16 and r.json()["id"] == f"cmpl-{fresh}"
    # an error after the body was read carries the id too
    r = await frontend.client.post(
        "/v1/completions", json={**body, "model": "nope"}, headers={"x-request-id": "err-1"}
    )
    assert r.status_code == 404 and r.headers["x-request-id"] == "err-1"
