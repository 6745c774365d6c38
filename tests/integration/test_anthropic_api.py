"""Anthropic's Messages API against real dyn processes, through the ``anthropic`` SDK: a frontend
with an API key over one mocker worker that answers from a ``--replies`` script (Hermes tool calls,
as dyn-tiny's chat template writes them; ``<think>`` sections read by the ``basic`` reasoning
parser the worker advertises)."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
KEY = "anthropic-test-key"
REPLIES = [
    {
        "match": "weather in Paris",
        "text": 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    },
    {"match": "18 C and sunny", "text": "It is 18 C and sunny in Paris."},
    {"match": "think first", "text": "<think>The user wants a number.</think>42"},
    {"match": "count for me", "text": "one two three STOP four five"},
    {"match": "", "text": "Hello from the mocker."},
]
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def url(stack_factory, tmp_path_factory):
    replies = tmp_path_factory.mktemp("anthropic") / "replies.jsonl"
    replies.write_text("".join(json.dumps(r) + "\n" for r in REPLIES))
    worker_args = ("--block-size", "16", "--replies", str(replies), "--dyn-reasoning-parser", "basic")
    return stack_factory("anthropic").up("--api-key", KEY, workers=1, worker_args=worker_args).url


@pytest.fixture
def client(url):
    return anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_unary_message(client):
    message = client.messages.create(model=MODEL, max_tokens=64, messages=user("hello"))
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Hello from the mocker."
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_streamed_text_through_the_beta_path(client):
    with client.beta.messages.stream(
        model=MODEL, max_tokens=64, messages=user("hello"), betas=["interleaved-thinking-2025-05-14"]
    ) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert text == "Hello from the mocker." == message.content[0].text
    assert message.stop_reason == "end_turn"


def test_a_tool_loop_streams_tool_use_and_takes_the_result_back(client):
    history = user("What is the weather in Paris?")
    with client.messages.stream(model=MODEL, max_tokens=200, tools=[WEATHER], messages=history) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["text", "tool_use"]
    call = first.content[1]
    assert call.name == "get_weather" and call.input == {"city": "Paris"}
    history += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C and sunny"}],
        },
    ]
    with client.messages.stream(model=MODEL, max_tokens=200, tools=[WEATHER], messages=history) as stream:
        second = stream.get_final_message()
    assert second.content[0].text == "It is 18 C and sunny in Paris." and second.stop_reason == "end_turn"


def test_thinking_comes_back_as_a_signed_thinking_block(client):
    thinking = {"type": "enabled", "budget_tokens": 1024}
    with client.messages.stream(
        model=MODEL, max_tokens=200, thinking=thinking, messages=user("think first, then answer")
    ) as stream:
        message = stream.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "The user wants a number." and message.content[0].signature
    assert message.content[1].text == "42"
    # the block goes back in the next turn as Claude Code sends it
    history = user("think first, then answer") + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
        {"role": "user", "content": "hello"},
    ]
    again = client.messages.create(model=MODEL, max_tokens=64, thinking=thinking, messages=history)
    assert again.content[-1].text == "Hello from the mocker."


def test_stop_sequences_and_max_tokens(client):
    with client.messages.stream(
        model=MODEL, max_tokens=64, stop_sequences=["STOP"], messages=user("count for me")
    ) as stream:
        stopped = stream.get_final_message()
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "STOP"
    assert stopped.content[0].text.strip() == "one two three"
    cut = client.messages.create(model=MODEL, max_tokens=2, messages=user("count for me"))
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2


def test_count_tokens_matches_the_prompt_a_request_sends(client):
    fields = {"model": MODEL, "system": "Be brief.", "tools": [WEATHER], "messages": user("hello")}
    counted = client.messages.count_tokens(**fields)
    u = client.messages.create(max_tokens=8, **fields).usage
    assert counted.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens


def test_context_editing_clears_old_tool_results_and_says_so(client):
    """Three weather lookups; ``clear_tool_uses`` past one call keeps the last result only."""
    turns = user("What is the weather in Paris?")
    for i in range(3):
        call = {"type": "tool_use", "id": f"c{i}", "name": "get_weather", "input": {"city": "Paris"}}
        result = {
            "type": "tool_result",
            "tool_use_id": f"c{i}",
            "content": f"lookup {i}: 18 C and sunny " * 20,
        }
        turns += [{"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
    edits = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "tool_uses", "value": 1},
                "keep": {"type": "tool_uses", "value": 1},
            }
        ]
    }
    fields = {
        "model": MODEL,
        "tools": [WEATHER],
        "messages": turns,
        "betas": ["context-management-2025-06-27"],
    }
    answer = client.beta.messages.create(max_tokens=16, context_management=edits, **fields)
    (applied,) = answer.context_management.applied_edits
    counted = client.beta.messages.count_tokens(context_management=edits, **fields)
    whole = client.beta.messages.count_tokens(**fields)
    assert answer.content[0].text == "It is 18 C and sunny in Paris."
    assert applied.cleared_tool_uses == 2 and applied.cleared_input_tokens > 100
    assert counted.input_tokens == whole.input_tokens - applied.cleared_input_tokens
    assert counted.context_management.original_input_tokens == whole.input_tokens


def test_a_repeated_long_prompt_reads_the_cache(client):
    system = [
        {"type": "text", "text": "You are a careful assistant. " * 60, "cache_control": {"type": "ephemeral"}}
    ]
    first = client.messages.create(model=MODEL, max_tokens=8, system=system, messages=user("hello"))
    with client.messages.stream(model=MODEL, max_tokens=8, system=system, messages=user("hello")) as stream:
        second = stream.get_final_message()
    prompt = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens > prompt // 2
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == prompt


def test_a_file_uploaded_through_the_beta_files_api_is_read_as_a_document(client):
    """``beta.files.upload``, then a document naming it: the reply is the one the script gives to
    the file's text, so that text reached the model."""
    betas = ["files-api-2025-04-14"]
    uploaded = client.beta.files.upload(
        file=("ask.txt", b"What is the weather in Paris?", "text/plain"), betas=betas
    )
    assert uploaded.id.startswith("file_") and uploaded.size_bytes == 29
    document = {"type": "document", "source": {"type": "file", "file_id": uploaded.id}}
    message = client.beta.messages.create(
        model=MODEL, max_tokens=64, betas=betas, messages=[{"role": "user", "content": [document]}]
    )
    assert message.content[0].text.startswith("Let me look.")  # the script's answer to the weather question
    assert client.beta.files.delete(uploaded.id, betas=betas).type == "file_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.beta.files.retrieve_metadata(uploaded.id, betas=betas)


def test_errors_are_anthropics_shape(client, url):
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL, max_tokens=0, messages=user("hello"))
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as image:
        block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [block]}])
    assert "messages[0].content[0]" in image.value.body["error"]["message"]
    wrong = anthropic.Anthropic(base_url=url, api_key="not-the-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        wrong.messages.create(model=MODEL, max_tokens=8, messages=user("hello"))
    assert denied.value.status_code == 401
    assert denied.value.body["error"]["type"] == "authentication_error"
    r = httpx.post(
        url + "/v1/messages/count_tokens",
        json={"model": "no-such-model", "messages": user("hello")},
        headers={"x-api-key": KEY},
    )
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
