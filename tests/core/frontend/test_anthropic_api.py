"""Anthropic's Messages API: the adapter to a chat request, and ``/v1/messages`` and
``/v1/messages/count_tokens`` in-process over fake workers, read by the ``anthropic`` SDK (its
``MessageStream`` accumulation checks the events' order and shapes)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import httpx2
import msgspec
import pytest

from dyn.core.frontend.apis.anthropic.adapter import adapt
from dyn.core.frontend.apis.anthropic.openapi import openapi_paths
from dyn.core.frontend.apis.anthropic.protocol import CountTokensRequest, MessagesRequest
from dyn.core.frontend.apis.anthropic.wire import signature, stop_reason
from dyn.core.frontend.chat_template import BILLING_HEADER
from dyn.core.messages import Finish, GenerateRequest, TokenChunk, Usage
from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.openai import decode_request
from tests.core.frontend.conftest import BASE_URL, Frontend
from tests.core.frontend.fake_workers import Batch, Script, failing, reply, token_ids

pytestmark = pytest.mark.anyio

MODEL = "dyn-tiny"
FIXTURES = Path(__file__).parents[2] / "fixtures" / "agents"


def request(**fields) -> MessagesRequest:
    body = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **fields}
    return decode_request(msgspec.json.encode(body), MessagesRequest)


def chat(**fields):
    return adapt(request(**fields))[0]


def bad(body: dict, kind: type = MessagesRequest) -> ApiError:
    with pytest.raises(ApiError) as info:
        adapt(decode_request(msgspec.json.encode(body), kind))
    return info.value


# --------------------------------------------------------------------------- the adapter


def test_system_blocks_join_without_the_billing_line():
    system = [
        {"type": "text", "text": f"{BILLING_HEADER}: cc_version=2.1.332.abc; cc_entrypoint=cli; cch=1f2e3;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be brief."},
    ]
    messages = chat(system=system).messages
    assert messages[0] == {"role": "system", "content": "You are Claude Code.\nBe brief."}
    assert chat(system="Plain.").messages[0] == {"role": "system", "content": "Plain."}


def test_leading_system_messages_join_the_system_prompt_and_later_ones_stay_in_place():
    turns = [
        {"role": "system", "content": "Lead."},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "system", "content": [{"type": "text", "text": "Reminder."}]},
        {"role": "user", "content": "three"},
    ]
    assert chat(system="Top.", messages=turns).messages == [
        {"role": "system", "content": "Top.\nLead."},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "system", "content": "Reminder."},
        {"role": "user", "content": "three"},
    ]


def test_a_tool_round_trip_becomes_tool_calls_and_tool_messages():
    turns = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Call it.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {"role": "system", "content": "Between the call and its result."},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "is_error": True,
                    "content": [{"type": "text", "text": "<tool_use_error>no</tool_use_error>"}],
                },
                {"type": "text", "text": "<system-reminder>go on</system-reminder>"},
            ],
        },
    ]
    messages = chat(messages=turns).messages
    assert messages == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Call it.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "<tool_use_error>no</tool_use_error>"},
        {"role": "user", "content": "<system-reminder>go on</system-reminder>"},
        {"role": "system", "content": "Between the call and its result."},
    ]


def test_newer_claude_code_roles_are_user_turns():
    assert chat(messages=[{"role": "ctx", "content": "a"}, {"role": "msg", "content": "b"}]).messages == [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
    ]


def test_a_final_assistant_text_is_continued():
    req = chat(
        messages=[{"role": "user", "content": "Say A"}, {"role": "assistant", "content": "The answer is"}]
    )
    assert req.continue_final_message and not req.add_generation_prompt
    assert chat().add_generation_prompt and not chat().continue_final_message


def test_images_become_image_url_parts_in_order_in_user_turns_and_tool_results():
    """Claude Code sends screenshots as image blocks in a user turn or a tool result."""
    png = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    text = {"type": "text", "text": "What is this?"}
    result = {"type": "tool_result", "tool_use_id": "t", "content": [png, {"type": "text", "text": "done"}]}
    messages = chat(messages=[{"role": "user", "content": [result, png, text, url]}]).messages
    assert messages == [
        {
            "role": "tool",
            "tool_call_id": "t",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "done"},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                text,
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            ],
        },
    ]
    file = {"type": "image", "source": {"type": "file"}}  # no file_id: the uploads are read before
    exc = bad({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [file]}]})
    assert exc.param == "messages[0].content[0].source" and "the file_id of an upload" in exc.message


def test_blocks_in_the_wrong_turn_are_a_400():
    use = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    exc = bad({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [use]}]})
    assert exc.param == "messages[0].content[0]" and "tool_use" in exc.message


def test_tools_keep_client_tools_and_ignore_server_tools():
    tools = [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        {
            "name": "Read",
            "description": "Read a file",
            "input_schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
            "cache_control": {"type": "ephemeral", "ttl": "1h"},
        },
        {"type": "bash_20250124", "name": "bash"},
    ]
    req, names = adapt(request(tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True}))
    assert [t["function"]["name"] for t in req.tools] == ["Read"]
    assert req.tools[0]["function"]["parameters"]["required"] == ["path"]
    assert req.tool_choice == "required" and req.parallel_tool_calls is False
    assert req.nvext.cache_control.ttl == "1h"
    assert names.name("tools[0].function.parameters") == "tools[1].input_schema"
    assert names.name("stop[2]") == "stop_sequences[2]"


@pytest.mark.parametrize(
    "choice, expected",
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "Read"}, {"type": "function", "function": {"name": "Read"}}),
    ],
)
def test_tool_choice(choice, expected):
    tools = [{"name": "Read", "input_schema": {"type": "object"}}]
    assert chat(tools=tools, tool_choice=choice).tool_choice == expected


def test_a_client_tool_needs_its_schema_and_a_named_choice_its_name():
    assert bad({**_body(), "tools": [{"name": "x"}]}).param == "tools[0].input_schema"
    tools = [{"name": "x", "input_schema": {}}]
    assert bad({**_body(), "tools": tools, "tool_choice": {"type": "tool"}}).param == "tool_choice.name"


def test_thinking():
    on = chat(thinking={"type": "enabled", "budget_tokens": 2048})
    assert on.chat_template_kwargs == {"enable_thinking": True, "thinking": True}
    assert on.nvext.max_thinking_tokens == 2048
    adaptive = chat(thinking={"type": "adaptive"})
    assert (
        adaptive.chat_template_kwargs == {"enable_thinking": True, "thinking": True}
        and adaptive.nvext is None
    )
    off = chat(thinking={"type": "disabled"}, chat_template_kwargs={"thinking": True})
    assert off.chat_template_kwargs == {"enable_thinking": False, "thinking": True}  # the client's own win
    assert bad({**_body(), "thinking": {"type": "enabled"}}).param == "thinking.budget_tokens"


def test_cache_control_anywhere_pins_with_the_longest_ttl():
    assert chat().nvext is None
    five = chat(system=[{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}])
    assert five.nvext.cache_control.ttl == "5m"
    hour = chat(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                    {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}},
                ],
            }
        ]
    )
    assert hour.nvext.cache_control.ttl == "1h"


def test_sampling_stop_metadata_and_output_format():
    req = chat(
        stop_sequences=["END"],
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        metadata={"user_id": "u1"},
        stream=True,
        output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}, "effort": "high"},
    )
    assert (req.stop, req.temperature, req.top_p, req.top_k, req.user, req.stream) == (
        ["END"],
        0.5,
        0.9,
        40,
        "u1",
        True,
    )
    assert req.max_tokens == 64
    assert req.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": {"type": "object"}},
    }
    assert req.chat_template_kwargs == {"reasoning_effort": "high"}  # as the Responses API's effort
    with pytest.raises(ApiError) as caught:
        chat(output_config={"effort": "x" * 65})
    assert caught.value.param == "output_config.effort"


def test_count_tokens_needs_no_max_tokens():
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    req, _ = adapt(decode_request(msgspec.json.encode(body), CountTokensRequest))
    assert req.max_tokens is None and req.messages == [{"role": "user", "content": "hi"}]


def test_stop_reasons():
    assert stop_reason("stop", None, False) == ("end_turn", None)
    assert stop_reason("stop", "END", False) == ("stop_sequence", "END")
    assert stop_reason("length", None, True) == ("max_tokens", None)
    assert stop_reason("tool_calls", None, True) == ("tool_use", None)
    assert stop_reason("stop", None, True) == ("tool_use", None)  # a forced call keeps "stop"
    assert signature("x") == signature("x") != signature("y")


def _body(**fields) -> dict:
    return {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **fields}


# --------------------------------------------------------------------------- in process


def client(fe: Frontend, api_key: str = "unused") -> anthropic.AsyncAnthropic:
    """The SDK over the app in process (its own HTTP package, ``httpx2``, carries the ASGI call)."""
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=fe.app), base_url=BASE_URL)
    return anthropic.AsyncAnthropic(api_key=api_key, base_url=BASE_URL, http_client=http, max_retries=0)


def scripted(text: str, cached: int = 0) -> Script:
    """Answer ``text`` a token at a time; the Finish reports ``cached`` prompt tokens hit."""
    ids = token_ids(text)

    async def script(req: GenerateRequest) -> AsyncIterator[Batch]:
        limit = req.stop.max_tokens
        out = ids if limit is None else ids[:limit]
        for token in out:
            yield [TokenChunk(req.request_id, [token])]
        reason = "length" if len(out) < len(ids) else "stop"
        yield [Finish(req.request_id, reason, Usage(len(req.token_ids), len(out), cached))]

    return script


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


async def test_unary_text_with_usage_split_by_the_cache_hit(make_frontend):
    async with make_frontend(workers=1, script=scripted("Hello there.", cached=3)) as fe:
        message = await client(fe).messages.create(
            model=MODEL, max_tokens=32, messages=[{"role": "user", "content": "hi"}]
        )
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == "Hello there."
    assert message.stop_reason == "end_turn" and message.stop_sequence is None and message.model == MODEL
    prompt = len(fe.fleet[1].requests[0].token_ids)
    u = message.usage
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (prompt - 3, 3, 0)
    assert u.output_tokens == len(token_ids("Hello there."))


async def test_stream_text_as_the_sdk_accumulates_it(make_frontend):
    async with make_frontend(workers=1, script=scripted("Hello there.", cached=2)) as fe:
        async with client(fe).messages.stream(
            model=MODEL, max_tokens=32, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            events = [event.type async for event in stream]
            message = await stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert events.count("content_block_start") == 1 and events.count("content_block_stop") == 1
    assert message.content[0].text == "Hello there." and message.stop_reason == "end_turn"
    assert message.usage.cache_read_input_tokens == 2
    assert message.usage.input_tokens == len(fe.fleet[1].requests[0].token_ids) - 2


async def test_raw_stream_events_are_anthropics(make_frontend):
    async with make_frontend(workers=1, script=scripted("Hi.")) as fe:
        r = await fe.client.post(
            "/v1/messages?beta=true", json=_body(stream=True), headers=_anthropic_headers()
        )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [(e.split("\n")[0], json.loads(e.split("\n")[1][6:])) for e in r.text.strip().split("\n\n")]
    names = [name.removeprefix("event: ") for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in zip(names, (d for _, d in events), strict=True))
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert "[DONE]" not in r.text


async def test_stream_tool_use_and_thinking(make_frontend):
    text = f"<think>Need the weather.</think>Let me check.\n{CALL}"
    async with make_frontend(
        workers=1,
        script=scripted(text),
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        reasoning_parser="deepseek_r1",
    ) as fe:
        async with client(fe).messages.stream(
            model=MODEL,
            max_tokens=200,
            tools=[WEATHER],
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=[{"role": "user", "content": "weather in Paris?"}],
        ) as stream:
            message = await stream.get_final_message()
        unary = await client(fe).messages.create(
            model=MODEL,
            max_tokens=200,
            tools=[WEATHER],
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=[{"role": "user", "content": "weather in Paris?"}],
        )
        sent = fe.fleet[1].requests[0]
    for m in (message, unary):
        assert [b.type for b in m.content] == ["thinking", "text", "tool_use"]
        thinking, text_block, call = m.content
        assert thinking.thinking == "Need the weather." and thinking.signature == signature(
            "Need the weather."
        )
        assert text_block.text.strip() == "Let me check."
        assert call.name == "get_weather" and call.input == {"city": "Paris"}
        assert m.stop_reason == "tool_use"
    assert sent.max_thinking_tokens == 1024


async def test_a_tool_result_round_trip_reaches_the_worker(make_frontend):
    async with make_frontend(
        workers=1, script=scripted("It is sunny."), tool_call_parser="hermes", enable_auto_tool_choice=True
    ) as fe:
        message = await client(fe).messages.create(
            model=MODEL,
            max_tokens=50,
            tools=[WEATHER],
            messages=[
                {"role": "user", "content": "weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "t", "signature": signature("t")},
                        {
                            "type": "tool_use",
                            "id": "call_1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}],
                },
            ],
        )
        prompt = fe.app.service.preprocessor.tokenizer.decode(fe.fleet[1].requests[0].token_ids, False)
    assert message.content[0].text == "It is sunny." and message.stop_reason == "end_turn"
    assert '"name": "get_weather", "arguments": {"city": "Paris"}' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt


async def test_stop_sequences_and_max_tokens(make_frontend):
    async with make_frontend(workers=1, script=scripted("one two three four five six")) as fe:
        sdk = client(fe)
        stopped = await sdk.messages.create(
            model=MODEL,
            max_tokens=50,
            stop_sequences=["four"],
            messages=[{"role": "user", "content": "count"}],
        )
        async with sdk.messages.stream(
            model=MODEL,
            max_tokens=50,
            stop_sequences=["four"],
            messages=[{"role": "user", "content": "count"}],
        ) as stream:
            streamed = await stream.get_final_message()
        cut = await sdk.messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "count"}]
        )
    for m in (stopped, streamed):
        assert m.stop_reason == "stop_sequence" and m.stop_sequence == "four"
        assert m.content[0].text.strip() == "one two three"
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2


async def test_count_tokens_is_the_prompt_a_request_sends(make_frontend):
    tools = [WEATHER]
    messages = [{"role": "user", "content": "weather in Paris?"}]
    async with make_frontend(workers=1, tool_call_parser="hermes", enable_auto_tool_choice=True) as fe:
        sdk = client(fe)
        counted = await sdk.messages.count_tokens(
            model=MODEL, system="Be brief.", tools=tools, messages=messages
        )
        sent = await sdk.messages.create(
            model=MODEL, max_tokens=5, system="Be brief.", tools=tools, messages=messages
        )
    u = sent.usage
    assert (
        counted.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens > 0
    )


async def test_errors_are_anthropics_shape(make_frontend):
    async with make_frontend(workers=1, api_key="sekrit") as fe:
        with pytest.raises(anthropic.AuthenticationError) as denied:
            await client(fe, api_key="wrong").messages.create(
                model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            )
        assert denied.value.body["type"] == "error"
        assert denied.value.body["error"]["type"] == "authentication_error"
        sdk = client(fe, api_key="sekrit")
        with pytest.raises(anthropic.BadRequestError) as invalid:
            await sdk.messages.create(model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "hi"}])
        error = invalid.value.body["error"]
        assert error["type"] == "invalid_request_error" and "max_tokens" in error["message"]
        with pytest.raises(anthropic.NotFoundError) as missing:
            await sdk.messages.create(
                model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            )
        assert missing.value.body["error"]["type"] == "not_found_error"
        with pytest.raises(anthropic.BadRequestError) as counted:
            await sdk.messages.count_tokens(model=MODEL, messages=[])
        assert counted.value.body["error"]["type"] == "invalid_request_error"
        r = await fe.client.post("/v1/messages", content=b"{}", headers={"x-api-key": "sekrit"})
        assert r.status_code == 415 and r.json()["error"]["type"] == "invalid_request_error"
        r = await fe.client.get("/v1/messages", headers={"x-api-key": "sekrit"})
        assert r.status_code == 405 and r.json()["type"] == "error"


async def test_a_failure_after_the_stream_started_is_an_error_event(make_frontend):
    async with make_frontend(workers=1, script=failing()) as fe:
        r = await fe.client.post("/v1/messages", json=_body(stream=True))
        assert r.status_code == 200
        last = r.text.strip().split("\n\n")[-1]
        assert last.startswith("event: error\ndata: ")
        body = json.loads(last.split("\n", 1)[1][6:])
        assert body["type"] == "error" and body["error"]["type"] == "api_error" and body["request_id"]
        with pytest.raises(anthropic.APIStatusError):
            async with client(fe).messages.stream(
                model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                await stream.get_final_message()


async def test_unknown_fields_claude_code_sends_are_accepted(make_frontend, caplog):
    body = _body(
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        betas=["x"],
        container=None,
        mcp_servers=[],
        service_tier="auto",
        output_config={"effort": "high"},
    )
    async with make_frontend(workers=1, script=reply("ok")) as fe:
        r = await fe.client.post(
            "/v1/messages?beta=true", json=body, headers={**_anthropic_headers(), "x-api-key": "anything"}
        )
    assert r.status_code == 200 and r.json()["content"] == [{"type": "text", "text": "ok"}]
    assert "mcp_servers" in caplog.text and "context_management" not in caplog.text  # honoured
    assert r.json()["context_management"] == {"applied_edits": []}  # keep: all clears nothing


def _anthropic_headers() -> dict[str, str]:
    return {"anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking-2025-05-14,context-1m"}


CLAUDE_CODE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
    "x-api-key": "sk-ant-anything",
    "x-claude-code-session-id": "6f1c7c0e-0d8e-4c55-9d1b-0d7f2a0c9b11",
    "x-app": "cli",
}


def claude_code_body() -> dict:
    """A request shaped as Claude Code 2.1's (shared/reference/anchors-2026-11.md): billing line
    and cached system blocks, 2020-12 tool schemas, adaptive thinking, ``output_config``,
    ``context_management``, a mid-conversation system message, a tool round trip with thinking."""
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"file_path": {"type": "string", "description": "Absolute path"}},
        "required": ["file_path"],
        "additionalProperties": False,
    }
    ephemeral = {"type": "ephemeral"}
    return {
        "model": MODEL,
        "max_tokens": 256,
        "stream": True,
        "temperature": 1,
        "metadata": {"user_id": "user_0123_account__session_6f1c7c0e"},
        "system": [
            {
                "type": "text",
                "text": f"{BILLING_HEADER}: cc_version=2.1.332.f00; cc_entrypoint=sdk-cli; cch=7a1b2;",
            },
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                "cache_control": ephemeral,
            },
            {"type": "text", "text": "You are an interactive CLI tool. " * 20, "cache_control": ephemeral},
        ],
        "tools": [
            {"name": "Read", "description": "Reads a file.", "input_schema": schema},
            {"name": "Glob", "description": "Finds files.", "input_schema": {**schema, "required": []}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 8},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>\nAs you answer...\n</system-reminder>"},
                    {"type": "text", "text": "read README.md", "cache_control": ephemeral},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should read it.", "signature": "EqQBCkYIBxgCKkB"},
                    {
                        "type": "tool_use",
                        "id": "toolu_01",
                        "name": "Read",
                        "input": {"file_path": "/r/README.md"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": [{"type": "text", "text": "     1\t# dyn"}],
                        "cache_control": ephemeral,
                    }
                ],
            },
            {"role": "system", "content": "The user switched to plan mode."},
        ],
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "medium"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    }


async def test_a_claude_code_request_is_served(make_frontend):
    async with make_frontend(
        workers=1, script=reply("Done."), tool_call_parser="hermes", enable_auto_tool_choice=True
    ) as fe:
        r = await fe.client.post(
            "/v1/messages?beta=true", json=claude_code_body(), headers=CLAUDE_CODE_HEADERS
        )
        counted = await fe.client.post(
            "/v1/messages/count_tokens?beta=true",
            json={k: v for k, v in claude_code_body().items() if k not in ("max_tokens", "stream")},
            headers=CLAUDE_CODE_HEADERS,
        )
        sent = fe.fleet[1].requests[0]
        prompt = fe.app.service.preprocessor.tokenizer.decode(sent.token_ids, False)
    assert r.status_code == 200, r.text
    events = [json.loads(e.split("\ndata: ", 1)[1]) for e in r.text.strip().split("\n\n")]
    assert events[-1]["type"] == "message_stop"
    assert (
        "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta") == "Done."
    )
    assert counted.status_code == 200 and counted.json()["input_tokens"] == len(sent.token_ids)
    assert BILLING_HEADER not in prompt and "web_search" not in prompt
    assert prompt.index("You are Claude Code") < prompt.index("read README.md") < prompt.index("# dyn")
    assert prompt.index("# dyn") < prompt.index("The user switched to plan mode.")


async def test_a_400_from_the_chat_path_names_the_messages_field(make_frontend):
    async with make_frontend(workers=1) as fe:
        r = await fe.client.post("/v1/messages", json=_body(stop_sequences=["x"] * 100))
    error = r.json()["error"]
    assert r.status_code == 400 and error["type"] == "invalid_request_error"
    assert (
        error["message"].startswith("stop_sequences holds 100 strings")
        and "--max-stop-strings" in error["message"]
    )


_HOP_HEADERS = ("host", "content-length", "connection", "accept-encoding")


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("claude-*.json")), ids=lambda p: p.name)
async def test_claude_code_requests_are_served_as_captured(make_frontend, fixture):
    """The requests the real Claude Code sent (``tests/fixtures/agents``: method, path, query,
    headers, body) are served as they are, and the stream is one the SDK accumulates."""
    captured = json.loads(fixture.read_text())
    body = captured["body"]
    body = json.loads(body) if isinstance(body, str) else body
    query = captured.get("query")
    path = captured.get("path", "/v1/messages") + (f"?{query}" if query else "")
    headers = {k: v for k, v in captured.get("headers", {}).items() if k.lower() not in _HOP_HEADERS}
    async with make_frontend(
        workers=1, script=reply("Done."), tool_call_parser="hermes", enable_auto_tool_choice=True
    ) as fe:
        r = await fe.client.request(captured.get("method", "POST"), path, json=body, headers=headers)
        assert r.status_code == 200, r.text
        counted = await fe.client.post(
            "/v1/messages/count_tokens?beta=true",
            json={k: v for k, v in body.items() if k not in ("max_tokens", "stream")},
            headers=headers,
        )
        sent = fe.fleet[1].requests[0]
    assert counted.status_code == 200 and counted.json()["input_tokens"] == len(sent.token_ids)
    events = [json.loads(e.split("\ndata: ", 1)[1]) for e in r.text.strip().split("\n\n")]
    assert [e["type"] for e in events[:2]] == ["message_start", "ping"] and events[-1][
        "type"
    ] == "message_stop"
    assert (
        "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta") == "Done."
    )


def test_the_openapi_part_describes_both_paths_with_prefixed_schemas():
    paths, schemas = openapi_paths("dyn-tiny")
    assert set(paths) == {"/v1/messages", "/v1/messages/count_tokens"}
    assert all(name.startswith("Anthropic") for name in schemas)
    assert schemas["AnthropicMessagesRequest"]["properties"]["model"] == {
        "type": "string",
        "enum": ["dyn-tiny"],
    }
    assert "max_tokens" in schemas["AnthropicMessagesRequest"]["required"]
    assert "max_tokens" not in schemas["AnthropicCountTokensRequest"].get("required", [])


async def test_no_enable_anthropic_api_turns_both_paths_off(make_frontend):
    async with make_frontend(workers=1, enable_anthropic_api=False) as fe:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            response = await fe.client.post(
                path,
                json={"model": "dyn-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert response.status_code == 404, path
        assert (
            await fe.client.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
            )
        ).status_code == 200


def test_the_server_tool_types_warned_about_are_bounded(monkeypatch):
    from dyn.core.frontend.apis.anthropic import adapter

    monkeypatch.setattr(adapter, "_warned_hosted", set())
    for i in range(3 * adapter.MAX_WARNED_TYPES):
        req = msgspec.convert(
            {
                "model": "dyn-tiny",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"name": "search", "type": f"web_search_{i}"}],
            },
            MessagesRequest,
        )
        adapt(req)
    assert len(adapter._warned_hosted) == adapter.MAX_WARNED_TYPES


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("messages", {"messages": [{"role": "user", "content": "hi"}] * 4097}),
        (
            "messages[0].content",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 4097}]},
        ),
        ("system", {"system": [{"type": "text", "text": "x"}] * 4097}),
        ("tools", {"tools": [{"name": f"t{i}", "input_schema": {"type": "object"}} for i in range(4097)]}),
    ],
)
async def test_oversized_lists_are_anthropic_400s_naming_the_field(make_frontend, field, body):
    async with make_frontend(workers=1) as fe:
        request = {
            "model": "dyn-tiny",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
            **body,
        }
        response = await fe.client.post("/v1/messages", json=request)
        assert response.status_code == 400, response.text[:300]
        error = response.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        assert field in error["error"]["message"], error
