"""Owns the model and the KV pool; turns a scheduled step into sampled tokens.

The flattened varlen batch (token ids, positions, slot mapping, block tables, context
lengths, cu_seqlens) follows the kernel contract in `engine/kernels/reference.py`. The step
reads results back to the host once (`_to_host`), after sampling on the device.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import ConfigError, EngineConfig
from engine.kernels import resolve_backend
from engine.layers.attention import AttentionMetadata
from engine.layers.sampler import Sampler, SamplerOutput, SamplingBatch
from engine.loader import build_model, load_model_args
from engine.models.llama import ModelArgs
from engine.scheduler import ScheduledSeq, SchedulerOutput
from engine.sequence import Sequence, TokenLogprobs


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
class SampledToken:
    token_id: int
    logprobs: TokenLogprobs | None


@dataclass
class BatchInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model_path: Path,
        eos_token_ids: frozenset[int],
        progress: bool = True,
    ) -> None:
        self.config = config
        self.device = config.resolve_device()
        self.args: ModelArgs = load_model_args(model_path)
        self.max_model_len = resolve_max_model_len(config, self.args)
        self.dtype = config.resolve_dtype(self.args.torch_dtype, self.device)
        self.backend = resolve_backend(config.attention_backend, self.device)
        self.eos_token_ids = eos_token_ids
        self.model = build_model(
            model_path, self.args, self.device, self.dtype, self.backend, progress=progress
        )
        self.sampler = Sampler()
        self.block_size = config.block_size
        self.num_blocks = self._size_kv_pool()
        a = self.args
        self.kv_cache = torch.zeros(
            2, a.num_layers, self.num_blocks, self.block_size, a.num_kv_heads, a.head_dim,
            dtype=self.dtype, device=self.device,
        )  # fmt: skip
        for layer, attn in enumerate(self.model.attention_layers()):
            attn.k_cache, attn.v_cache = self.kv_cache[0, layer], self.kv_cache[1, layer]
        self.default_generator = torch.Generator(self.device).manual_seed(config.seed)
        self.decode: PaddedDecode | None = None
        if self.device.type == "cuda" and self.backend == "triton" and not config.enforce_eager:
            self.decode = PaddedDecode(
                self.model, self.device, config.max_num_seqs, self.max_blocks_per_seq
            )
            self.decode.capture_graphs()

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    # --- KV pool sizing ----------------------------------------------------------------

    @property
    def kv_bytes_per_block(self) -> int:
        a = self.args
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * a.num_layers * self.block_size * a.num_kv_heads * a.head_dim * itemsize

    def _size_kv_pool(self) -> int:
        if self.config.num_gpu_blocks is not None:
            return self.config.num_gpu_blocks
        if self.device.type == "cuda":
            available = self._profile_cuda_free_bytes()
        else:
            available = self.config.kv_cache_bytes
        num_blocks = available // self.kv_bytes_per_block
        if num_blocks < 1:
            raise ConfigError(
                f"no room for a single KV block ({self.kv_bytes_per_block} bytes) in "
                f"{available} bytes; raise kv_cache_bytes or gpu_memory_utilization"
            )
        return int(num_blocks)

    @torch.inference_mode()
    def _profile_cuda_free_bytes(self) -> int:
        """Peak activation memory of a full-budget forward, subtracted from the allowance."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        num_tokens = min(self.config.max_num_batched_tokens, self.args.max_position_embeddings)
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        positions = torch.arange(num_tokens, device=self.device)
        hidden = self.model(ids, positions, None)
        rows = min(self.config.max_num_seqs, num_tokens)
        self.model.compute_logits(hidden[:rows]).float().softmax(-1)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        current = torch.cuda.memory_allocated(self.device)
        del hidden
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        in_use = total - free
        return int(total * self.config.gpu_memory_utilization - in_use - (peak - current))

    # --- one step ----------------------------------------------------------------------

    def prepare_inputs(self, scheduled: list[ScheduledSeq]) -> BatchInputs:
        size = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu_seqlens = [0]
        context_lens: list[int] = []
        logits_indices: list[int] = []
        max_blocks = max(len(item.seq.block_table) for item in scheduled)
        tables: list[list[int]] = []
        for item in scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_tokens
            table = seq.block_table
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(table[pos // size] * size + pos % size for pos in range(start, end))
            cu_seqlens.append(cu_seqlens[-1] + item.num_tokens)
            context_lens.append(end)
            tables.append(table + [0] * (max_blocks - len(table)))
            if item.sample:
                logits_indices.append(cu_seqlens[-1] - 1)

        def on_device(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        meta = AttentionMetadata(
            slot_mapping=on_device(slots, torch.int64),
            cu_seqlens_q=on_device(cu_seqlens, torch.int32),
            context_lens=on_device(context_lens, torch.int32),
            block_tables=on_device(tables, torch.int32),
            max_query_len=max(item.num_tokens for item in scheduled),
        )
        return BatchInputs(
            input_ids=on_device(input_ids, torch.int64),
            positions=on_device(positions, torch.int64),
            meta=meta,
            logits_indices=on_device(logits_indices, torch.int64),
        )

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate whole blocks (all layers, K and V) before they are written."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput) -> list[SampledToken]:
        """Run one step; returns one token per scheduled entry with `sample` set, in order."""
        self.copy_blocks(step.block_copies)
        batch = self.prepare_inputs(step.scheduled)
        num_seqs = len(step.scheduled)
        if (
            self.decode is not None
            and num_seqs <= self.decode.max_batch
            and all(item.num_tokens == 1 for item in step.scheduled)
        ):
            hidden = self.decode.run(batch, num_seqs)
        else:
            hidden = self.model(batch.input_ids, batch.positions, batch.meta)
        to_sample = [item.seq for item in step.scheduled if item.sample]
        if not to_sample:
            return []
        logits = self.model.compute_logits(hidden[batch.logits_indices])
        sampling = self.sampling_batch(to_sample, logits.shape[-1])
        return self._to_host(self.sampler(logits, sampling), to_sample)

    def sampling_batch(self, seqs: list[Sequence], vocab_size: int) -> SamplingBatch:
        params = [seq.params for seq in seqs]
        dev = self.device

        def column(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(dev, non_blocking=True)

        greedy = [p.greedy for p in params]
        top_k = top_p = min_p = presence = frequency = counts = banned = None
        if any(p.top_k > 0 for p in params):
            top_k = column([p.top_k if p.top_k > 0 else vocab_size for p in params], torch.int64)
        if any(p.top_p < 1.0 for p in params):
            top_p = column([p.top_p for p in params], torch.float32)
        if any(p.min_p > 0.0 for p in params):
            min_p = column([p.min_p for p in params], torch.float32)
        if any(p.has_penalties for p in params):
            presence = column([p.presence_penalty for p in params], torch.float32)
            frequency = column([p.frequency_penalty for p in params], torch.float32)
            counts = self._row_scatter(
                [list(seq.output_counts.items()) for seq in seqs], vocab_size, torch.float32
            )
        early = [seq.num_output_tokens < seq.params.min_tokens for seq in seqs]
        if any(early):
            bans = [
                [
                    (t, 1)
                    for t in {*self.eos_token_ids, *seq.params.stop_token_ids}
                    if t < vocab_size
                ]
                if is_early
                else []
                for seq, is_early in zip(seqs, early, strict=True)
            ]
            banned = self._row_scatter(bans, vocab_size, torch.float32) > 0
        wanted = [p.logprobs for p in params if p.logprobs is not None]
        return SamplingBatch(
            temperatures=column(
                [1.0 if g else p.temperature for g, p in zip(greedy, params, strict=True)],
                torch.float32,
            ),
            greedy=column(greedy, torch.bool),
            all_greedy=all(greedy),
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            presence_penalty=presence,
            frequency_penalty=frequency,
            output_counts=counts,
            banned=banned,
            generators=[seq.generator for seq in seqs],
            default_generator=self.default_generator,
            num_logprobs=max(max(wanted), 1) if wanted else 0,
        )

    def _row_scatter(
        self, rows: list[list[tuple[int, int]]], vocab_size: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """A dense `[rows, vocab]` tensor built on the device from sparse (column, value) lists.

        Only the sparse lists cross to the device; padding lands in a spare last column.
        """
        width = max(1, max(len(row) for row in rows))
        columns = [[c for c, _ in row] + [vocab_size] * (width - len(row)) for row in rows]
        values = [[v for _, v in row] + [0] * (width - len(row)) for row in rows]
        index = torch.tensor(columns, dtype=torch.int64).to(self.device, non_blocking=True)
        source = torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)
        dense = torch.zeros(len(rows), vocab_size + 1, dtype=dtype, device=self.device)
        return dense.scatter_add_(1, index, source)[:, :vocab_size]

    def _to_host(self, out: SamplerOutput, seqs: list[Sequence]) -> list[SampledToken]:
        """The step's only device-to-host transfer: everything packed into one tensor."""
        if out.logprobs is None:
            return [SampledToken(t, None) for t in out.token_ids.cpu().tolist()]
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
        ).cpu()
        results = []
        for row, seq in zip(packed.tolist(), seqs, strict=True):
            token = int(row[0])
            wanted = seq.params.logprobs
            if wanted is None:
                results.append(SampledToken(token, None))
                continue
            top = {int(row[2 + i]): row[2 + k + i] for i in range(wanted)}
            results.append(SampledToken(token, TokenLogprobs(token, row[1], top)))
        return results


class PaddedDecode:
    """Decode steps on fixed input buffers, so one CUDA graph per batch size can replay them.

    A batch of n decodes runs as the next captured size up; the extra rows are padding
    (slot -1: nothing stored; context_len 0: zero output). Without captured graphs the same
    buffers run eagerly, which is how the CPU tests check the padding.
    """

    def __init__(
        self, model: torch.nn.Module, device: torch.device, max_num_seqs: int, max_blocks: int
    ) -> None:
        self.model = model
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
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def _forward(self, size: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            cu_seqlens_q=self.cu_seqlens_q[: size + 1],
            context_lens=self.context_lens[:size],
            block_tables=self.block_tables[:size],
            max_query_len=1,
        )
        return self.model(self.input_ids[:size], self.positions[:size], meta)

    @torch.inference_mode()
    def capture_graphs(self) -> None:
        """Largest first, sharing one memory pool. On failure, decode stays eager."""
        pool = None
        try:
            for size in reversed(self.sizes):
                self._forward(size)  # warm up: compiles the kernels outside the capture
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[size] = self._forward(size)
                pool = graph.pool()
                self.graphs[size] = graph
        except RuntimeError:
            logging.getLogger(__name__).exception("CUDA graph capture failed; decode runs eagerly")
            self.graphs.clear()
            self.outputs.clear()

    def run(self, batch: BatchInputs, num_seqs: int) -> torch.Tensor:
        size = next(s for s in self.sizes if s >= num_seqs)
        meta = batch.meta
        width = meta.block_tables.shape[1]
        self.input_ids[:num_seqs] = batch.input_ids
        self.input_ids[num_seqs:size] = 0
        self.positions[:num_seqs] = batch.positions
        self.positions[num_seqs:size] = 0
        self.slot_mapping[:num_seqs] = meta.slot_mapping
        self.slot_mapping[num_seqs:size] = -1
        self.context_lens[:num_seqs] = meta.context_lens
        self.context_lens[num_seqs:size] = 0
        self.block_tables[:size].zero_()
        self.block_tables[:num_seqs, :width] = meta.block_tables
        graph = self.graphs.get(size)
        if graph is None:
            return self._forward(size)[:num_seqs]
        graph.replay()
        return self.outputs[size][:num_seqs]
