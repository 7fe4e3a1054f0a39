"""Per linear layer, the fastest way to multiply on this machine, measured once at load.

There are several ways to run a layer on the CPU: `F.linear` (MKL's sgemm) on float weights,
oneDNN with the weight packed into its blocked layout, and for a weight kept quantized the
C kernel (`engine.kernels.cpu`, at each thread count up to torch's) or a transient
dequantization followed by `F.linear`. Which wins depends on the CPU (oneDNN won 2-3x on an
AMD EPYC and lost 2x on an Intel Xeon of the same machine kind) and on how many rows a call
has, so `choose_kernels` times the candidates on each distinct weight shape at three row
counts (one decode row, a batch of decodes, a prefill chunk) and keeps the fastest per row
class. A layer holds one copy of its weight: float weights become either oneDNN's packed
copy or stay dense, whichever is faster over the three classes; quantized weights stay
quantized. The choices are logged and cached in a JSON file under the kernel cache directory,
keyed by the CPU's model and flags, torch's version and thread count and the kernel source,
so later loads on the same machine skip the timing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels.cpu.build import CpuKernels, cpu_identity, load_kernels, source_hash
from engine.layers import cpu_matmul
from engine.quant.weight import QuantizedWeight

log = logging.getLogger(__name__)

ROW_CLASSES = (1, 16, 256)  # rows timed: a decode, a batch of decodes, a prefill chunk
KERNEL_CHOICES = ("auto", "torch", "onednn", "native")
TIMING_REPEATS = 5
CACHE_VERSION = 1


def row_class(rows: int) -> int:
    """Index into `ROW_CLASSES` of the class `rows` belongs to."""
    return 0 if rows <= 4 else 1 if rows <= 64 else 2


# --- the ways to multiply --------------------------------------------------------------


@dataclass
class FLinear:
    weight: torch.Tensor
    name: str = "f_linear"

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, self.weight, bias)


@dataclass
class OneDnnLinear:
    packed: torch.Tensor
    name: str = "onednn"

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return cpu_matmul.packed_linear(x, self.packed, bias)


@dataclass
class NativeQuantLinear:
    kernels: CpuKernels
    weight: QuantizedWeight
    threads: int

    @property
    def name(self) -> str:
        return f"native-{self.threads}t"

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = self.kernels.linear(x, self.weight, self.threads)
        return out if bias is None else out + bias


@dataclass
class DequantizedLinear:
    """The weight dequantized for this call only, then `F.linear` (pays off for many rows)."""

    weight: QuantizedWeight
    kernels: CpuKernels | None
    threads: int

    @property
    def name(self) -> str:
        return "dequantize+f_linear" if self.kernels else "torch_reference"

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.kernels is not None:
            dense = self.kernels.dequantize(self.weight, None, self.threads)
        else:
            dense = self.weight.dequantize()
        return F.linear(x, dense.to(x.dtype), bias)


Method = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


class RowClassLinear:
    """One method per row class, picked per call by the rows of `x`."""

    def __init__(self, methods: list[Method]) -> None:
        self.methods = methods

    @property
    def names(self) -> list[str]:
        return [str(getattr(m, "name", m)) for m in self.methods]

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        return self.methods[row_class(rows)](x, bias)


# --- timing ------------------------------------------------------------------------------


def _time(method: Method, x: torch.Tensor) -> float:
    """Seconds per call: the fastest of a few, after a warm-up call (the box may be busy)."""
    method(x, None)
    best = float("inf")
    for _ in range(TIMING_REPEATS):
        start = time.perf_counter()
        method(x, None)
        best = min(best, time.perf_counter() - start)
    return best


def _probe_rows(in_features: int, max_rows: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randn(min(rows, max_rows), in_features, generator=generator) for rows in ROW_CLASSES
    ]


# --- the choice --------------------------------------------------------------------------


@dataclass
class KernelChooser:
    """Chooses and remembers; one per model load."""

    cache_dir: Path
    request: str = "auto"  # one of KERNEL_CHOICES: auto measures, the others force
    max_rows: int = ROW_CLASSES[-1]

    def __post_init__(self) -> None:
        if self.request not in KERNEL_CHOICES:
            raise ValueError(f"linear kernel must be one of {', '.join(KERNEL_CHOICES)}")
        self.threads = max(1, torch.get_num_threads())
        self.kernels: CpuKernels | None = None
        if self.request in ("auto", "native"):
            self.kernels, why = load_kernels(self.cache_dir)
            if self.kernels is None:
                log.warning("quantized CPU kernels unavailable, using torch: %s", why)
        key = "\n".join(
            (
                cpu_identity(),
                torch.__version__,
                source_hash(),
                str(self.threads),
                str(CACHE_VERSION),
            )
        )
        digest = hashlib.sha256(key.encode()).hexdigest()[:20]
        self.cache_file = self.cache_dir / f"linear-choice-{digest}.json"
        self.cache = self._read_cache()
        self.cache_changed = False
        self.logged: set[str] = set()

    def _read_cache(self) -> dict[str, list[str]]:
        try:
            data = json.loads(self.cache_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def save(self) -> None:
        if not self.cache_changed:
            return
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            staging = self.cache_file.with_suffix(f".{os.getpid()}.tmp")
            staging.write_text(json.dumps(self.cache, indent=1, sort_keys=True), encoding="utf-8")
            os.replace(staging, self.cache_file)
        except OSError as exc:
            log.warning("could not save the kernel choices to %s: %s", self.cache_file, exc)

    def quantized_candidates(self, weight: QuantizedWeight) -> list[Method]:
        candidates: list[Method] = [DequantizedLinear(weight, self.kernels, self.threads)]
        if self.kernels is not None:
            for threads in range(1, self.threads + 1):
                candidates.append(NativeQuantLinear(self.kernels, weight, threads))
        return candidates

    def for_quantized(self, weight: QuantizedWeight, max_rows: int) -> RowClassLinear:
        candidates = self.quantized_candidates(weight)
        by_name = {str(getattr(c, "name", "")): c for c in candidates}
        if self.request != "auto":
            native = [c for c in candidates if isinstance(c, NativeQuantLinear)]
            pick = native[-1] if self.request == "native" and native else candidates[0]
            return RowClassLinear([pick] * len(ROW_CLASSES))
        n, k = weight.shape
        key = f"quantized:{n}x{k}:{weight.bits}b:g{weight.group_size}:rows{max_rows}"
        names = self.cache.get(key)
        if not names or any(name not in by_name for name in names):
            names = []
            report = []
            for x in _probe_rows(k, max_rows):
                timings = {str(getattr(c, "name", "")): _time(c, x) for c in candidates}
                best = min(timings, key=timings.__getitem__)
                names.append(best)
                report.append(f"rows {x.shape[0]}: " + ", ".join(
                    f"{name} {seconds * 1e6:.0f} us" for name, seconds in timings.items()
                ))  # fmt: skip
            self.cache[key] = names
            self.cache_changed = True
            log.info("%s %dx%d timed: %s", weight.describe(), n, k, "; ".join(report))
        if key not in self.logged:
            self.logged.add(key)
            log.info("%s %dx%d: rows 1/16/256 -> %s", weight.describe(), n, k, ", ".join(names))
        return RowClassLinear([by_name[name] for name in names])

    def for_dense(self, weight: torch.Tensor, max_rows: int) -> Method:
        """F.linear or oneDNN's packed copy: one storage for every row class."""
        if self.request == "torch" or self.request == "native":
            return FLinear(weight)
        packed = cpu_matmul.pack(weight)
        if packed is None:
            return FLinear(weight)
        onednn = OneDnnLinear(packed)
        if self.request == "onednn":
            return onednn
        n, k = weight.shape
        key = f"dense:{n}x{k}:{weight.dtype}:rows{max_rows}"
        choice = self.cache.get(key)
        if choice not in (["f_linear"], ["onednn"]):
            totals = {"f_linear": 0.0, "onednn": 0.0}
            for x in _probe_rows(k, max_rows):
                for method in (FLinear(weight), onednn):
                    totals[method.name] += _time(method, x) / x.shape[0]  # seconds per row
            choice = [min(totals, key=totals.__getitem__)]
            self.cache[key] = choice
            self.cache_changed = True
            log.info(
                "float %dx%d timed (per row, summed over 1/16/256 rows): %s",
                n, k, ", ".join(f"{m} {s * 1e6:.1f} us" for m, s in totals.items()),
            )  # fmt: skip
        if key not in self.logged:
            self.logged.add(key)
            log.info("float %dx%d -> %s", n, k, choice[0])
        return onednn if choice == ["onednn"] else FLinear(weight)

    def row_decoder(self) -> Callable[[QuantizedWeight, torch.Tensor], torch.Tensor]:
        kernels = self.kernels
        if kernels is None:
            return QuantizedWeight.dequantize
        return lambda weight, rows: kernels.dequantize(weight, rows, 1)


