"""The token-estimate bench: one line per body shape, the bound never below the estimate, and
the machine named above the figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.estimate import bodies, main
from bench.machine import cpu_model


def test_every_body_is_measured_under_the_cpu_it_ran_on(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--repeat", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"CPU: {cpu_model()}")
    rows = {line[:44].strip(): line[44:].split() for line in lines[2:]}
    assert set(rows) == set(bodies())
    for name, (typical_us, bound_us, typical, bound) in rows.items():
        assert float(typical_us) > 0 and float(bound_us) > 0, name
        assert int(bound) >= int(typical), name


def test_cpu_model_reads_the_model_name(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t\t: avx\n")
    assert cpu_model(cpuinfo).startswith("Example CPU 9000, ")
    assert cpu_model(tmp_path / "absent")  # a machine without /proc still names something
