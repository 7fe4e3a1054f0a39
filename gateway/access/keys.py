"""API keys on Redis: format, HMAC hashing, and the KeyStore (create, update, rotate, revoke, list).

A key reads ``sk-sy-<public id>-<secret>``. Redis holds only HMAC-SHA256(pepper, secret) under the
public id, in a hash named ``sy:{key:<id>}``; the braces are a hash tag, so the record and its
rotation idempotency records share one slot and the Lua scripts work on a Redis Cluster.
Every change is published on ``sy:keys:changed`` so other replicas drop their cached copy.

A rotation with an ``Idempotency-Key`` draws a fresh random nonce and derives its secret as
HMAC(pepper, key id, nonce, idempotency key); the nonce lives only in the idempotency record
(``sy:{key:<id>}:rotate:<sha256 of the key>``, 24 h), so a replay while the record lives gets
the same secret back, and once it expires nothing (no stored value, no guessable key) can
compute that secret again: every rotation installs a secret no earlier state can reproduce.

A key's limiter state lives in its *home* (``gateway/access/teams.py``): its own slot, or its
team's. Changing the key's team to a team that exists moves its home in the same script that
writes the record: the home epoch goes up and ``<old home>|<epoch>`` joins the key's pending
moves (``sy:{key:<id>}:moves``, indexed in ``sy:limits:moving``), which
``gateway.metering.moves`` carries over.

``check_pepper`` guards the one setting that must match across replicas: ``sy:keys:pepper``
holds an HMAC fingerprint of the pepper (never the pepper), set by the first gateway that
starts on a Redis (``SET NX``: existing deployments adopt their first replica's). A gateway
whose pepper gives another fingerprint would answer 401 to every key made elsewhere, so it
refuses to start instead, naming ``SWITCHYARD_KEY_PEPPER``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, Literal, TypedDict

import msgspec
import orjson
from redis.asyncio import Redis

from gateway.access.teams import key_home
from gateway.money import stored_usd_to_nanos
from gateway.store.hash_fields import WRITE_FIELDS_LUA

KEY_PREFIX = "sk-sy-"
ID_LENGTH = 16
SECRET_LENGTH = 40
INDEX_KEY = "sy:keys:index"
CHANGES_CHANNEL = "sy:keys:changed"
PEPPER_FINGERPRINT_KEY = "sy:keys:pepper"
MOVES_INDEX_KEY = "sy:limits:moving"
IDEMPOTENCY_TTL_S = 24 * 3600
_ALPHABET = string.ascii_letters + string.digits
_ID_ALPHABET = string.ascii_lowercase + string.digits


def record_key(key_id: str) -> str:
    return f"sy:{{key:{key_id}}}"


def moves_key(key_id: str) -> str:
    """The key's pending limiter moves (member ``<old home>|<epoch>``, scored by epoch)."""
    return f"{record_key(key_id)}:moves"


