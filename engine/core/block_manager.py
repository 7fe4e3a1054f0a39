"""Paged KV blocks: free list, ref counts, automatic prefix caching, copy-on-write.

A full block is keyed by a chained hash of (parent block's hash, its token ids), so a hit
means the whole prefix up to and including that block matches; the token ids are compared
on a hit to rule out hash collisions. Blocks nobody references but that still hold a cached
prefix stay findable until a new allocation needs them (lazy LRU eviction).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence as Seq

from engine.core.sequence import Sequence


class Block:
    __slots__ = ("block_hash", "block_id", "ref_count", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


def chain_hash(parent_hash: int | None, token_ids: Seq[int]) -> int:
    return hash((parent_hash, tuple(token_ids)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free_ids: deque[int] = deque(range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref 0 but cached, LRU first
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_ids) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- allocation -------------------------------------------------------------------

    def _take_block(self) -> int:
        if self._free_ids:
            block_id = self._free_ids.popleft()
        else:
            block_id, _ = self._evictable.popitem(last=False)
            block = self.blocks[block_id]
            del self._cached[block.block_hash]  # type: ignore[arg-type]
            block.block_hash, block.token_ids = None, ()
        self.blocks[block_id].ref_count = 1
        return block_id

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count > 0:
            return
        if block.block_hash is not None:
            self._evictable[block_id] = None
        else:
            self._free_ids.append(block_id)

    def match_prefix(self, seq: Sequence, max_tokens: int) -> int:
        """Reuse cached full blocks of `seq.token_ids[:max_tokens]`; returns the tokens found.

        Call at admission, with an empty block table; `count_prefix_lookup` records it once
        the admission goes through.
        """
        assert not seq.block_table
        if not self.enable_prefix_caching:
            return 0
        parent: int | None = None
        size = self.block_size
        for start in range(0, max_tokens - size + 1, size):
            tokens = tuple(seq.token_ids[start : start + size])
            block_hash = chain_hash(parent, tokens)
            block_id = self._cached.get(block_hash)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._evictable[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_hashes.append(block_hash)
            parent = block_hash
        hit_tokens = len(seq.block_table) * size
        seq.num_computed_tokens = seq.num_cached_tokens = hit_tokens
        return hit_tokens

    def count_prefix_lookup(self, queried_tokens: int, hit_tokens: int) -> None:
        if self.enable_prefix_caching:
            self.prefix_cache_queries += queried_tokens
            self.prefix_cache_hits += hit_tokens

    def allocate(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]] | None:
        """Make room for `num_new_tokens` more tokens of `seq`.

        Returns the (src, dst) block copies the runner must do first (copy-on-write of a
        shared, partially filled block about to be written), or None when the pool is short.
        """
        table = seq.block_table
        first_written = seq.num_computed_tokens // self.block_size
        needs_copy = first_written < len(table) and self.blocks[table[first_written]].ref_count > 1
        new_blocks = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(table)
        if max(new_blocks, 0) + needs_copy > self.num_free_blocks:
            return None
        copies: list[tuple[int, int]] = []
        if needs_copy:
            shared = table[first_written]
            table[first_written] = self._take_block()
            self._release(shared)
            copies.append((shared, table[first_written]))
        for _ in range(new_blocks):
            table.append(self._take_block())
        return copies

    def register_full_blocks(self, seq: Sequence) -> None:
        """Publish the blocks `seq` has filled completely since the last call."""
        if not self.enable_prefix_caching:
            return
        size = self.block_size
        # a token still in flight (asynchronous scheduling) is not hashed before it lands
        known = min(seq.num_computed_tokens, len(seq.token_ids))
        num_full = min(known // size, len(seq.block_table))
        for index in range(len(seq.block_hashes), num_full):
            parent = seq.block_hashes[index - 1] if index else None
            tokens = tuple(seq.token_ids[index * size : (index + 1) * size])
            block_hash = chain_hash(parent, tokens)
            seq.block_hashes.append(block_hash)
            block = self.blocks[seq.block_table[index]]
            if block.block_hash is None and block_hash not in self._cached:
                block.block_hash, block.token_ids = block_hash, tokens
                self._cached[block_hash] = block.block_id

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """`child` shares every block of `parent` (ref counts go up)."""
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        for block_id in child.block_table:
            self.blocks[block_id].ref_count += 1

    def free(self, seq: Sequence) -> None:
        # Tail blocks first, so LRU eviction takes the least shareable part of a prefix first.
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.block_hashes = []

    def ref_count(self, block_id: int) -> int:
        return self.blocks[block_id].ref_count
