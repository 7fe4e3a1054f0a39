"""``bench.limiter_floor``: a reservation of a key without limits makes one script call on the
limiter's connection to a real Redis, one with limits none more; the site folder installs it
in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from redis_helpers import ClientFactory

from bench import limiter_floor
from bench.parts import FLOOR_PATH
from gateway.metering.gate import LimitsGate
from gateway.store.direct import DirectRedis


def eval_calls(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.info("commandstats").get("cmdstat_eval", {}).get("calls", 0))


@pytest.mark.parametrize(("reserved", "calls"), [(None, 1), ("a reservation", 0)])
async def test_only_a_reservation_of_nothing_makes_the_round_trip(
    reserved: Any,
    calls: int,
    clean_redis: str,
    make_client: ClientFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def reserve(_self: Any, *_args: Any, **_kwargs: Any) -> tuple[Any, str]:
        return reserved, "estimate"

    monkeypatch.setattr(LimitsGate, "reserve", reserve)
    limiter_floor.install()
    gate = SimpleNamespace(limiter=SimpleNamespace(_direct=DirectRedis(make_client(clean_redis))))
    with redis.Redis.from_url(clean_redis) as client:
        client.config_resetstat()
    assert await LimitsGate.reserve(gate, "principal", plan="plan") == (reserved, "estimate")
    assert eval_calls(clean_redis) == calls


def test_the_site_folder_installs_it_at_start_up() -> None:
    env = {**os.environ, "PYTHONPATH": FLOOR_PATH}
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "from gateway.metering.gate import LimitsGate as G; print(G.reserve.__name__)",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == "reserve_after_a_round_trip"
