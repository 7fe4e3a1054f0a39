"""Owns the model, the KV pool and the sampler; runs a step's `StepInputs` on the device.

`launch` moves the step's host arrays to the device in one copy (through pinned, double
buffered staging on CUDA), fills input tokens still on the device from the previous
step's samples, runs the forward (a captured CUDA graph for decodes when there is one),
samples on the device and starts one non-blocking device-to-host copy of the results;
`StepHandle.result()` waits for that copy. In between, the host prepares the next step
(asynchronous scheduling). `execute` does both at once (tensor-parallel ranks). With
tensor parallelism only rank 0 samples.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from math import inf
from pathlib import Path

import numpy as np
import torch

from engine.config import EngineConfig
from engine.core.cuda_graphs import PaddedDecode, choose_kv_splits, num_sms
from engine.core.input_batch import StepInputs
from engine.core.memory_profile import (
    graph_pool_estimate,
    kv_pool_bytes,
    profile_grammar,
    profile_step_inputs,
)
from engine.core.sampling_rows import SamplingRows
from engine.errors import ConfigError
from engine.kernels import resolve_backend
from engine.kernels.reference import AttentionMetadata, plan_paged_attention
from engine.layers.kernel_choice import choose_kernels
from engine.layers.linear import kv_heads_per_rank
from engine.layers.sampler import Sampler, SamplerOutput
from engine.loader import build_model, load_model_args
from engine.models.llama import ModelArgs, ParallelSpec
from engine.sampling import TokenLogprobs

log = logging.getLogger(__name__)


def resolve_max_model_len(config: EngineConfig, args: ModelArgs) -> int:
    limit = args.max_position_embeddings
    if args.sliding_window:
        limit = min(limit, args.sliding_window)  # beyond the window results would differ
    if config.max_model_len is not None and config.max_model_len > limit:
        raise ConfigError(
            f"max_model_len ({config.max_model_len}) exceeds what the model supports ({limit})"
        )
    return config.max_model_len or limit


@dataclass
class StepResult:
    """One step's sampled tokens, in `sample_rows` order (empty off rank 0)."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None] | None  # None when no sampled row asked for them


class StepHandle:
    """A launched step: `result()` waits for its one device-to-host copy."""

    def __init__(
        self,
        host: torch.Tensor | None,
        event: torch.cuda.Event | None,
        wanted: np.ndarray | None,
        num_top: int,
    ) -> None:
        self._host = host  # token ids, or [token, logprob, top ids..., top logprobs...] rows
        self._event = event
        self._wanted = wanted  # logprobs each row asked for (-1: none); None: no logprobs
        self._num_top = num_top

    @classmethod
    def empty(cls) -> StepHandle:
        return cls(None, None, None, 0)

    @classmethod
    def start(
        cls, out: SamplerOutput, wanted: np.ndarray | None, device: torch.device
    ) -> StepHandle:
        """`wanted`: the logprobs each row asked for, when the sampler made logprobs."""
        if out.logprobs is None:
            packed, wanted_rows, k = out.token_ids, None, 0
        else:
            assert out.top_ids is not None and out.top_logprobs is not None
            k = out.top_ids.shape[1]
            packed = torch.cat(
                [
                    out.token_ids[:, None].double(),
                    out.logprobs[:, None].double(),
                    out.top_ids.double(),
                    out.top_logprobs.double(),
                ],
                dim=1,
            )
            wanted_rows = wanted
        if device.type != "cuda":
            return cls(packed, None, wanted_rows, k)
        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return cls(host, event, wanted_rows, k)

    def result(self, before_wait: Callable[[], None] | None = None) -> StepResult:
        """The step's tokens; `before_wait` runs first if they are not on the host yet."""
        if self._host is None:
            return StepResult([], None)
        if self._event is not None:
            if before_wait is not None and not self._event.query():
                before_wait()
            self._event.synchronize()
        if self._wanted is None:
            return StepResult(self._host.tolist(), None)
        k = self._num_top
        tokens: list[int] = []
        logprobs: list[TokenLogprobs | None] = []
        for row, wanted in zip(self._host.tolist(), self._wanted.tolist(), strict=True):
            token = int(row[0])
            tokens.append(token)
            if wanted < 0:
                logprobs.append(None)
                continue
            # a constrained row may allow fewer than k tokens: the disallowed ones are -inf
            top = {int(row[2 + i]): row[2 + k + i] for i in range(wanted) if row[2 + k + i] > -inf}
            logprobs.append(TokenLogprobs(token, row[1], top))
        return StepResult(tokens, logprobs)


@dataclass
class BatchInputs:
    input_ids: torch.Tensor  # int64
    positions: torch.Tensor  # int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # int64
    sample_rows: torch.Tensor  # int64
    prev_positions: torch.Tensor  # int64
    prev_indices: torch.Tensor  # int64


