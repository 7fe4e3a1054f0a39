"""A separate writer process for the concurrency tests.

``python sqlstore_writer.py URL SEED COUNT START STOP BATCH`` regenerates the deterministic
events of ``make_events(COUNT, seed=SEED)``, inserts ``events[START:STOP]`` in batches of
BATCH into the store at URL, and prints how many the store reported as new.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from sqlstore_support import DAY0, make_events, noon

from gateway.ledger import open_store


async def main(url: str, seed: int, count: int, start: int, stop: int, batch: int) -> None:
    events = make_events(count, seed=seed)[start:stop]
    with tempfile.TemporaryDirectory() as scratch:
        store = await open_store(
            url, data_dir=Path(scratch), clock=lambda: noon(DAY0 + timedelta(days=4))
        )
        try:
            inserted = 0
            for offset in range(0, len(events), batch):
                inserted += await store.insert(events[offset : offset + batch])
        finally:
            await store.close()
    print(inserted)


if __name__ == "__main__":
    url, *numbers = sys.argv[1:]
    asyncio.run(main(url, *(int(number) for number in numbers)))
