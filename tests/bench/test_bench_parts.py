"""``bench.parts``: the bare proxy answers as the upstream does, and the report reads each
part against the gateway as served."""

from __future__ import annotations

import argparse
import math

import orjson
import pytest
from starlette.testclient import TestClient

from bench import parts
from bench.bare_proxy import create_bare_app
from bench.gateway import BODY, Run


def test_the_bare_proxy_relays_the_upstream_answer(fake_upstream) -> None:
    with TestClient(create_bare_app(fake_upstream.base_url)) as client:
        answer = client.post("/v1/chat/completions", content=orjson.dumps(BODY))
        assert client.get("/healthz").text == "ok"
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json()["object"] == "chat.completion"


def test_the_bare_proxy_relays_a_stream_as_it_comes(fake_upstream) -> None:
    with TestClient(create_bare_app(fake_upstream.base_url)) as client:
        body = orjson.dumps({**BODY, "stream": True})
        with client.stream("POST", "/v1/chat/completions", content=body) as answer:
            relayed = b"".join(answer.iter_bytes())
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in relayed.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    pieces = [orjson.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert "".join(p for p in pieces if p) == "Hello from the fake upstream."


def test_each_part_is_read_against_the_gateway_as_served(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def cost(gateway_us: float, redis_us: float) -> parts.Cost:
        return parts.Cost(
            Run(rps=500.0, p50_ms=2.0, p99_ms=4.0, requests=100), gateway_us, redis_us
        )

    costs = {
        (parts.DIRECT, 64): [parts.Cost(Run(30000.0, 0.5, 1.0), math.nan, math.nan)] * 3,
        ("as served", 64): [cost(1000, 100), cost(1100, 90), cost(900, 110)],
        ("key without limits", 64): [cost(900, 40)] * 3,
        ("no access log", 64): [cost(980, 100)] * 3,
        ("exporter held off", 64): [cost(950, 80)] * 3,
        ("key without limits + one round trip", 64): [cost(950, 60)] * 3,
        ("bare proxy", 64): [cost(400, math.nan)] * 3,
    }
    args = argparse.Namespace(repeat=3, duration=8.0, stream_clients=16)
    parts.report(args, [64], costs, "Test CPU, 2 cores", "0.1 0.1 0.1")
    rows = {line.split("  ")[-1].strip(): line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith("   64")}  # fmt: skip
    assert rows[parts.DIRECT][1:3] == ["30,000", "0.500"]
    assert rows["as served"][2:7] == ["2.000", "1.500", "1,000", "100.0", "1,100"]
    assert rows["key without limits"][6:9] == ["940", "160", "µs"]
    assert rows["no access log"][6:9] == ["1,080", "20", "µs"]
    assert rows["key without limits + one round trip"][6:8] == ["1,010", "90"]
    assert rows["bare proxy"][5:9] == ["-", "400", "700", "µs"]


def test_each_part_streams_against_the_upstream_straight(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def cost(ttfb_ms: float, gateway_us: float, redis_us: float) -> parts.Cost:
        return parts.Cost(
            Run(rps=1500.0, p50_ms=ttfb_ms, p99_ms=math.nan, requests=9000), gateway_us, redis_us
        )

    costs = {
        (parts.DIRECT, parts.STREAMS): [cost(1.5, math.nan, math.nan)] * 3,
        ("as served", parts.STREAMS): [cost(7.0, 600, 50), cost(7.5, 650, 40), cost(6.5, 620, 60)],
        ("key without limits", parts.STREAMS): [cost(5.0, 500, 20)] * 3,
        ("no access log", parts.STREAMS): [cost(6.8, 590, 50)] * 3,
        ("exporter held off", parts.STREAMS): [cost(6.6, 560, 45)] * 3,
        ("key without limits + one round trip", parts.STREAMS): [cost(5.8, 540, 30)] * 3,
        ("bare proxy", parts.STREAMS): [cost(3.0, 250, math.nan)] * 3,
    }
    parts.report_streams(16, costs)
    lines = capsys.readouterr().out.splitlines()
    assert "16 at a time" in lines[1] and "first byte p50 1.500 ms" in lines[1]
    rows = {line.split("  ")[-1].strip(): line.split() for line in lines[3:]}
    assert rows["as served"][1:6] == ["7.000", "5.500", "620", "50.0", "680"]
    assert rows["key without limits"][2] == "3.500" and rows["key without limits"][6] == "160"
    assert rows["bare proxy"][1:7] == ["3.000", "1.500", "250", "-", "250", "430"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--concurrency", "1,x"], "--concurrency"),
        (["--concurrency", "0"], "--concurrency"),
        (["--repeat", "0"], "--repeat"),
        (["--stream-clients", "-1"], "--stream-clients"),
    ],
)
def test_bad_arguments_are_named(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parts.main(argv)
    assert named in capsys.readouterr().err
