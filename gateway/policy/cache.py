"""The policy's ``cache:`` block: how long and how large cached answers may be, and who shares them.

``CachePolicy`` is the schema a model or a task carries in the routing policy (an absent block
means "never cached"). It is strict like the rest of the policy: unknown fields, non-finite
numbers and out-of-range values are refused, and pydantic's error names the field.

Precedence (``effective_cache``): a request routed through a task uses the task's block when it
has one, else the block of the model that serves it; a request that names a model uses the
model's block. The task is the more specific statement about the workload.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MAX_TTL_S = 30 * 86_400
# A Redis string may hold 512 MB; an answer this large is never worth caching in memory.
MAX_ENTRY_BYTES_LIMIT = 64 * 1024 * 1024
MAX_ENTRIES_LIMIT = 10_000_000


class CachePolicy(BaseModel):
    """``cache: {ttl_s, max_entry_bytes, max_entries, shared, allow_nondeterministic}``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    ttl_s: int = Field(
        default=3600, ge=1, le=MAX_TTL_S, description="seconds an answer stays cached"
    )
    max_entry_bytes: int = Field(
        default=1024 * 1024,
        ge=1,
        le=MAX_ENTRY_BYTES_LIMIT,
        description="larger answers (a stream that grows past it too) are not stored",
    )
    max_entries: int = Field(
        default=10_000,
        ge=1,
        le=MAX_ENTRIES_LIMIT,
        description="per (team, model) scope; past it the entries closest to expiry go first",
    )
    shared: bool = Field(
        default=False,
        description="one cache for every team; unset, each team (or team-less key) has its own",
    )
    allow_nondeterministic: bool = Field(
        default=False,
        description="also cache requests with temperature > 0 and no seed, or n > 1",
    )


def effective_cache(
    task_cache: CachePolicy | None, model_cache: CachePolicy | None
) -> CachePolicy | None:
    """The block that governs one request: the task's when it has one, else the model's."""
    return task_cache if task_cache is not None else model_cache
