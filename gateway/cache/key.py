"""The cache key of a request, its scope (who may share the entry), and whether it is cacheable.

The key is the SHA-256 of the canonical request: the route (``chat.completions``...), the
answer's mode (``json`` or ``sse``), the model after routing (canonical name, provider and the
upstream model name, so a policy edit that remaps a model never serves the old model's answers),
the body, and the client's headers that a provider passes on (``forward_headers``: an
``anthropic-beta`` or ``OpenAI-Organization`` can change the answer; none sent, none in the
key). Every body field is part of it except ``IGNORED_FIELDS``, a short list of fields
that cannot change the answer; a field the gateway has never heard of is therefore included,
so a new sampling option can never make two different requests collide. Canonical JSON is
orjson with sorted keys and no whitespace; a top-level number that is a whole float (``0.0``)
is written as the integer (``0``), so SDKs that spell numbers differently share entries.

The scope is the namespace an entry lives in: ``team:<team>`` by default, ``key:<key id>`` for
a key that belongs to no team (so team-less keys never share), or ``shared`` when the policy
says ``shared: true``. Entries of different scopes never meet: the scope is part of the Redis
key, not only of the hash.

Only deterministic requests are cached unless the policy allows more (``nondeterminism``):
chat and text completions with ``temperature`` 0 or a ``seed``, and no ``n`` > 1; embeddings
always; image generations never.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.policy import Candidate

# Fields that cannot change the answer (``model`` is replaced by the routed model).
IGNORED_FIELDS = frozenset(
    {
        "model",  # replaced by the model after routing (aliases and "auto" resolve to it)
        "stream",  # the mode is part of the key on its own
        "stream_options",  # include_usage only adds or drops the usage chunk: see entry.py
        "user",  # an end-user id for the provider's abuse monitoring
        "safety_identifier",  # the same, under its newer name
        "metadata",  # tags stored with the completion; the gateway reads task_type for routing
        "store",  # whether the provider keeps the completion for its own tools
        "prompt_cache_key",  # a routing hint for the provider's prompt cache
    }
)

Mode = Literal["json", "sse"]
KEY_VERSION = b"switchyard-cache-v1\n"
SHARED_NAMESPACE = "shared"

ALWAYS_DETERMINISTIC = frozenset({"embeddings"})
NEVER_DETERMINISTIC = frozenset({"images.generations"})


@dataclass(frozen=True, slots=True)
class CacheScope:
    """Where an entry lives: a namespace (team, team-less key, or shared) and a model."""

    namespace: str
    model: str

    @classmethod
    def of(cls, *, model: str, team: str | None, key_id: str, shared: bool) -> CacheScope:
        if shared:
            return cls(SHARED_NAMESPACE, model)
        return cls(f"team:{team}" if team else f"key:{key_id}", model)

    @property
    def team(self) -> str | None:
        kind, _, name = self.namespace.partition(":")
        return name if kind == "team" else None

    @property
    def member(self) -> bytes:
        """The scope as one string (the registry set's member)."""
        return orjson.dumps([self.namespace, self.model])

    @classmethod
    def from_member(cls, member: bytes | str) -> CacheScope:
        namespace, model = orjson.loads(member)
        return cls(namespace, model)

    @property
    def id(self) -> str:
        """A short hash: the Redis hash tag of the scope's keys (names may hold any byte)."""
        return hashlib.sha256(self.member).hexdigest()[:24]


def _canonical_value(value: Any) -> Any:
    if type(value) is float and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def canonical_request(
    route: str,
    body: Mapping[str, Any],
    mode: Mode,
    routed: Candidate,
    headers: Mapping[str, str] | None = None,
) -> bytes:
    """The bytes the key hashes (for tests and for debugging a miss). ``headers``: the
    forwarded ones, lower-case names (a request that forwards none keys as it always did)."""
    kept = {
        name: _canonical_value(value) for name, value in body.items() if name not in IGNORED_FIELDS
    }
    document = {
        "route": route,
        "mode": mode,
        "model": routed.model,
        "provider": routed.provider,
        "upstream_model": routed.upstream_model,
        "body": kept,
    }
    if headers:
        document["headers"] = dict(headers)
    return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)


def request_key(
    route: str,
    body: Mapping[str, Any],
    mode: Mode,
    routed: Candidate,
    headers: Mapping[str, str] | None = None,
) -> str:
    """The entry's hash (64 hex digits) within its scope."""
    canonical = canonical_request(route, body, mode, routed, headers)
    return hashlib.sha256(KEY_VERSION + canonical).hexdigest()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def nondeterminism(route: str, body: Mapping[str, Any]) -> str | None:
    """Why this request may get another answer next time (a short reason), or None."""
    if route in ALWAYS_DETERMINISTIC:
        return None
    if route in NEVER_DETERMINISTIC:
        return "image generation is sampled"
    n = body.get("n")
    if n is not None and not (_is_number(n) and n == 1):
        return "n > 1"
    temperature = body.get("temperature")
    if _is_number(temperature) and temperature == 0:
        return None
    seed = body.get("seed")
    if _is_number(seed):
        return None
    return "temperature is not 0 and no seed is set"
