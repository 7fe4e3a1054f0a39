"""``python -m bench.ledger --growth``: each store fills a day with both kinds of event id, in
turns, and a row is printed per part of the fill."""

from __future__ import annotations

import pytest

from bench.ledger import main


def test_growth_fills_the_sqlite_store_with_each_kind_of_id(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["--growth", "800", "--batches", "100", "--no-postgres"])
    out = capsys.readouterr().out
    assert "cpu: " in out
    assert "random ids" in out and "time-ordered ids" in out
    rows = [line.split() for line in out.splitlines() if line.strip().endswith("x")]
    assert [row[0] for row in rows] == [f"{n * 100}" for n in range(1, 9)]
    for row in rows:
        random_us, ordered_us = float(row[1]), float(row[2])
        assert random_us > 0 and ordered_us > 0
        assert float(row[3].rstrip("x")) == pytest.approx(random_us / ordered_us, abs=0.02)


def test_a_growth_of_no_events_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--growth", "0", "--no-postgres"])
    assert "--growth" in capsys.readouterr().err
