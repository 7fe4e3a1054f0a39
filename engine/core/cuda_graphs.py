"""Decode steps on fixed buffers, replayed as CUDA graphs: one per (batch size, KV splits).

A batch of n decodes runs as the next captured size up; the extra rows are padding (slot
-1: nothing stored; context_len 0: zero output). The flash-decoding split count is chosen
per step from the step's real longest context (`choose_kv_splits`), so a short batch does
not pay for 16 splits and a reduce because `max_model_len` is long; each size is captured
once per split count that size can use (powers of two). Without captured graphs the same
buffers run eagerly, which is how the CPU tests check the padding and the buckets.

Capture can fail in many ways (out of memory, an unsupported op, a driver or Triton
error); any failure falls back to eager decode with a warning instead of aborting start-up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import InitVar, dataclass
from typing import Any

import torch

from engine.kernels.reference import AttentionMetadata

log = logging.getLogger(__name__)

# The Triton kernel's flash-decoding limits (`kernels/triton_paged_attention.py`).
MIN_TOKENS_PER_SPLIT = 256  # below this many KV positions per split, splitting costs more
MAX_KV_SPLITS = 16


def choose_kv_splits(
    num_seqs: int, num_kv_heads: int, max_query_len: int, max_context_len: int, num_sms: int
) -> int:
    """Split the KV range only when the grid would leave SMs idle and the contexts are long
    enough to be worth it; a power of two, so a few graphs cover every case."""
    if max_query_len > 16 or num_sms <= 0:
        return 1
    programs = max(1, num_seqs * num_kv_heads)
    wanted = -(-2 * num_sms // programs)
    useful = max_context_len // MIN_TOKENS_PER_SPLIT
    splits = max(1, min(wanted, useful, MAX_KV_SPLITS))
    return 1 << (splits.bit_length() - 1)


def split_buckets(batch_size: int, num_kv_heads: int, num_sms: int) -> list[int]:
    """Every split count `choose_kv_splits` can pick for a padded batch of this size."""
    longest = MAX_KV_SPLITS * MIN_TOKENS_PER_SPLIT
    top = choose_kv_splits(batch_size, num_kv_heads, 1, longest, num_sms)
    return [1 << i for i in range(top.bit_length())]


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 0 elsewhere (never split)."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).multi_processor_count


@dataclass(eq=False)
class PaddedDecode:
    """Fixed decode buffers and, on CUDA, the graphs captured over them."""

    model: torch.nn.Module
    device: torch.device
    max_num_seqs: InitVar[int]  # sizes the buffers (at most 512 rows)
    max_blocks: InitVar[int]  # block-table width
    num_kv_heads: int
    sms: InitVar[int | None] = None  # the device's SM count, if not read from it

    def __post_init__(self, max_num_seqs: int, max_blocks: int, sms: int | None) -> None:
        device = self.device
        self.num_sms = num_sms(device) if sms is None else sms
        limit = max(1, min(max_num_seqs, 512))
        sizes = {1, 2, 4, 8, *range(16, limit + 1, 16), limit}
        self.sizes = sorted(s for s in sizes if s <= limit)
        self.max_batch = self.sizes[-1]
        n = self.max_batch
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.context_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, max_blocks, dtype=torch.int32, device=device)
        self.graphs: dict[tuple[int, int], Any] = {}  # (size, splits) -> torch.cuda.CUDAGraph
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.pool_bytes = 0  # what the captured graphs hold, measured at capture

    def size_for(self, num_seqs: int) -> int:
        return next(s for s in self.sizes if s >= num_seqs)

    def splits_for(self, size: int, max_context_len: int) -> int:
        return choose_kv_splits(size, self.num_kv_heads, 1, max_context_len, self.num_sms)

    def graph_keys(self) -> list[tuple[int, int]]:
        """Largest first (the shared pool is sized by the first capture)."""
        return [
            (size, splits)
            for size in reversed(self.sizes)
            for splits in reversed(split_buckets(size, self.num_kv_heads, self.num_sms))
        ]

    def _forward(self, size: int, splits: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            cu_seqlens_q=self.cu_seqlens_q[: size + 1],
            context_lens=self.context_lens[:size],
            block_tables=self.block_tables[:size],
            max_query_len=1,
            num_kv_splits=splits,
        )
        return self.model(self.input_ids[:size], self.positions[:size], meta)

    @torch.inference_mode()
    def capture_graphs(self, new_graph: Callable[[], Any] | None = None) -> bool:
        """Capture every (size, splits) graph; on any failure decode stays eager (False).

        `new_graph` makes an empty graph (`torch.cuda.CUDAGraph` by default).
        """
        new_graph = new_graph or torch.cuda.CUDAGraph
        before = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        pool = None
        try:
            for size, splits in self.graph_keys():
                self._forward(size, splits)  # warm up: compiles the kernels outside the capture
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                graph = new_graph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[size, splits] = self._forward(size, splits)
                pool = graph.pool()
                self.graphs[size, splits] = graph
        except Exception as exc:  # whatever broke the capture, serving goes on eagerly
            log.warning(
                "CUDA graph capture failed (%s: %s); decode runs eagerly",
                type(exc).__name__,
                exc,
                exc_info=True,
            )
            self.graphs.clear()
            self.outputs.clear()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                torch.cuda.empty_cache()
            return False
        if self.device.type == "cuda":
            self.pool_bytes = torch.cuda.memory_allocated(self.device) - before
        return True

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        num_seqs: int,
        max_context_len: int,
    ) -> torch.Tensor:
        size = self.size_for(num_seqs)
        splits = self.splits_for(size, max_context_len)
        width = meta.block_tables.shape[1]
        self.input_ids[:num_seqs] = input_ids
        self.input_ids[num_seqs:size] = 0
        self.positions[:num_seqs] = positions
        self.positions[num_seqs:size] = 0
        self.slot_mapping[:num_seqs] = meta.slot_mapping
        self.slot_mapping[num_seqs:size] = -1
        self.context_lens[:num_seqs] = meta.context_lens
        self.context_lens[num_seqs:size] = 0
        # entries past a row's context are never read, and padding rows read nothing
        self.block_tables[:num_seqs, :width] = meta.block_tables
        graph = self.graphs.get((size, splits))
        if graph is None:
            return self._forward(size, splits)[:num_seqs]
        graph.replay()
        return self.outputs[size, splits][:num_seqs]
