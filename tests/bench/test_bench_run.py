"""``bench.run --servers``: which servers, and granian only where it is installed."""

import argparse

import pytest

from bench import run
from bench.granian_serve import GRANIAN_MISSING


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