def choose_kernels(
    model: nn.Module,
    cache_dir: Path,
    request: str = "auto",
    max_rows: int = 256,
    max_seqs: int = 256,
) -> int:
    """Give every linear layer of a CPU model its method (see the module docstring); returns
    the bytes of weights held outside the parameters (quantized planes, oneDNN copies).
    `max_rows`: the most rows a step sends through a layer; `max_seqs`: through the head."""
    chooser = KernelChooser(cache_dir, request)
    uses: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        uses[id(param)] = uses.get(id(param), 0) + 1
    held: dict[int, int] = {}
    for name, module in model.named_modules():
        quantized: QuantizedWeight | None = getattr(module, "quantized", None)
        if quantized is not None:
            held[id(quantized)] = quantized.nbytes
            if hasattr(module, "row_decoder"):
                module.row_decoder = chooser.row_decoder()
            if hasattr(module, "method"):
                rows = max_seqs if name.endswith("lm_head") else max_rows
                module.method = chooser.for_quantized(quantized, rows)
            continue
        if not hasattr(module, "method") or module.weight.dim() != 2:
            continue
        weight = module.weight
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            continue
        if uses.get(id(weight), 0) > 1:  # a tied embedding reads the dense rows: no 2nd copy
            module.method = FLinear(weight.detach())
            continue
        rows = max_seqs if name.endswith("lm_head") else max_rows
        method = chooser.for_dense(weight.detach(), rows)
        module.method = method
        if isinstance(method, OneDnnLinear):
            held[id(method.packed)] = method.packed.numel() * method.packed.element_size()
            if uses.get(id(weight)) == 1:  # only the packed copy is read from now on
                weight.data = torch.empty(0, dtype=weight.dtype, device=weight.device)
    chooser.save()
    return sum(held.values())
