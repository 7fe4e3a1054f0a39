"""Owns the model and the KV pool; turns a step's inputs into sampled tokens.

`build_step_inputs` (host only, run where the scheduler lives) flattens a scheduled step
into `StepInputs`: plain lists, cheap to pickle, so the same object drives the in-process
runner and every tensor-parallel rank. The varlen batch (token ids, positions, slot
mapping, block tables, context lengths, cu_seqlens) follows the kernel contract in
`engine/kernels/reference.py`. The step reads results back to the host once (`_to_host`),
after sampling on the device; with tensor parallelism only rank 0 samples.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.core.scheduler import SchedulerOutput
from engine.core.sequence import TokenLogprobs
from engine.errors import ConfigError
from engine.kernels import resolve_backend
from engine.layers.attention import AttentionMetadata
from engine.layers.linear import kv_heads_per_rank
from engine.layers.sampler import Sampler, SamplerOutput, SamplingBatch
from engine.loader import build_model, load_model_args
from engine.models.llama import ModelArgs, ParallelSpec
from engine.sampling import SamplingParams


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
class SamplingRow:
    """What the sampler needs to know about one sequence sampled this step."""

    seq_id: int
    params: SamplingParams
    seed: int | None  # the request's seed + the sample's index; None: unseeded
    output_counts: list[tuple[int, int]]  # (token, count) so far; only with penalties
    banned_ids: list[int]  # EOS and stop ids, banned while under min_tokens
    prompt_ids: list[int] = field(default_factory=list)  # distinct; only with repetition_penalty


@dataclass
class StepInputs:
    """One step as plain lists: what every rank needs, and nothing that lives on a device."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    cu_seqlens_q: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]  # padded with 0 to the longest table
    max_query_len: int
    logits_indices: list[int]  # the token rows projected to logits, one per sampling row
    block_copies: list[tuple[int, int]]  # copy-on-write (src, dst), before anything runs
    sampling: list[SamplingRow]
    released_seq_ids: list[int]  # finished seeded sequences: their generators can go

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)


