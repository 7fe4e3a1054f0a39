"""Compile `qmatmul.c` with the system C compiler once per machine and load it with ctypes.

The shared object is cached under the engine's kernel cache directory, named by a hash of
the source, the compiler's version and flags, and the CPU's model and feature flags, so a
change to any of them builds anew and two machines sharing a directory never load each
other's build. Without a compiler, or when the build fails, `load_kernels` returns None
with the reason, and the engine multiplies through torch instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.quant.weight import QuantizedWeight

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("qmatmul.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC")
BUILD_TIMEOUT_S = 120


def cpu_identity() -> str:
    """The CPU's model name and feature flags (Linux), else what `platform` knows."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    model = flags = ""
    for line in info.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = " ".join(sorted(value.split()))
    return f"{model} | {flags}"


def source_hash() -> str:
    """Names the kernel source in cache keys; a missing source (a broken install) is a key too."""
    try:
        return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    except OSError:
        return "no-source"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _compiler_version(compiler: str) -> str:
    result = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    return result.stdout.splitlines()[0] if result.stdout else compiler


@dataclass
class CpuKernels:
    """The loaded kernels; every call takes contiguous CPU tensors."""

    library: ctypes.CDLL
    path: Path
    simd_width: int

    def __post_init__(self) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int
        self.library.sy_qlinear.argtypes = [i, i, i, i, i, p, p, p, p, p, i]
        self.library.sy_qlinear.restype = i
        self.library.sy_dequantize.argtypes = [i, p, i, i, i, p, p, p, p, i]
        self.library.sy_dequantize.restype = i

    def linear(self, x: torch.Tensor, weight: QuantizedWeight, threads: int) -> torch.Tensor:
        """`x[..., K] @ w.T` in float32."""
        n, k = weight.shape
        flat = x.reshape(-1, k)
        if flat.dtype != torch.float32 or not flat.is_contiguous():
            flat = flat.float().contiguous()
        out = torch.empty(flat.shape[0], n, dtype=torch.float32)
        status = self.library.sy_qlinear(
            flat.shape[0], n, k, weight.group_size, weight.bits, flat.data_ptr(),
            weight.codes.data_ptr(), weight.scales.data_ptr(), weight.offsets.data_ptr(),
            out.data_ptr(), threads,
        )  # fmt: skip
        if status:
            raise ValueError(f"the CPU kernel refused a {weight.describe()} weight of {n}x{k}")
        return out.view(*x.shape[:-1], n)

    def dequantize(
        self, weight: QuantizedWeight, rows: torch.Tensor | None, threads: int
    ) -> torch.Tensor:
        """The float32 weight, or its `rows` (int64 ids) only."""
        n, k = weight.shape
        ids = None if rows is None else rows.reshape(-1).to(torch.int64).contiguous()
        count = n if ids is None else ids.numel()
        out = torch.empty(count, k, dtype=torch.float32)
        status = self.library.sy_dequantize(
            count, None if ids is None else ids.data_ptr(), k, weight.group_size, weight.bits,
            weight.codes.data_ptr(), weight.scales.data_ptr(), weight.offsets.data_ptr(),
            out.data_ptr(), threads,
        )  # fmt: skip
        if status:
            raise ValueError(f"the CPU kernel refused to dequantize {weight.describe()}")
        return out


def build_key(compiler: str) -> str:
    parts = (source_hash(), _compiler_version(compiler), " ".join(FLAGS), cpu_identity())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def load_kernels(cache_dir: Path) -> tuple[CpuKernels | None, str]:
    """The kernels built for this machine (built now if not cached), or None and why."""
    if not SOURCE.is_file():
        return None, f"the kernel source {SOURCE} is missing from this install"
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler (cc, gcc or clang) on PATH"
    try:
        target = cache_dir / f"qmatmul-{build_key(compiler)}.so"
        if not target.is_file():
            cache_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache_dir) as scratch:
                built = Path(scratch) / target.name
                result = subprocess.run(
                    [compiler, *FLAGS, "-o", str(built), str(SOURCE)],
                    capture_output=True,
                    text=True,
                    timeout=BUILD_TIMEOUT_S,
                    check=False,
                )
                if result.returncode:
                    return None, f"{compiler} failed: {result.stderr.strip()[-500:]}"
                built.chmod(0o600)  # DATA_DIR files are 0600; dlopen needs no execute bit
                os.replace(built, target)  # atomic: a concurrent loader sees all or nothing
            log.info("built the CPU kernels with %s into %s", compiler, target)
        library = ctypes.CDLL(str(target))
        return CpuKernels(library, target, int(library.sy_simd_width())), ""
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"could not build or load the CPU kernels: {exc}"
