"""Content parts as a request renderer writes them: text, images and its format's own raw parts.

User content and tool results are lists of such parts in every format. ``ContentParts`` renders
one block of such a list for its format and refuses any other kind of block with
``Untranslatable``, naming where the block sat in the client's body. In the OpenAI formats a
user turn also holds items that stand alone beside its message: tool results, and raw items
that the format's ``stands_alone`` picks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.formats.errors import Untranslatable
from gateway.formats.internal import Block, FormatName, Image, Message, Raw, Text, ToolResult
from gateway.formats.portability import TITLES, raw_data


@dataclass(frozen=True, slots=True)
class ContentParts:
    """One format's parts: ``text`` and ``image`` write those blocks, a ``Raw`` block's data goes
    as it is (to its own format only), and ``stands_alone`` picks raw data that is an item."""

    target: FormatName
    text: Callable[[Text], dict[str, Any]]
    image: Callable[[Image], dict[str, Any]]
    stands_alone: Callable[[dict[str, Any]], bool] = lambda data: False  # for raw data

    def render(self, block: Block, path: str, refusal: str) -> dict[str, Any]:
        """One part; ``path`` is the enclosing item's, ``refusal`` why other blocks cannot go."""
        if isinstance(block, Text):
            return self.text(block)
        if isinstance(block, Image):
            return self.image(block)
        if isinstance(block, Raw):
            return raw_data(block, self.target, path)
        raise Untranslatable(block.path or path, TITLES[self.target], refusal)

    def split_user(
        self,
        message: Message,
        tool_result: Callable[[ToolResult], dict[str, Any]],
        refusal: Callable[[Block], str],
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """A user turn as (items that stand alone, parts of its one message), in order."""
        items: list[dict[str, Any]] = []
        parts: list[dict[str, Any]] = []
        for block in message.content:
            if isinstance(block, ToolResult):
                items.append(tool_result(block))
                continue
            part = self.render(block, message.path, refusal(block))
            alone = isinstance(block, Raw) and self.stands_alone(part)
            (items if alone else parts).append(part)
        return items, parts
