"""Reading untrusted JSON and YAML within bounds: nesting depth, and YAML alias expansion.

Python's YAML composer and most tree walkers recurse once per level, so a document nested a
few thousand levels deep ends in ``RecursionError``; a YAML "billion laughs" (anchors whose
aliases repeat each other nine times over nine levels) is a few hundred bytes that expand to
hundreds of millions of nodes for whatever walks the result. ``load_yaml`` refuses both before
building any Python object: the composer counts its depth, and the composed node graph is sized
as if every alias were expanded (shared nodes counted once per use, memoised, so sizing a bomb
costs no more than its text). Nothing here recurses deeper than ``max_depth``. A document
that names more than ``max_aliases`` aliases is refused while it is being composed, so a
megabyte of ``*a`` costs a few thousand events, not seconds of parsing.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode


class DocumentTooComplex(ValueError):
    """The document is nested too deeply or expands to too many nodes."""


def nesting_depth_exceeds(data: Any, limit: int) -> bool:
    """True when ``data`` nests lists/dicts more than ``limit`` levels (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


class _DepthCountingLoader(yaml.SafeLoader):
    """PyYAML's safe loader whose composer stops past ``max_depth`` collections or past
    ``max_aliases`` aliases."""

    def __init__(self, text: str, max_depth: int, max_aliases: int | None = None) -> None:
        super().__init__(text)
        self.max_depth = max_depth
        self.max_aliases = max_aliases
        self.depth = 0
        self.aliases = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self.depth += 1
        try:
            if self.depth > self.max_depth:
                raise DocumentTooComplex(f"nested more than {self.max_depth} levels deep")
            if self.max_aliases is not None and self.check_event(AliasEvent):  # type: ignore[no-untyped-call]
                self.aliases += 1
                if self.aliases > self.max_aliases:
                    raise DocumentTooComplex(f"using more than {self.max_aliases} aliases")
            return super().compose_node(parent, index)  # type: ignore[no-untyped-call]
        finally:
            self.depth -= 1


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def expanded_size(root: Node, limit: int) -> int:
    """Nodes in ``root`` with every alias expanded; DocumentTooComplex past ``limit`` or for an
    alias that contains itself."""
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        known = sizes.get(key)
        if known is not None:
            return known
        if key in in_progress:
            raise DocumentTooComplex("an alias refers to a node that contains it")
        in_progress.add(key)
        total = 1 + sum(size(child) for child in _children(node))
        in_progress.discard(key)
        if total > limit:
            raise DocumentTooComplex(f"expands to more than {limit} nodes (aliases included)")
        sizes[key] = total
        return total

    return size(root)


def load_yaml(text: str, *, max_depth: int, max_nodes: int, max_aliases: int | None = None) -> Any:
    """``yaml.safe_load`` within bounds; DocumentTooComplex past them, yaml.YAMLError as usual."""
    loader = _DepthCountingLoader(text, max_depth, max_aliases)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_size(node, max_nodes)
        return loader.construct_document(node)
    finally:
        loader.dispose()
