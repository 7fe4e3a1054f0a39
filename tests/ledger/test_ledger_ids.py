"""Usage and audit event ids are UUIDv7: their first 48 bits are the millisecond they were
made, so each day's index grows at its end (``gateway/ledger/ids.py``)."""

import time
import uuid

from gateway.ledger.ids import time_ordered_id
from gateway.metering.accounting import Accounting


def test_an_id_is_a_uuid7_in_32_lower_case_hex_digits() -> None:
    made = time_ordered_id()
    assert len(made) == 32 and made == made.lower()
    parsed = uuid.UUID(hex=made)
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122


def test_an_id_begins_with_the_millisecond_it_was_made() -> None:
    before = time.time_ns() // 1_000_000
    made = time_ordered_id()
    after = time.time_ns() // 1_000_000
    assert before <= int(made[:12], 16) <= after


def test_ids_made_in_later_milliseconds_sort_after_earlier_ones() -> None:
    made = []
    for _ in range(5):
        made.append(time_ordered_id())
        time.sleep(0.002)
    assert made == sorted(made)


def test_ids_made_in_the_same_millisecond_differ() -> None:
    made = {time_ordered_id() for _ in range(10_000)}
    assert len(made) == 10_000


def test_a_request_books_its_usage_under_a_time_ordered_id() -> None:
    books = Accounting(route="chat", started=0.0)
    assert uuid.UUID(hex=books.record_id).version == 7
    assert Accounting(route="chat", started=0.0).record_id != books.record_id
