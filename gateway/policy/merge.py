"""A JSON policy edit applied to the YAML file in force, changing only what the edit changes.

``PUT /admin/policy`` with a JSON body (often ``GET /admin/policy``'s ``policy`` with one field
changed, so every default is spelled out) is merged into the file's round-trip document
(ruamel.yaml keeps comments, key order, flow style and number spelling): a value equal to the
file's is left as written, a changed one replaced in place, a removed key deleted, a new key
appended. A new key that the policy would read the same without (``formats: null``,
``deployments: {}``, any default) is left out. The result is checked to parse (with the
gateway's own YAML reader) to the same policy as the JSON; when it would not, the JSON is
written as plain YAML instead, so the file never says something other than what was applied.
"""

from __future__ import annotations

import io
import itertools
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from gateway.policy.base import PolicyError
from gateway.policy.document import Policy
from gateway.policy.parse import parse_policy, validate_policy_data

# Past this many added keys, leaving out defaults one by one would cost a validation each.
_MAX_PRUNE_TRIALS = 300

_Path = tuple[Any, ...]


def _round_trip(text: str) -> YAML:
    loader = YAML(typ="rt")
    loader.preserve_quotes = True
    loader.width = 100
    mapping, sequence, offset = guess_indent(text)
    loader.indent(mapping=mapping, sequence=sequence, offset=offset)
    return loader


def guess_indent(text: str) -> tuple[int, int, int]:
    """The file's own indentation, as ruamel's ``indent(mapping, sequence, offset)``: the step
    of its first nested mapping, and where its first block list puts the dash against the
    list's key (``key:\n  - a`` or ``key:\n- a``). ruamel applies one style to the whole
    document, so the file's is the one to keep."""
    lines = [
        line
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#") and line.strip() != "---"
    ]
    mapping, sequence, offset = 2, 4, 2
    found_mapping = found_sequence = False
    for previous, line in itertools.pairwise(lines):
        parent = len(previous) - len(previous.lstrip())
        indent = len(line) - len(line.lstrip())
        opens = previous.rstrip().endswith(":")
        if not opens:
            continue
        if line.lstrip().startswith("- ") and not found_sequence:
            offset = max(indent - parent, 0)
            sequence, found_sequence = offset + 2, True
        elif indent > parent and not found_mapping and not previous.lstrip().startswith("- "):
            mapping, found_mapping = indent - parent, True
        if found_mapping and found_sequence:
            break
    return mapping, sequence, offset


def plain_yaml(data: dict[str, Any]) -> str:
    """The JSON as YAML in its own key order (no file to merge into)."""
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def merge_policy_yaml(base_text: str | None, data: dict[str, Any]) -> str:
    """The YAML text to store for the policy ``data`` (validated already), merged into
    ``base_text`` (the file in force) where it can be."""
    target = validate_policy_data(data)
    if not base_text:
        return plain_yaml(data)
    loader = _round_trip(base_text)
    try:
        document = loader.load(base_text)
    except Exception:  # a file ruamel cannot read round-trip is rewritten plainly
        return plain_yaml(data)
    if not isinstance(document, CommentedMap):
        return plain_yaml(data)
    added: list[_Path] = []
    _merge_map(document, data, (), added)
    _leave_out_defaults(document, added, target)
    text = _dump(loader, document)
    if _reads_as(text, target):
        return text
    return plain_yaml(data)


def _merge_map(into: CommentedMap, new: dict[str, Any], path: _Path, added: list[_Path]) -> None:
    for key in [k for k in into if k not in new]:
        del into[key]
    for key, value in new.items():
        if key not in into:
            into[key] = value
            added.append((*path, key))
        elif into[key] == value:
            continue  # as written: the file's spelling (2.00, flow style, quotes) stays
        else:
            into[key] = _merged(into[key], value, (*path, key), added)


def _merged(old: Any, new: Any, path: _Path, added: list[_Path]) -> Any:
    if isinstance(old, CommentedMap) and isinstance(new, dict):
        _merge_map(old, new, path, added)
        return old
    if isinstance(old, CommentedSeq) and isinstance(new, list) and len(old) == len(new):
        for index, item in enumerate(new):
            if old[index] != item:
                old[index] = _merged(old[index], item, (*path, index), added)
        return old
    return new


def _leave_out_defaults(document: CommentedMap, added: list[_Path], target: Policy) -> None:
    """Drop each added key the policy reads the same without: all at once when that holds
    (the usual GET-edit-PUT), else one by one."""
    if not added:
        return
    removed = [(_parent(document, path), path[-1]) for path in added]
    values = [parent.pop(key) for parent, key in removed]
    if _same_policy(document, target):
        return
    for (parent, key), value in zip(removed, values, strict=True):
        parent[key] = value
    if len(added) > _MAX_PRUNE_TRIALS:
        return
    for parent, key in removed:
        value = parent.pop(key)
        if not _same_policy(document, target):
            parent[key] = value


def _parent(document: CommentedMap, path: _Path) -> Any:
    node: Any = document
    for part in path[:-1]:
        node = node[part]
    return node


def _same_policy(document: CommentedMap, target: Policy) -> bool:
    try:
        return _same(validate_policy_data(_plain(document)), target)
    except PolicyError:
        return False


def _same(policy: Policy, target: Policy) -> bool:
    return policy.model_dump(mode="json") == target.model_dump(mode="json")


def _plain(value: Any) -> Any:
    """ruamel's containers as plain dicts and lists (what the validator expects)."""
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _dump(loader: YAML, document: CommentedMap) -> str:
    out = io.StringIO()
    loader.dump(document, out)
    return out.getvalue()


def _reads_as(text: str, target: Policy) -> bool:
    try:
        return _same(parse_policy(text), target)
    except PolicyError:
        return False
