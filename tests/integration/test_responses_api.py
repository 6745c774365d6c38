"""``/v1/responses`` against real dyn processes, through clients nobody here wrote: the ``openai``
SDK's ``client.responses`` (unary, ``stream=True``, the ``responses.stream`` helper, function
tools round-tripped with ``function_call_output``, ``previous_response_id``, ``text.format``
json_schema, retrieve and delete, background responses polled, cancelled and streamed then
resumed, their input items, a file uploaded with ``files.create`` and read by its id,
reasoning items), and the OpenAI Agents SDK with its default
model class (``OpenAIResponsesModel``) running a two-tool loop. The mocker answers from a
``--replies`` script in the Hermes format of dyn-tiny's chat template; its worker reads
reasoning with the ``basic`` parser (``<think>`` ... ``</think>`` when the model writes it)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.openai_clients import async_openai

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME_CALL = '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>'
FINAL = "It is 18 C and sunny, and 14:05, in Paris."
REPLIES = [
    {"match": "weather and the time in Paris", "text": WEATHER_CALL},
    {"match": "sunny in Paris", "text": TIME_CALL},
    {"match": "14:05", "text": FINAL},
    {"match": "Say hello", "text": "Hello from dyn."},
    {"match": "Think about Rome", "text": "<think>Rome is in Italy.</think>Rome is the capital of Italy."},
    {"match": "Describe Paris as JSON", "text": '{"name": "Paris", "population": 2100000}'},
    {"match": "Talk at length", "text": "and so on " * 20_000},  # seconds of output: cancelled first
]
TOOLS = [
    {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    }
    for name, description in (
        ("get_weather", "The current weather in a city."),
        ("get_time", "The local time."),
    )
]


@pytest.fixture(scope="module")
def stack(stack_factory, tmp_path_factory):
    replies = tmp_path_factory.mktemp("responses") / "replies.jsonl"
    replies.write_text("".join(json.dumps(r) + "\n" for r in REPLIES))
    worker_args = ("--replies", str(replies), "--dyn-reasoning-parser", "basic")
    return stack_factory("responses").up(workers=1, worker_args=worker_args)


@pytest.fixture(scope="module")
def url(stack):
    return stack.url


def responses_served(stack) -> float:
    return stack.metric("dynamo_frontend_requests_total", 'endpoint="responses"')


@pytest.fixture
def client(url):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_a_unary_response(client):
    response = client.responses.create(model=MODEL, input="Say hello", instructions="Be brief.")
    assert response.status == "completed" and response.output_text == "Hello from dyn."
    assert response.instructions == "Be brief." and response.usage.output_tokens > 0


def test_a_streamed_response_through_both_sdk_paths(client):
    events = list(client.responses.create(model=MODEL, input="Say hello", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == "Hello from dyn."
    with client.responses.stream(model=MODEL, input="Say hello") as stream:
        for _ in stream:
            pass
        assert stream.get_final_response().output_text == "Hello from dyn."


def test_function_tools_round_trip_with_their_outputs(client):
    history: list = [{"role": "user", "content": "What are the weather and the time in Paris?"}]
    first = client.responses.create(model=MODEL, input=history, tools=TOOLS, store=False)
    (call,) = first.output
    assert (call.type, call.name, json.loads(call.arguments)) == (
        "function_call",
        "get_weather",
        {"city": "Paris"},
    )
    history += [call.model_dump(exclude_none=True), _output(call.call_id, "18 C and sunny in Paris")]
    second = client.responses.create(model=MODEL, input=history, tools=TOOLS, store=False)
    (call,) = second.output
    assert call.name == "get_time"
    history += [call.model_dump(exclude_none=True), _output(call.call_id, "14:05")]
    assert client.responses.create(model=MODEL, input=history, tools=TOOLS, store=False).output_text == FINAL


def test_previous_response_id_carries_the_conversation(client):
    first = client.responses.create(
        model=MODEL, input="What are the weather and the time in Paris?", tools=TOOLS
    )
    (call,) = first.output
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[_output(call.call_id, "18 C and sunny in Paris")],
        tools=TOOLS,
    )
    (call,) = second.output
    assert call.name == "get_time" and second.previous_response_id == first.id
    final = client.responses.create(
        model=MODEL,
        previous_response_id=second.id,
        input=[_output(call.call_id, "14:05")],
        tools=TOOLS,
        stream=True,
    )
    completed = [e.response for e in final if e.type == "response.completed"]
    assert completed[0].output_text == FINAL


def test_json_schema_output_through_text_format(client):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["name", "population"],
        "additionalProperties": False,
    }
    response = client.responses.create(
        model=MODEL,
        input="Describe Paris as JSON",
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
    )
    assert json.loads(response.output_text) == {"name": "Paris", "population": 2100000}


def test_retrieve_and_delete_a_stored_response(client):
    import openai

    response = client.responses.create(model=MODEL, input="Say hello", metadata={"run": "1"})
    fetched = client.responses.retrieve(response.id)
    assert (
        fetched.id == response.id
        and fetched.output_text == "Hello from dyn."
        and fetched.metadata == {"run": "1"}
    )
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_an_uploaded_file_is_read_by_its_id(client):
    """``files.create``, then an ``input_file`` naming it: the reply is the one the script gives to
    the file's text, so that text reached the model."""
    import openai

    uploaded = client.files.create(file=("ask.txt", b"Say hello"), purpose="user_data")
    assert client.files.content(uploaded.id).read() == b"Say hello"
    turn = {"role": "user", "content": [{"type": "input_file", "file_id": uploaded.id}]}
    assert client.responses.create(model=MODEL, input=[turn]).output_text == "Hello from dyn."
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input=[turn])