def build_step_inputs(
    step: SchedulerOutput,
    block_size: int,
    eos_token_ids: frozenset[int],
    vocab_size: int,
    released_seq_ids: list[int],
) -> StepInputs:
    """Host only: flatten the scheduled step (and whom to sample how) into plain lists."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    cu_seqlens = [0]
    context_lens: list[int] = []
    logits_indices: list[int] = []
    rows: list[SamplingRow] = []
    max_blocks = max(len(item.seq.block_table) for item in step.scheduled)
    tables: list[list[int]] = []
    for item in step.scheduled:
        seq, start = item.seq, item.seq.num_computed_tokens
        end = start + item.num_tokens
        table = seq.block_table
        input_ids.extend(seq.token_ids[start:end])
        positions.extend(range(start, end))
        slots.extend(
            table[pos // block_size] * block_size + pos % block_size for pos in range(start, end)
        )
        cu_seqlens.append(cu_seqlens[-1] + item.num_tokens)
        context_lens.append(end)
        tables.append(table + [0] * (max_blocks - len(table)))
        if not item.sample:
            continue
        logits_indices.append(cu_seqlens[-1] - 1)
        params = seq.params
        banned: list[int] = []
        if seq.num_output_tokens < params.min_tokens:
            banned = sorted(t for t in {*eos_token_ids, *params.stop_token_ids} if t < vocab_size)
        rows.append(
            SamplingRow(
                seq_id=seq.seq_id,
                params=params,
                seed=None if params.seed is None else params.seed + seq.index,
                output_counts=list(seq.output_counts.items()) if params.has_penalties else [],
                banned_ids=banned,
                prompt_ids=(
                    sorted(set(seq.token_ids[: seq.num_prompt_tokens]))
                    if params.repetition_penalty != 1.0
                    else []
                ),
            )
        )
    return StepInputs(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slots,
        cu_seqlens_q=cu_seqlens,
        context_lens=context_lens,
        block_tables=tables,
        max_query_len=max(item.num_tokens for item in step.scheduled),
        logits_indices=logits_indices,
        block_copies=list(step.block_copies),
        sampling=rows,
        released_seq_ids=list(released_seq_ids),
    )


@dataclass
class BatchInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor


class ModelRunner:
    """One rank's model shard and KV pool (the whole model when `tp` is None).

    Every rank runs `execute` on the same `StepInputs`; the collectives inside the model
    keep them in step, and rank 0 alone samples and returns tokens.
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
        )  # fmt: skip
        self.sampler = Sampler()
        self.block_size = config.block_size
        self.num_kv_heads = kv_heads_per_rank(self.args.num_kv_heads, self.tp.tp_size)
        self.num_blocks = self._size_kv_pool()
        a = self.args
        self.kv_cache = torch.zeros(
            2, a.num_layers, self.num_blocks, self.block_size, self.num_kv_heads, a.head_dim,
            dtype=self.dtype, device=self.device,
        )  # fmt: skip
        for layer, attn in enumerate(self.model.attention_layers()):
            attn.k_cache, attn.v_cache = self.kv_cache[0, layer], self.kv_cache[1, layer]
        self.default_generator = torch.Generator(self.device).manual_seed(config.seed)
        self.generators: dict[int, torch.Generator] = {}  # seeded sequences, by seq_id
        self.decode: PaddedDecode | None = None
        # CUDA graphs would capture the collectives too; untested, so TP decodes eagerly
        if (
            self.device.type == "cuda"
            and self.backend == "triton"
            and not config.enforce_eager
            and self.tp.tp_size == 1
        ):
            self.decode = PaddedDecode(
                self.model, self.device, config.max_num_seqs, self.max_blocks_per_seq
            )
            self.decode.capture_graphs()

    @property
    def healthy(self) -> bool:
        return True  # in process: a failure raises from `execute` and the engine carries on

    def shutdown(self) -> None:
        """Nothing to stop: the model lives in this process."""

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    # --- KV pool sizing ----------------------------------------------------------------

    @property
    def kv_bytes_per_block(self) -> int:
        a = self.args
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * a.num_layers * self.block_size * self.num_kv_heads * a.head_dim * itemsize

    @property
    def weight_bytes(self) -> int:
        """Bytes of this rank's weights (tied embeddings counted once)."""
        unique = {id(p): p for p in self.model.parameters()}.values()
        return sum(p.numel() * p.element_size() for p in unique)

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

    def to_device(self, inputs: StepInputs) -> BatchInputs:
        def on_device(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        meta = AttentionMetadata(
            slot_mapping=on_device(inputs.slot_mapping, torch.int64),
            cu_seqlens_q=on_device(inputs.cu_seqlens_q, torch.int32),
            context_lens=on_device(inputs.context_lens, torch.int32),
            block_tables=on_device(inputs.block_tables, torch.int32),
            max_query_len=inputs.max_query_len,
        )
        return BatchInputs(
            input_ids=on_device(inputs.input_ids, torch.int64),
            positions=on_device(inputs.positions, torch.int64),
            meta=meta,
            logits_indices=on_device(inputs.logits_indices, torch.int64),
        )

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate whole blocks (all layers, K and V) before they are written."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]

    @torch.inference_mode()
    def execute(self, inputs: StepInputs) -> list[SampledToken]:
        """Run one step; returns one token per sampling row, in order (none off rank 0)."""
        for seq_id in inputs.released_seq_ids:
            self.generators.pop(seq_id, None)
        self.copy_blocks(inputs.block_copies)
        batch = self.to_device(inputs)
        num_seqs = inputs.num_seqs
        decode_only = inputs.max_query_len == 1
        if self.decode is not None and decode_only and num_seqs <= self.decode.max_batch:
            hidden = self.decode.run(batch, num_seqs)
        else:
            hidden = self.model(batch.input_ids, batch.positions, batch.meta)
        if not inputs.sampling:
            return []
        logits = self.model.compute_logits(hidden[batch.logits_indices])  # all-gathered
        if self.tp.tp_rank != 0:
            return []
        sampling = self.sampling_batch(inputs.sampling, logits.shape[-1])
        return self._to_host(self.sampler(logits, sampling), inputs.sampling)

    def _generator(self, row: SamplingRow) -> torch.Generator | None:
        if row.seed is None:
            return None
        generator = self.generators.get(row.seq_id)
        if generator is None:
            generator = torch.Generator(self.device).manual_seed(row.seed)
            self.generators[row.seq_id] = generator
        return generator

    def sampling_batch(self, rows: list[SamplingRow], vocab_size: int) -> SamplingBatch:
        params = [row.params for row in rows]
        dev = self.device

        def column(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(dev, non_blocking=True)

        greedy = [p.greedy for p in params]
        top_k = top_p = min_p = presence = frequency = counts = banned = None
        repetition = seen = None
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
                [row.output_counts for row in rows], vocab_size, torch.float32
            )
        if any(p.repetition_penalty != 1.0 for p in params):
            repetition = column([p.repetition_penalty for p in params], torch.float32)
            tokens = [[(t, 1) for t in row.prompt_ids] + row.output_counts for row in rows]
            seen = self._row_scatter(tokens, vocab_size, torch.float32) > 0
        if any(row.banned_ids for row in rows):
            bans = [[(t, 1) for t in row.banned_ids] for row in rows]
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
            repetition_penalty=repetition,
            seen=seen,
            banned=banned,
            generators=[self._generator(row) for row in rows],
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

    def _to_host(self, out: SamplerOutput, rows: list[SamplingRow]) -> list[SampledToken]:
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
        for row, sampled in zip(packed.tolist(), rows, strict=True):
            token = int(row[0])
            wanted = sampled.params.logprobs
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