def _random(alphabet: str, length: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


def hash_secret(pepper: bytes, secret: str) -> str:
    return hmac.new(pepper, secret.encode(), hashlib.sha256).hexdigest()


class PepperMismatch(ValueError):
    """This process's key pepper is not the one the keys in this Redis were made with."""


def pepper_fingerprint(pepper: bytes) -> bytes:
    return (
        hmac.new(pepper, b"switchyard key pepper fingerprint v1", hashlib.sha256)
        .hexdigest()
        .encode()
    )


async def check_pepper(redis: Redis, pepper: bytes) -> bool:
    """Adopt ``pepper`` for this Redis if none is recorded yet (True), or check it is the one
    recorded (False); raise ``PepperMismatch`` when it is not."""
    mine = pepper_fingerprint(pepper)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.set(PEPPER_FINGERPRINT_KEY, mine, nx=True)
        pipe.get(PEPPER_FINGERPRINT_KEY)
        adopted, recorded = await pipe.execute()
    if recorded != mine:
        raise PepperMismatch(
            "SWITCHYARD_KEY_PEPPER differs from the pepper the API keys in this Redis were made"
            f" with (its fingerprint is in {PEPPER_FINGERPRINT_KEY}): every key made by the other"
            " gateways would be refused here. Give every replica the same SWITCHYARD_KEY_PEPPER."
        )
    return bool(adopted)


def format_key(key_id: str, secret: str) -> str:
    return f"{KEY_PREFIX}{key_id}-{secret}"


def parse_prefixed_secret(
    token: str, prefix: str, id_length: int, secret_length: int
) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed ``<prefix><id>-<secret>`` credential (both parts ASCII
    letters and digits, of the given lengths), else None."""
    if not token.startswith(prefix):
        return None
    token_id, sep, secret = token[len(prefix) :].partition("-")
    if not sep or len(token_id) != id_length or len(secret) != secret_length:
        return None
    if not (token_id.isascii() and token_id.isalnum() and secret.isascii() and secret.isalnum()):
        return None
    return token_id, secret


def parse_key(token: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed key, else None."""
    return parse_prefixed_secret(token, KEY_PREFIX, ID_LENGTH, SECRET_LENGTH)


def rotation_secret(pepper: bytes, key_id: str, nonce: str, idempotency_key: str) -> str:
    """The secret of an idempotent rotation: a replay recomputes it from the nonce kept in the
    idempotency record; the secret itself is stored nowhere."""
    digest = hmac.new(
        pepper, f"rotate|{key_id}|{nonce}|{idempotency_key}".encode(), hashlib.sha512
    ).digest()
    return "".join(_ALPHABET[byte % len(_ALPHABET)] for byte in digest[:SECRET_LENGTH])


# Hash fields: scalars stored as text, lists/dicts as JSON; a missing field means None.
_INT_FIELDS = ("rpm", "tpm", "max_parallel_requests", "home_epoch")
_FLOAT_FIELDS = (
    "budget_usd",
    "expires_at",
    "created_at",
    "updated_at",
    "rotated_at",
    "revoked_at",
    "previous_valid_until",
)
_JSON_FIELDS = ("models", "metadata", "alert_thresholds", "tags")
EDITABLE_FIELDS = (
    "name",
    "team",
    "models",
    "rpm",
    "tpm",
    "budget_usd",
    "budget_period",
    "max_parallel_requests",
    "budget_mode",
    "alert_thresholds",
    "tags",
    "expires_at",
    "metadata",
)


class KeyView(TypedDict):
    """An API key as the admin API shows it (``KeyRecord.public_view``)."""

    id: str
    object: Literal["api_key"]
    name: str | None
    team: str | None
    models: list[str] | None
    rpm: int | None
    tpm: int | None
    budget_usd: float | None
    budget_period: str | None
    max_parallel_requests: int | None
    budget_mode: Literal["hard", "soft"]
    alert_thresholds: list[int]
    tags: list[str]
    expires_at: float | None
    metadata: dict[str, Any]
    status: Literal["active", "revoked", "expired"]
    created_at: float
    updated_at: float | None
    rotated_at: float | None
    revoked_at: float | None
    previous_secret_valid_until: Annotated[
        float | None, msgspec.Meta(description="until when the secret before a rotation works")
    ]


@dataclass(frozen=True)
class KeyRecord:
    id: str
    secret_hash: str
    # Drawn at creation; only a replay of an idempotency record written before rotation
    # nonces still reads it (such a record lives 24 h).
    rotation_salt: str
    created_at: float
    updated_at: float
    status: str = "active"  # active | revoked ("expired" is derived from expires_at)
    name: str | None = None
    team: str | None = None
    models: tuple[str, ...] | None = None
    rpm: int | None = None
    tpm: int | None = None
    budget_usd: float | None = None
    budget_period: str | None = None
    max_parallel_requests: int | None = None
    budget_mode: str | None = None  # hard (None) refuses past the budget; soft only alerts
    alert_thresholds: tuple[int, ...] | None = None  # percents of the budget (webhooks)
    tags: tuple[str, ...] | None = None  # a request's tags when it names none (attribution)
    expires_at: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    previous_hash: str | None = None
    previous_valid_until: float | None = None
    rotated_at: float | None = None
    revoked_at: float | None = None
    # Where the key's limiter state lives (None: its own slot, key:<id>), the number of moves
    # so far, and the home before the last move.
    home: str | None = None
    home_epoch: int = 0
    home_from: str | None = None
    # budget_usd in nano-dollars, read exactly from its decimal text once per record load.
    budget_nanos: int | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.budget_usd is not None:
            object.__setattr__(self, "budget_nanos", stored_usd_to_nanos(self.budget_usd))

    @property
    def limits_home(self) -> str:
        return self.home or key_home(self.id)

    def effective_status(self, now: float) -> str:
        if self.status == "revoked":
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"

    def public_view(self, now: float | None = None) -> KeyView:
        """What the admin API shows: never a hash or salt."""
        now = time.time() if now is None else now
        return {
            "id": self.id,
            "object": "api_key",
            "name": self.name,
            "team": self.team,
            "models": list(self.models) if self.models is not None else None,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "budget_usd": self.budget_usd,
            "budget_period": self.budget_period,
            "max_parallel_requests": self.max_parallel_requests,
            "budget_mode": self.budget_mode or "hard",
            "alert_thresholds": list(self.alert_thresholds or ()),
            "tags": list(self.tags or ()),
            "expires_at": self.expires_at,
            "metadata": self.metadata,
            "status": self.effective_status(now),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "rotated_at": self.rotated_at,
            "revoked_at": self.revoked_at,
            "previous_secret_valid_until": (
                self.previous_valid_until
                if self.previous_valid_until and self.previous_valid_until > now
                else None
            ),
        }


# The fields a record keeps in Redis (derived ones, like budget_nanos, are computed on load).
_STORED_FIELDS = frozenset(f.name for f in fields(KeyRecord) if f.init)


def _decode(raw: dict[bytes, bytes]) -> KeyRecord:
    values: dict[str, Any] = {}
    for name_bytes, value_bytes in raw.items():
        name = name_bytes.decode()
        if name in _INT_FIELDS:
            values[name] = int(value_bytes)
        elif name in _FLOAT_FIELDS:
            values[name] = float(value_bytes)
        elif name in _JSON_FIELDS:
            decoded = orjson.loads(value_bytes)
            listed = name in ("models", "alert_thresholds", "tags") and decoded is not None
            values[name] = tuple(decoded) if listed else decoded
        elif name in _STORED_FIELDS:
            values[name] = value_bytes.decode()
    return KeyRecord(**values)


def _encode(name: str, value: Any) -> str | bytes:
    if name in _JSON_FIELDS:
        return orjson.dumps(list(value) if isinstance(value, tuple) else value)
    return repr(value) if isinstance(value, float) else str(value)


@dataclass(frozen=True, slots=True)
class KeyLabel:
    """What a report shows beside a key's id."""

    name: str | None
    team: str | None


@dataclass(frozen=True)
class CreatedKey:
    record: KeyRecord
    key: str  # the full secret key, shown once


@dataclass(frozen=True)
class RotateOutcome:
    status: str  # ok | replay | missing | revoked
    created: CreatedKey | None = None


@dataclass(frozen=True)
class KeyPage:
    records: list[KeyRecord]
    has_more: bool


# KEYS: the record, the idempotency record. ARGV: 1 the new secret's hash, 2 now, 3 the end of
# the old secret's grace, 4 the idempotency TTL, 5 '1' with an Idempotency-Key, 6 its nonce.
# A replay returns the first rotation's hash and nonce and changes nothing. An idempotency
# record written before nonces (a plain string: the hash only) derived its secret from the
# key's rotation_salt; it is answered with an empty nonce until it expires.
_ROTATE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
if redis.call('HGET', KEYS[1], 'status') == 'revoked' then return {'revoked'} end
if ARGV[5] == '1' then
  local kind = redis.call('TYPE', KEYS[2])['ok']
  if kind == 'hash' then
    local prior = redis.call('HMGET', KEYS[2], 'secret_hash', 'nonce')
    return {'replay', prior[1], prior[2]}
  elseif kind == 'string' then
    return {'replay', redis.call('GET', KEYS[2]), ''}
  end
end
local current = redis.call('HGET', KEYS[1], 'secret_hash')
redis.call('HSET', KEYS[1], 'secret_hash', ARGV[1], 'previous_hash', current,
  'previous_valid_until', ARGV[3], 'rotated_at', ARGV[2], 'updated_at', ARGV[2])
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[2], 'secret_hash', ARGV[1], 'nonce', ARGV[6])
  redis.call('EXPIRE', KEYS[2], ARGV[4])
