"""``check_id`` refuses exactly the ids with braces, whitespace or control characters."""

import pytest

from gateway.ledger.record import MAX_ID_LENGTH, RecordError, check_id


def _refused(value: str) -> bool:
    try:
        check_id(RecordError, "key_id", value)
    except RecordError as exc:
        assert exc.field == "key_id"
        return True
    return False


def test_every_code_point_is_judged_as_the_character_rule_says() -> None:
    # The rule as written per character; check_id tests whole strings for speed.
    for code in range(0x110000):
        ch = chr(code)
        expected = ch in "{}" or not ch.isprintable() or ch.isspace()
        assert _refused(f"k{ch}k") is expected, hex(code)


@pytest.mark.parametrize("value", ["", None, 7, "x" * (MAX_ID_LENGTH + 1)])
def test_empty_long_and_non_string_ids_are_refused(value: object) -> None:
    with pytest.raises(RecordError, match="key_id"):
        check_id(RecordError, "key_id", value)


def test_ordinary_ids_pass() -> None:
    for value in ["req-1", "sk_abc.DEF:42/x@y=z", "x" * MAX_ID_LENGTH, "ключ-é"]:
        check_id(RecordError, "key_id", value)
