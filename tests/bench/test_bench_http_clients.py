"""The HTTP client benchmark runs the gateway's own upstream client against the others it
finds, and says which it could not run."""

from __future__ import annotations

import importlib.util

import pytest

from bench import http_clients


def test_the_benchmark_prints_each_client_at_each_concurrency(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    found = importlib.util.find_spec
    monkeypatch.setattr(
        http_clients.importlib.util,
        "find_spec",
        lambda name: None if name == "rnet" else found(name),
    )
    argv = ["--clients", "gateway,aiohttp,rnet", "--concurrency", "1,4"]
    assert http_clients.main([*argv, "--requests", "40", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "rnet: not installed (pip install rnet); skipped" in out
    assert "CPU: " in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("gateway ", "aiohttp "))]
    assert [(row[0], row[1]) for row in rows] == [
        ("gateway", "1"), ("aiohttp", "1"), ("gateway", "4"), ("aiohttp", "4"),
    ]  # fmt: skip
    for row in rows:
        assert float(row[2]) > 0 and float(row[3]) > 0
    assert all(row[4] == "1.00x" for row in rows if row[0] == "gateway")


def test_an_unknown_client_is_named() -> None:
    with pytest.raises(SystemExit, match="--clients: unknown curl"):
        http_clients.main(["--clients", "gateway,curl"])