end
return {'ok'}
"""

_REVOKE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], 'status') ~= 'revoked' then
  redis.call('HSET', KEYS[1], 'status', 'revoked', 'revoked_at', ARGV[1], 'updated_at', ARGV[1])
end
return 1
"""

# KEYS: the record, its pending moves. ARGV: 1 the key's home after this update ('' = leave it
# as it is), 2 the key's own home, 3 count of field/value pairs to set, the pairs, then the
# fields to delete. Returns 0 (no such key), 1 (updated) or 2 (updated, and its home moved).
_UPDATE = (
    WRITE_FIELDS_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
write_fields(3)
if ARGV[1] == '' then return 1 end
local home = redis.call('HGET', KEYS[1], 'home') or ARGV[2]
if home == ARGV[1] then return 1 end
local epoch = (tonumber(redis.call('HGET', KEYS[1], 'home_epoch')) or 0) + 1
redis.call('HSET', KEYS[1], 'home', ARGV[1], 'home_epoch', epoch, 'home_from', home)
redis.call('ZADD', KEYS[2], epoch, home .. '|' .. epoch)
return 2
"""
)


class KeyStore:
    """All key reads and writes; the same class serves the admin API, auth and the CLI."""

    def __init__(self, redis: Redis, pepper: bytes) -> None:
        self.redis = redis
        self.pepper = pepper
        self._rotate = redis.register_script(_ROTATE)
        self._revoke = redis.register_script(_REVOKE)
        self._update = redis.register_script(_UPDATE)

    def verify_secret(self, record: KeyRecord, secret: str, now: float) -> bool:
        """Constant-time check against the current secret, or the previous one during grace."""
        presented = hash_secret(self.pepper, secret)
        if hmac.compare_digest(presented, record.secret_hash):
            return True
        return bool(
            record.previous_hash
            and record.previous_valid_until is not None
            and now < record.previous_valid_until
            and hmac.compare_digest(presented, record.previous_hash)
        )

    async def get(self, key_id: str) -> KeyRecord | None:
        raw = await self.redis.hgetall(record_key(key_id))
        return _decode(raw) if raw else None

    async def labels(self, key_ids: Sequence[str]) -> dict[str, KeyLabel]:
        """The name and team of each key (one pipelined round trip; both None for a key
        deleted since), for reports that would otherwise show bare ids."""
        ids = list(dict.fromkeys(key_ids))
        if not ids:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for key_id in ids:
                pipe.hmget(record_key(key_id), "name", "team")
            replies = await pipe.execute()
        return {
            key_id: KeyLabel(
                name=name.decode() if name else None, team=team.decode() if team else None
            )
            for key_id, (name, team) in zip(ids, replies, strict=True)
        }

    async def create(self, fields: dict[str, Any], home: str | None = None) -> CreatedKey:
        """A new key; ``home`` is its team's home when it joins an existing team."""
        now = time.time()
        key_id = _random(_ID_ALPHABET, ID_LENGTH)
        secret = _random(_ALPHABET, SECRET_LENGTH)
        values = {name: value for name, value in fields.items() if value is not None}
        record = KeyRecord(
            id=key_id,
            secret_hash=hash_secret(self.pepper, secret),
            rotation_salt=secrets.token_hex(8),
            created_at=now,
            updated_at=now,
            home=home,
            **{name: tuple(value) if name == "models" else value for name, value in values.items()},
        )
        mapping = {
            name: _encode(name, getattr(record, name))
            for name in KeyRecord.__dataclass_fields__
            if name in _STORED_FIELDS and getattr(record, name) is not None
        }
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(record_key(key_id), mapping=mapping)
            pipe.zadd(INDEX_KEY, {key_id: now})
            await pipe.execute()
        return CreatedKey(record, format_key(key_id, secret))

    async def update(
        self, key_id: str, changes: dict[str, Any], home: str | None = None
    ) -> KeyRecord | None:
        """Set the given editable fields; a None value clears the field. ``home``: where the
        key's limiter state belongs after this change (None: where it is)."""
        now = time.time()
        to_set: list[str | bytes] = []
        to_delete: list[str] = []
        for name, value in changes.items():
            if name not in EDITABLE_FIELDS:
                raise ValueError(f"{name} is not editable")
            if value is None:
                to_delete.append(name)
            else:
                to_set += [name, _encode(name, value)]
        to_set += ["updated_at", _encode("updated_at", now)]
        found = await self._update(
            keys=[record_key(key_id), moves_key(key_id)],
            args=[home or "", key_home(key_id), len(to_set) // 2, *to_set, *to_delete],
        )
        if not found:
            return None
        if found == 2 or home is not None:
            # The move is carried over by gateway.metering.moves; a replay of this update (the
            # home already set) still makes sure the key is indexed.
            await self.index_moves(key_id)
        await self._publish(key_id)
        return await self.get(key_id)

    async def index_moves(self, key_id: str) -> None:
        """List the key among those with limiter moves pending, if it has any."""
        if await self.redis.zcard(moves_key(key_id)):
            await self.redis.zadd(MOVES_INDEX_KEY, {key_id: int(time.time() * 1000)})

    async def rotate(
        self, key_id: str, grace_seconds: float, idempotency_key: str | None = None
    ) -> RotateOutcome:
        record = await self.get(key_id)
        if record is None:
            return RotateOutcome("missing")
        # A fresh nonce for every rotation: an Idempotency-Key used again after its record
        # expired is a new rotation, never the secret it once gave.
        nonce = secrets.token_hex(16)
        if idempotency_key:
            secret = rotation_secret(self.pepper, key_id, nonce, idempotency_key)
            idem_digest = hashlib.sha256(idempotency_key.encode()).hexdigest()
            idem_key = f"{record_key(key_id)}:rotate:{idem_digest}"
        else:
            secret = _random(_ALPHABET, SECRET_LENGTH)
            idem_key = f"{record_key(key_id)}:rotate:-"
        now = time.time()
        new_hash = hash_secret(self.pepper, secret)
        result = await self._rotate(
            keys=[record_key(key_id), idem_key],
            args=[
                new_hash,
                repr(now),
                repr(now + grace_seconds),
                IDEMPOTENCY_TTL_S,
                "1" if idempotency_key else "0",
                nonce,
            ],
        )
        status = result[0].decode()
        if status == "replay":
            assert idempotency_key
            prior_hash = (result[1] or b"").decode()
            # An empty nonce: a record from before nonces, whose secret used the salt.
            prior_nonce = (result[2] or b"").decode() or record.rotation_salt
            secret = rotation_secret(self.pepper, key_id, prior_nonce, idempotency_key)
            if not hmac.compare_digest(prior_hash, hash_secret(self.pepper, secret)):
                # The record does not give back its secret (another pepper?): refuse to guess.
                return RotateOutcome("conflict")
        if status not in ("ok", "replay"):
            return RotateOutcome(status)
        if status == "ok":
            await self._publish(key_id)
        rotated = await self.get(key_id)
        assert rotated is not None
        return RotateOutcome(status, CreatedKey(rotated, format_key(key_id, secret)))

    async def revoke(self, key_id: str) -> KeyRecord | None:
        found = await self._revoke(keys=[record_key(key_id)], args=[repr(time.time())])
        if not found:
            return None
        await self._publish(key_id)
        return await self.get(key_id)

    async def list(
        self,
        *,
        limit: int = 50,
        after: str | None = None,
        team: str | None = None,
        status: str | None = None,
    ) -> KeyPage:
        """Keys in creation order, ``limit`` at a time from after the id ``after``."""
        start = 0
        if after is not None:
            rank = await self.redis.zrank(INDEX_KEY, after)
            if rank is None:
                raise KeyError(after)
            start = rank + 1
        now = time.time()
        found: list[KeyRecord] = []
        batch = max(limit * 2, 100)
        while True:
            ids = await self.redis.zrange(INDEX_KEY, start, start + batch - 1)
            if not ids:
                return KeyPage(found, False)
            async with self.redis.pipeline(transaction=False) as pipe:
                for key_id in ids:
                    pipe.hgetall(record_key(key_id.decode()))
                raws = await pipe.execute()
            for raw in raws:
                if not raw:
                    continue
                record = _decode(raw)
                if team is not None and record.team != team:
                    continue
                if status is not None and record.effective_status(now) != status:
                    continue
                if len(found) == limit:
                    return KeyPage(found, True)
                found.append(record)
            start += len(ids)

    async def _publish(self, key_id: str) -> None:
        await self.redis.publish(CHANGES_CHANNEL, key_id)
