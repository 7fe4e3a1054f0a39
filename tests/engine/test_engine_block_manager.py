"""Block manager: ref counts, prefix-cache hits verified by token ids, LRU eviction, COW."""

from __future__ import annotations

from engine.core.block_manager import BlockManager, chain_hash
from engine.core.sequence import Request, Sequence
from engine.sampling import SamplingParams

BLOCK = 4


def _seq(tokens: list[int], seq_id: int = 0) -> Sequence:
    request = Request(f"r{seq_id}", None, tokens, SamplingParams())
    seq = Sequence(seq_id, request, 0)
    request.seqs.append(seq)
    return seq


def _compute(bm: BlockManager, seq: Sequence, num_tokens: int) -> list[tuple[int, int]]:
    copies = bm.allocate(seq, num_tokens)
    assert copies is not None
    seq.num_computed_tokens += num_tokens
    bm.register_full_blocks(seq)
    return copies


def test_allocate_and_free_return_every_block():
    bm = BlockManager(num_blocks=8, block_size=BLOCK, enable_prefix_caching=False)
    seq = _seq(list(range(10)))
    _compute(bm, seq, 10)
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    assert bm.allocate(_seq(list(range(40)), 1), 40) is None  # 10 blocks > 5 free: refused
    bm.free(seq)
    assert bm.num_free_blocks == 8 and all(b.ref_count == 0 for b in bm.blocks)


def test_prefix_hit_shares_full_blocks_and_counts_tokens():
    bm = BlockManager(num_blocks=16, block_size=BLOCK, enable_prefix_caching=True)
    first = _seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    _compute(bm, first, 9)
    second = _seq([1, 2, 3, 4, 5, 6, 7, 8, 42, 43], seq_id=1)
    hit = bm.match_prefix(second, second.num_tokens - 1)
    assert hit == 8 and second.num_computed_tokens == 8
    assert second.block_table == first.block_table[:2]
    assert [bm.ref_count(b) for b in second.block_table] == [2, 2]
    bm.count_prefix_lookup(9, hit)
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (9, 8)
    # a different first block breaks the chain even if the second block matches
    third = _seq([9, 9, 9, 9, 5, 6, 7, 8, 1], seq_id=2)
    assert bm.match_prefix(third, 8) == 0
    for seq in (first, second, third):
        bm.free(seq)
    assert bm.num_free_blocks == 16


def test_hash_hit_with_different_tokens_is_rejected():
    bm = BlockManager(num_blocks=4, block_size=BLOCK, enable_prefix_caching=True)
    first = _seq([1, 2, 3, 4, 5])
    _compute(bm, first, 5)
    block = bm.blocks[first.block_table[0]]
    block.token_ids = (7, 7, 7, 7)  # what a hash collision would look like
    other = _seq([1, 2, 3, 4, 5], seq_id=1)
    assert bm.match_prefix(other, 4) == 0
    assert chain_hash(None, [1, 2, 3, 4]) == block.block_hash
    bm.free(first)


def test_unreferenced_cached_blocks_stay_until_evicted_lru_first():
    bm = BlockManager(num_blocks=4, block_size=BLOCK, enable_prefix_caching=True)
    old = _seq([1, 2, 3, 4, 5, 6, 7, 8])
    _compute(bm, old, 8)
    bm.free(old)
    assert bm.num_free_blocks == 4  # cached but free to take
    again = _seq([1, 2, 3, 4, 5, 6, 7, 8, 9], seq_id=1)
    assert bm.match_prefix(again, 8) == 8  # still cached after the free
    bm.free(again)
    # two fresh blocks come from the never-used free list, not the cached ones
    filler = _seq(list(range(100, 108)), seq_id=2)
    _compute(bm, filler, 8)
    probe = _seq([1, 2, 3, 4, 5, 6, 7, 8, 9], seq_id=3)
    assert bm.match_prefix(probe, 8) == 8
    bm.free(probe)
    bm.free(filler)
    # now demand every block: the cached ones are evicted, and their hashes forgotten
    big = _seq(list(range(200, 216)), seq_id=4)
    _compute(bm, big, 16)
    bm.free(big)
    assert bm.match_prefix(_seq([1, 2, 3, 4, 5], seq_id=5), 4) == 0


def test_fork_shares_blocks_and_copies_partial_last_block_on_write():
    bm = BlockManager(num_blocks=8, block_size=BLOCK, enable_prefix_caching=True)
    parent = _seq([1, 2, 3, 4, 5, 6])  # one full block + a half-filled one
    _compute(bm, parent, 6)
    child = _seq([1, 2, 3, 4, 5, 6], seq_id=1)
    bm.fork(parent, child)
    assert [bm.ref_count(b) for b in parent.block_table] == [2, 2]
    child.token_ids.append(7)
    copies = bm.allocate(child, 1)
    assert copies is not None and len(copies) == 1
    src, dst = copies[0]
    assert src == parent.block_table[1] and dst == child.block_table[1] and src != dst
    assert bm.ref_count(parent.block_table[0]) == 2  # the full block stays shared
    assert bm.ref_count(src) == 1 and bm.ref_count(dst) == 1
    bm.free(parent)
    bm.free(child)
    assert bm.num_free_blocks == 8
