"""Real-shaped bodies and SSE streams of each format, as the providers send them.

The streams tell one story in each format: the model thinks, says it will check the weather,
and calls ``get_weather`` with ``{"city": "Paris", "unit": "c"}``. The prompt is 622 tokens of
which 100 were read from the cache and 50 written to it (where the format can say so); the
answer is 89 tokens, 30 of them reasoning.
"""

from __future__ import annotations

from typing import Any

from gateway.formats.internal import Usage

WEATHER_TOOL_ARGS = {"city": "Paris", "unit": "c"}
SAID = "I'll check the weather in Paris."
THOUGHT = "The user wants Paris weather. I should call the tool."
SIGNATURE = "EqQBCkYIBhgCIkB0sig"
CREATED = 1_760_000_000
# What every sample answer and stream reports, as the internal record (see above).
USAGE = Usage(
    prompt_tokens=622,
    completion_tokens=89,
    cached_tokens=100,
    cache_write_tokens=50,
    reasoning_tokens=30,
)


def _anthropic_event(kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    """An Anthropic SSE event: the event's name is its ``type``."""
    return kind, {"type": kind, **fields}


def _block_delta(index: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return _anthropic_event("content_block_delta", index=index, delta=delta)


ANTHROPIC_STREAM: list[tuple[str, dict[str, Any]]] = [
    _anthropic_event(
        "message_start",
        message={
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "claude-sonnet-4-5-20250929",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 472,
                "cache_creation_input_tokens": 50,
                "cache_read_input_tokens": 100,
                "output_tokens": 2,
            },
        },
    ),
    _anthropic_event("ping"),
    _anthropic_event(
        "content_block_start",
        index=0,
        content_block={"type": "thinking", "thinking": "", "signature": ""},
    ),
    _block_delta(0, {"type": "thinking_delta", "thinking": THOUGHT[:20]}),
    _block_delta(0, {"type": "thinking_delta", "thinking": THOUGHT[20:]}),
    _block_delta(0, {"type": "signature_delta", "signature": SIGNATURE}),
    _anthropic_event("content_block_stop", index=0),
    _anthropic_event("content_block_start", index=1, content_block={"type": "text", "text": ""}),
    _block_delta(1, {"type": "text_delta", "text": SAID[:11]}),
    _block_delta(1, {"type": "text_delta", "text": SAID[11:]}),
    _anthropic_event("content_block_stop", index=1),
    _anthropic_event(
        "content_block_start",
        index=2,
        content_block={
            "type": "tool_use",
            "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            "name": "get_weather",
            "input": {},
        },
    ),
    _block_delta(2, {"type": "input_json_delta", "partial_json": ""}),
    _block_delta(2, {"type": "input_json_delta", "partial_json": '{"city": "Pa'}),
    _block_delta(2, {"type": "input_json_delta", "partial_json": 'ris", "unit": "c"}'}),
    _anthropic_event("content_block_stop", index=2),
    _anthropic_event(
        "message_delta",
        delta={"stop_reason": "tool_use", "stop_sequence": None},
        usage={"output_tokens": 89, "output_tokens_details": {"thinking_tokens": 30}},
    ),
    _anthropic_event("message_stop"),
]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": "gpt-4o-2024-08-06",
        "system_fingerprint": "fp_eb9dce56a8",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": None,
    }


CHAT_USAGE = {
    "prompt_tokens": 622,
    "completion_tokens": 89,
    "total_tokens": 711,
    "prompt_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 50, "audio_tokens": 0},
    "completion_tokens_details": {
        "reasoning_tokens": 30,
        "audio_tokens": 0,
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
    },
}


def chat_stream(reasoning: bool) -> list[tuple[None, Any]]:
    """OpenAI's shape; ``reasoning`` adds ``reasoning_content`` deltas as DeepSeek and vLLM send."""
    chunks: list[dict[str, Any]] = [_chunk({"role": "assistant", "content": "", "refusal": None})]
    if reasoning:
        chunks += [
            _chunk({"reasoning_content": THOUGHT[:20]}),
            _chunk({"reasoning_content": THOUGHT[20:]}),
        ]
    chunks += [_chunk({"content": SAID[:11]}), _chunk({"content": SAID[11:]})]
    call = {
        "index": 0,
        "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    chunks += [
        _chunk({"tool_calls": [call]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Pa'}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ris", "unit": "c"}'}}]}),
        _chunk({}, "tool_calls"),
        {**_chunk({}), "choices": [], "usage": CHAT_USAGE},
    ]
    return [(None, chunk) for chunk in chunks] + [(None, b"[DONE]")]


def responses_object(
    status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "id": "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
        "object": "response",
        "created_at": CREATED,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": "o4-mini-2025-04-16",
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                "strict": False,
            }
        ],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


