"""Every client mistake gets the OpenAI error shape and the right status, never a 500."""

from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def post(stack, path, body=None, content=None, headers=None):
    return httpx.post(stack.url + path, json=body, content=content, headers=headers, timeout=30)


def assert_error(r, status, param=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    if param is not None:
        assert err["param"] == param, err
    return err


@pytest.mark.parametrize("body, param", [
    ({**CHAT, "max_tokens": "many"}, "max_tokens"),
    ({**CHAT, "messages": "hello"}, "messages"),
    ({**CHAT, "temperature": 7}, "temperature"),
    ({**CHAT, "n": 0}, "n"),
    ({**CHAT, "messages": [{"content": "no role"}]}, "messages[0].role"),
    ({**CHAT, "use_beam_search": True}, "use_beam_search"),
    ({**CHAT, "guided_json": {"type": "strng"}}, "guided_json"),
    ({**CHAT, "guided_regex": "a(b"}, "guided_regex"),
    ({**CHAT, "response_format": {"type": "xml"}}, "response_format.type"),
    ({**CHAT, "guided_choice": ["a"], "guided_regex": "a"}, "guided_choice"),
    ({**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ({**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({**CHAT, "tool_choice": "required"}, "tool_choice"),
    ({**CHAT, "tool_choice": {"type": "function", "function": {"name": "nope"}},
      "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice.function.name"),
    ({**CHAT, "nvext": {"backend_instance_id": "seven"}}, "nvext.backend_instance_id"),
    ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
    ({**CHAT, "add_generation_prompt": True, "continue_final_message": True}, "continue_final_message"),
    ({k: v for k, v in CHAT.items() if k != "messages"}, "messages"),
])
def test_bad_request_bodies_are_400_naming_the_field(stack, body, param):
    assert_error(post(stack, "/v1/chat/completions", body), 400, param)


def test_malformed_json_is_400(stack):
    json_type = {"content-type": "application/json"}
    assert_error(post(stack, "/v1/chat/completions", content=b'{"model": "dyn-tiny", "messages": [',
                      headers=json_type), 400)
    assert_error(post(stack, "/v1/completions", content=b"not json", headers=json_type), 400)


def test_unknown_model_is_404(stack):
    err = assert_error(post(stack, "/v1/chat/completions", {**CHAT, "model": "gpt-17"}), 404, "model")
    assert "gpt-17" in err["message"]


def test_prompt_over_the_context_is_400(stack):
    r = post(stack, "/v1/completions", {"model": MODEL, "prompt": [5] * 9000, "max_tokens": 4})
    err = assert_error(r, 400)
    assert "maximum context length is 8192" in err["message"]
    r = post(stack, "/v1/completions", {"model": MODEL, "prompt": [5] * 8000, "max_tokens": 500})
    assert_error(r, 400)


def test_unknown_worker_instance_is_404(stack):
    r = post(stack, "/v1/chat/completions", CHAT, headers={"x-worker-instance-id": "12345"})
    assert_error(r, 404)


def test_routes_and_methods(stack):
    assert_error(httpx.get(stack.url + "/v1/nothing", timeout=10), 404)
    assert_error(httpx.get(stack.url + "/v1/chat/completions", timeout=10), 405)


def test_openai_client_raises_typed_errors(stack):
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], n=500)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


@pytest.fixture(scope="module")
def guarded(stack_factory):
    """A frontend with an API key, CORS for one origin, direct routing, and no workers."""
    s = stack_factory("guarded")
    s.start_frontend("--api-key", "sekret", "--router-mode", "direct",
                     "--allowed-origins", '["https://app.example"]')
    return s


def test_api_key_protects_v1(guarded):
    assert_error(httpx.get(guarded.url + "/v1/models", timeout=10), 401)
    wrong = {"authorization": "Bearer nope"}
    assert_error(httpx.get(guarded.url + "/v1/models", headers=wrong, timeout=10), 401)
    ok = httpx.get(guarded.url + "/v1/models", headers={"authorization": "Bearer sekret"}, timeout=10)
    assert ok.status_code == 200
    assert_error(httpx.get(guarded.url + "/metrics", timeout=10), 401)  # only --public-metrics opens it
    assert httpx.get(guarded.url + "/metrics", headers={"authorization": "Bearer sekret"}, timeout=10).status_code == 200


def test_no_workers_is_503_with_retry_after(guarded):
    key = {"authorization": "Bearer sekret"}
    r = post(guarded, "/v1/chat/completions", CHAT, headers={**key, "x-worker-instance-id": "1"})
    assert_error(r, 404)
    r = post(guarded, "/v1/chat/completions", {**CHAT, "stream": True}, headers=key)
    # direct mode with no target: a client mistake
    assert_error(r, 400, "nvext.backend_instance_id")
    health = httpx.get(guarded.url + "/health", timeout=10)
    assert health.status_code == 503 and health.json()["instances"] == []


def test_cors_preflight_and_simple_requests(guarded):
    pre = httpx.options(guarded.url + "/v1/chat/completions", timeout=10, headers={
        "origin": "https://app.example", "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == "https://app.example"
    bad = httpx.options(guarded.url + "/v1/chat/completions", timeout=10, headers={
        "origin": "https://evil.example", "access-control-request-method": "POST"})
    assert bad.status_code == 400
    simple = httpx.get(guarded.url + "/health", headers={"origin": "https://app.example"}, timeout=10)
    assert simple.headers["access-control-allow-origin"] == "https://app.example"


@pytest.fixture(scope="module")
def empty(stack_factory):
    """A round-robin frontend with no workers."""
    s = stack_factory("nobody")
    s.start_frontend()
    return s


def test_round_robin_with_no_workers_is_503(empty):
    for body in (CHAT, {**CHAT, "stream": True}):
        r = post(empty, "/v1/chat/completions", body)
        err = assert_error(r, 503)
        assert r.headers["retry-after"] == "1" and "no worker" in err["message"]
