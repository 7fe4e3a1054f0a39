"""Inline images as OpenAI writes them (``data:`` URLs) and as Anthropic writes them (base64 and
a media type), and the image types each accepts."""

from __future__ import annotations

from gateway.formats.errors import MalformedRequest
from gateway.formats.internal import Image

# The image types Anthropic accepts inline; OpenAI accepts these too.
ANTHROPIC_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def parse_data_url(url: str) -> tuple[str, str] | None:
    """(media type, base64 data) of a ``data:<type>;base64,<data>`` URL; None for other URLs."""
    if not url.startswith("data:"):
        return None
    head, comma, data = url[5:].partition(",")
    if not comma:
        return None
    media_type, _, encoding = head.partition(";")
    if encoding != "base64" or not media_type:
        return None
    return media_type, data


def image_from_url(url: str, detail: str | None, path: str, url_path: str) -> Image:
    """An image a client gave by URL (both OpenAI formats): a base64 ``data:`` URL becomes
    inline data, another ``data:`` URL is refused naming ``url_path``, any other stays a URL."""
    inline = parse_data_url(url)
    if inline is not None:
        return Image(data=inline[1], media_type=inline[0], detail=detail, path=path)
    if url.startswith("data:"):
        raise MalformedRequest(
            f"{url_path} must be a base64 data URL or an http(s) URL", param=url_path
        )
    return Image(url=url, detail=detail, path=path)


def data_url(media_type: str, data: str) -> str:
    return f"data:{media_type};base64,{data}"
