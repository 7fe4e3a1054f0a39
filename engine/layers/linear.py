"""Linear layers written for tensor parallelism (Megatron-style column/row splits).

Each parameter carries a `weight_loader(param, full_tensor, shard_id)` that slices the
checkpoint tensor down to this rank's shard, so the loader never needs to know about
sharding. With `tp_size == 1` (the only case wired up so far) no communication happens;
`RowParallelLinear` and the vocab-parallel layers all-reduce/gather when `tp_size > 1`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class WeightShapeError(ValueError):
    """A checkpoint tensor does not fit the parameter it is loaded into."""


def _copy_checked(target: torch.Tensor, source: torch.Tensor) -> None:
    if tuple(target.shape) != tuple(source.shape):
        raise WeightShapeError(f"expected shape {tuple(target.shape)}, got {tuple(source.shape)}")
    if not source.is_floating_point():
        raise WeightShapeError(f"expected a floating-point tensor, got dtype {source.dtype}")
    target.copy_(source)


def _all_reduce(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    if tp_size > 1:
        import torch.distributed as dist

        dist.all_reduce(x)
    return x


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    _copy_checked(param.data, loaded)


class _ShardedLinear(nn.Module):
    """Holds this rank's `[out_local, in_local]` weight; subclasses say how to slice."""

    def __init__(
        self,
        in_local: int,
        out_local: int,
        bias: bool,
        tp_size: int,
        tp_rank: int,
    ) -> None:
        super().__init__()
        self.tp_size, self.tp_rank = tp_size, tp_rank
        self.weight = nn.Parameter(torch.empty(out_local, in_local), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        if bias:
            self.bias = nn.Parameter(torch.empty(out_local), requires_grad=False)
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        else:
            self.register_parameter("bias", None)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        raise NotImplementedError


class ColumnParallelLinear(_ShardedLinear):
    """Splits the output dimension; each rank computes its slice of the outputs."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        tp_size: int = 1,
        tp_rank: int = 0,
    ) -> None:
        if output_size % tp_size:
            raise ValueError(f"output size {output_size} is not divisible by tp_size {tp_size}")
        super().__init__(input_size, output_size // tp_size, bias, tp_size, tp_rank)

    def _rank_rows(self, loaded: torch.Tensor, full_rows: int) -> torch.Tensor:
        if loaded.shape[0] != full_rows:
            raise WeightShapeError(f"expected {full_rows} rows, got shape {tuple(loaded.shape)}")
        per_rank = full_rows // self.tp_size
        return loaded.narrow(0, self.tp_rank * per_rank, per_rank)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        _copy_checked(param.data, self._rank_rows(loaded, param.shape[0] * self.tp_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input fused into one (gate_up)."""

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = False,
        tp_size: int = 1,
        tp_rank: int = 0,
    ) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, tp_size, tp_rank)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        assert isinstance(shard_id, int)
        local_sizes = [size // self.tp_size for size in self.output_sizes]
        offset = sum(local_sizes[:shard_id])
        target = param.data.narrow(0, offset, local_sizes[shard_id])
        _copy_checked(target, self._rank_rows(loaded, self.output_sizes[shard_id]))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections fused; heads (not rows) are what gets split across ranks."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        tp_size: int = 1,
        tp_rank: int = 0,
    ) -> None:
        if num_heads % tp_size or num_kv_heads % tp_size:
            raise ValueError(
                f"heads ({num_heads}) and kv heads ({num_kv_heads}) must divide by tp_size {tp_size}"
            )
        self.head_dim = head_dim
        self.num_heads = num_heads // tp_size
        self.num_kv_heads = num_kv_heads // tp_size
        output_size = (num_heads + 2 * num_kv_heads) * head_dim
        super().__init__(hidden_size, output_size, bias, tp_size, tp_rank)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        offset, size = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[
            shard_id  # type: ignore[index]
        ]
        target = param.data.narrow(0, offset, size)
        _copy_checked(target, self._rank_rows(loaded, size * self.tp_size))


class RowParallelLinear(_ShardedLinear):
    """Splits the input dimension; partial outputs are summed across ranks."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        tp_size: int = 1,
        tp_rank: int = 0,
    ) -> None:
        if input_size % tp_size:
            raise ValueError(f"input size {input_size} is not divisible by tp_size {tp_size}")
        super().__init__(input_size // tp_size, output_size, bias, tp_size, tp_rank)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if param.dim() == 1:  # the bias is not split; it is added once after the reduce
            _copy_checked(param.data, loaded)
            return
        per_rank = param.shape[1]
        if loaded.dim() != 2 or loaded.shape[1] != per_rank * self.tp_size:
            raise WeightShapeError(
                f"expected shape {(param.shape[0], per_rank * self.tp_size)}, got {tuple(loaded.shape)}"
            )
        _copy_checked(param.data, loaded.narrow(1, self.tp_rank * per_rank, per_rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _all_reduce(F.linear(x, self.weight), self.tp_size)
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the vocabulary's rows."""

    def __init__(
        self, vocab_size: int, hidden_size: int, tp_size: int = 1, tp_rank: int = 0
    ) -> None:
        super().__init__()
        self.tp_size, self.tp_rank = tp_size, tp_rank
        self.vocab_size = vocab_size
        self.per_rank = -(-vocab_size // tp_size)
        self.vocab_start = tp_rank * self.per_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if loaded.dim() != 2 or loaded.shape[0] != self.vocab_size:
            raise WeightShapeError(
                f"expected shape {(self.vocab_size, param.shape[1])}, got {tuple(loaded.shape)}"
            )
        rows = min(self.per_rank, self.vocab_size - self.vocab_start)
        param.data.zero_()
        _copy_checked(param.data[:rows], loaded.narrow(0, self.vocab_start, rows))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(token_ids, self.weight)
        local = token_ids - self.vocab_start
        outside = (local < 0) | (local >= self.per_rank)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return _all_reduce(out, self.tp_size)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection; shares the embedding's sharding (and weight when tied)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = F.linear(hidden, self.weight)
        if self.tp_size > 1:
            import torch.distributed as dist

            parts = [torch.empty_like(logits) for _ in range(self.tp_size)]
            dist.all_gather(parts, logits)
            logits = torch.cat(parts, dim=-1)
        return logits[..., : self.vocab_size]
