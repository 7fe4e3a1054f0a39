"""``take_attribution``: where the end user and the tags come from, in which order, what is
refused (a 400 naming the field), and that the gateway's own ``metadata.tags`` leaves the body
that goes upstream."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.metering.attribution import Attribution, take_attribution


def attribution(body: dict[str, Any], headers: dict[str, str] | None = None, key_tags=None):
    return take_attribution(body, headers or {}, key_tags)


def test_the_header_user_wins_over_the_body_and_anthropic_metadata() -> None:
    assert attribution({"user": "bob"}).end_user == "bob"
    assert attribution({"user": "bob"}, {"x-switchyard-user": "ana"}).end_user == "ana"
    assert attribution({"metadata": {"user_id": "u-7"}}).end_user == "u-7"
    assert attribution({"user": "bob"}, {"x-switchyard-user": ""}).end_user == ""
    assert attribution({}) == Attribution()


def test_tags_from_body_and_header_together_else_the_keys_defaults() -> None:
    body = {"metadata": {"tags": ["proj-x", "exp-1"], "purpose": "kept"}}
    got = attribution(body, {"x-switchyard-tags": "exp-1, region:eu"}, ["default"])
    assert got.tags == ("proj-x", "exp-1", "region:eu")  # a repeat counts once
    assert body == {"metadata": {"purpose": "kept"}}  # the rest of metadata goes upstream
    only_tags = {"metadata": {"tags": "a,b"}}
    assert attribution(only_tags).tags == ("a", "b")
    assert only_tags == {}  # an emptied metadata is dropped, not sent as {}
    assert attribution({}, {}, ["default", "web"]).tags == ("default", "web")
    assert attribution({}).tags == ()


@pytest.mark.parametrize(
    ("body", "headers", "param"),
    [
        ({"metadata": {"tags": ["has space"]}}, {}, "metadata.tags"),
        ({"metadata": {"tags": [""]}}, {}, "metadata.tags"),
        ({"metadata": {"tags": ["x" * 65]}}, {}, "metadata.tags"),
        ({"metadata": {"tags": [3]}}, {}, "metadata.tags"),
        ({"metadata": {"tags": {"a": 1}}}, {}, "metadata.tags"),
        ({}, {"x-switchyard-tags": "a,b,c,d,e,f,g,h,i"}, "x-switchyard-tags"),
        ({"metadata": {"tags": list("abcde")}}, {"x-switchyard-tags": "f,g,h,i"}, "metadata.tags"),
        ({"user": 42}, {}, "user"),
        ({"user": "a" * 201}, {}, "user"),
        ({}, {"x-switchyard-user": "tab\there"}, "x-switchyard-user"),
        ({"metadata": {"user_id": ["x"]}}, {}, "metadata.user_id"),
    ],
)
def test_bad_attribution_is_a_400_naming_the_field(
    body: dict[str, Any], headers: dict[str, str], param: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        attribution(body, headers)
    assert refused.value.param == param
    assert refused.value.status == 400
