"""The request-pieces bench: each piece timed before and now, under the CPU it ran on."""

from __future__ import annotations

import orjson
import pytest

from bench.machine import cpu_model
from bench.request_pieces import BODY, CHAT, bytes_bound_before, main
from gateway.routing.estimate import _bytes_bound


def test_each_piece_is_timed_both_ways_under_the_cpu_it_ran_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["--repeat", "3"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"CPU: {cpu_model()}")
    *table, note = lines[2:]
    rows = {line[:36].strip(): line[36:].split() for line in table}
    assert set(rows) == {
        "header lookups of a JSON request",
        "access line",
        "deliver a whole answer",
        "unknown-header guard",
        "export decode of an own event",
        "token bound, bench body",
        "token bound, 12.7 KB chat",
        "strict JSON, bench body",
        "strict JSON, 12.7 KB chat",
        "model price, as a request reads it",
        "lifespan state, as a handler reads",
        "Redis round trip, 1 reply",
        "Redis round trip, 2 replies",
        "Redis round trip, 10 replies",
        "Redis reply already on the socket",
    }
    for name, (before, now) in rows.items():
        assert float(before) > 0 and float(now) > 0, name
    assert note.startswith("(replies taken from the socket at once: ")
    assert note.endswith(" of 7 tries)")  # 3 // 5 → one call a round, seven rounds


def test_the_token_bound_before_counts_what_the_bound_counts_now() -> None:
    """The two walks timed are the same count: only the way of summing differs."""
    chat = orjson.loads(CHAT)["messages"]
    parts = [{"type": "text", "text": "née ☃"}, {"type": "image_url", "image_url": {"url": "x"}}]
    for value in (chat, BODY["messages"], parts, [None, True, 3, 2.5, {"k": ["é"]}]):
        assert bytes_bound_before(value) == _bytes_bound(value)
