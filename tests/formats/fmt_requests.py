"""Rich client requests of each format: system prompts, multi-turn tool use with results,
images, thinking, structured output; what real agents (Claude Code, the Agents SDK) send."""

from __future__ import annotations

from typing import Any

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city"],
}


def anthropic_request(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": [
            {"type": "text", "text": "You are a weather assistant."},
            {"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "Weather in Paris and Rome? Also, what is in these pictures?",
                    },
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                    },
                    {
                        "type": "image",
                        "source": {"type": "url", "url": "https://example.com/cat.jpg"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": "Two cities: two calls.",
                        "signature": "EqQBCkYIBhgC",
                    },
                    {"type": "text", "text": "Checking both."},
                    {
                        "type": "tool_use",
                        "id": "toolu_01A",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_01B",
                        "name": "get_weather",
                        "input": {"city": "Rome", "unit": "c"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "18°C, cloudy"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01B",
                        "content": [{"type": "text", "text": "service unavailable"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "Try Rome again later."},
                ],
            },
        ],
        "tools": [
            {
                "name": "get_weather",
                "description": "Weather for a city",
                "input_schema": WEATHER_SCHEMA,
                "cache_control": {"type": "ephemeral"},
            }
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "temperature": 0.5,
        "top_p": 0.9,
        "metadata": {"user_id": "user-42"},
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "stream": True,
    }
    body.update(overrides)
    return body


def chat_request(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "You are a weather assistant."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather in Paris and Rome?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "https://example.com/cat.jpg", "detail": "high"},
                    },
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18°C, cloudy"},
            {
                "role": "tool",
                "tool_call_id": "call_2",
                "content": [{"type": "text", "text": "21°C, sunny"}],
            },
            {"role": "developer", "content": "Answer in one sentence."},
            {"role": "user", "content": "Summarise."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather for a city",
                    "parameters": WEATHER_SCHEMA,
                    "strict": True,
                },
            }
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "summary",
                "schema": {"type": "object", "properties": {"text": {"type": "string"}}},
                "strict": True,
            },
        },
        "reasoning_effort": "high",
        "max_completion_tokens": 500,
        "temperature": 0.7,
        "seed": 7,
        "user": "user-42",
        "metadata": {"team": "weather"},
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    body.update(overrides)
    return body


def responses_request(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "o4-mini",
        "instructions": "You are a weather assistant.",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Weather in Paris?"},
                    {
                        "type": "input_image",
                        "image_url": f"data:image/png;base64,{PNG}",
                        "detail": "low",
                    },
                ],
            },
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "Need the tool."}],
                "encrypted_content": "gAAAAB",
            },
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city":"Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "18°C, cloudy"},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": "It is 18°C and cloudy.", "annotations": []}
                ],
            },
            {"role": "user", "content": "And tomorrow?"},
        ],
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": WEATHER_SCHEMA,
                "strict": True,
            }
        ],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {
            "format": {
                "type": "json_schema",
                "name": "forecast",
                "schema": {"type": "object", "properties": {}},
                "strict": True,
            },
            "verbosity": "low",
        },
        "reasoning": {"effort": "medium", "summary": "auto"},
        "max_output_tokens": 800,
        "store": False,
        "stream": True,
    }
    body.update(overrides)
    return body
