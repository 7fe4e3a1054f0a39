"""langchain-openai against a real gateway serving the local engine (tiny random-weight Qwen3):
``ChatOpenAI(...).bind_tools([...])`` gets a valid call of the bound tool, and
``.with_structured_output(Schema)`` an object of the schema — what issue 28's new user tried
first and got a 400 for."""

from __future__ import annotations

from typing import Literal

import langchain_openai
import pytest
from pydantic import BaseModel, Field
from tool_cases import ASK, TOOLS, check_call


class Pet(BaseModel):
    """A pet (bounded fields: random weights reach the end of the schema in few tokens)."""

    name: str = Field(min_length=1, max_length=6)
    kind: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)


@pytest.fixture
def chat(local_gateway, api_key):
    return langchain_openai.ChatOpenAI(
        model="tiny",
        base_url=local_gateway.v1,
        api_key=api_key,
        max_retries=0,
        timeout=120,
        max_tokens=200,
        temperature=1.0,
        seed=4,
    )


def test_bind_tools_gets_a_valid_call(chat):
    bound = chat.bind_tools(TOOLS, tool_choice="get_weather", parallel_tool_calls=False)
    message = bound.invoke(ASK)
    (call,) = message.tool_calls
    assert call["id"].startswith("call_")
    check_call(call["name"], call["args"], only="get_weather")
    assert message.response_metadata["finish_reason"] == "tool_calls"


def test_bind_tools_required_streamed(chat):
    bound = chat.bind_tools(TOOLS, tool_choice="required", parallel_tool_calls=False)
    merged = None
    for piece in bound.stream(ASK):
        merged = piece if merged is None else merged + piece
    (call,) = merged.tool_calls
    check_call(call["name"], call["args"])


def test_with_structured_output_returns_the_object(chat):
    pet = chat.with_structured_output(Pet).invoke([{"role": "user", "content": "A pet, as JSON."}])
    assert isinstance(pet, Pet)
