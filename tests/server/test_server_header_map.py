"""header_map reads a request's headers as Starlette's Headers does, once per request."""

from starlette.datastructures import Headers

from gateway.server.header_map import header_map


def _scope(*pairs: tuple[bytes, bytes]) -> dict:
    return {"type": "http", "headers": list(pairs)}


def test_a_name_sent_twice_reads_as_its_first_value_as_headers_get_does() -> None:
    scope = _scope((b"x-tag", b"first"), (b"content-type", b"application/json"), (b"x-tag", b"2"))
    headers = header_map(scope)
    assert headers["x-tag"] == Headers(scope=scope).get("x-tag") == "first"
    assert headers == {"x-tag": "first", "content-type": "application/json"}


def test_names_are_lower_case_and_values_latin_1_like_starlettes() -> None:
    scope = _scope((b"X-Request-ID", b"abc"), (b"x-user", "caf\u00e9".encode("latin-1")))
    headers = header_map(scope)
    assert headers == {"x-request-id": "abc", "x-user": "caf\u00e9"}
    assert headers.get("x-user") == Headers(scope=scope).get("X-User")
    assert headers.get("authorization") is None


def test_it_is_built_once_per_request_and_kept_in_the_scope() -> None:
    scope = _scope((b"authorization", b"Bearer k"))
    first = header_map(scope)
    assert header_map(scope) is first
    assert header_map(_scope((b"authorization", b"Bearer k"))) is not first
