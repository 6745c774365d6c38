"""OpenAI's Responses API (``dyn.core.frontend.apis.responses``): the request adapter, the
response store, and ``/v1/responses`` in process over fake workers, every body and event read
back with the ``openai`` SDK's own types (``openai.types.responses``), as a client parses them.
The shapes are OpenAI's API reference ("Responses", "Streaming events"); Codex and the Agents SDK
run against real processes in tests/integration/test_responses_api.py."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import msgspec
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from dyn.core.frontend.apis.responses.adapter import (
    MAX_INPUT_ITEMS,
    chat_request,
    seal_reasoning,
    unseal_reasoning,
)
from dyn.core.frontend.apis.responses.protocol import ResponsesRequest
from dyn.core.frontend.apis.responses.store import ResponseStore
from dyn.core.messages import GenerateRequest, TokenChunk, TokenLogprobs
from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.openai import decode_request
from tests.core.frontend.conftest import BASE_URL
from tests.core.frontend.fake_workers import (
    Batch,
    Script,
    endless,
    failing,
    finish,
    held,
    reply,
    token_ids,
    tokenizer,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio

EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
THOUGHT_AND_CALL = (
    "<think>The user wants weather.</think>Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
HERMES = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True}
PARSERS = {**HERMES, "reasoning_parser": "deepseek_r1"}


def request(**fields) -> ResponsesRequest:
    """A request as the endpoint decodes it."""
    return decode_request(json.dumps({"model": "dyn-tiny", **fields}).encode(), ResponsesRequest)


def bad(**fields) -> ApiError:
    with pytest.raises(ApiError) as caught:
        chat_request(request(**fields))
    assert caught.value.status == 400
    return caught.value


# --------------------------------------------------------------------------- the adapter


def test_a_string_input_is_a_user_message_after_the_instructions():
    turn = chat_request(request(input="Hi", instructions="Be terse.", max_output_tokens=7, temperature=0.5))
    chat = turn.chat
    assert chat.messages == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert (chat.max_tokens, chat.temperature, chat.tools, chat.response_format) == (7, 0.5, None, None)
    assert turn.items == [{"type": "message", "role": "user", "content": "Hi"}]


def test_leading_system_and_developer_messages_join_the_instructions():
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: on."}]},
        {"role": "system", "content": "Be kind."},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {"role": "developer", "content": "Later."},
    ]
    messages = chat_request(request(input=items, instructions="Be terse.")).chat.messages
    assert messages == [
        {"role": "system", "content": "Be terse.\n\nSandbox: on.\n\nBe kind."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "system", "content": "Later."},
    ]


def test_an_answer_with_its_reasoning_and_calls_is_one_assistant_message():
    items = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "encrypted_content": seal_reasoning("Two cities."),
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "21 C"}]},
    ]
    messages = chat_request(request(input=items)).chat.messages
    assert messages[1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Two cities.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18 C", "name": "get_weather"},
        {"role": "tool", "tool_call_id": "c2", "content": "21 C", "name": "get_weather"},
    ]


def test_reasoning_text_comes_from_content_then_encrypted_content_then_summary():
    def reasoning_of(item: dict) -> str | None:
        messages = chat_request(request(input=[{"role": "user", "content": "q"}, item])).chat.messages
        return messages[-1].get("reasoning_content")

    content = [{"type": "reasoning_text", "text": "raw"}]
    summary = [{"type": "summary_text", "text": "short"}]
    sealed = seal_reasoning("sealed é")
    assert (
        reasoning_of(
            {"type": "reasoning", "content": content, "summary": summary, "encrypted_content": sealed}
        )
        == "raw"
    )
    assert reasoning_of({"type": "reasoning", "summary": summary, "encrypted_content": sealed}) == "sealed é"
    assert (
        reasoning_of({"type": "reasoning", "summary": summary, "encrypted_content": "gAAAA-openai"})
        == "short"
    )
    other_servers = {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA-openai"}
    assert reasoning_of(other_servers) is None  # nothing to give back: no empty assistant turn
    assert unseal_reasoning(sealed, "x") == "sealed é" and unseal_reasoning("other", "x") is None
    error = bad(input=[{"type": "reasoning", "summary": [], "encrypted_content": "dyn.reasoning.v1:@@"}])
    assert error.param == "input[0].encrypted_content"


def test_items_nothing_here_can_use_are_dropped_and_custom_calls_kept():
    items = [
        {"role": "user", "content": "go"},
        {"type": "custom_tool_call", "call_id": "p1", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "p1", "output": "done"},
        {"type": "local_shell_call", "call_id": "s1", "action": {"type": "exec", "command": ["ls"]}},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"type": "web_search_call", "id": "ws_2", "status": "completed"},
    ]
    turn = chat_request(request(input=items))
    call = turn.chat.messages[1]["tool_calls"][0]["function"]
    assert call == {"name": "apply_patch", "arguments": json.dumps({"input": "*** Begin Patch"})}
    assert turn.chat.messages[2] == {
        "role": "tool",
        "tool_call_id": "p1",
        "content": "done",
        "name": "apply_patch",
    }
    assert len(turn.chat.messages) == 3
    assert sorted(turn.dropped_items) == ["local_shell_call", "web_search_call", "web_search_call"]


def test_function_tools_are_kept_namespaces_flattened_and_hosted_tools_dropped():
    tools = [
        {**TOOL, "strict": True},
        {"type": "web_search"},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
        {"type": "local_shell"},
        {
            "type": "namespace",
            "name": "crm",
            "description": "The CRM.",
            "tools": [
                {"type": "function", "name": "find_customer", "parameters": {"type": "object"}},
                {"type": "function", "name": "get_weather"},
                {"type": "custom", "name": "note"},
            ],
        },
    ]
    turn = chat_request(
        request(input="hi", tools=tools, tool_choice={"type": "function", "name": "get_weather"})
    )
    functions = [t["function"] for t in turn.chat.tools]
    assert [f["name"] for f in functions] == ["get_weather", "find_customer"]
    assert functions[0] == {
        "name": "get_weather",
        "description": TOOL["description"],
        "parameters": TOOL["parameters"],
        "strict": True,
    }
    assert turn.namespaces == {"find_customer": "crm"}
    assert turn.chat.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert sorted(turn.dropped_tools) == [
        "crm.custom",
        "crm.get_weather (its name is taken)",
        "custom",
        "local_shell",
        "web_search",
    ]


def test_tool_choice_of_dropped_or_allowed_tools():
    hosted_only = chat_request(request(input="hi", tools=[{"type": "web_search"}], tool_choice="auto")).chat
    assert hosted_only.tools is None and hosted_only.tool_choice is None
    hosted_choice = chat_request(
        request(input="hi", tools=[TOOL], tool_choice={"type": "web_search_preview"})
    )
    assert hosted_choice.chat.tool_choice == "auto" and hosted_choice.dropped_tools == [
        "tool_choice web_search_preview"
    ]
    other = {**TOOL, "name": "other"}
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "other"}]}
    chat = chat_request(request(input="hi", tools=[TOOL, other], tool_choice=allowed)).chat
    assert [t["function"]["name"] for t in chat.tools] == ["other"] and chat.tool_choice == "required"


def test_text_format_reasoning_effort_and_logprobs():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    text = {"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}}
    chat = chat_request(
        request(
            input="hi",
            text=text,
            reasoning={"effort": "high", "summary": "auto"},
            include=["message.output_text.logprobs"],
            top_logprobs=3,
        )
    ).chat
    assert chat.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "thing", "schema": schema, "strict": True},
    }
    assert chat.chat_template_kwargs == {"reasoning_effort": "high"}
    assert (chat.logprobs, chat.top_logprobs) == (True, 3)
    assert chat_request(
        request(input="hi", text={"format": {"type": "json_object"}})
    ).chat.response_format == {"type": "json_object"}
    plain = chat_request(
        request(input="hi", text={"format": {"type": "text"}, "verbosity": "low"}, top_logprobs=3)
    )
    assert plain.chat.response_format is None and not plain.chat.logprobs and plain.chat.top_logprobs is None


def test_a_previous_conversation_comes_before_the_input_and_the_instructions_first():
    history = [
        {"role": "user", "content": "first"},
        {
            "type": "message",
            "role": "assistant",
            "id": "m",
            "status": "completed",
            "content": [{"type": "output_text", "text": "one"}],
        },
    ]
    turn = chat_request(request(input="second", instructions="New rules."), history)
    assert turn.chat.messages == [
        {"role": "system", "content": "New rules."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "second"},
    ]
    assert turn.items == [*history, {"type": "message", "role": "user", "content": "second"}]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "top_logprobs": 21}, "top_logprobs"),
        ({"input": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"input": "x", "metadata": {"k": "v" * 513}}, "metadata.k"),
        ({"input": "x", "prompt_cache_key": "k" * 257}, "prompt_cache_key"),
        ({"input": [{"role": "user", "content": "x"}] * (MAX_INPUT_ITEMS + 1)}, "input"),
        ({"input": []}, "input"),
        ({"input": ["text"]}, "input[0]"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": 3}]}, "input[0].content"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": "x"},
                    {"type": "function_call", "name": "f", "arguments": "{}"},
                ]
            },
            "input[1].call_id",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "input[0].output"),
        ({"input": "x", "tools": [{"type": "function", "name": ""}]}, "tools[0].name"),
        ({"input": "x", "tools": [TOOL, TOOL]}, "tools[1].name"),
        ({"input": "x", "tools": [{"name": "f"}]}, "tools[0].type"),
        ({"input": "x", "tools": [{**TOOL, "parameters": "{}"}]}, "tools[0].parameters"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(fields, param):
    assert bad(**fields).param == param


# --------------------------------------------------------------------------- the store


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_store_evicts_the_least_recently_used_beyond_its_count():
    store = ResponseStore(max_count=2)
    store.put("a", b"A", b"[]")
    store.put("b", b"B", b"[]")
    assert store.get("a") is not None  # a is now the most recently used
    store.put("c", b"C", b"[]")
    assert store.get("b") is None and store.get("a").body == b"A" and store.get("c").body == b"C"
    assert len(store) == 2


def test_the_store_is_bounded_in_bytes_and_refuses_what_alone_exceeds_them():
    store = ResponseStore(max_bytes=100)
    store.put("a", b"x" * 40, b"[]")
    store.put("b", b"x" * 40, b"[]")
    assert store.bytes == 84
    store.put("c", b"x" * 40, b"[]")
    assert store.get("a") is None and store.bytes == 84
    assert not store.put("huge", b"x" * 99, b"[]") and store.get("huge") is None
    assert store.get("b") is not None and store.get("c") is not None


def test_stored_responses_expire_after_their_ttl_and_can_be_deleted():
    clock = Clock()
    store = ResponseStore(ttl_s=10, clock=clock)
    store.put("a", b"A", b"[1]")
    clock.now = 9.9
    assert store.get("a").conversation == b"[1]"
    clock.now = 10
    assert store.get("a") is None and store.bytes == 0
    store.put("b", b"B", b"[]")
    assert store.delete("b") and not store.delete("b") and store.get("b") is None
    store.put("c", b"C", b"[]")
    clock.now = 30
    store.put("d", b"D", b"[]")  # a put drops what expired
    assert len(store) == 1 and store.bytes == 3
    with pytest.raises(ValueError):
        ResponseStore(max_count=0)


def test_expiry_follows_the_order_of_puts_whatever_the_order_of_use():
    clock = Clock()
    store = ResponseStore(ttl_s=10, clock=clock)
    for i, name in enumerate("abc"):
        clock.now = i
        store.put(name, b"x", b"[]")
    store.get("a")  # used last: evicted last, but it still expires first
    clock.now = 10.5
    store.put("d", b"x", b"[]")
    assert [store.get(n) is not None for n in "abcd"] == [False, True, True, True]


def test_replacing_and_deleting_do_not_pile_up_in_the_expiry_queue():
    clock = Clock()
    store = ResponseStore(ttl_s=10, clock=clock)
    store.put("kept", b"x", b"[]")
    for i in range(10_000):
        store.put("same", b"x", b"[]")
        store.put(f"gone{i}", b"x", b"[]")
        store.delete(f"gone{i}")
    assert len(store) == 2 and len(store._by_expiry) <= 2 * 3 + 16  # three entries at most at a put
    clock.now = 10
    store.put("new", b"x", b"[]")
    assert store.get("kept") is None and store.get("same") is None and len(store) == 1


# --------------------------------------------------------------------------- over HTTP


def sdk(fe) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=BASE_URL + "/v1", api_key="unused", http_client=fe.client, max_retries=0
    )


def sse_events(text: str) -> list[dict]:
    """The events of an SSE body, each checked: ``event:`` names its ``type``."""
    events = []
    for block in text.strip().split("\n\n"):
        head, data = block.split("\n", 1)
        assert head.startswith("event: ") and data.startswith("data: "), block
        event = json.loads(data[len("data: ") :])
        assert event["type"] == head[len("event: ") :]
        events.append(event)
    return events


def without_ids(response: dict) -> dict:
    """A response with its ids and call ids blanked (they differ between two requests)."""
    out = json.loads(json.dumps(response))
    out["id"] = out["created_at"] = None
    for item in out["output"]:
        item["id"] = None
        if "call_id" in item:
            item["call_id"] = None
    return out


async def test_a_unary_response_with_reasoning_text_and_a_call(make_frontend):
    async with make_frontend(workers=1, script=reply(THOUGHT_AND_CALL), **PARSERS) as fe:
        response = await sdk(fe).responses.create(
            model="dyn-tiny",
            input="Weather in Paris?",
            instructions="Use tools.",
            tools=[TOOL, {"type": "web_search"}],
            metadata={"team": "a"},
            include=["reasoning.encrypted_content"],
        )
        raw = (await fe.client.get(f"/v1/responses/{response.id}")).json()
    Response.model_validate(raw)  # every field the SDK declares required is there, in its type
    assert response.status == "completed" and response.id.startswith("resp_")
    reasoning, message, call = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "The user wants weather."
    assert unseal_reasoning(reasoning.encrypted_content, "x") == "The user wants weather."
    assert message.type == "message" and response.output_text == "Let me check.\n"
    assert (call.type, call.name, json.loads(call.arguments)) == (
        "function_call",
        "get_weather",
        {"city": "Paris"},
    )
    assert call.call_id.startswith("call_") and call.status == "completed"
    assert response.instructions == "Use tools." and response.metadata == {"team": "a"}
    assert [t["type"] for t in raw["tools"]] == ["function", "web_search"]
    usage = response.usage
    assert usage.input_tokens > 0 and usage.output_tokens == len(
        tokenizer().encode(THOUGHT_AND_CALL, add_special_tokens=False)
    )
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert raw["usage"]["input_tokens_details"]["cached_tokens"] == 0


async def test_a_stream_is_the_unary_response_in_events(make_frontend):
    async with make_frontend(workers=1, script=reply(THOUGHT_AND_CALL), **PARSERS) as fe:
        body = {"model": "dyn-tiny", "input": "Weather?", "tools": [TOOL]}
        unary = (await fe.client.post("/v1/responses", json=body)).json()
        r = await fe.client.post("/v1/responses", json={**body, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream") and "[DONE]" not in r.text
    events = sse_events(r.text)
    for event in events:
        EVENTS.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds[2:5] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
    ]
    assert "response.output_text.delta" in kinds and "response.function_call_arguments.delta" in kinds
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert added == [d["type"] for d in done] == ["reasoning", "message", "function_call"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    arguments = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert text == "Let me check.\n" and json.loads(arguments) == {"city": "Paris"}
    final = events[-1]["response"]
    assert final["output"] == done
    assert without_ids(final) == without_ids(unary)


async def test_a_request_id_with_quotes_stays_valid_json(frontend):
    r = await frontend.client.post(
        "/v1/responses",
        json={"model": "dyn-tiny", "input": "x", "stream": True},
        headers={"x-request-id": 'a"b\\c'},
    )
    events = sse_events(r.text)  # every event parses
    assert events[-1]["response"]["id"] == 'resp_a"b\\c'
    assert (await frontend.client.get('/v1/responses/resp_a"b\\c')).status_code == 200


async def test_the_sdk_stream_helper_accumulates_the_response(make_frontend):
    async with make_frontend(workers=1, script=reply("Hello there, friend.")) as fe:
        async with sdk(fe).responses.stream(model="dyn-tiny", input="Hi") as stream:
            deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
            final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Hello there, friend."
    assert [item.type for item in final.output] == ["message"]


async def test_max_output_tokens_ends_a_response_incomplete(make_frontend):
    async with make_frontend(workers=1, script=reply("one two three four five six")) as fe:
        body = {"model": "dyn-tiny", "input": "count", "max_output_tokens": 2}
        unary = (await fe.client.post("/v1/responses", json=body)).json()
        events = sse_events((await fe.client.post("/v1/responses", json={**body, "stream": True})).text)
    for response in (unary, events[-1]["response"]):
        assert response["status"] == "incomplete" and response["max_output_tokens"] == 2
        assert response["incomplete_details"] == {"reason": "max_output_tokens"}
        assert response["output"][-1]["status"] == "incomplete" and response["usage"]["output_tokens"] == 2
    assert events[-1]["type"] == "response.incomplete"


async def test_an_engine_failure_mid_stream_is_response_failed(make_frontend):
    async with make_frontend(workers=1, script=failing("engine_error", "the engine fell over")) as fe:
        r = await fe.client.post("/v1/responses", json={"model": "dyn-tiny", "input": "x", "stream": True})
        unary = await fe.client.post("/v1/responses", json={"model": "dyn-tiny", "input": "x"})
    events = sse_events(r.text)
    for event in events:
        EVENTS.validate_python(event)
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert "fell over" in failed["error"]["message"]
    assert unary.status_code >= 500 and "error" in unary.json()


async def test_previous_response_id_continues_the_stored_conversation(make_frontend):
    async with make_frontend(
        workers=1, script=reply("<think>Paris, then.</think>It is sunny."), **PARSERS
    ) as fe:
        client = sdk(fe)
        first = await client.responses.create(
            model="dyn-tiny", input="Weather in Paris?", instructions="Old rules."
        )
        second = await client.responses.create(
            model="dyn-tiny", input="And tomorrow?", previous_response_id=first.id, stream=True
        )
        async for event in second:
            if event.type == "response.completed":
                completed = event.response
        third = await client.responses.create(
            model="dyn-tiny", input="Thanks!", previous_response_id=completed.id
        )
        prompt = tokenizer().decode(fe.fleet.requests[-1].token_ids)
    assert third.previous_response_id == completed.id and third.status == "completed"
    assert prompt.count("It is sunny.") == 2 and "Old rules." not in prompt
    assert prompt.index("Weather in Paris?") < prompt.index("And tomorrow?") < prompt.index("Thanks!")


async def test_an_unknown_previous_response_is_a_404_naming_the_field(frontend):
    r = await frontend.client.post(
        "/v1/responses", json={"model": "dyn-tiny", "input": "x", "previous_response_id": "resp_gone"}
    )
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["param"] == "previous_response_id" and error["code"] == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        await sdk(frontend).responses.create(model="dyn-tiny", input="x", previous_response_id="resp_gone")


async def test_get_and_delete_a_stored_response(frontend):
    client = sdk(frontend)
    stored = await client.responses.create(model="dyn-tiny", input="Hi")
    unstored = await client.responses.create(model="dyn-tiny", input="Hi", store=False)
    fetched = await client.responses.retrieve(stored.id)
    assert fetched.model_dump() == stored.model_dump()
    assert (await frontend.client.get(f"/v1/responses/{unstored.id}")).status_code == 404
    deleted = await frontend.client.delete(f"/v1/responses/{stored.id}")
    assert deleted.json() == {"id": stored.id, "object": "response.deleted", "deleted": True}
    gone = await frontend.client.delete(f"/v1/responses/{stored.id}")
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "response_id"
    assert (await frontend.client.get(f"/v1/responses/{stored.id}")).status_code == 404
    assert (await frontend.client.put(f"/v1/responses/{stored.id}")).status_code == 405
    assert len(frontend.app.response_store) == 0


async def test_json_schema_constrains_the_engine(make_frontend):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    async with make_frontend(workers=1, script=reply('{"a": 1}')) as fe:
        response = await sdk(fe).responses.create(
            model="dyn-tiny",
            input="json please",
            text={"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}},
        )
        constraint = fe.fleet.requests[-1].constraint
    assert json.loads(response.output_text) == {"a": 1} and response.text.format.type == "json_schema"
    assert constraint is not None


async def test_prompt_cache_key_is_the_session_when_no_header_named_one(frontend, monkeypatch):
    seen = []
    service = frontend.app.service
    prepare = service.prepare_chat

    async def spy(req, ctx, *args, **kwargs):
        seen.append(ctx.session_id)
        return await prepare(req, ctx, *args, **kwargs)

    monkeypatch.setattr(service, "prepare_chat", spy)
    await frontend.client.post(
        "/v1/responses", json={"model": "dyn-tiny", "input": "x", "prompt_cache_key": "conv-7"}
    )
    await frontend.client.post("/v1/responses", json={"model": "dyn-tiny", "input": "x"})
    r = await frontend.client.post(
        "/v1/responses", json={"model": "dyn-tiny", "input": "x", "prompt_cache_key": "not an id"}
    )
    await frontend.client.post(
        "/v1/responses",
        json={"model": "dyn-tiny", "input": "x", "prompt_cache_key": "conv-7"},
        headers={"session-id": "from-codex"},
    )
    assert r.status_code == 200 and seen == ["conv-7", None, None, "from-codex"]


async def test_dropped_tools_and_items_are_one_warning_each(frontend, caplog):
    body = {
        "model": "dyn-tiny",
        "input": [{"role": "user", "content": "x"}, {"type": "local_shell_call", "call_id": "a"}],
        "tools": [{"type": "web_search"}, {"type": "mcp", "server_label": "s"}],
        "tool_choice": "auto",
        "some_new_field": 1,
    }
    with caplog.at_level(logging.WARNING):
        r = await frontend.client.post("/v1/responses", json=body)
    assert r.status_code == 200
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert any("cannot run were ignored: mcp, web_search" in w for w in warnings)
    assert any("were dropped: local_shell_call x1" in w for w in warnings)
    assert any("some_new_field" in w for w in warnings)


def reply_with_logprobs(text: str) -> Script:
    """``reply(text)`` with each token's logprob (-0.5) and itself as its one top token."""
    ids = token_ids(text)

    async def script(request: GenerateRequest) -> AsyncIterator[Batch]:
        for token in ids:
            yield [TokenChunk(request.request_id, [token], [TokenLogprobs(-0.5, [token], [-0.5])])]
        yield [finish(request, "stop", len(ids))]

    return script