RESPONSES_USAGE = {
    "input_tokens": 622,
    "input_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 50},
    "output_tokens": 89,
    "output_tokens_details": {"reasoning_tokens": 30},
    "total_tokens": 711,
}
REASONING_ITEM = {
    "id": "rs_67ccd2bf17f0819081ff3bb2cf6508e6",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": THOUGHT}],
    "encrypted_content": "gAAAAABoISQ24OyVRYbkYfukg",
}
MESSAGE_ITEM = {
    "id": "msg_67ccd2bf17f0819081ff3bb2cf6508e6",
    "type": "message",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": SAID, "annotations": []}],
}
CALL_ITEM = {
    "id": "fc_67ccd3f0a4a08190b5fc0e2bd24a8d1d",
    "type": "function_call",
    "status": "completed",
    "arguments": '{"city": "Paris", "unit": "c"}',
    "call_id": "call_12345xyz",
    "name": "get_weather",
}


def responses_stream() -> list[tuple[str, dict[str, Any]]]:
    rs, msg, fc = REASONING_ITEM["id"], MESSAGE_ITEM["id"], CALL_ITEM["id"]
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": responses_object("in_progress", [], None)},
        {"type": "response.in_progress", "response": responses_object("in_progress", [], None)},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"id": rs, "type": "reasoning", "summary": []},
        },
        {
            "type": "response.reasoning_summary_part.added",
            "item_id": rs,
            "output_index": 0,
            "summary_index": 0,
            "part": {"type": "summary_text", "text": ""},
        },
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": rs,
            "output_index": 0,
            "summary_index": 0,
            "delta": THOUGHT[:20],
        },
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": rs,
            "output_index": 0,
            "summary_index": 0,
            "delta": THOUGHT[20:],
        },
        {
            "type": "response.reasoning_summary_text.done",
            "item_id": rs,
            "output_index": 0,
            "summary_index": 0,
            "text": THOUGHT,
        },
        {
            "type": "response.reasoning_summary_part.done",
            "item_id": rs,
            "output_index": 0,
            "summary_index": 0,
            "part": {"type": "summary_text", "text": THOUGHT},
        },
        {"type": "response.output_item.done", "output_index": 0, "item": REASONING_ITEM},
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {
                "id": msg,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            },
        },
        {
            "type": "response.content_part.added",
            "item_id": msg,
            "output_index": 1,
            "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []},
        },
        {
            "type": "response.output_text.delta",
            "item_id": msg,
            "output_index": 1,
            "content_index": 0,
            "delta": SAID[:11],
            "logprobs": [],
        },
        {
            "type": "response.output_text.delta",
            "item_id": msg,
            "output_index": 1,
            "content_index": 0,
            "delta": SAID[11:],
            "logprobs": [],
        },
        {
            "type": "response.output_text.done",
            "item_id": msg,
            "output_index": 1,
            "content_index": 0,
            "text": SAID,
            "logprobs": [],
        },
        {
            "type": "response.content_part.done",
            "item_id": msg,
            "output_index": 1,
            "content_index": 0,
            "part": {"type": "output_text", "text": SAID, "annotations": []},
        },
        {"type": "response.output_item.done", "output_index": 1, "item": MESSAGE_ITEM},
        {
            "type": "response.output_item.added",
            "output_index": 2,
            "item": {**CALL_ITEM, "status": "in_progress", "arguments": ""},
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": fc,
            "output_index": 2,
            "delta": '{"city": "Pa',
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": fc,
            "output_index": 2,
            "delta": 'ris", "unit": "c"}',
        },
        {
            "type": "response.function_call_arguments.done",
            "item_id": fc,
            "output_index": 2,
            "arguments": CALL_ITEM["arguments"],
        },
        {"type": "response.output_item.done", "output_index": 2, "item": CALL_ITEM},
        {
            "type": "response.completed",
            "response": responses_object(
                "completed", [REASONING_ITEM, MESSAGE_ITEM, CALL_ITEM], RESPONSES_USAGE
            ),
        },
    ]
    return [(event["type"], {**event, "sequence_number": i}) for i, event in enumerate(events)]


# -- non-streaming answers with the same story ------------------------------------------------

ANTHROPIC_MESSAGE = {
    "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [
        {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
        {"type": "text", "text": SAID},
        {
            "type": "tool_use",
            "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            "name": "get_weather",
            "input": WEATHER_TOOL_ARGS,
        },
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 472,
        "cache_creation_input_tokens": 50,
        "cache_read_input_tokens": 100,
        "output_tokens": 89,
        "output_tokens_details": {"thinking_tokens": 30},
    },
}
CHAT_COMPLETION = {
    "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
    "object": "chat.completion",
    "created": CREATED,
    "model": "gpt-4o-2024-08-06",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": SAID,
                "refusal": None,
                "reasoning_content": THOUGHT,
                "tool_calls": [
                    {
                        "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city": "Paris", "unit": "c"}',
                        },
                    }
                ],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ],
    "usage": CHAT_USAGE,
    "system_fingerprint": "fp_eb9dce56a8",
}
RESPONSES_RESPONSE = responses_object(
    "completed", [REASONING_ITEM, MESSAGE_ITEM, CALL_ITEM], RESPONSES_USAGE
)
