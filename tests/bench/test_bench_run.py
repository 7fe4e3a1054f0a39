"""``bench.run``: ``--servers`` (granian only where it is installed), and trees compared round
by round."""

import argparse

import pytest

from bench import run
from bench.gateway import Run
from bench.granian_serve import GRANIAN_MISSING
from bench.run import Measured, RedisSample, paired, paired_line


def parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog="bench.run")


def test_servers_default_is_uvicorn_alone() -> None:
    assert run.parse_servers(parser(), "uvicorn") == ["uvicorn"]
    assert run.servers_line(["direct", "gateway"]) is None


@pytest.mark.parametrize("listed", ["", "gunicorn", "uvicorn,uvicorn", "uvicorn,hypercorn"])
def test_servers_refuses_unknown_or_repeated_names(
    listed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        run.parse_servers(parser(), listed)
    assert "--servers: a comma list of uvicorn, granian" in capsys.readouterr().err


def test_granian_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "granian_version", lambda: None)
    with pytest.raises(SystemExit) as stopped:
        run.parse_servers(parser(), "uvicorn,granian")
    assert stopped.value.code == f"--servers granian: {GRANIAN_MISSING}"
    assert "pip install granian" in str(stopped.value.code)


def test_granian_present_is_served_by_the_bench_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "granian_version", lambda: "9.9")
    assert run.parse_servers(parser(), "uvicorn, granian") == ["uvicorn", "granian"]
    assert run.SERVERS["uvicorn"] == ("-m", "gateway", "serve")
    assert run.SERVERS["granian"] == ("-m", "bench.granian_serve")
    line = run.servers_line(["direct", "uvicorn", "granian"])
    assert line is not None and "granian 9.9" in line


def _measured(rps: float, gw_us: float, redis_us: float) -> Measured:
    run = Run(rps=rps, p50_ms=1.0, p99_ms=2.0, requests=1000, cpu_us=gw_us)
    return Measured(run=run, redis_cpu_us=redis_us, redis=RedisSample(cpu_s=0.0, commands={}))


def test_paired_rounds_compare_each_round_with_its_own_before() -> None:
    # The box slows down over the rounds; after costs a tenth less in every round.
    before = [_measured(2000, 450, 50), _measured(1500, 600, 66), _measured(1000, 900, 100)]
    after = [_measured(2200, 405, 45), _measured(1650, 540, 60), _measured(1100, 810, 90)]
    pair = paired(before, after)
    assert pair.rounds == 3 and pair.cheaper_rounds == 3
    assert pair.cpu_ratio == pytest.approx(0.9, abs=0.001)
    assert pair.rps_ratio == pytest.approx(1.1)
    line = paired_line(64, "/tmp/before", "/work/after", before, after)
    assert line.startswith("c64 /work/after against /tmp/before, round by round:")
    assert "0.900x" in line and "cheaper in 3 of 3 rounds" in line and "req/s 1.100x" in line


def test_paired_rounds_count_a_round_that_cost_more() -> None:
    before = [_measured(1000, 500, 50), _measured(1000, 500, 50)]
    after = [_measured(900, 600, 50), _measured(1000, 450, 50)]
    pair = paired(before, after)
    assert pair.cheaper_rounds == 1 and pair.rounds == 2