async def test_logprobs_when_included(make_frontend):
    async with make_frontend(workers=1, script=reply_with_logprobs("Hello there.")) as fe:
        body = {
            "model": "dyn-tiny",
            "input": "x",
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
        }
        unary = (await fe.client.post("/v1/responses", json=body)).json()
        events = sse_events((await fe.client.post("/v1/responses", json={**body, "stream": True})).text)
    Response.model_validate(unary)
    text = unary["output"][0]["content"][0]
    assert "".join(lp["token"] for lp in text["logprobs"]) == text["text"] == "Hello there."
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert all(len(d["logprobs"]) >= 1 for d in deltas)
    assert events[-1]["response"]["output"][0]["content"][0]["logprobs"] == text["logprobs"]


async def test_null_settings_are_their_defaults(frontend):
    body = {"model": "dyn-tiny", "input": "x", "store": None, "stream": None, "parallel_tool_calls": None}
    response = (await frontend.client.post("/v1/responses", json=body)).json()
    assert response["store"] is True and response["parallel_tool_calls"] is True
    assert (await frontend.client.get(f"/v1/responses/{response['id']}")).status_code == 200


NASTY = [
    {"input": [{"role": ["user"], "content": "x"}]},
    {"input": [{"role": "user", "content": [{"type": ["input_text"], "text": "x"}]}]},
    {"input": [{"role": "user", "content": [None, 1, "x"]}]},
    {"input": [{"type": 5}, {"type": None}, {"type": {"a": 1}}, {"role": "user", "content": "x"}]},
    {"input": [{"type": "reasoning", "content": [1], "summary": "x"}]},
    {"input": [{"type": "function_call", "call_id": 1, "name": [], "arguments": {}}]},
    {"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}, 3]}]},
    {"input": "x", "tools": [1, None, "web_search", [], {"type": 3}]},
    {"input": "x", "tools": [{"type": "namespace", "name": "n", "tools": [1, {"type": "function"}]}]},
    {
        "input": "x",
        "tools": [TOOL],
        "tool_choice": {"type": "allowed_tools", "tools": [{"type": "function", "name": []}]},
    },
    {"input": "x", "tools": [TOOL], "tool_choice": {"type": ["function"], "name": {}}},
    {"input": "x", "tools": [TOOL], "tool_choice": "sometimes"},
    {"input": "x", "text": {"format": {"type": "json_schema", "schema": {}, "name": 5, "strict": "yes"}}},
    {"input": "x", "text": {"format": {"type": "json_schema", "schema": {"type": "bogus"}}}},
    {"input": "x", "text": {"format": {"type": ["text"]}}},
    {"input": "x", "reasoning": {"effort": "x" * 300}},
    {"input": "x", "include": ["everything"], "truncation": "auto", "service_tier": "flex"},
    {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "not json"}]},
]


