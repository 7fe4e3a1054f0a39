"""Client cache controls: Cache-Control directives and x-switchyard-cache, bad values refused."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from gateway.cache import DEFAULT_DIRECTIVE, CacheDirective, CacheHeaderError, directive_of


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, DEFAULT_DIRECTIVE),
        ({"cache-control": "no-cache"}, CacheDirective(lookup=False)),
        ({"cache-control": "No-Cache, max-stale"}, CacheDirective(lookup=False)),
        ({"cache-control": "no-store"}, CacheDirective(store=False)),
        ({"cache-control": "no-cache, no-store"}, CacheDirective(lookup=False, store=False)),
        ({"cache-control": "max-age=60"}, CacheDirective(max_age_s=60)),
        ({"cache-control": 'max-age="60", max-age=30'}, CacheDirective(max_age_s=30)),
        ({"cache-control": "max-age=0"}, CacheDirective(lookup=False, max_age_s=0)),
        ({"cache-control": "max-age=soon"}, DEFAULT_DIRECTIVE),  # unparsable: ignored
        ({"cache-control": "private, must-revalidate"}, DEFAULT_DIRECTIVE),
        ({"x-switchyard-cache": "bypass"}, CacheDirective(lookup=False)),
        ({"x-switchyard-cache": " BYPASS "}, CacheDirective(lookup=False)),
        (
            {"x-switchyard-cache": "bypass", "cache-control": "no-store"},
            CacheDirective(lookup=False, store=False),
        ),
    ],
)
def test_directives(headers: dict[str, str], expected: CacheDirective) -> None:
    assert directive_of(headers) == expected


def test_header_names_are_case_insensitive_on_a_real_request() -> None:
    headers = Headers(headers={"Cache-Control": "max-age=5", "X-Switchyard-Cache": "Bypass"})
    assert directive_of(headers) == CacheDirective(lookup=False, max_age_s=5)


@pytest.mark.parametrize("value", ["hit", "off", "refresh", "bypass,no-store"])
def test_an_unknown_switchyard_value_is_a_client_error(value: str) -> None:
    with pytest.raises(CacheHeaderError) as refused:
        directive_of({"x-switchyard-cache": value})
    assert refused.value.header == "x-switchyard-cache"
    assert "bypass" in refused.value.message