def test_a_background_response_is_polled_to_its_end_and_another_is_cancelled(client):
    import time

    created = client.responses.create(model=MODEL, input="Say hello", background=True)
    assert created.status == "queued" and created.background
    deadline = time.monotonic() + 30
    done = client.responses.retrieve(created.id)
    while done.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.05)
        done = client.responses.retrieve(created.id)
    assert done.status == "completed" and done.output_text == "Hello from dyn."
    items = list(client.responses.input_items.list(created.id))
    assert [item.content[0].text for item in items] == ["Say hello"]
    long = client.responses.create(
        model=MODEL, input="Talk at length", background=True, max_output_tokens=100_000
    )
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == client.responses.retrieve(long.id).status == "cancelled"


def test_a_streamed_background_response_is_resumed_after_the_client_leaves(client):
    stream = client.responses.create(model=MODEL, input="Say hello", background=True, stream=True)
    seen = []
    for event in stream:
        seen.append(event)
        if len(seen) == 3:
            break
    stream.close()  # the client leaves; the response goes on
    rest = list(
        client.responses.retrieve(seen[0].response.id, stream=True, starting_after=seen[-1].sequence_number)
    )
    events = seen + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed" and events[-1].response.background
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello from dyn."


def test_reasoning_items_come_back_and_can_be_sent_back(client):
    response = client.responses.create(
        model=MODEL, input="Think about Rome", include=["reasoning.encrypted_content"], store=False
    )
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "Rome is in Italy."
    assert reasoning.encrypted_content and message.content[0].text == "Rome is the capital of Italy."
    streamed = list(client.responses.create(model=MODEL, input="Think about Rome", stream=True))
    thought = "".join(e.delta for e in streamed if e.type == "response.reasoning_text.delta")
    assert thought == "Rome is in Italy."
    # a client that keeps no state (Codex) sends the reasoning back without its text
    sent_back = {
        "type": "reasoning",
        "id": reasoning.id,
        "summary": [],
        "encrypted_content": reasoning.encrypted_content,
    }
    history = [
        {"role": "user", "content": "Think about Rome"},
        sent_back,
        message.model_dump(exclude_none=True),
    ]
    again = client.responses.create(model=MODEL, input=[*history, {"role": "user", "content": "Say hello"}])
    assert again.output_text == "Hello from dyn."


def _agent_tools(calls: list[tuple[str, str]]):
    import agents

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(("get_weather", city))
        return f"18 C and sunny in {city}"

    @agents.function_tool
    def get_time(city: str) -> str:
        """The local time in a city."""
        calls.append(("get_time", city))
        return "14:05"

    return [get_weather, get_time]


@pytest.fixture
def default_client(url):
    """The Agents SDK's default client and API pointed at the stack (restored after the test)."""
    import agents
    from agents.models import _openai_shared

    agents.set_tracing_disabled(True)  # tracing would export to api.openai.com
    saved = (_openai_shared.get_default_openai_client(), _openai_shared.get_use_responses_by_default())
    agents.set_default_openai_client(async_openai(url), use_for_tracing=False)
    agents.set_default_openai_api("responses")
    yield
    _openai_shared.set_default_openai_client(saved[0])
    _openai_shared.set_use_responses_by_default(saved[1])


def test_the_agents_sdk_default_model_runs_a_two_tool_loop(default_client, stack):
    import agents

    served = responses_served(stack)
    calls: list[tuple[str, str]] = []
    agent = agents.Agent(
        name="assistant", instructions="Answer with the tools.", model=MODEL, tools=_agent_tools(calls)
    )
    result = agents.Runner.run_sync(agent, "What are the weather and the time in Paris?", max_turns=5)
    assert calls == [("get_weather", "Paris"), ("get_time", "Paris")]
    assert result.final_output == FINAL
    assert responses_served(stack) == served + 3  # its default model spoke the Responses API


def test_the_agents_sdk_default_model_streams_the_same_loop(default_client):
    import agents

    async def run() -> str:
        agent = agents.Agent(name="assistant", model=MODEL, tools=_agent_tools([]))
        result = agents.Runner.run_streamed(agent, "What are the weather and the time in Paris?", max_turns=5)
        async for _ in result.stream_events():
            pass
        return result.final_output

    assert asyncio.run(run()) == FINAL


def _output(call_id: str, output: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output}
