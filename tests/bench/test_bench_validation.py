"""The validation micro-benchmark runs, and its two contenders judge bodies alike (so the
timings compare the same work)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bench.validation import BODIES, PydanticChatRequest, main
from gateway.api.v1.validation import validate_chat
from gateway.errors import InvalidRequest

HI = [{"role": "user", "content": "hi"}]
REFUSED = [
    {"messages": [{"role": {}, "content": None}]},
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": "user", "content": [{"text": "no type"}]}]},
    {"messages": []},
    {"messages": HI, "n": 0},
    {"messages": HI, "max_tokens": True},
    {"messages": HI, "tools": [{"type": "function", "function": {"name": ""}}]},
    {"messages": HI, "response_format": {"json_schema": {"name": "x"}}},
    {"messages": HI, "metadata": {"task_type": 1}},
]


def test_the_benchmark_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--number", "20", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    for name in BODIES:
        assert f"| {name} |" in out
    assert "exchange middleware: +" in out


@pytest.mark.parametrize("body", REFUSED)
def test_both_contenders_refuse_the_same_bodies(body: dict) -> None:
    with pytest.raises(InvalidRequest):
        validate_chat(body)
    with pytest.raises(ValidationError):
        PydanticChatRequest.model_validate(body)


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_both_contenders_accept_the_benchmark_bodies(body: dict) -> None:
    validate_chat(body)
    PydanticChatRequest.model_validate(body)
