"""Reading a policy: bounded YAML (or JSON) into a validated ``Policy``, its version, and the
JSON Schema in ``docs/policy.schema.json`` (``python -m gateway.policy --schema``)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.policy.base import PolicyError
from gateway.policy.bounded_yaml import DocumentTooComplex, load_yaml
from gateway.policy.document import Policy

# Bounds of a policy document (a real one nests 5 levels and has a few thousand nodes).
MAX_POLICY_DEPTH = 32
MAX_POLICY_NODES = 100_000
# A policy is a few kilobytes (the shipped one is about 10 KB): these bounds refuse a document
# built to keep a parser busy (issue 26: 900 KB of aliases took 3.3 s) before it is parsed.
MAX_POLICY_BYTES = 256 * 1024
MAX_POLICY_ALIASES = 1000


def _error_path(error: dict) -> str:
    return ".".join(
        str(part) for part in error["loc"] if not str(part).startswith("function-after")
    )


def validate_policy_data(data: Any) -> Policy:
    """Validate an already-parsed mapping (YAML or JSON) into a Policy, or raise PolicyError."""
    if not isinstance(data, dict):
        raise PolicyError("", "the policy must be a mapping")
    try:
        return Policy.model_validate(data)
    except PolicyError:
        raise
    except ValidationError as exc:
        first = exc.errors()[0]
        context_error = first.get("ctx", {}).get("error")
        if isinstance(context_error, PolicyError):
            raise context_error from exc
        message = first["msg"].removeprefix("Value error, ")
        raise PolicyError(_error_path(first), message) from exc


def parse_policy(text: str) -> Policy:
    """Parse YAML (or JSON, a subset of YAML) into a validated Policy, or raise PolicyError.

    At most ``MAX_POLICY_BYTES`` of UTF-8, ``MAX_POLICY_DEPTH`` levels of nesting,
    ``MAX_POLICY_ALIASES`` aliases and ``MAX_POLICY_NODES`` nodes with every alias expanded: a
    huge, deeply nested or alias-bomb document is an invalid policy. CPU-bound for large
    input: callers on an event loop run it in a worker thread."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_POLICY_BYTES:
        raise PolicyError("", f"the policy is {size} bytes; at most {MAX_POLICY_BYTES} are read")
    try:
        data = load_yaml(
            text,
            max_depth=MAX_POLICY_DEPTH,
            max_nodes=MAX_POLICY_NODES,
            max_aliases=MAX_POLICY_ALIASES,
        )
    except DocumentTooComplex as exc:
        raise PolicyError("", f"the policy is {exc}") from None
    except yaml.YAMLError as exc:
        raise PolicyError("", f"invalid YAML: {exc}") from exc
    return validate_policy_data(data)


def load_policy_file(path: Path | str) -> Policy:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PolicyError("", f"cannot read policy file {path}: {exc.strerror}") from exc
    return parse_policy(text)


def policy_version(text: str) -> str:
    """Content hash: the version recorded with each usage event."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def policy_json_schema() -> dict[str, Any]:
    schema = Policy.model_json_schema(by_alias=True)
    schema["title"] = "Switchyard routing policy (routing_rules.yaml)"
    return schema
