"""Inline images as OpenAI writes them (``data:`` URLs) and as Anthropic writes them (base64 and
a media type), and the image types each accepts."""

from __future__ import annotations

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


def data_url(media_type: str, data: str) -> str:
    return f"data:{media_type};base64,{data}"
