"""Compile every Triton kernel variant for a GPU target, with or without that GPU present.

``python tests/kernel_checks/compile_check.py [--arch 90]`` prints one line per variant with its
shared memory, and exits non-zero on the first failure. Triton's interpreter (the CPU test
path) accepts code the compiler rejects, so this is what proves on a CPU-only machine that
the kernels build for a real GPU. Run it without ``TRITON_INTERPRET`` set.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.kernels import (
    kv_store,
    triton_paged_attention,
    triton_rms_norm,
    triton_rope,
    triton_silu_and_mul,
)

# Opt-in shared memory per block on H100/H200 (sm_90) and A100 (sm_80).
SHARED_MEMORY_LIMIT = {90: 227 * 1024, 80: 163 * 1024}


def variants() -> Iterator[tuple[str, Any, dict[str, str], dict[str, Any]]]:
    """(label, kernel, argument types, constexprs) for the shapes the engine launches."""
    for dtype in ("bf16", "fp16", "fp32"):
        for group, block_q, block_m, splits in ((2, 8, 16, 1), (4, 16, 64, 1), (8, 2, 16, 4)):
            types = {n: f"*{dtype}" for n in ("query_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")}
            types.update(
                block_tables_ptr="*i32",
                cu_seqlens_q_ptr="*i32",
                context_lens_ptr="*i32",
                partial_out_ptr="*fp32",
                partial_max_ptr="*fp32",
                partial_sum_ptr="*fp32",
                scale_log2="fp32",
            )
            constexprs = {
                "GROUP": group,
                "GROUP_P2": group,
                "BLOCK_Q": block_q,
                "BLOCK_M": block_m,
                "BLOCK_DIM": 128,
                "TILE_KV": 32 if dtype == "fp32" else 64,
                "NUM_SPLITS": splits,
                "DOT_PRECISION": "ieee" if dtype == "fp32" else "tf32",
            }
            label = f"paged_attention {dtype} group={group} rows={block_m} splits={splits}"
            yield label, triton_paged_attention._paged_attention_kernel, types, constexprs
        reduce_types = {
            "cu_seqlens_q_ptr": "*i32",
            "out_ptr": f"*{dtype}",
            "partial_out_ptr": "*fp32",
            "partial_max_ptr": "*fp32",
            "partial_sum_ptr": "*fp32",
        }
        yield (
            f"reduce_splits {dtype}",
            triton_paged_attention._reduce_splits_kernel,
            reduce_types,
            {"BLOCK_HEADS": 32, "BLOCK_DIM": 128, "NUM_SPLITS": 8},
        )
        store_types = {
            n: f"*{dtype}" for n in ("key_ptr", "value_ptr", "k_cache_ptr", "v_cache_ptr")
        }
        store_types["slot_mapping_ptr"] = "*i64"
        yield (
            f"store_kv {dtype}",
            kv_store._store_kv_kernel,
            store_types,
            {"BLOCK_HEADS": 8, "BLOCK_DIM": 128},
        )
    norm_args = ("x_ptr", "residual_ptr", "weight_ptr", "out_ptr", "residual_out_ptr")
    norm_types = {n: "*bf16" for n in norm_args} | {"eps": "fp32"}
    yield (
        "rms_norm bf16",
        triton_rms_norm._rms_norm_kernel,
        norm_types,
        {"HAS_RESIDUAL": True, "BLOCK": 4096},
    )
    rope_types = {n: "*bf16" for n in ("query_ptr", "key_ptr", "query_out_ptr", "key_out_ptr")}
    rope_types |= {"positions_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32"}
    yield (
        "rope bf16",
        triton_rope._rope_kernel,
        rope_types,
        {"BLOCK_HEADS": 16, "BLOCK_KV_HEADS": 8, "BLOCK_HALF": 64},
    )
    yield (
        "silu_and_mul bf16",
        triton_silu_and_mul._silu_and_mul_kernel,
        {"x_ptr": "*bf16", "out_ptr": "*bf16"},
        {"BLOCK": 1024},
    )


def compile_variant(kernel: Any, types: dict[str, str], constexprs: dict[str, Any], arch: int):
    signature = {
        name: "constexpr" if name in constexprs else types.get(name, "i32")
        for name in kernel.arg_names
    }
    return triton.compile(
        ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", arch, 32)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/kernel_checks/compile_check.py")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print(
            "error: unset TRITON_INTERPRET: the interpreter replaces the compiler", file=sys.stderr
        )
        return 2
    limit = SHARED_MEMORY_LIMIT.get(args.arch)
    for label, kernel, types, constexprs in variants():
        start = time.perf_counter()
        try:
            compiled = compile_variant(kernel, types, constexprs, args.arch)
        except Exception as exc:
            print(f"FAIL {label}: {type(exc).__name__}: {exc}", flush=True)
            return 1
        shared = compiled.metadata.shared
        if limit is not None and shared > limit:
            print(f"FAIL {label}: {shared} bytes of shared memory > {limit}", flush=True)
            return 1
        took = time.perf_counter() - start
        print(f"ok   {label}: sm_{args.arch} shared={shared} B ({took:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
