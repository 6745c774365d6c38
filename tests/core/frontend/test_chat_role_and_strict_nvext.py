"""Issue 18 item 6, in-process: the answer's role with ``add_generation_prompt: false``, unknown
``nvext`` fields and parameters dyn cannot honour refused with a 400 naming them.

The role rule is vLLM's ``OpenAIServingChat.get_chat_request_role`` (``serving_chat.py``): the
last message's role when ``add_generation_prompt`` is false, else ``--response-role``
("assistant"). The nvext fields refused here are Dynamo's (``lib/llm/src/protocols/openai/nvext.rs``
as summarised in ../shared/reference/dynamo-router-spec.md 6.1: ``router``,
``routing_constraints``, ``agent_hints.strict_priority``), which dyn does not build, and a field
``agent_context`` does not define. ``guided_decoding_backend`` per request is refused by vLLM V1 too when it differs from the
engine's (``vllm/v1/engine/processor.py``).
"""

from __future__ import annotations

import json
import logging

import pytest

pytestmark = pytest.mark.anyio

CONTINUE = [
    {"role": "user", "content": "Write a haiku."},
    {"role": "assistant", "content": "Autumn moonlight"},
]


async def test_without_a_generation_prompt_the_answer_takes_the_last_messages_role(frontend):
    body = {"messages": CONTINUE, "add_generation_prompt": False, "continue_final_message": True}
    r = await frontend.client.post("/v1/chat/completions", json={**body, "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"
    as_user = [{"role": "system", "content": "Play the user."}, {"role": "user", "content": "Hi"}]
    r = await frontend.client.post(
        "/v1/chat/completions", json={"messages": as_user, "add_generation_prompt": False, "max_tokens": 3}
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "user"
    r = await frontend.client.post(
        "/v1/chat/completions",
        json={"messages": as_user, "add_generation_prompt": False, "max_tokens": 3, "stream": True},
    )
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert events[0]["choices"][0]["delta"]["role"] == "user"


async def test_with_a_generation_prompt_the_answer_is_the_assistants(frontend):
    as_user = [{"role": "user", "content": "Hi"}]
    r = await frontend.client.post("/v1/chat/completions", json={"messages": as_user, "max_tokens": 3})
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize(
    ("nvext", "param"),
    [
        ({"router": {"ttft_target": 100}}, "nvext.router"),
        ({"routing_constraints": {"required_taints": ["a"]}}, "nvext.routing_constraints"),
        (
            {
                "agent_context": {
                    "workflow_type_id": "a",
                    "workflow_id": "b",
                    "program_id": "c",
                    "tenant": "t",
                }
            },
            "nvext.agent_context.tenant",
        ),
        ({"agent_hints": {"strict_priority": 1}}, "nvext.agent_hints.strict_priority"),
        ({"session_control": {"session_id": "s", "ttl": 3}}, "nvext.session_control.ttl"),
        ({"cache_control": {"type": "ephemeral", "scope": "x"}}, "nvext.cache_control.scope"),
    ],
)
async def test_unknown_nvext_fields_are_refused_naming_them(frontend, nvext, param):
    r = await frontend.client.post(
        "/v1/chat/completions", json={"messages": CONTINUE[:1], "max_tokens": 2, "nvext": nvext}
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and param in error["message"]
    assert frontend.fleet.requests == []


async def test_unknown_top_level_fields_are_ignored_with_a_warning_as_vllm_does(frontend, caplog):
    caplog.set_level(logging.WARNING, logger="dyn.core.frontend.endpoints.generate")
    r = await frontend.client.post(
        "/v1/chat/completions",
        json={"messages": CONTINUE[:1], "max_tokens": 2, "some_future_field": 1},
        headers={"x-request-id": "r-ignored"},
    )
    assert r.status_code == 200, r.text
    (record,) = [r for r in caplog.records if "ignored" in r.getMessage()]
    assert "r-ignored" in record.getMessage() and "'some_future_field'" in record.getMessage()
    caplog.clear()
    r = await frontend.client.post("/v1/chat/completions", json={"messages": CONTINUE[:1], "max_tokens": 2})
    assert r.status_code == 200 and not [r for r in caplog.records if "ignored" in r.getMessage()]


@pytest.mark.parametrize(("backend", "status"), [("xgrammar", 400), ("outlines", 400), ("auto", 200)])
async def test_guided_decoding_backend_is_refused_unless_auto(frontend, backend, status):
    r = await frontend.client.post(
        "/v1/completions",
        json={"prompt": "a", "max_tokens": 2, "guided_decoding_backend": backend},
    )
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["param"] == "guided_decoding_backend"
