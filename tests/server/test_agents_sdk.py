"""The OpenAI Agents SDK (openai-agents) on its default model, the Responses API, against SmolLM2 served with a
hermes chat template: an agent with a function tool runs to its final output through Runner.run_sync."""
from __future__ import annotations

import asyncio

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIProvider, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem


@pytest.fixture
def client(smol_server):
    """An AsyncOpenAI client for the agent; closed on the loop Runner.run_sync ran on (the thread's default loop,
    which run_sync leaves open), so no connection outlives the test."""
    set_tracing_disabled(True)  # traces would go to OpenAI's servers
    c = openai.AsyncOpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    yield c
    loop = asyncio.get_event_loop_policy().get_event_loop()
    loop.run_until_complete(c.close())
    loop.close()
    asyncio.set_event_loop(None)


def test_runner_calls_the_function_tool_and_finishes(client):
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        cities.append(city)
        return f"Sunny, 21 C in {city}"

    # the first turn must call the tool (tool_choice by name); the SDK resets it to auto after the call, so the
    # second turn answers from the tool's result
    agent = Agent(name="weather", instructions="You are a helpful assistant. Answer briefly.",
                  model="smollm2-hermes", tools=[get_weather],
                  model_settings=ModelSettings(temperature=0, max_tokens=200, tool_choice="get_weather"))
    provider = OpenAIProvider(openai_client=client)  # its default model for a name: OpenAIResponsesModel
    assert type(provider.get_model("smollm2-hermes")).__name__ == "OpenAIResponsesModel"
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4,
                             run_config=RunConfig(model_provider=provider))
    assert cities and cities[0].strip()  # the tool really ran, with the argument the model wrote
    kinds = [type(i) for i in result.new_items]
    assert kinds[:2] == [ToolCallItem, ToolCallOutputItem] and kinds[-1] is MessageOutputItem
    assert isinstance(result.final_output, str) and result.final_output.strip()
    assert len(result.raw_responses) == 2 and all(r.response_id.startswith("resp_") for r in result.raw_responses)
    assert sum(r.usage.output_tokens for r in result.raw_responses) == result.context_wrapper.usage.output_tokens

