"""nvext end to end through the official openai client: every request field's happy path and its
bad-type 400, header overrides, the response nvext (worker_id, timing) and annotations."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
MESSAGES = [{"role": "user", "content": "Tell me about KV caches."}]


@pytest.fixture(scope="module")
def kv_stack(stack_factory):
    return stack_factory("nvext").up("--router-mode", "kv", "--enable-cache-control")


@pytest.fixture(scope="module")
def client(kv_stack):
    return openai.OpenAI(base_url=kv_stack.url + "/v1", api_key="x", max_retries=0)


def chat(client, nvext, max_tokens=4, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=max_tokens, extra_body={"nvext": nvext}, **kw
    )


@pytest.mark.parametrize(
    "nvext",
    [
        {"greed_sampling": True},
        {"use_raw_prompt": True},
        {"annotations": ["request_id"]},
        {"max_thinking_tokens": 16},
        {"extra_fields": ["worker_id", "timing"]},
        {"agent_hints": {"priority": 5, "osl": 8, "latency_sensitivity": 1.2, "speculative_prefill": False}},
        {"agent_hints": {"kv_overlap_score_credit": 0.25}},
        {"cache_control": {"type": "ephemeral", "ttl": "1h"}},
        {"cache_control": {"type": "ephemeral", "ttl": 42}},
        {"session_control": {"session_id": "happy", "action": "bind", "timeout": 60}},
    ],
)
def test_each_field_is_accepted(client, nvext):
    r = chat(client, nvext)
    assert r.choices[0].finish_reason in ("length", "stop")


def test_routing_fields_and_token_data_reach_the_named_worker(kv_stack, client):
    a, b = sorted(kv_stack.instances())
    r = chat(
        client,
        {
            "backend_instance_id": b,
            "dp_rank": 0,
            "decode_worker_id": b,
            "token_data": [5, 6, 7, 8, 9],
            "extra_fields": ["worker_id"],
        },
    )
    assert r.usage.prompt_tokens == 5
    assert r.nvext["worker_id"] == {
        "prefill_worker_id": b,
        "prefill_dp_rank": 0,
        "decode_worker_id": b,
        "decode_dp_rank": 0,
    }
    # the header beats the body
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=2,
        extra_body={"nvext": {"backend_instance_id": b, "extra_fields": ["worker_id"]}},
        extra_headers={"x-worker-instance-id": str(a), "x-dp-rank": "0"},
    )
    assert r.nvext["worker_id"]["decode_worker_id"] == a


@pytest.mark.parametrize(
    "nvext, param",
    [
        ({"greed_sampling": "yes"}, "nvext.greed_sampling"),
        ({"use_raw_prompt": 1}, "nvext.use_raw_prompt"),
        ({"annotations": "request_id"}, "nvext.annotations"),
        ({"backend_instance_id": "seven"}, "nvext.backend_instance_id"),
        ({"token_data": ["a"]}, "nvext.token_data[0]"),
        ({"max_thinking_tokens": "many"}, "nvext.max_thinking_tokens"),
        ({"extra_fields": "timing"}, "nvext.extra_fields"),
        ({"prefill_worker_id": "p"}, "nvext.prefill_worker_id"),
        ({"decode_worker_id": [1]}, "nvext.decode_worker_id"),
        ({"dp_rank": "0"}, "nvext.dp_rank"),
        ({"agent_hints": 5}, "nvext.agent_hints"),
        ({"agent_hints": {"priority": "high"}}, "nvext.agent_hints.priority"),
        ({"agent_hints": {"osl": "long"}}, "nvext.agent_hints.osl"),
        ({"agent_hints": {"speculative_prefill": "yes"}}, "nvext.agent_hints.speculative_prefill"),
        ({"agent_hints": {"latency_sensitivity": "fast"}}, "nvext.agent_hints.latency_sensitivity"),
        ({"agent_hints": {"kv_overlap_score_credit": 1.5}}, "nvext.agent_hints.kv_overlap_score_credit"),
        (
            {"agent_context": {"workflow_type_id": "t", "workflow_id": "w", "program_id": "p" * 257}},
            "nvext.agent_context.program_id",
        ),
        ({"agent_hints": {"kv_overlap_score_credit": "all"}}, "nvext.agent_hints.kv_overlap_score_credit"),
        ({"cache_control": "1h"}, "nvext.cache_control"),
        ({"cache_control": {"type": "permanent"}}, "nvext.cache_control.type"),
        ({"cache_control": {"ttl": [1]}}, "nvext.cache_control.ttl"),
        ({"cache_control": {"ttl": "forever"}}, "nvext.cache_control.ttl"),
        ({"session_control": "s"}, "nvext.session_control"),
        ({"session_control": {"session_id": 5}}, "nvext.session_control.session_id"),
        ({"session_control": {"action": "open"}}, "nvext.session_control.session_id"),
        ({"session_control": {"session_id": "s", "action": "reopen"}}, "nvext.session_control.action"),
        ({"session_control": {"session_id": "s", "timeout": 0}}, "nvext.session_control.timeout"),
        ({"extra_fields": ["bogus"]}, "nvext.extra_fields"),
        ({"annotations": ["bogus"]}, "nvext.annotations"),
        ({"agent_hints": {"priority": 2**40}}, "nvext.agent_hints.priority"),
        ({"prefill_worker_id": 1}, "nvext.prefill_worker_id"),
        ({"backend_instance_id": 1, "decode_worker_id": 2}, "nvext.decode_worker_id"),
    ],
)
def test_bad_fields_are_400_naming_the_field(client, nvext, param):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, nvext)
    assert err.value.body["param"] == param, err.value.body


def test_a_prefill_worker_header_without_disaggregation_is_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, extra_headers={"x-prefill-instance-id": "7"}
        )
    assert "no disaggregated workers" in err.value.body["message"]


def test_sessions_need_a_single_choice(client):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, {"session_control": {"session_id": "s"}}, n=2)
    assert err.value.body["param"] == "nvext.session_control"


TIMING_KEYS = {
    "request_received_ms",
    "prefill_wait_time_ms",
    "prefill_time_ms",
    "ttft_ms",
    "total_time_ms",
    "itl_ms",
    "kv_hit_rate",
    "router_queue_depth",
}


def check_timing(timing):
    assert set(timing) == TIMING_KEYS, timing
    assert timing["ttft_ms"] <= timing["total_time_ms"]
    assert abs(timing["prefill_wait_time_ms"] + timing["prefill_time_ms"] - timing["ttft_ms"]) < 0.01
    assert 0 <= timing["kv_hit_rate"] <= 1 and timing["router_queue_depth"] >= 0


def test_response_nvext_unary_and_on_the_final_chunk_only(kv_stack, client):
    r = chat(client, {"extra_fields": ["worker_id", "timing"]}, max_tokens=6)
    assert r.nvext["worker_id"]["decode_worker_id"] in kv_stack.instances()
    check_timing(r.nvext["timing"])
    plain = chat(client, {})
    assert getattr(plain, "nvext", None) is None
    chunks = list(chat(client, {"extra_fields": ["timing"]}, max_tokens=6, stream=True))
    with_nvext = [c for c in chunks if getattr(c, "nvext", None)]
    assert len(with_nvext) == 1 and with_nvext[0].choices[0].finish_reason is not None
    check_timing(with_nvext[0].nvext["timing"])
    assert "worker_id" not in with_nvext[0].nvext


def test_a_repeated_prompt_reports_its_kv_hit_rate(client):
    messages = [{"role": "user", "content": "cache me " * 40}]
    body = {"nvext": {"extra_fields": ["timing", "worker_id"]}}
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, extra_body=body)
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, extra_body=body)
    assert first.nvext["timing"]["kv_hit_rate"] < 0.5
    assert again.nvext["timing"]["kv_hit_rate"] > 0.8
    assert again.nvext["worker_id"] == first.nvext["worker_id"]


def sse_events(response) -> list[tuple[str | None, str]]:
    """(event name or None, data or comment) of each SSE event of a raw response."""
    events, name, value = [], None, ""
    for line in response.iter_lines():
        if not line:
            if name is not None or value:
                events.append((name, value))
            name, value = None, ""
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith((": ", "data: ")):
            value = line.split(": ", 1)[1]
    return events


def test_annotations_arrive_as_sse_events(client):
    with client.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=4,
        stream=True,
        extra_headers={"x-request-id": "annotated-1"},
        extra_body={"nvext": {"annotations": ["formatted_prompt", "token_ids", "request_id", "llm_metrics"]}},
    ) as response:
        events = sse_events(response)
    named = {name: json.loads(value) for name, value in events if name is not None}
    assert named["request_id"] == "annotated-1"
    assert "Tell me about KV caches." in named["formatted_prompt"]
    assert all(isinstance(t, int) for t in named["token_ids"]) and named["token_ids"]
    metrics = named["llm_metrics"]
    assert metrics["input_tokens"] == len(named["token_ids"]) and metrics["output_tokens"] == 4
    assert events[-1] == (None, "[DONE]")
    # token_ids are not echoed back when the client sent them
    r = httpx.post(
        str(client.base_url) + "chat/completions",
        timeout=30,
        json={
            "model": MODEL,
            "messages": MESSAGES,
            "max_tokens": 2,
            "stream": True,
            "nvext": {"token_data": [1, 2, 3], "annotations": ["token_ids", "request_id"]},
        },
    )
    names = [line for line in r.text.splitlines() if line.startswith("event: ")]
    assert names == ["event: request_id"]


def test_use_raw_prompt_skips_the_template(client):
    raw = chat(client, {"use_raw_prompt": True, "annotations": []})
    templated = chat(client, {})
    assert raw.usage.prompt_tokens < templated.usage.prompt_tokens
