"""The tool-call parsers on good, several and malformed outputs, whole and streamed: a stream
fed in two pieces split at every position yields the same content and calls as the whole."""

from __future__ import annotations

import json

import pytest

from gateway.providers.tool_parsers import Piece, make_parser

FUNCTIONS = frozenset({"get_weather", "add"})


def hermes_call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def summary(pieces: list[Piece]) -> tuple[str, list[tuple[str, dict]]]:
    content = "".join(p.content for p in pieces)
    calls = [(p.call.name, json.loads(p.call.arguments)) for p in pieces if p.call]
    return content, calls


CASES = {
    "hermes": [
        # (output, content, calls)
        (hermes_call("add", {"a": 1, "b": 2}), "", [("add", {"a": 1, "b": 2})]),
        (
            "Let me check. " + hermes_call("get_weather", {"city": "Oslo"}),
            "Let me check.",  # the blank before a call is dropped
            [("get_weather", {"city": "Oslo"})],
        ),
        (
            hermes_call("add", {"a": 1}) + "\n" + hermes_call("get_weather", {"city": "Rome"}),
            "",
            [("add", {"a": 1}), ("get_weather", {"city": "Rome"})],
        ),
        (  # a raw control character in a string (the grammar allows it): read, re-escaped
            '<tool_call>\n{"arguments": {"city":"a\x1db"},\r"name":\t"get_weather"}\n</tool_call>',
            "",
            [("get_weather", {"city": "a\x1db"})],
        ),
        ("plain text, < and <tool not a call", "plain text, < and <tool not a call", []),
        ("<tool_call>\n{not json}\n</tool_call>", "<tool_call>\n{not json}\n</tool_call>", []),
        (
            '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # not offered
            '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
            [],
        ),
        ('<tool_call>\n{"name": "add", "argu', '<tool_call>\n{"name": "add", "argu', []),
        (
            hermes_call("add", {"a": 3}) + ' <tool_call>{"name": 5}</tool_call>',
            ' <tool_call>{"name": 5}</tool_call>',
            [("add", {"a": 3})],
        ),
    ],
    "llama3_json": [
        ('{"name": "add", "parameters": {"a": 1, "b": 2}}', "", [("add", {"a": 1, "b": 2})]),
        (
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}',
            "",
            [("get_weather", {"city": "Oslo"})],
        ),
        (
            '{"name": "add", "parameters": {"a": 1}}; {"name": "get_weather", "arguments": {}}',
            "",
            [("add", {"a": 1}), ("get_weather", {})],
        ),
        ("The answer is 3.", "The answer is 3.", []),
        ('{"name": "add", "parameters": {"a": 1', '{"name": "add", "parameters": {"a": 1', []),
        ('{"name": "nope", "parameters": {}}', '{"name": "nope", "parameters": {}}', []),
        ('{"city": "Oslo"}', '{"city": "Oslo"}', []),
        (
            '{"name": "add", "parameters": {}} and more',
            '{"name": "add", "parameters": {}} and more',
            [],
        ),
    ],
}


@pytest.mark.parametrize(
    ("parser", "output", "content", "calls"),
    [(parser, *case) for parser, cases in CASES.items() for case in cases],
)
def test_parse_whole_and_streamed_at_every_split(parser, output, content, calls):
    tool_parser = make_parser(parser, FUNCTIONS)
    whole_content, whole_calls = tool_parser.parse(output)
    assert [(c.name, json.loads(c.arguments)) for c in whole_calls] == calls
    assert whole_content == (content if not calls else content or None)
    assert all(c.id.startswith("call_") for c in whole_calls)
    for at in range(len(output) + 1):
        stream = tool_parser.stream()
        pieces = stream.feed(output[:at]) + stream.feed(output[at:]) + stream.finish()
        assert summary(pieces) == (content, calls), at  # no call text in the content


def test_a_stream_fed_char_by_char_never_shows_call_text():
    output = "Sure. " + hermes_call("add", {"a": 1, "b": 2})
    stream = make_parser("hermes", FUNCTIONS).stream()
    pieces = [piece for char in output for piece in stream.feed(char)] + stream.finish()
    assert "".join(p.content for p in pieces) == "Sure."
    assert [p.call.name for p in pieces if p.call] == ["add"]


@pytest.mark.parametrize("parser", ["hermes", "llama3_json"])
def test_call_format_is_a_structural_tag_of_the_offered_schemas(parser):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    tool_parser = make_parser(parser, FUNCTIONS)
    one = tool_parser.call_format({"add": schema}, parallel=False)
    several = tool_parser.call_format({"add": schema, "get_weather": schema}, parallel=True)
    assert json.dumps(schema) in json.dumps(one)
    assert several["type"] == "sequence" and "anyOf" in json.dumps(several)
    assert '"const": "get_weather"' in json.dumps(several)
