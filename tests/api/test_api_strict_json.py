"""Duplicate keys are refused exactly, whether the colon count clears a body or the full parse
runs: checked against bodies written with and without duplicates, colons in keys and values,
colons spelled as escapes, and whitespace around the separators."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.strict_json import _no_duplicates_by_count, parse_json_value
from gateway.errors import InvalidRequest

TEXT = st.text(alphabet=st.sampled_from('ab:é漢 "\\/\n'), max_size=6)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), TEXT)


@st.composite
def writings(draw: st.DrawFn, depth: int = 0) -> tuple[str, bool]:
    """A JSON text of a random value, and whether some object in it repeats a key."""
    kind = draw(st.sampled_from(["scalar", "list", "object"] if depth < 3 else ["scalar"]))
    if kind == "scalar":
        return _scalar(draw, draw(SCALARS)), False
    if kind == "list":
        items = [draw(writings(depth + 1)) for _ in range(draw(st.integers(0, 3)))]
        return "[" + ",".join(text for text, _ in items) + "]", any(dup for _, dup in items)
    keys = draw(st.lists(TEXT, max_size=4, unique=True))
    if keys and draw(st.booleans()):
        keys.insert(draw(st.integers(0, len(keys))), draw(st.sampled_from(keys)))
    members, repeated = [], len(keys) != len(set(keys))
    for key in keys:
        value, inner = draw(writings(depth + 1))
        repeated |= inner
        space = draw(st.sampled_from(["", " ", "\n  "]))
        members.append(f"{_string(draw, key)}{space}:{space}{value}")
    return "{" + ", ".join(members) + "}", repeated


def _scalar(draw: st.DrawFn, value: Any) -> str:
    return _string(draw, value) if isinstance(value, str) else json.dumps(value)


def _string(draw: st.DrawFn, text: str) -> str:
    """``text`` as a JSON string, each colon written plainly or as either escape."""
    written = json.dumps(text, ensure_ascii=draw(st.booleans()))
    return "".join(
        draw(st.sampled_from([":", "\\u003a", "\\u003A"])) if char == ":" else char
        for char in written
    )


@settings(max_examples=400, deadline=None)
@given(writings())
def test_a_body_is_refused_exactly_when_an_object_repeats_a_key(writing: tuple[str, bool]) -> None:
    text, repeated = writing
    raw = text.encode()
    data = orjson.loads(raw)
    if _no_duplicates_by_count(raw, data):
        assert not repeated
    if repeated:
        with pytest.raises(InvalidRequest, match="more than once in one object"):
            parse_json_value(raw)
    else:
        assert parse_json_value(raw) == data


def test_an_escaped_colon_that_would_balance_a_dropped_member_is_still_caught() -> None:
    # Two members in the text, one left after parsing, and the kept value's colon escaped:
    # the plain counts are equal (2 and 2), so the count must not be trusted here.
    raw = b'{"a": 1, "a": "\\u003a"}'
    assert raw.count(b":") == orjson.dumps(orjson.loads(raw)).count(b":")
    assert not _no_duplicates_by_count(raw, orjson.loads(raw))
    with pytest.raises(InvalidRequest, match="'a' more than once"):
        parse_json_value(raw)


def test_a_chat_body_with_colons_in_its_text_is_cleared_by_the_count() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Note: see http://x.y/z"}]}
    raw = json.dumps(body).encode()
    assert _no_duplicates_by_count(raw, orjson.loads(raw))
    assert parse_json_value(raw) == body
