"""The passed-through operations with the openai SDK: audio transcriptions and translations and
image edits (multipart uploads streamed through with their model replaced, within the upload
cap), speech (audio bytes back), moderations, embeddings on Azure, and ``GET
/v1/models/{id}``; each metered from what the provider reports, or estimated."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from native_gateway import NativeGateway
from native_upstreams import form_fields

AUDIO = b"RIFF" + bytes(range(256)) * 400  # ~100 KB, every byte value


def client(native: NativeGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=native.gateway.v1, api_key=native.key, max_retries=0)


def last_event(native: NativeGateway) -> dict[str, Any]:
    native.gateway.wait_exported()  # reports read the usage store, a moment behind
    with native.gateway.admin() as admin:
        page = admin.get("/admin/usage/events", params={"key": native.key_id, "limit": 1})
    return page.json()["data"][0]


def test_transcription_is_streamed_through_with_the_model_replaced(native: NativeGateway) -> None:
    reply = client(native).audio.transcriptions.create(
        model="whisper", file=("a.wav", io.BytesIO(AUDIO), "audio/wav"), prompt="names: Zoë"
    )
    assert reply.text == f"openai heard {len(AUDIO)} bytes as whisper-1"
    seen = native.fleet["openai"].seen[-1]
    assert seen.path == "/v1/audio/transcriptions"
    form = form_fields(seen)
    assert form["model"] == "whisper-1" and form["file"] == AUDIO and form["prompt"] == "names: Zoë"
    assert int(seen.headers["content-length"]) == len(seen.body)
    event = last_event(native)
    assert event["route"] == "audio.transcriptions" and event["usage_source"] == "provider"
    assert (event["prompt_tokens"], event["completion_tokens"]) == (50, 7)
    assert event["cost_nanos"] == 57 * 6000


def test_an_upload_goes_to_the_replica_a_fleet_picks(native: NativeGateway) -> None:
    raw = client(native).audio.transcriptions.with_raw_response.create(
        model="fleet-whisper", file=("a.wav", io.BytesIO(AUDIO), "audio/wav")
    )
    assert raw.parse().text == f"engine heard {len(AUDIO)} bytes as whisper-large-v3"
    replica = native.fleet["engine"].replica.removeprefix("http://")
    assert f"replica={replica}" in raw.headers["x-switchyard-route"]
    seen = native.fleet["engine"].seen[-1]
    assert seen.path == "/v1/audio/transcriptions" and form_fields(seen)["file"] == AUDIO
    assert last_event(native)["usage_source"] == "provider"


def test_azure_deployment_serves_audio_and_embeddings(native: NativeGateway) -> None:
    reply = client(native).audio.translations.create(
        model="azure-whisper", file=("a.wav", io.BytesIO(AUDIO), "audio/wav")
    )
    assert reply.text.startswith("azure heard")
    embedded = client(native).embeddings.create(model="azure-embed", input="hello")
    assert embedded.data[0].embedding == [0.5, 0.25]
    paths = [(seen.path, seen.query) for seen in native.fleet["azure"].seen[-2:]]
    version = {"api-version": "2024-10-21"}
    assert paths == [
        ("/openai/deployments/whisper-1/audio/translations", version),
        ("/openai/deployments/text-embedding-3-small/embeddings", version),
    ]


def test_image_edit_upload_and_its_reported_usage(native: NativeGateway) -> None:
    reply = client(native).images.edit(
        model="image-editor", image=("in.png", io.BytesIO(b"\x89PNG" + AUDIO[:5000])), prompt="hat"
    )
    assert reply.data[0].b64_json == "aGk="
    form = form_fields(native.fleet["openai"].seen[-1])
    assert form["model"] == "gpt-image-1" and form["prompt"] == "hat"
    event = last_event(native)
    assert (event["prompt_tokens"], event["completion_tokens"]) == (30, 200)
    assert event["cost_nanos"] == 30 * 5000 + 200 * 40000


def test_uploads_past_the_cap_are_413_declared_or_chunked(native: NativeGateway) -> None:
    big = AUDIO * 3  # > the 256 KiB cap of this gateway
    with pytest.raises(openai.APIStatusError) as caught:
        client(native).audio.transcriptions.create(
            model="whisper", file=("a.wav", io.BytesIO(big), "audio/wav")
        )
    assert caught.value.status_code == 413
    before = len(native.fleet["openai"].seen)
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
    ).encode()

    def chunked() -> Iterator[bytes]:  # no Content-Length: only counting can stop it
        yield head
        for _ in range(40):
            yield AUDIO[:10_000]
        yield f"\r\n--{boundary}--\r\n".encode()

    response = httpx.post(
        native.gateway.v1 + "/audio/transcriptions",
        content=chunked(),
        headers={
            "Authorization": f"Bearer {native.key}",
            "Content-Type": f"multipart/form-data; boundary={boundary}",
        },
        timeout=30,
    )
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "request_too_large"
    # The upstream never got a whole file: what it saw (if anything) was cut short.
    for seen in native.fleet["openai"].seen[before:]:
        assert len(seen.body) < len(head) + 40 * 10_000


def test_the_model_must_come_before_the_file(native: NativeGateway) -> None:
    boundary = "xyz"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        f'RIFF\r\n--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
        f"whisper\r\n--{boundary}--\r\n"
    ).encode()
    response = httpx.post(
        native.gateway.v1 + "/audio/transcriptions",
        content=body,
        headers={
            "Authorization": f"Bearer {native.key}",
            "Content-Type": f"multipart/form-data; boundary={boundary}",
        },
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "model"
    not_multipart = httpx.post(
        native.gateway.v1 + "/audio/transcriptions",
        json={"model": "whisper"},
        headers={"Authorization": f"Bearer {native.key}"},
    )
    assert not_multipart.status_code == 400
    assert not_multipart.json()["error"]["param"] == "content-type"


def test_providers_that_do_not_offer_an_operation_are_refused(native: NativeGateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(native).audio.transcriptions.create(
            model="claude-whisper", file=("a.wav", io.BytesIO(b"RIFF"), "audio/wav")
        )
    assert caught.value.body["code"] == "unsupported_endpoint"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        client(native).embeddings.create(model="claude", input="hi")


def test_speech_returns_the_provider_audio_and_is_estimated(native: NativeGateway) -> None:
    audio = client(native).audio.speech.create(model="tts", voice="alloy", input="hello there")
    assert audio.content == b"ID3" + b"hello there" * 10
    assert audio.response.headers["content-type"] == "audio/mpeg"
    event = last_event(native)
    assert event["route"] == "audio.speech" and event["usage_source"] == "estimated"
    assert event["completion_tokens"] == 0 and event["prompt_tokens"] >= 1


def test_moderations_pass_through(native: NativeGateway) -> None:
    result = client(native).moderations.create(model="moderation", input="a kind word")
    assert result.results[0].flagged is False
    assert native.fleet["openai"].seen[-1].body["model"] == "omni-moderation-latest"


def test_get_one_model(native: NativeGateway) -> None:
    sdk = client(native)
    model = sdk.models.retrieve("claude")
    assert model.id == "claude" and model.owned_by == "anthropic"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("no-such-model")
    _, narrow = native.gateway.create_key(name="narrow", models=["gpt"])
    narrowed = openai.OpenAI(base_url=native.gateway.v1, api_key=narrow, max_retries=0)
    assert narrowed.models.retrieve("gpt").id == "gpt"
    with pytest.raises(openai.NotFoundError):
        narrowed.models.retrieve("claude")  # exists, but not for this key
    response = httpx.get(native.gateway.v1 + "/models/gpt", headers={"x-api-key": native.key})
    assert response.status_code == 200