@pytest.mark.parametrize("body", NASTY)
async def test_malformed_requests_are_4xx_never_5xx(frontend, body):
    r = await frontend.client.post("/v1/responses", json={"model": "dyn-tiny", **body})
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert r.json()["error"]["message"]


async def test_errors_of_the_chat_path_name_the_responses_field(frontend):
    schema = {"type": "bogus"}
    r = await frontend.client.post(
        "/v1/responses",
        json={
            "model": "dyn-tiny",
            "input": "x",
            "text": {"format": {"type": "json_schema", "schema": schema}},
        },
    )
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "text.format.schema"
    assert error["message"].startswith("text.format.schema ")
    bad_call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "not json"}
    r = await frontend.client.post("/v1/responses", json={"model": "dyn-tiny", "input": [bad_call]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


async def test_request_errors_are_openai_error_bodies(frontend):
    r = await frontend.client.post(
        "/v1/responses", json={"model": "dyn-tiny", "input": "x", "background": True, "store": False}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "background"
    r = await frontend.client.post("/v1/responses", json={"model": "dyn-tiny", "input": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    r = await frontend.client.post(
        "/v1/responses", json={"model": "dyn-tiny", "input": "x", "metadata": {"k": 1}}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "metadata[...]"  # msgspec's name


# --------------------------------------------------------------------------- what Codex sends

FIXTURES = Path(__file__).parents[2] / "fixtures" / "agents"
CODEX = sorted(FIXTURES.glob("codex-*.json"))


@pytest.mark.skipif(not CODEX, reason="no captured Codex requests in tests/fixtures/agents")
@pytest.mark.parametrize("fixture", CODEX, ids=[f.stem for f in CODEX])
async def test_what_codex_sends_is_served(make_frontend, fixture, caplog):
    body = {**json.loads(fixture.read_text())["body"], "model": "dyn-tiny"}
    call = '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "ls"}}\n</tool_call>'
    async with make_frontend(workers=1, script=reply(call), **HERMES) as fe:
        with caplog.at_level(logging.WARNING):
            r = await fe.client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    for event in events:
        EVENTS.validate_python(event)
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed" and final["output"][-1]["name"] == "exec_command"
    assert any(
        "cannot run were ignored" in rec.getMessage() and "web_search" in rec.getMessage()
        for rec in caplog.records
    )


async def test_a_call_to_a_namespaced_function_names_its_namespace(make_frontend):
    namespace = {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Sub-agents.",
        "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}],
    }
    call = '<tool_call>\n{"name": "spawn_agent", "arguments": {}}\n</tool_call>'
    async with make_frontend(workers=1, script=reply(call), **HERMES) as fe:
        body = {"model": "dyn-tiny", "input": "spawn", "tools": [namespace]}
        unary = (await fe.client.post("/v1/responses", json=body)).json()
        events = sse_events((await fe.client.post("/v1/responses", json={**body, "stream": True})).text)
    added = next(e["item"] for e in events if e["type"] == "response.output_item.added")
    for item in (unary["output"][0], added, events[-1]["response"]["output"][0]):
        assert (item["name"], item["namespace"]) == ("spawn_agent", "multi_agent_v1")


# --------------------------------------------------------------------------- truncation "auto"

CONTEXT = 256
WORDS = " ".join(f"w{i}" for i in range(16))  # about 30 tokens of dyn-tiny


def prompt_turn(prompt: str) -> int:
    """The oldest user turn a prompt holds."""
    return min(t for t in range(5) if f"turn {t}:" in prompt)


def _long_conversation() -> list[dict]:
    """Five user turns, each long, with a tool call and its output in the third."""
    items: list[dict] = []
    for turn in range(5):
        items.append({"role": "user", "content": f"turn {turn}: {WORDS}"})
        if turn == 2:
            items.append({"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"})
            items.append({"type": "function_call_output", "call_id": "c2", "output": f"sunny {WORDS}"})
        items.append({"role": "assistant", "content": f"answer {turn}"})
    items.append({"role": "user", "content": "last question"})
    return items


async def test_truncation_auto_drops_the_oldest_turns_that_do_not_fit(make_frontend):
    records = {1: {"context_length": CONTEXT}}
    async with make_frontend(workers=1, records=records, script=reply("Fine."), **HERMES) as fe:
        await wait_until(lambda: fe.app.service.preprocessor.info.context_length == CONTEXT, 10, "the cap")
        body = {
            "model": "dyn-tiny",
            "instructions": "Be terse.",
            "input": _long_conversation(),
            "max_output_tokens": 16,
        }
        refused = await fe.client.post("/v1/responses", json=body)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
        assert not fe.fleet.requests
        r = await fe.client.post("/v1/responses", json={**body, "truncation": "auto"})
        assert r.status_code == 200, r.text
        response = Response.model_validate(r.json())
        sent = fe.fleet.requests[-1]
        prompt = tokenizer().decode(sent.token_ids)
        chat = chat_request(request(**body)).chat
        older = next(
            i
            for i, m in enumerate(chat.messages)
            if str(m.get("content")).startswith(f"turn {prompt_turn(prompt) - 1}:")
        )
        longer = msgspec.structs.replace(chat, messages=[chat.messages[0], *chat.messages[older:]])
        one_more_turn = len(await fe.app.service.preprocessor.tokenize_chat_async(longer))
    assert response.truncation == "auto" and response.usage.input_tokens == len(sent.token_ids)
    assert len(sent.token_ids) + 16 <= CONTEXT
    assert "Be terse." in prompt and "last question" in prompt and "turn 0:" not in prompt
    kept = [t for t in range(5) if f"turn {t}:" in prompt]
    assert kept and kept == list(range(kept[0], 5))  # the newest turns, whole
    assert one_more_turn + 16 > CONTEXT  # the fewest dropped


async def test_truncation_auto_fails_as_without_it_when_the_last_message_alone_is_too_long(make_frontend):
    records = {1: {"context_length": CONTEXT}}
    async with make_frontend(workers=1, records=records) as fe:
        await wait_until(lambda: fe.app.service.preprocessor.info.context_length == CONTEXT, 10, "the cap")
        body = {
            "model": "dyn-tiny",
            "input": [{"role": "user", "content": "old"}, {"role": "user", "content": WORDS * 12}],
            "truncation": "auto",
        }
        r = await fe.client.post("/v1/responses", json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert r.json()["error"]["param"] == "input"
        assert not fe.fleet.requests


async def test_an_unknown_truncation_is_a_400_naming_the_field(frontend):
    r = await frontend.client.post(
        "/v1/responses", json={"model": "dyn-tiny", "input": "x", "truncation": "some"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncation"


# --------------------------------------------------------------------------- input items


async def test_input_items_list_a_responses_own_input_a_page_at_a_time(make_frontend):
    async with make_frontend(workers=1, script=reply("It is sunny.")) as fe:
        client = sdk(fe)
        first = await client.responses.create(model="dyn-tiny", input="Weather in Paris?")
        own = [
            {"role": "user", "content": "And tomorrow?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "rain", "id": "fco_mine"},
            {"role": "user", "content": [{"type": "input_text", "text": "Thanks!"}]},
        ]
        second = await client.responses.create(model="dyn-tiny", input=own, previous_response_id=first.id)
        newest_first = [item async for item in client.responses.input_items.list(second.id)]
        oldest_first = [
            item async for item in client.responses.input_items.list(second.id, order="asc", limit=1)
        ]
        page = await client.responses.input_items.list(
            second.id, order="asc", limit=2, after=oldest_first[0].id
        )
        again = [item async for item in client.responses.input_items.list(second.id)]
        first_items = [item async for item in client.responses.input_items.list(first.id)]
        missing = await fe.client.get("/v1/responses/resp_gone/input_items")
        bad_limit = await fe.client.get(f"/v1/responses/{second.id}/input_items?limit=101")
        bad_after = await fe.client.get(f"/v1/responses/{second.id}/input_items?after=nope")
        long_query = await fe.client.get(f"/v1/responses/{second.id}/input_items?after={'x' * 5000}")
        other = await fe.client.get(f"/v1/responses/{second.id}/output_items")
    assert [i.type for i in oldest_first] == ["message", "function_call", "function_call_output", "message"]
    assert [i.id for i in newest_first] == [i.id for i in reversed(oldest_first)] == [i.id for i in again]
    assert len({i.id for i in oldest_first}) == 4 and oldest_first[2].id == "fco_mine"
    assert oldest_first[0].content[0].text == "And tomorrow?" and oldest_first[3].content[0].text == "Thanks!"
    assert oldest_first[1].call_id == "c1" and oldest_first[1].name == "get_weather"
    assert [i.id for i in page.data] == [i.id for i in oldest_first[1:3]] and page.has_more
    assert [i.content[0].text for i in first_items] == ["Weather in Paris?"]  # the history is not listed
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "response_id"
    assert bad_limit.status_code == 400 and bad_limit.json()["error"]["param"] == "limit"
    assert bad_after.status_code == 400 and bad_after.json()["error"]["param"] == "after"
    assert long_query.status_code == 400 and long_query.json()["error"]["param"] == "query"
    assert other.status_code == 404


async def test_a_continued_response_stores_the_history_and_only_appends_its_own_items(make_frontend):
    async with make_frontend(workers=1, script=reply("Fine.")) as fe:
        client = sdk(fe)
        first = await client.responses.create(model="dyn-tiny", input="one")
        second = await client.responses.create(model="dyn-tiny", input="two", previous_response_id=first.id)
        store = fe.app.response_store
        history, stored = store.get(first.id), store.get(second.id)
    assert stored.conversation.startswith(history.conversation[:-1] + b",")
    items = json.loads(stored.conversation)
    assert [i.get("content") for i in items if i.get("role") == "user"] == ["one", "two"]
    assert stored.inputs == (2, 3) and history.inputs == (0, 1)


# --------------------------------------------------------------------------- background


async def _ended(client: openai.AsyncOpenAI, response_id: str) -> Response:
    """The stored response once it has ended (polled as a client polls, at most 10 s)."""
    for _ in range(500):
        got = await client.responses.retrieve(response_id)
        if got.status not in ("queued", "in_progress"):
            return got
        await anyio.sleep(0.02)
    raise AssertionError(f"background response {response_id} still {got.status} after 10 s")


async def test_a_background_response_is_answered_at_once_and_read_back_when_it_ends(make_frontend):
    release = anyio.Event()
    async with make_frontend(workers=1, script=held(release, reply("It is sunny."))) as fe:
        client = sdk(fe)
        created = await client.responses.create(model="dyn-tiny", input="Weather?", background=True)
        running = await client.responses.retrieve(created.id)
        busy = await fe.client.post(
            "/v1/responses", json={"model": "dyn-tiny", "input": "more", "previous_response_id": created.id}
        )
        await wait_until(lambda: fe.app.inflight == 1, 10, "the task to count against --max-inflight")
        release.set()
        done = await _ended(client, created.id)
        follow = await client.responses.create(
            model="dyn-tiny", input="Thanks", previous_response_id=created.id
        )
        items = [i async for i in client.responses.input_items.list(created.id)]
    assert created.status == "queued" and created.background and created.output == []
    assert running.status == "in_progress" and running.usage is None
    assert busy.status_code == 400 and busy.json()["error"]["param"] == "previous_response_id"
    assert done.status == "completed" and done.output_text == "It is sunny." and done.background
    assert done.usage.output_tokens == len(token_ids("It is sunny."))
    assert follow.status == "completed" and [i.content[0].text for i in items] == ["Weather?"]
    assert fe.app.inflight == 0 and not fe.fleet.cancelled


async def _running_background(fe, text: str) -> tuple[openai.AsyncOpenAI, Response]:
    """A background response on ``fe``'s endless worker, once its engine request is out."""
    client = sdk(fe)
    created = await client.responses.create(model="dyn-tiny", input=text, background=True)
    await wait_until(lambda: fe.fleet.requests, 10, "the engine request")
    return client, created


async def test_cancel_stops_a_running_background_response_and_its_engine_request(make_frontend):
    async with make_frontend(workers=1, script=endless()) as fe:
        client, created = await _running_background(fe, "Go on forever")
        cancelled = await client.responses.cancel(created.id)
        read = await client.responses.retrieve(created.id)
        again = await fe.client.post(f"/v1/responses/{created.id}/cancel")
        unknown = await fe.client.post("/v1/responses/resp_gone/cancel")
        for worker in fe.fleet:
            worker.script = reply("ok")
        plain = await client.responses.create(model="dyn-tiny", input="x")
        not_background = await fe.client.post(f"/v1/responses/{plain.id}/cancel")
        await wait_until(lambda: fe.fleet.cancelled, 10, "the engine request's cancel")
    assert cancelled.status == read.status == "cancelled" and cancelled.id == created.id
    assert fe.fleet.cancelled == [fe.fleet.requests[0].request_id]
    assert again.status_code == 400 and again.json()["error"]["param"] == "response_id"
    assert unknown.status_code == 404 and not_background.status_code == 400
    assert fe.app.inflight == 0


async def test_deleting_a_running_background_response_cancels_it(make_frontend):
    async with make_frontend(workers=1, script=endless()) as fe:
        client, created = await _running_background(fe, "Go on")
        deleted = await client.responses.delete(created.id)
        gone = await fe.client.get(f"/v1/responses/{created.id}")
        await wait_until(lambda: fe.fleet.cancelled, 10, "the engine request's cancel")
    assert deleted is None and gone.status_code == 404
    assert fe.app.inflight == 0 and not fe.app.background_responses


async def test_a_failed_background_response_is_stored_failed(make_frontend):
    async with make_frontend(workers=1, script=failing()) as fe:
        client = sdk(fe)
        created = await client.responses.create(model="dyn-tiny", input="x", background=True)
        done = await _ended(client, created.id)
    assert done.status == "failed" and "fake engine failed" in done.error.message


async def test_an_unstored_background_response_is_a_400(frontend):
    body = {"model": "dyn-tiny", "input": "x", "background": True, "store": False}
    r = await frontend.client.post("/v1/responses", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "background"
    assert not frontend.fleet.requests


async def test_background_responses_are_bounded(make_frontend):
    async with make_frontend(workers=1, script=endless(), responses_store_max_entries=2) as fe:
        assert fe.app.response_store.max_count == 2  # the flag reaches the app's store
        client = sdk(fe)
        for _ in range(2):
            await client.responses.create(model="dyn-tiny", input="x", background=True)
        over = await fe.client.post(
            "/v1/responses", json={"model": "dyn-tiny", "input": "x", "background": True}
        )
        assert over.status_code == 429 and over.json()["error"]["param"] == "background"
        for response_id in list(fe.app.background_responses._tasks):
            await client.responses.cancel(response_id)


async def test_at_exit_running_background_responses_get_the_grace_period_then_are_cancelled(make_frontend):
    release = anyio.Event()

    def script(request):
        return (
            endless()(request)
            if "forever" in tokenizer().decode(request.token_ids)
            else held(release, reply("Done."))(request)
        )

    async with make_frontend(workers=1, script=script) as fe:
        client = sdk(fe)
        quick = await client.responses.create(model="dyn-tiny", input="soon", background=True)
        slow = await client.responses.create(model="dyn-tiny", input="forever", background=True)
        await wait_until(lambda: len(fe.fleet.requests) == 2, 10, "both engine requests")
        release.set()
        await fe.app.background_responses.drain(0.5)
        quick_end = await client.responses.retrieve(quick.id)
        slow_end = await client.responses.retrieve(slow.id)
    assert (quick_end.status, slow_end.status) == ("completed", "cancelled")
    assert len(fe.fleet.cancelled) == 1 and not fe.app.background_responses


# --------------------------------------------------------------------------- item references


async def test_item_references_stand_for_the_stored_items_they_name(make_frontend):
    async with make_frontend(workers=1, script=reply("It is sunny.")) as fe:
        client = sdk(fe)
        first = await client.responses.create(model="dyn-tiny", input="Weather in Paris?")
        listed = [item async for item in client.responses.input_items.list(first.id)]
        body = {
            "model": "dyn-tiny",
            "input": [
                {"type": "item_reference", "id": listed[0].id},
                {"type": "item_reference", "id": first.output[0].id},
                {"role": "user", "content": "And tomorrow?"},
            ],
        }
        r = await fe.client.post("/v1/responses", json=body)
        prompt = tokenizer().decode(fe.fleet.requests[-1].token_ids)
        refused = []
        for bad_id in ("msg_nothere_0", "fco_mine", f"{first.output[0].id[:-1]}9", "x_" + "1" * 20, 7):
            body["input"] = [{"type": "item_reference", "id": bad_id}]
            refused.append(await fe.client.post("/v1/responses", json=body))
    assert r.status_code == 200, r.text
    assert prompt.index("Weather in Paris?") < prompt.index("It is sunny.") < prompt.index("And tomorrow?")
    for bad in refused:
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[0].id", bad.text
