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


def test_each_part_is_read_against_the_gateway_as_served(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def cost(gateway_us: float, redis_us: float) -> parts.Cost:
        return parts.Cost(
            Run(rps=500.0, p50_ms=2.0, p99_ms=4.0, requests=100), gateway_us, redis_us
        )

    costs = {
        ("as served", 64): [cost(1000, 100), cost(1100, 90), cost(900, 110)],
        ("key without limits", 64): [cost(900, 40)] * 3,
        ("no access log", 64): [cost(980, 100)] * 3,
        ("exporter held off", 64): [cost(950, 80)] * 3,
        ("bare proxy", 64): [cost(400, math.nan)] * 3,
    }
    args = argparse.Namespace(repeat=3, duration=8.0)
    parts.report(args, [64], costs, "Test CPU, 2 cores", "0.1 0.1 0.1")
    rows = {line.split("  ")[-1].strip(): line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith("   64")}  # fmt: skip
    assert rows["as served"][3:6] == ["1,000", "100.0", "1,100"]
    assert rows["key without limits"][5:8] == ["940", "160", "µs"]
    assert rows["no access log"][5:8] == ["1,080", "20", "µs"]
    assert rows["bare proxy"][4:8] == ["-", "400", "700", "µs"]


@pytest.mark.parametrize(
    "argv", [["--concurrency", "1,x"], ["--concurrency", "0"], ["--repeat", "0"]]
)
def test_bad_arguments_are_named(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parts.main(argv)
    assert "--concurrency" in capsys.readouterr().err
