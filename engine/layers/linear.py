"""Linear layers written for tensor parallelism (Megatron-style column/row splits).

Each parameter carries a `weight_loader(param, source, shard_id)` that reads only this
rank's slice of the checkpoint tensor. `source` is a `WeightSource` (a lazy safetensors
slice from the loader, or a whole tensor wrapped in `TensorSource`), so a rank never
materialises the parts of a weight it does not hold. Column-parallel layers need no
communication; `RowParallelLinear` and the vocab embedding all-reduce, the LM head
all-gathers, and only when `tp_size > 1`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import WeightShapeError
from engine.quant.weight import QuantizedWeight, concat_rows

SERVABLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class WeightSource(Protocol):
    """A checkpoint tensor that is read on demand, in whole or as a slice along one dim."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor: ...

    def full(self) -> torch.Tensor: ...


class TensorSource:
    """A tensor already in memory, seen as a `WeightSource`."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        return self.tensor.narrow(dim, start, length)

    def full(self) -> torch.Tensor:
        return self.tensor


class QuantizedSource:
    """A checkpoint weight kept quantized; `full()`/`narrow()` dequantize it for a layer that
    holds float weights (another device, tensor parallelism, `quantization: none`)."""

    def __init__(self, weight: QuantizedWeight) -> None:
        self.weight = weight

    @property
    def shape(self) -> tuple[int, ...]:
        return self.weight.shape

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        if dim == 0:
            return self.weight.rows(start, length).dequantize()
        return self.full().narrow(dim, start, length)

    def full(self) -> torch.Tensor:
        return self.weight.dequantize()


def as_source(loaded: WeightSource | torch.Tensor) -> WeightSource:
    return TensorSource(loaded) if isinstance(loaded, torch.Tensor) else loaded


@dataclass(frozen=True)
class ParallelSpec:
    """This rank's place in the tensor-parallel group."""

    tp_size: int = 1
    tp_rank: int = 0


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads a rank holds: a share, or one replicated head when ranks outnumber them."""
    return max(1, num_kv_heads // tp_size)


ShardId = str | int | None  # which part of a fused weight a checkpoint tensor is


def _require_shape(source: WeightSource | torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(source.shape) != expected:
        raise WeightShapeError(f"expected shape {expected}, got {tuple(source.shape)}")


def _copy_checked(target: torch.Tensor, source: torch.Tensor) -> None:
    _require_shape(source, tuple(target.shape))
    if source.dtype not in SERVABLE_DTYPES:  # fp8 and ints need scales this engine lacks
        raise WeightShapeError(
            f"dtype {source.dtype} is not a float dtype the engine serves (float32, float16, "
            "bfloat16): a quantized weight"
        )
    target.copy_(source)


def _copy_rank_part(
    target: torch.Tensor, source: WeightSource, dim: int, full: int, start: int
) -> None:
    """Fill `target` with `target.shape[dim]` entries of `source` from `start` along `dim`;
    `source` must be shaped as `target` but for `full` entries along `dim`."""
    _require_shape(source, (*target.shape[:dim], full, *target.shape[dim + 1 :]))
    _copy_checked(target, source.narrow(dim, start, target.shape[dim]))


def _all_reduce(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    if tp_size > 1:
        import torch.distributed as dist

        dist.all_reduce(x)
    return x


def _all_gather_last(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    """Every rank's `x` side by side along the last dim."""
    if tp_size == 1:
        return x
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(tp_size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def default_weight_loader(param: nn.Parameter, loaded: WeightSource | torch.Tensor) -> None:
    """Unsharded parameters (norms): every rank reads the whole tensor."""
    _copy_checked(param.data, as_source(loaded).full())


class _RankLoaded(nn.Module):
    """Parameters whose `weight_loader` reads only this rank's part of a checkpoint tensor."""

    def __init__(self, tp: ParallelSpec) -> None:
        super().__init__()
        self.tp_size, self.tp_rank = tp.tp_size, tp.tp_rank

    def _new_param(self, *shape: int) -> nn.Parameter:
        param = nn.Parameter(torch.empty(*shape), requires_grad=False)
        param.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        return param

    def weight_loader(
        self,
        param: nn.Parameter,
        loaded: WeightSource | torch.Tensor,
        shard_id: ShardId = None,
    ) -> None:
        """Copy this rank's part of ``loaded`` into ``param`` (or keep it quantized)."""
        if isinstance(loaded, QuantizedSource) and param is getattr(self, "weight", None):
            self._hold_quantized(loaded.weight, shard_id)
            return
        self._load(param, as_source(loaded), shard_id)

    def _load(self, param: nn.Parameter, source: WeightSource, shard_id: ShardId) -> None:
        """Each layer kind defines which slice of ``source`` this rank keeps (abstract)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how it loads weights")

    def _quantized_rows(self, shard_id: ShardId) -> int:
        """Where the rows of part `shard_id` start in the (fused) weight; 0 when unfused."""
        return 0

    def _hold_quantized(self, part: QuantizedWeight, shard_id: ShardId) -> None:
        if self.tp_size != 1:
            raise WeightShapeError("quantized weights are kept only without tensor parallelism")
        if part.shape[1] != self.weight.shape[1]:
            raise WeightShapeError(f"expected {self.weight.shape[1]} inputs, got {part.shape[1]}")
        parts = self.__dict__.setdefault("_quantized_parts", {})
        parts[self._quantized_rows(shard_id)] = part

    def finish_quantized(self) -> bool:
        """After loading: stack the quantized parts into `quantized` and drop the float
        placeholder; False when the weight came as floats."""
        parts: dict[int, QuantizedWeight] = self.__dict__.pop("_quantized_parts", {})
        if not parts:
            return False
        rows = 0
        for start in sorted(parts):
            if start != rows:
                raise WeightShapeError(f"quantized rows {rows}..{start} are missing")
            rows += parts[start].shape[0]
        if rows != self.weight.shape[0]:
            raise WeightShapeError(f"expected {self.weight.shape[0]} rows, got {rows}")
        ordered = [parts[start] for start in sorted(parts)]
        self.quantized = ordered[0] if len(ordered) == 1 else concat_rows(ordered)
        self.weight.data = torch.empty(0, dtype=self.weight.dtype, device=self.weight.device)
        return True


class LinearMethod(Protocol):
    """How a layer multiplies: chosen at load (`engine.layers.kernel_choice`)."""

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor: ...


class _Multiplied:
    """A layer that multiplies by its weight: `F.linear`, or the `method` chosen at load for
    the machine (oneDNN's packed copy, a quantized kernel, ...)."""

    weight: nn.Parameter
    quantized: QuantizedWeight | None = None  # the weight, when kept quantized
    method: LinearMethod | None = None

    def _linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.method is not None:
            return self.method(x, bias)
        if self.quantized is not None:  # the reference, before any kernel was chosen
            return F.linear(x, self.quantized.dequantize().to(x.dtype), bias)
        return F.linear(x, self.weight, bias)


class _ShardedLinear(_Multiplied, _RankLoaded):
    """Holds this rank's `[out_local, in_local]` weight; subclasses say how to slice."""

    def __init__(self, in_local: int, out_local: int, bias: bool, tp: ParallelSpec) -> None:
        super().__init__(tp)
        self.weight = self._new_param(out_local, in_local)
        if bias:
            self.bias = self._new_param(out_local)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._linear(x, self.bias)


class _EvenlySplitLinear(_ShardedLinear):
    """A linear whose weight the ranks share in equal parts along `split_dim`."""

    split_dim: ClassVar[int]  # 0: the outputs (column parallel), 1: the inputs (row parallel)

    def __init__(self, input_size: int, output_size: int, bias: bool, tp: ParallelSpec) -> None:
        local = [output_size, input_size]
        if local[self.split_dim] % tp.tp_size:
            name = ("output", "input")[self.split_dim]
            raise ValueError(
                f"{name} size {local[self.split_dim]} is not divisible by tp_size {tp.tp_size}"
            )
        local[self.split_dim] //= tp.tp_size
        super().__init__(local[1], local[0], bias, tp)

    def _load(self, param: nn.Parameter, source: WeightSource, shard_id: ShardId) -> None:
        dim = self.split_dim
        if param.dim() <= dim:  # the row-parallel bias is whole: added once after the reduce
            _copy_checked(param.data, source.full())
            return
        per_rank = param.shape[dim]
        _copy_rank_part(param.data, source, dim, per_rank * self.tp_size, self.tp_rank * per_rank)


class ColumnParallelLinear(_EvenlySplitLinear):
    """Splits the output dimension; each rank computes its slice of the outputs."""

    split_dim = 0


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input fused into one (gate_up)."""

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool,
        tp: ParallelSpec,
    ) -> None:
        if any(size % tp.tp_size for size in output_sizes):
            raise ValueError(
                f"output sizes {output_sizes} are not divisible by tp_size {tp.tp_size}"
            )
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, tp)

    def _load(self, param: nn.Parameter, source: WeightSource, shard_id: ShardId) -> None:
        assert isinstance(shard_id, int)
        local_sizes = [size // self.tp_size for size in self.output_sizes]
        size = local_sizes[shard_id]
        target = param.data.narrow(0, sum(local_sizes[:shard_id]), size)
        _copy_rank_part(target, source, 0, self.output_sizes[shard_id], self.tp_rank * size)

    def _quantized_rows(self, shard_id: ShardId) -> int:
        assert isinstance(shard_id, int)
        return sum(self.output_sizes[:shard_id])


class QKVParallelLinear(_ShardedLinear):
    """q, k and v projections fused; heads (not rows) are what gets split across ranks.

    Query heads are split evenly. KV heads are split too while there are at least as many
    as ranks; beyond that each rank holds the one KV head its query heads attend to, so
    `tp_size / num_kv_heads` ranks share (replicate) each KV head.
    """

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool,
        tp: ParallelSpec,
    ) -> None:
        tp_size = tp.tp_size
        if num_heads % tp_size or (num_kv_heads % tp_size and tp_size % num_kv_heads):
            raise ValueError(
                f"heads ({num_heads}) must divide by tp_size {tp_size}, and kv heads "
                f"({num_kv_heads}) must divide by it or divide it"
            )
        self.head_dim = head_dim
        self.total_kv_heads = num_kv_heads
        self.num_heads = num_heads // tp_size
        self.num_kv_heads = kv_heads_per_rank(num_kv_heads, tp_size)
        # which block of `num_kv_heads` checkpoint KV heads this rank holds
        replicas = max(1, tp_size // num_kv_heads)
        self.kv_group = tp.tp_rank // replicas
        out_local = (self.num_heads + 2 * self.num_kv_heads) * head_dim
        super().__init__(hidden_size, out_local, bias, tp)

    def _load(self, param: nn.Parameter, source: WeightSource, shard_id: ShardId) -> None:
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        if shard_id == "q":
            offset, size, full, start = 0, q_size, q_size * self.tp_size, self.tp_rank * q_size
        elif shard_id in ("k", "v"):
            offset = q_size if shard_id == "k" else q_size + kv_size
            size, full = kv_size, self.total_kv_heads * self.head_dim
            start = self.kv_group * kv_size
        else:
            raise WeightShapeError(f"unknown qkv shard {shard_id!r}")
        _copy_rank_part(param.data.narrow(0, offset, size), source, 0, full, start)

    def _quantized_rows(self, shard_id: ShardId) -> int:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return {"q": 0, "k": q_size, "v": q_size + kv_size}[str(shard_id)]


class RowParallelLinear(_EvenlySplitLinear):
    """Splits the input dimension; partial outputs are summed across ranks."""

    split_dim = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _all_reduce(self._linear(x, None), self.tp_size)
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(_RankLoaded):
    """Each rank holds a contiguous slice of the vocabulary's rows (the last one padded)."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: ParallelSpec) -> None:
        super().__init__(tp)
        self.vocab_size = vocab_size
        self.per_rank = -(-vocab_size // tp.tp_size)
        self.vocab_start = tp.tp_rank * self.per_rank
        self.weight = self._new_param(self.per_rank, hidden_size)

    def _load(self, param: nn.Parameter, source: WeightSource, shard_id: ShardId) -> None:
        _require_shape(source, (self.vocab_size, param.shape[1]))
        rows = max(0, min(self.per_rank, self.vocab_size - self.vocab_start))
        param.data.zero_()
        if rows:
            _copy_checked(param.data[:rows], source.narrow(0, self.vocab_start, rows))

    quantized: QuantizedWeight | None = None  # the rows, when kept quantized
    # looks rows up in `quantized` (set at load; the torch reference until then)
    row_decoder: Callable[[QuantizedWeight, torch.Tensor], torch.Tensor] | None = None

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:
            decode = self.row_decoder or QuantizedWeight.dequantize
            return decode(self.quantized, token_ids.reshape(-1)).view(*token_ids.shape, -1)
        if self.tp_size == 1:
            return F.embedding(token_ids, self.weight)
        local = token_ids - self.vocab_start
        outside = (local < 0) | (local >= self.per_rank)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return _all_reduce(out, self.tp_size)


class ParallelLMHead(_Multiplied, VocabParallelEmbedding):
    """The output projection; shares the embedding's sharding (and weight when tied)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = _all_gather_last(self._linear(hidden, None), self.tp_size)
        return logits[..., : self.vocab_size]
