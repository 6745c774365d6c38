"""``dyn frontend --tool-parser-plugin FILE`` with a plugin written for vLLM, end to end: the
frontend runs on the vLLM venv's Python (``scripts/provision_vllm_cpu.sh``; skipped without
``DYN_VLLM_VENV``) with ``tests/core/parsers/vllm_call_tags_plugin.py``, a mocker worker answers
in that plugin's ``<call>`` format from a ``--replies`` script, and the OpenAI client gets the
calls, streamed and whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.vllm_cpu import VENV, python_and_model

NEEDS_VLLM = pytest.mark.skipif(
    not VENV,
    reason="set DYN_VLLM_VENV=$(scripts/provision_vllm_cpu.sh) to run the frontend with vLLM installed",
)
pytestmark = [pytest.mark.integration, NEEDS_VLLM, pytest.mark.timeout(300)]
PLUGIN = Path(__file__).resolve().parents[1] / "core" / "parsers" / "vllm_call_tags_plugin.py"
MODEL = "dyn-tiny"
CALL = '<call>{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}</call>'
REPLIES = [
    {"match": "weather in Paris", "text": "Let me check.\n" + CALL},
    {
        "match": "two cities",
        "text": CALL + '\n<call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</call>',
    },
    {"match": "hello", "text": "Hello! 3 < 4 and <cal is not a call."},
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "array"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def client(stack_factory, tmp_path_factory):
    from openai import OpenAI

    python, _ = python_and_model()
    replies = tmp_path_factory.mktemp("vllm-plugin") / "replies.jsonl"
    replies.write_text("".join(json.dumps(r) + "\n" for r in REPLIES))
    s = stack_factory("vllm-plugin")
    s.worker("--replies", str(replies))
    plugin_flags = ("--tool-parser-plugin", str(PLUGIN), "--tool-call-parser", "call_tags")
    url = s.start_frontend(*plugin_flags, "--enable-auto-tool-choice", python=str(python), timeout=120)
    s.wait_instances(1)
    return OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def ask(client, text: str, **kwargs):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], tools=[WEATHER], max_tokens=200, **kwargs
    )


def test_unary_answers_carry_the_plugins_calls(client):
    choice = ask(client, "What is the weather in Paris?").choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check.\n"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": [1, 2]})
    ]
    two = ask(client, "two cities please").choices[0]
    assert [json.loads(c.function.arguments)["city"] for c in two.message.tool_calls] == ["Paris", "Oslo"]
    assert len({c.id for c in two.message.tool_calls}) == 2
    plain = ask(client, "hello").choices[0]
    assert plain.finish_reason == "stop" and not plain.message.tool_calls
    assert plain.message.content == "Hello! 3 < 4 and <cal is not a call."


def test_streamed_answers_carry_the_same_calls(client):
    content, calls, reasons = "", {}, []
    for chunk in ask(client, "What is the weather in Paris?", stream=True):
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for call in delta.tool_calls or ():
                entry = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert content == "Let me check.\n" and reasons == ["tool_calls"]
    (call,) = calls.values()
    assert call["id"] and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris", "days": [1, 2]}
