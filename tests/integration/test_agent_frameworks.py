"""Agent frameworks nobody here wrote, against real dyn processes: the OpenAI Agents SDK runs a
two-tool loop to a final answer, and pydantic-ai gets typed results (through its default
tool-call output, i.e. ``tool_choice: required`` constrained by the mocker's grammar engine, and
through native JSON-schema output). The mocker answers from a ``--replies`` script in the Hermes
format that dyn-tiny's chat template writes."""

from __future__ import annotations

import json

import pytest

from tests.openai_clients import async_openai

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
REPLIES = [
    {
        "match": "weather and the time in Paris",
        "text": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    },
    {
        "match": "sunny in Paris",
        "text": '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>',
    },
    {"match": "14:05", "text": "It is 18 C and sunny, and 14:05, in Paris."},
]


@pytest.fixture(scope="module")
def url(stack_factory, tmp_path_factory):
    replies = tmp_path_factory.mktemp("frameworks") / "replies.jsonl"
    replies.write_text("".join(json.dumps(r) + "\n" for r in REPLIES))
    s = stack_factory("frameworks").up(workers=1, worker_args=("--replies", str(replies)))
    return s.url


def test_openai_agents_sdk_runs_a_two_tool_loop(url):
    import agents

    agents.set_tracing_disabled(True)  # tracing would export to api.openai.com
    calls: list[tuple[str, str]] = []

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

    model = agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=async_openai(url))
    agent = agents.Agent(
        name="assistant", instructions="Answer with the tools.", model=model, tools=[get_weather, get_time]
    )
    result = agents.Runner.run_sync(agent, "What are the weather and the time in Paris?", max_turns=5)
    assert calls == [("get_weather", "Paris"), ("get_time", "Paris")]
    assert result.final_output == "It is 18 C and sunny, and 14:05, in Paris."


def test_openai_agents_sdk_streams_the_same_loop(url):
    import asyncio

    import agents

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"18 C and sunny in {city}"

    @agents.function_tool
    def get_time(city: str) -> str:
        """The local time in a city."""
        return "14:05"

    async def run() -> str:
        model = agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=async_openai(url))
        agent = agents.Agent(name="assistant", model=model, tools=[get_weather, get_time])
        result = agents.Runner.run_streamed(agent, "What are the weather and the time in Paris?", max_turns=5)
        async for _ in result.stream_events():
            pass
        return result.final_output

    assert asyncio.run(run()) == "It is 18 C and sunny, and 14:05, in Paris."


def test_pydantic_ai_typed_results(url):
    from pydantic import BaseModel, Field
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.profiles.openai import OpenAIModelProfile
    from pydantic_ai.providers.openai import OpenAIProvider

    class City(BaseModel):
        name: str = Field(max_length=40)
        population: int = Field(ge=0)
        capital: bool

    model = OpenAIChatModel(
        MODEL,
        provider=OpenAIProvider(base_url=url + "/v1", api_key="unused"),
        profile=OpenAIModelProfile(supports_json_schema_output=True),
    )
    # pydantic-ai's default: a final_result tool the model must call (tool_choice required)
    tool_result = Agent(model, output_type=City, retries=0).run_sync("Tell me about Paris.")
    assert isinstance(tool_result.output, City)
    # native structured output: response_format json_schema
    native = Agent(model, output_type=NativeOutput(City), retries=0).run_sync("Tell me about Rome.")
    assert isinstance(native.output, City)
