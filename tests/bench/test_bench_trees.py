"""The before/after bench: what it refuses, and how it sets each tree against the first."""

import sys
from pathlib import Path

import pytest

from bench import trees
from bench.gateway import Run


def test_a_folder_that_is_not_a_checkout_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    here = Path(__file__).resolve().parents[2]
    monkeypatch.setattr(sys, "argv", ["bench.trees", str(here), str(tmp_path)])
    with pytest.raises(SystemExit) as exited:
        trees.main()
    assert exited.value.code == 2
    assert f"trees: {tmp_path} is not a checkout" in capsys.readouterr().err


def test_medians_are_set_against_the_first_tree(capsys: pytest.CaptureFixture[str]) -> None:
    results = {
        ("before", 1): [Run(1000, 0.8, 2.0, 5000, 700), Run(1100, 0.8, 2.0, 5500, 660)],
        ("after", 1): [Run(1150, 0.7, 2.0, 5750, 600), Run(1250, 0.7, 2.0, 6250, 560)],
    }
    trees._report(["before", "after"], [1], results)
    before, after = capsys.readouterr().out.splitlines()[-2:]
    assert "1,050 req/s (1.000x)" in before and "680 µs CPU (1.000x)" in before
    assert "1,200 req/s (1.143x)" in after and "580 µs CPU (0.853x)" in after
