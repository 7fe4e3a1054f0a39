"""``gateway.redact``: what is scrubbed out of upstream text before anyone sees it."""

from __future__ import annotations

import pytest

from gateway.redact import MAX_RELAYED_CHARS, REDACTED, redact, secret_values

PROVIDER_KEY = "prov-key-7Hq2mZx9"  # does not look like anything: only the exact value catches it


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Incorrect API key provided: sk-proj-AbCdEf0123456789xyz.", "sk-proj-AbCdEf0123456789xyz"),
        ("Incorrect API key provided: sk-ant-api03-abcdefghijk", "sk-ant-api03-abcdefghijk"),
        ("got header Authorization: Bearer eyJhbGciOi.payload.sig", "eyJhbGciOi.payload.sig"),
        ("Basic dXNlcjpwYXNzd29yZA== was refused", "dXNlcjpwYXNzd29yZA=="),
        ('{"x-api-key": "anthropic-secret-value"}', "anthropic-secret-value"),
        ("retry with api_key=abc123secret&x=1", "abc123secret"),
        ("api-key: 0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef"),
        ("token=ghp_abcdefghijklmnopqrstuvwx1234", "ghp_abcdefghijklmnopqrstuvwx1234"),
        ("aws AKIAABCDEFGHIJKLMNOP denied", "AKIAABCDEFGHIJKLMNOP"),
        ("key AIzaSyA-abcdefghijklmnopqrstuvwx", "AIzaSyA-abcdefghijklmnopqrstuvwx"),
        ("session 9f8e7d6c5b4a39281706f5e4d3c2b1a0ffee", "9f8e7d6c5b4a39281706f5e4d3c2b1a0ffee"),
        (f"backend said {PROVIDER_KEY} is wrong", PROVIDER_KEY),
    ],
)
def test_credentials_are_replaced(text: str, secret: str) -> None:
    scrubbed = redact(text, [PROVIDER_KEY])
    assert secret not in scrubbed
    assert REDACTED in scrubbed


def test_ordinary_error_text_is_kept() -> None:
    text = (
        "The model `gpt-4o-mini` does not exist or you do not have access to it. "
        "max_tokens must be at most 4096; see https://platform.openai.com/docs/api-reference."
    )
    assert redact(text) == text


def test_text_is_cut_to_the_limit() -> None:
    scrubbed = redact("word " * 10_000)
    assert len(scrubbed) == MAX_RELAYED_CHARS and scrubbed.endswith("…")
    assert len(redact("x" * 100, limit=20)) == 20


def test_a_secret_straddling_the_cut_is_replaced_first() -> None:
    text = "a" * 290 + " " + PROVIDER_KEY + " tail"
    scrubbed = redact(text, [PROVIDER_KEY])
    assert PROVIDER_KEY[:5] not in scrubbed[280:]  # no prefix of the key survives the cut


def test_secret_values_of_a_provider() -> None:
    values = secret_values("MY_KEY", {"api-key": "azure-header-key"}, {"MY_KEY": "from-env-key"})
    assert set(values) == {"azure-header-key", "from-env-key"}
    assert secret_values(None, {}, {}) == ()
