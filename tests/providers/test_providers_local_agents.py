"""The OpenAI Agents SDK against a real gateway serving the local engine (tiny random-weight
Qwen3): an agent with one ``@function_tool``, forced to call it (``tool_choice``), runs the
tool with the arguments the engine wrote and then answers from its result (call → tool result
→ final answer), over Chat Completions."""

from __future__ import annotations

import agents
from tool_cases import WEATHER_PARAMETERS, check_call


def test_one_function_tool_round_trip(local_gateway, api_key):
    from openai import AsyncOpenAI

    calls: list[dict] = []

    @agents.function_tool
    def get_weather(city: str, unit: str) -> str:
        """The weather in a city now.

        Args:
            city: the city.
            unit: c or f.
        """
        calls.append({"city": city, "unit": unit})
        return f"21 degrees {unit} and sunny in {city}"

    client = AsyncOpenAI(base_url=local_gateway.v1, api_key=api_key, max_retries=0, timeout=120)
    model = agents.OpenAIChatCompletionsModel(model="tiny", openai_client=client)
    # the SDK's schema from the signature, bounded like the tests' own (random weights)
    get_weather.params_json_schema = WEATHER_PARAMETERS
    agent = agents.Agent(
        name="weather",
        instructions="Answer with the weather.",
        model=model,
        tools=[get_weather],
        model_settings=agents.ModelSettings(
            tool_choice="get_weather", max_tokens=200, parallel_tool_calls=False
        ),
        reset_tool_choice=True,  # after the call, the model is free to answer in text
    )
    result = agents.Runner.run_sync(
        agent, "What is the weather in Paris?", run_config=agents.RunConfig(tracing_disabled=True)
    )
    assert len(calls) == 1
    check_call("get_weather", calls[0])
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"], kinds
    assert kinds[-1] == "message_output_item" and isinstance(result.final_output, str)
