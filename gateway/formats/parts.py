"""Content parts as a request renderer writes them: text, images and its format's own raw parts.

User content and tool results are lists of such parts in every format. ``ContentParts`` renders
one block of such a list for its format and refuses any other kind of block with
``Untranslatable``, naming where the block sat in the client's body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.formats.errors import Untranslatable
from gateway.formats.internal import Block, FormatName, Image, Raw, Text
from gateway.formats.portability import TITLES, raw_data


@dataclass(frozen=True, slots=True)
class ContentParts:
    target: FormatName
    text: Callable[[Text], dict[str, Any]]
    image: Callable[[Image], dict[str, Any]]

    def render(self, block: Block, path: str, refusal: str) -> dict[str, Any]:
        """One part; ``path`` is the enclosing item's, ``refusal`` why other blocks cannot go."""
        if isinstance(block, Text):
            return self.text(block)
        if isinstance(block, Image):
            return self.image(block)
        if isinstance(block, Raw):
            return raw_data(block, self.target, path)
        raise Untranslatable(block.path or path, TITLES[self.target], refusal)
