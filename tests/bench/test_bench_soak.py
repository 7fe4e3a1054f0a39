"""A short, bounded soak (~20 s): a real gateway process under a fixed mixed load answers every
request, and its RSS is sampled and stays within bounds after warm-up (``make soak`` runs the
long version and reports the figures in docs/benchmarks.md)."""

from __future__ import annotations

import io

from bench.soak import soak


async def test_short_soak_answers_everything_and_rss_stays_bounded() -> None:
    printed = io.StringIO()
    result = await soak(40, 15, warmup_s=5, sample_s=1, stream_ratio=0.5, out=printed)
    assert result.sent >= 15 * 40 * 0.95
    assert result.errors == 0 and result.ok == result.sent
    assert len(result.after_warmup()) >= 8
    assert all(sample.rss_mb > 10 for sample in result.samples)
    assert abs(result.growth_mb) < 15, printed.getvalue()
    assert "rss_mb" in printed.getvalue().splitlines()[0]
