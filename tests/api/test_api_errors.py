"""Every error case renders OpenAI's envelope with the right status, and nothing leaks."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest
from gateway_runner import GatewayThread, RunningGateway, make_settings
from starlette.routing import Route


def _post(
    gateway: RunningGateway, key: str | None, body: object, **kwargs: object
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(
        gateway.v1 + "/chat/completions",
        content=content,
        headers={"Content-Type": "application/json", **headers},
        timeout=10,
        **kwargs,  # type: ignore[arg-type]
    )


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


HI = [{"role": "user", "content": "hi"}]


def test_invalid_json_is_400(gateway: RunningGateway, key: str) -> None:
    response = _post(gateway, key, b"{not json")
    assert response.status_code == 400
    assert "not valid JSON" in _error(response)["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "fake"}, "messages"),
        ({"model": "fake", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"model": "fake", "messages": HI, "temperature": 7}, "temperature"),
        ({"model": "fake", "messages": HI, "max_tokens": "ten"}, "max_tokens"),
        ({"model": 5, "messages": HI}, "model"),
        ({"model": "fake", "messages": HI, "stream": "yes"}, "stream"),
    ],
)
def test_schema_errors_name_the_field(
    gateway: RunningGateway, key: str, body: dict, param: str
) -> None:
    response = _post(gateway, key, body)
    assert response.status_code == 400
    assert _error(response)["param"] == param


def test_sdk_sees_bad_request(gateway: RunningGateway, key: str) -> None:
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="embed-model", input=[])
    assert caught.value.param == "input"  # type: ignore[attr-defined]


def test_missing_and_invalid_keys_are_401(gateway: RunningGateway) -> None:
    missing = _post(gateway, None, {"model": "fake", "messages": HI})
    assert missing.status_code == 401
    assert _error(missing)["code"] == "missing_api_key"
    for bad in ("nope", "sk-sy-aaaaaaaaaaaaaaaa-" + "b" * 40):
        response = _post(gateway, bad, {"model": "fake", "messages": HI})
        assert response.status_code == 401
        assert _error(response)["code"] == "invalid_api_key"
    client = openai.OpenAI(base_url=gateway.v1, api_key="sk-sy-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_unknown_model_is_404(gateway: RunningGateway, key: str) -> None:
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=HI)  # type: ignore[arg-type]
    assert caught.value.code == "model_not_found"


def test_body_over_the_limit_is_413(gateway: RunningGateway, key: str) -> None:
    big = {"model": "fake", "messages": [{"role": "user", "content": "x" * 70_000}]}
    response = _post(gateway, key, big)
    assert response.status_code == 413
    assert _error(response)["code"] == "request_too_large"

    def chunks():  # no Content-Length: the limit is enforced while reading
        yield orjson.dumps(big)

    chunked = httpx.post(
        gateway.v1 + "/chat/completions",
        content=chunks(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert chunked.status_code == 413


def test_unreachable_upstream_is_502(gateway: RunningGateway, key: str) -> None:
    response = _post(gateway, key, {"model": "dead-model", "messages": HI})
    assert response.status_code == 502
    assert "unreachable" in _error(response)["message"]


def test_upstream_timeout_is_504(gateway: RunningGateway, key: str) -> None:
    response = _post(gateway, key, {"model": "slow-model", "messages": HI})
    assert response.status_code == 504
    assert _error(response)["type"] == "upstream_timeout"


def test_upstream_4xx_is_passed_through(gateway: RunningGateway, key: str) -> None:
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="upstream-400", messages=HI)  # type: ignore[arg-type]
    assert "fake upstream rejected the request" in caught.value.message
    assert caught.value.code == "bad_input"


def test_upstream_5xx_is_502(gateway: RunningGateway, key: str) -> None:
    response = _post(gateway, key, {"model": "upstream-500", "messages": HI})
    assert response.status_code == 502
    assert "HTTP 500" in _error(response)["message"]


def test_stream_cut_upstream_ends_with_an_error_event(gateway: RunningGateway, key: str) -> None:
    body = {"model": "break-model", "messages": HI, "stream": True}
    with httpx.stream(
        "POST",
        gateway.v1 + "/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    ) as response:
        assert response.status_code == 200
        text = response.read().decode()
    events = [e for e in text.split("\n\n") if e.strip()]
    assert events[0].startswith("data: {")  # chunks were relayed before the failure
    assert events[-1].startswith("event: error\ndata: ")
    error = orjson.loads(events[-1].split("data: ", 1)[1])["error"]
    assert error["type"] == "upstream_error"
    assert "[DONE]" not in text
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(model="break-model", messages=HI, stream=True))  # type: ignore[arg-type]


def test_unknown_route_and_wrong_method(gateway: RunningGateway) -> None:
    missing = httpx.get(gateway.base_url + "/v1/nothing-here")
    assert missing.status_code == 404
    assert _error(missing)["type"] == "invalid_request_error"
    wrong = httpx.get(gateway.v1 + "/chat/completions")
    assert wrong.status_code == 405
    assert _error(wrong)["code"] == "method_not_allowed"


def test_unexpected_failure_is_an_envelope_without_a_trace(
    tmp_path, fake_policy, redis_url
) -> None:
    runner = GatewayThread(make_settings(tmp_path, fake_policy, redis_url))

    async def boom(request):
        raise RuntimeError("secret internal detail")

    original_start = runner.start

    def start_with_boom() -> RunningGateway:
        running = original_start()
        running.app.router.routes.append(Route("/boom", boom))
        return running

    running = start_with_boom()
    try:
        response = httpx.get(running.base_url + "/boom", headers={"X-Request-ID": "boom-1"})
        assert response.status_code == 500
        error = _error(response)
        assert error["type"] == "server_error"
        assert "secret internal detail" not in response.text
        assert "Traceback" not in response.text
        assert response.headers["x-request-id"] == "boom-1"
    finally:
        runner.stop()


def test_authentication_comes_before_body_parsing(gateway: RunningGateway) -> None:
    response = _post(gateway, None, b"{not json")
    assert response.status_code == 401