class InputStaging:
    """The step's int32 arrays packed into one preallocated buffer (no allocation per step),
    copied to the device at once.

    There are two buffers, used in turn: step k+1 is written while step k may still read
    its own (at most one step is in flight). On CUDA they are pinned and the copy is
    asynchronous; on the CPU the model reads the buffer itself.
    """

    def __init__(self, device: torch.device, capacity: int) -> None:
        self.device = device
        self._pinned = device.type == "cuda"
        self._buffers = [self._new(capacity) for _ in range(2)]
        self._turn = 0

    def _new(self, capacity: int) -> tuple[torch.Tensor, np.ndarray]:
        buffer = torch.empty(capacity, dtype=torch.int32, pin_memory=self._pinned)
        return buffer, buffer.numpy()

    def to_device(self, parts: list[np.ndarray]) -> torch.Tensor:
        total = sum(len(part) for part in parts)
        self._turn ^= 1
        if len(self._buffers[self._turn][1]) < total:
            self._buffers[self._turn] = self._new(2 * total)
        staging, host = self._buffers[self._turn]
        np.concatenate(parts, out=host[:total])
        if not self._pinned:
            return staging[:total]
        return staging[:total].to(self.device, non_blocking=True)


class ModelRunner:
    """One rank's model shard and KV pool (the whole model when `tp` is None).

    Every rank runs the same `StepInputs`; the collectives inside the model keep them in
    step, and rank 0 alone samples and returns tokens.
    """

    def __init__(
        self,
        config: EngineConfig,
        model_path: Path,
        progress: bool = True,
        tp: ParallelSpec | None = None,
    ) -> None:
        self.config = config
        self.tp = tp or ParallelSpec()
        self.device = config.resolve_device()
        if self.device.type == "cuda" and self.tp.tp_size > 1:
            self.device = torch.device("cuda", self.tp.tp_rank)
        self.args: ModelArgs = load_model_args(model_path)
        self.max_model_len = resolve_max_model_len(config, self.args)
        self.dtype = config.resolve_dtype(self.args.torch_dtype, self.device)
        self.backend = resolve_backend(config.attention_backend, self.device)
        self.model = build_model(
            model_path, self.args, self.device, self.dtype, self.backend, progress, self.tp,
            max_position=self.max_model_len,
            keep_quantized=config.keeps_quantized(self.device, self.dtype),
        )  # fmt: skip
        # each CPU linear's fastest method on this machine (timed once, cached); the bytes of
        # weights held outside parameters: quantized planes, oneDNN's packed copies
        self.packed_bytes = 0
        if self.device.type == "cpu":
            self.packed_bytes = choose_kernels(
                self.model, config.resolve_kernel_cache_dir(), config.linear_kernel,
                max_rows=config.max_num_batched_tokens, max_seqs=config.max_num_seqs,
            )  # fmt: skip
        self._init_step_state()
        self.num_blocks = self._size_kv_pool()
        self.kv_cache = self._bind_kv_cache(self.num_blocks)
        if self.decode is not None and self.device.type == "cuda":
            self._capture_graphs()

    def _capture_graphs(self) -> None:
        assert self.decode is not None
        if self.decode.capture_graphs() and self.decode.pool_bytes > self.graph_estimate:
            log.warning(
                "the CUDA graphs hold %d bytes, more than the %d estimated when sizing the"
                " KV pool; lower gpu_memory_utilization if memory runs short",
                self.decode.pool_bytes,
                self.graph_estimate,
            )

    def _init_step_state(self) -> None:
        """Everything a step needs besides the weights and the KV pool (before profiling)."""
        config = self.config
        self.sampler = Sampler()
        self.block_size = config.block_size
        self.num_kv_heads = kv_heads_per_rank(self.args.num_kv_heads, self.tp.tp_size)
        self.kv_cache: torch.Tensor | None = None
        self.num_sms = num_sms(self.device)
        self.default_generator = torch.Generator(self.device).manual_seed(config.seed)
        self.rows: SamplingRows | None = None
        if self.tp.tp_rank == 0:
            self.rows = SamplingRows(config.max_num_seqs, self.args.vocab_size, self.device)
        tokens = max(config.max_num_batched_tokens, config.max_num_seqs)
        capacity = 3 * tokens + 6 * (config.max_num_seqs + 1)
        capacity += config.max_num_seqs * self.max_blocks_per_seq
        self._staging = InputStaging(self.device, capacity)
        self._last_sampled: torch.Tensor | None = None  # the previous step's tokens, on device
        self.graph_estimate = 0
        self.decode: PaddedDecode | None = None
        # CUDA graphs would capture the collectives too; untested, so TP decodes eagerly
        if (
            self.device.type == "cuda"
            and self.backend == "triton"
            and not config.enforce_eager
            and self.tp.tp_size == 1
        ):
            self.decode = PaddedDecode(
                self.model,
                self.device,
                config.max_num_seqs,
                self.max_blocks_per_seq,
                self.num_kv_heads,
            )

    @property
    def healthy(self) -> bool:
        return True  # in process: a failure raises from `execute` and the engine carries on

    def shutdown(self) -> None:
        """Nothing to stop: the model lives in this process."""

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    # --- KV pool -----------------------------------------------------------------------

    @property
    def kv_bytes_per_block(self) -> int:
        a = self.args
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * a.num_layers * self.block_size * self.num_kv_heads * a.head_dim * itemsize

    @property
    def weight_bytes(self) -> int:
        """Bytes of this rank's weights (tied embeddings counted once, packed copies too)."""
        unique = {id(p): p for p in self.model.parameters()}.values()
        return sum(p.numel() * p.element_size() for p in unique) + self.packed_bytes

    def _bind_kv_cache(self, num_blocks: int) -> torch.Tensor:
        a = self.args
        cache = torch.zeros(
            2, a.num_layers, num_blocks, self.block_size, self.num_kv_heads, a.head_dim,
            dtype=self.dtype, device=self.device,
        )  # fmt: skip
        for layer, attn in enumerate(self.model.attention_layers()):
            attn.k_cache, attn.v_cache = cache[0, layer], cache[1, layer]
        return cache

    def _restore_kv_cache(self) -> None:
        """Back to the pool (or to none, before it exists) after a temporary cache."""
        for layer, attn in enumerate(self.model.attention_layers()):
            if self.kv_cache is None:
                attn.k_cache = attn.v_cache = None
            else:
                attn.k_cache, attn.v_cache = self.kv_cache[0, layer], self.kv_cache[1, layer]

    def _size_kv_pool(self) -> int:
        if self.config.num_gpu_blocks is not None:
            return self.config.num_gpu_blocks
        if self.device.type == "cuda":
            available = self._profile_cuda_free_bytes()
        else:
            available = self.config.kv_cache_bytes
        num_blocks = available // self.kv_bytes_per_block
        if self.tp.tp_size > 1:  # every rank must agree on the pool the scheduler plans for
            import torch.distributed as dist

            agreed = torch.tensor([num_blocks], dtype=torch.int64, device=self.device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
            num_blocks = int(agreed.item())
        if num_blocks < 1:
            raise ConfigError(
                f"no room for a single KV block ({self.kv_bytes_per_block} bytes) in "
                f"{available} bytes; raise kv_cache_bytes or gpu_memory_utilization"
            )
        return int(num_blocks)

    @torch.inference_mode()
    def run_profile_step(self) -> int:
        """A worst-case step through the serving path, on a temporary KV cache of its own;
        returns that cache's bytes (held through the step, so not activation memory)."""
        inputs, num_blocks = profile_step_inputs(
            self.config.max_num_batched_tokens,
            self.config.max_num_seqs,
            self.max_model_len,
            self.block_size,
        )
        profile_grammar(inputs, self.args.vocab_size)
        self._bind_kv_cache(num_blocks)
        try:
            self.launch(inputs).result()
        finally:
            self._restore_kv_cache()
            self._last_sampled = None
        return num_blocks * self.kv_bytes_per_block

    @torch.inference_mode()
    def _profile_cuda_free_bytes(self) -> int:
        """The allowance less weights, sampler state, a step's peak and the graph pool."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        baseline = torch.cuda.memory_allocated(self.device)
        temporary_cache = self.run_profile_step()
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        activation_peak = peak - baseline - temporary_cache
        self.graph_estimate = self._estimate_graph_pool() if self.decode is not None else 0
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        return kv_pool_bytes(
            total,
            self.config.gpu_memory_utilization,
            total - free,
            activation_peak,
            self.graph_estimate,
        )

    def _estimate_graph_pool(self) -> int:
        """Eager runs of the largest graph and of the one with the most splits."""
        decode = self.decode
        assert decode is not None
        keys = decode.graph_keys()
        widest = max(keys, key=lambda key: (key[1], key[0]))
        peaks = []
        self._bind_kv_cache(1)  # padding rows (context 0) read and write nothing
        try:
            for size, splits in {keys[0], widest}:
                torch.cuda.reset_peak_memory_stats(self.device)
                before = torch.cuda.memory_allocated(self.device)
                decode._forward(size, splits)
                torch.cuda.synchronize(self.device)
                peaks.append(torch.cuda.max_memory_allocated(self.device) - before)
        finally:
            self._restore_kv_cache()
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        outputs = [size * self.args.hidden_size * itemsize for size, _ in keys]
        return graph_pool_estimate(peaks, outputs)

    # --- one step ----------------------------------------------------------------------

    def _to_device(self, inputs: StepInputs) -> BatchInputs:
        t, b, s = inputs.num_tokens, inputs.num_seqs, inputs.num_sampled
        p = len(inputs.prev_token_positions)
        # the arrays the model indexes with first (int64 on the device), then the int32 ones;
        # cut apart by one split per dtype: every torch call costs host time each step
        packed = self._staging.to_device(
            [
                inputs.input_ids,
                inputs.positions,
                inputs.slot_mapping,
                inputs.logits_indices,
                inputs.sample_rows,
                inputs.prev_token_positions,
                inputs.prev_token_indices,
                inputs.cu_seqlens_q,
                inputs.context_lens,
                inputs.block_tables.reshape(-1),
            ]
        )
        num_longs = 3 * t + 2 * s + 2 * p
        int32s = packed.split_with_sizes([num_longs, b + 1, b, inputs.block_tables.size])
        longs = int32s[0].long().split_with_sizes([t, t, t, s, s, p, p])
        # from this step's real longest context (the torch reference ignores it)
        splits = choose_kv_splits(
            b, self.num_kv_heads, inputs.max_query_len, inputs.max_context_len, self.num_sms
        )
        meta = AttentionMetadata(
            slot_mapping=longs[2],
            cu_seqlens_q=int32s[1],
            context_lens=int32s[2],
            block_tables=int32s[3].view(b, -1),
            max_query_len=inputs.max_query_len,
            num_kv_splits=splits,
            all_slots_valid=True,  # every slot comes from a block table: no padding
        )
        if self.backend == "torch":  # how its attention batches this step, once for all layers
            meta.torch_plan = plan_paged_attention(
                inputs.cu_seqlens_q.tolist(),
                inputs.context_lens.tolist(),
                meta.block_tables,
                self.block_size,
                self.args.num_heads // self.tp.tp_size,
                self.num_kv_heads,
                self.args.head_dim,
            )
        return BatchInputs(
            input_ids=longs[0],
            positions=longs[1],
            meta=meta,
            logits_indices=longs[3],
            sample_rows=longs[4],
            prev_positions=longs[5],
            prev_indices=longs[6],
        )

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate whole blocks (all layers, K and V) before they are written."""
        if not pairs:
            return
        assert self.kv_cache is not None
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]

    def _forward(self, batch: BatchInputs, inputs: StepInputs) -> torch.Tensor:
        decode = self.decode
        if decode is not None and inputs.max_query_len == 1 and inputs.num_seqs <= decode.max_batch:
            return decode.run(
                batch.input_ids,
                batch.positions,
                batch.meta,
                inputs.num_seqs,
                inputs.max_context_len,
            )
        return self.model(batch.input_ids, batch.positions, batch.meta)

    def _take_last_sampled(self, inputs: StepInputs, batch: BatchInputs) -> None:
        """Decode inputs sampled by the step before are still on the device: fill them in."""
        if not len(inputs.prev_token_positions):
            return
        last = self._last_sampled
        assert last is not None, "no previous step to take tokens from"
        if inputs.inputs_are_last_sampled:  # all of them, in order: no gather
            t = inputs.num_tokens
            batch.input_ids = last if last.shape[0] == t else last[:t]
        else:
            batch.input_ids[batch.prev_positions] = last[batch.prev_indices]

    @torch.inference_mode()
    def launch(self, inputs: StepInputs) -> StepHandle:
        """Start one step on the device; the handle's `result()` waits for its tokens."""
        rows = self.rows
        if rows is not None:
            rows.release(inputs.released_seq_ids)
            rows.setup(inputs.new_rows)
        self.copy_blocks(inputs.block_copies)
        batch = self._to_device(inputs)
        self._take_last_sampled(inputs, batch)
        hidden = self._forward(batch, inputs)
        if not inputs.num_sampled:
            return StepHandle.empty()
        logits = self.model.compute_logits(hidden[batch.logits_indices])  # all-gathered
        if rows is None:
            return StepHandle.empty()
        sampling = rows.batch(
            inputs.sample_rows,
            batch.sample_rows,
            self.default_generator,
            inputs.grammar_positions,
            inputs.grammar_bitmask,
        )
        out = self.sampler(logits, sampling)
        rows.record(inputs.sample_rows, batch.sample_rows, out.token_ids)
        self._last_sampled = out.token_ids
        wanted = None if out.logprobs is None else rows.num_logprobs[inputs.sample_rows]
        return StepHandle.start(out, wanted, self.device)

    def execute(self, inputs: StepInputs) -> StepResult:
        """Run one step to the end; returns one token per sampled row (none off rank 0)."""
        return self.launch(inputs).result()
