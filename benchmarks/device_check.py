"""The one script run on the H100: correctness matrix, then the timing table.

    python -m benchmarks.device_check [--skip-correctness] [--skip-timing] [--quick]

Writes logs and results.json under $OUT (or ./out); prints the short table last.
Correctness: fresh N(0,1) inputs per case, output memory poisoned with NaN
beforehand (a NaN buffer is freed right before the call, so the allocator hands
it to the kernel's output), the kernel runs before any reference is computed,
and the relative error ||out - ref|| / ||ref|| is taken against a float64 numpy
reference (a float32 GPU reference for shapes above 2^31 flops).

>>> bound("bfloat16") > bound("float32")
True
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import matmul as harness
from pallas_gemm import GemmConfig, matmul
from pallas_gemm.gemm import gemm as kernel_matmul  # the kernel entry (return_pre)

BOUNDS = {
    "bfloat16": 8e-3,
    "float16": 1.5e-3,
    "float32": 1e-4,
    "float8_e4m3fn": 5e-2,
    "float8_e5m2": 1e-1,
}
"""Relative-error bounds by output dtype (bf16 rounding alone gives ~2e-3; fp8
rounding ~2^-4 for e4m3, ~2^-3 for e5m2)."""

TF32_BOUND = 3e-3
"""f32 operands are multiplied in tf32 (10-bit mantissa): ~5e-4 relative per product."""

FP8_ACC_BOUND = 5e-3
"""fp8 WGMMA on Hopper accumulates with reduced precision inside the tensor core
(not a full f32 sum); measured 2.0e-3 at K=8192 with f32 outputs, XLA's fp8 dot
is compared on the same inputs in each fp8 check (`xla_rel_err`)."""


def bound(out_dtype: str, in_dtype: str = "bfloat16") -> float:
  if in_dtype == "float32":
    return max(TF32_BOUND, BOUNDS[out_dtype])
  if in_dtype.startswith("float8"):
    return max(FP8_ACC_BOUND, BOUNDS[out_dtype])
  return BOUNDS[out_dtype]


@dataclasses.dataclass(frozen=True)
class Check:
  name: str
  a_shape: tuple
  b_shape: tuple
  kwargs: dict = dataclasses.field(default_factory=dict, hash=False)
  dtype: str = "bfloat16"
  c_shape: tuple | None = None
  b_dtype: str | None = None


def checks() -> list[Check]:
  coop_n = GemmConfig(wg_split="n")
  ping = GemmConfig(schedule="pingpong", tile_m=128, tile_n=128, stages=6)
  checks = []
  # All four layouts x two dtypes, at an odd shape (M, N edges, K tail, padded B).
  for dtype in ("bfloat16", "float16"):
    for ta in (False, True):
      for tb in (False, True):
        m, n, k = 1000, 1016, 1000
        a_shape = (k, m) if ta else (m, k)
        b_shape = (n, k) if tb else (k, n)
        checks.append(
            Check(
                f"{'T' if ta else 'N'}{'T' if tb else 'N'} {dtype} 1000x1016x1000",
                a_shape,
                b_shape,
                dict(transpose_a=ta, transpose_b=tb),
                dtype,
            )
        )
  # Aligned and 64-byte-swizzle shapes, each schedule.
  for name, cfg in (
      ("coop-m", None),
      ("coop-n", coop_n),
      ("pingpong", ping),
      ("cluster21", GemmConfig(cluster=(2, 1))),
      ("cluster12", GemmConfig(cluster=(1, 2))),
      ("ping-cluster21", dataclasses.replace(ping, cluster=(2, 1))),
      ("whole-epi", GemmConfig(stages=3, epilogue_tile=None)),
      ("along_m", GemmConfig(raster="along_m", group=4)),
  ):
    checks.append(Check(f"NN {name} 1024x2048x512", (1024, 512), (512, 2048), dict(config=cfg)))
    checks.append(
        Check(
            f"TT {name} 520x1000x1056",
            (1056, 520),
            (1000, 1056),
            dict(
                transpose_a=True,
                transpose_b=True,
                config=None
                if cfg is None
                else (
                    dataclasses.replace(cfg, wg_split="n") if cfg.schedule == "cooperative" else cfg
                ),
            ),
        )
    )
  # Three consumer warpgroups (`GemmConfig.consumers`): 192x96 tiles, 64 rows each, as
  # cuBLAS runs 1536^3 (partial edge tiles, a 1x2 cluster, the tail split's partial
  # sums per warpgroup, an epilogue, B stored (N, K), and a split along N).
  c3 = GemmConfig(tile_m=192, tile_n=96, consumers=3, stages=5, epilogue_tile=(64, 32))
  checks += [
      Check("NN consumers3 1536x1536x1536", (1536, 1536), (1536, 1536), dict(config=c3)),
      Check(
          "NN consumers3 cluster12 1000x1016x1000",
          (1000, 1000),
          (1000, 1016),
          dict(config=dataclasses.replace(c3, cluster=(1, 2))),
      ),
      Check(  # 14 x 22 = 308 tiles on 132 SMs: 2 whole waves, 44 tiles in 3 slices of 16
          "NN consumers3 splittail 2688x2112x3072",
          (2688, 3072),
          (3072, 2112),
          dict(config=dataclasses.replace(c3, stream_k=True, split_tail=True)),
      ),
      Check(
          "NT consumers3 bias+gelu 777x1000x520",
          (777, 520),
          (1000, 520),
          dict(transpose_b=True, bias=True, activation="gelu_tanh", config=c3),
      ),
      Check(  # the default's pick (`heuristics.WAVE_TILE`): one wave of 8 x 16 tiles
          "NN consumers3 default rowbias+bias+gelu+residual 1536x1500x1000",
          (1536, 1000),
          (1000, 1500),
          dict(bias=True, row_bias=True, residual="bfloat16", activation="gelu_tanh"),
      ),
      Check(  # the default's pick again: 6 x 22 tiles, f16, f32 output, beta * c
          "NT consumers3 default f16 f32-out c+residual 1152x2000x700",
          (1152, 700),
          (2000, 700),
          dict(transpose_b=True, out_dtype="float32", beta=0.5, residual="float16"),
          dtype="float16",
          c_shape=(1152, 2000),
      ),
      Check(
          "NN consumers3 split-n 64x192 500x1000x700",
          (500, 700),
          (700, 1000),
          dict(config=GemmConfig(tile_m=64, tile_n=192, consumers=3, wg_split="n", stages=6)),
      ),
  ]
  # Stream-K (the last wave split over all SMs at K-step granularity, reduced in the kernel):
  # one contributor per tile, two (fewer tiles than SMs), single-step ranges and idle SMs.
  sk = GemmConfig(stream_k=True)
  sk21, sk_n = dataclasses.replace(sk, cluster=(2, 1)), dataclasses.replace(sk, wg_split="n")
  tail = dataclasses.replace(sk, split_tail=True)
  checks += [
      Check("NN streamk cluster21 4096x8192x4096", (4096, 4096), (4096, 8192), dict(config=sk21)),
      Check("NN streamk cluster21 2048x2048x2048", (2048, 2048), (2048, 2048), dict(config=sk21)),
      Check("NN streamk 2048x2048x128 one-step ranges", (2048, 128), (128, 2048), dict(config=sk)),
      # the tail split: whole waves, then the last wave's tiles in equal K slices
      Check("NN splittail 2304x2112x4096", (2304, 4096), (4096, 2112), dict(config=tail)),
      Check(
          "NN splittail cluster21 2304x2112x4096",
          (2304, 4096),
          (4096, 2112),
          dict(config=dataclasses.replace(tail, cluster=(2, 1))),
      ),
      Check(  # 32 tiles, 25 K steps: each tile in 2 slices (>= 12 steps each)
          "NN splittail bias+gelu 1000x1016x1600 (one partial wave)",
          (1000, 1600),
          (1600, 1016),
          dict(bias=True, activation="gelu_tanh", config=tail),
      ),
      Check(
          "NN streamk bias+gelu 1000x1016x1000",
          (1000, 1000),
          (1000, 1016),
          dict(bias=True, activation="gelu_tanh", config=sk),
      ),
      Check(
          "TT streamk batch3 300x264x200",
          (3, 200, 300),
          (3, 264, 200),
          dict(transpose_a=True, transpose_b=True, config=sk_n),
      ),
      Check(
          "NT streamk f32 out c+rowbias+residual 1000x1016x1000",
          (1000, 1000),
          (1016, 1000),
          dict(
              transpose_b=True,
              out_dtype="float32",
              beta=0.5,
              row_bias=True,
              residual="bfloat16",
              config=dataclasses.replace(sk, stages=2, epilogue_tile=(64, 32)),
          ),
          c_shape=(1000, 1016),
      ),
      Check(
          "NT streamk return_pre bias+gelu 1000x1016x520",
          (1000, 520),
          (1016, 520),
          dict(transpose_b=True, bias=True, activation="gelu_tanh", return_pre=True, config=sk),
      ),
      Check("NN streamk cluster21 8192x8192x8192", (8192, 8192), (8192, 8192), dict(config=sk21)),
  ]
  # Tiny and degenerate shapes (every operand padded), batched and broadcast operands.
  checks += [
      Check("NN 200x136x72", (200, 72), (72, 136)),
      Check("NN 5x1x40", (5, 40), (40, 1)),
      Check("NN 1x300x1", (1, 1), (1, 300)),
      # N of one swizzle span or less under a 256-wide tile (once all wrong: see gemm._box_cols).
      Check("NN 256x64x512", (256, 512), (512, 64)),
      Check("NN 100x32x96", (100, 96), (96, 32)),
      Check("NT 256x64x512", (256, 512), (64, 512), dict(transpose_b=True)),
      Check("TT 64x64x64", (64, 64), (64, 64), dict(transpose_a=True, transpose_b=True)),
      Check("NN batch3 300x264x200", (3, 300, 200), (3, 200, 264)),
      Check(
          "TT batch3 300x264x200",
          (3, 200, 300),
          (3, 264, 200),
          dict(transpose_a=True, transpose_b=True),
      ),
      Check("NN a-batched b-2D 2x3x100x200x64", (2, 3, 100, 64), (64, 200)),
      Check("TN a-batched b-2D 3x100x200x64", (3, 64, 100), (64, 200), dict(transpose_a=True)),
  ]
  # Epilogues.
  for act in ("relu", "gelu_tanh", "gelu_exact", "silu", "sigmoid"):
    checks.append(
        Check(
            f"NN bias+{act} 1000x1016x1000",
            (1000, 1000),
            (1000, 1016),
            dict(bias=True, activation=act),
        )
    )
  checks += [
      Check(
          "NN alpha,beta*c+bias+gelu 1000x1016x1000",
          (1000, 1000),
          (1000, 1016),
          dict(bias=True, activation="gelu_tanh", alpha=0.5, beta=-1.5),
          c_shape=(1000, 1016),
      ),
      Check(
          "NT f32 out alpha*ab+beta*c 1000x1016x1000",
          (1000, 1000),
          (1016, 1000),
          dict(transpose_b=True, out_dtype="float32", alpha=2.0, beta=0.25),
          c_shape=(1000, 1016),
      ),
      Check("NN f32 out 4000x8000x4000", (4000, 4000), (4000, 8000), dict(out_dtype="float32")),
      Check("NN 4000x8000x4000", (4000, 4000), (4000, 8000)),
      Check("NN 4096x8192x4096", (4096, 4096), (4096, 8192)),
      Check(
          "NN batch2 f16 c(2D) 512x768x640",
          (2, 512, 640),
          (2, 640, 768),
          dict(beta=1.0),
          dtype="float16",
          c_shape=(512, 768),
      ),
  ]
  # fp8 and tf32 operands: K-major (NT) natively, other layouts through an XLA transpose.
  for dtype in ("float8_e4m3fn", "float8_e5m2", "float32"):
    checks += [
        Check(
            f"NT {dtype} 1000x1016x1024",
            (1000, 1024),
            (1016, 1024),
            dict(transpose_b=True),
            dtype=dtype,
        ),
        Check(f"NN {dtype} 1000x1016x1000", (1000, 1000), (1000, 1016), dtype=dtype),
        Check(
            f"TT {dtype} 520x1000x1056",
            (1056, 520),
            (1000, 1056),
            dict(transpose_a=True, transpose_b=True),
            dtype=dtype,
        ),
    ]
  checks += [
      Check(
          "NT e4m3xe5m2 1000x1016x1024",
          (1000, 1024),
          (1016, 1024),
          dict(transpose_b=True),
          dtype="float8_e4m3fn",
          b_dtype="float8_e5m2",
      ),
      Check(
          "NT e4m3 out e4m3 scale0.25 1000x1016x1024",
          (1000, 1024),
          (1016, 1024),
          dict(transpose_b=True, out_dtype="float8_e4m3fn", out_scale=0.25),
          dtype="float8_e4m3fn",
      ),
      Check(
          "NT e4m3 out e5m2 bias+relu 1000x1016x1024",
          (1000, 1024),
          (1016, 1024),
          dict(
              transpose_b=True, out_dtype="float8_e5m2", bias=True, activation="relu", out_scale=4.0
          ),
          dtype="float8_e4m3fn",
      ),
      Check(
          "NN bf16 out e4m3 scale 1000x1016x1000",
          (1000, 1000),
          (1000, 1016),
          dict(out_dtype="float8_e4m3fn", out_scale=0.5),
      ),
      Check(
          "NT e4m3 f32 out 8192x8192x8192",
          (8192, 8192),
          (8192, 8192),
          dict(transpose_b=True, out_dtype="float32"),
          dtype="float8_e4m3fn",
      ),
      Check(
          "NT e4m3 8192x8192x8192",
          (8192, 8192),
          (8192, 8192),
          dict(transpose_b=True),
          dtype="float8_e4m3fn",
      ),
      Check(
          "NT f32 4096x8192x4096",
          (4096, 4096),
          (8192, 4096),
          dict(transpose_b=True),
          dtype="float32",
      ),
      # Epilogue extras: row bias, residual after the activation, clamp.
      Check(
          "NN rowbias+bias+gelu+residual+clamp 1000x1016x1000",
          (1000, 1000),
          (1000, 1016),
          dict(
              bias=True,
              row_bias=True,
              residual="bfloat16",
              activation="gelu_tanh",
              clamp=(-0.5, 2.0),
          ),
      ),
      Check(
          "TT f32 out c+rowbias+residual(f32)+clamp 520x1000x1056",
          (1056, 520),
          (1000, 1056),
          dict(
              transpose_a=True,
              transpose_b=True,
              out_dtype="float32",
              alpha=0.5,
              beta=2.0,
              row_bias=True,
              residual="float32",
              clamp=(None, 1.5),
          ),
          c_shape=(520, 1000),
      ),
      Check(
          "NN batch3 pingpong rowbias+residual 300x264x200",
          (3, 300, 200),
          (3, 200, 264),
          dict(
              row_bias=True,
              residual="bfloat16",
              clamp=(-1.0, None),
              config=GemmConfig(schedule="pingpong", tile_m=128, tile_n=128, stages=4),
          ),
      ),
      Check(
          "NN a-batched cluster21 rowbias+residual 2x3x100x200x64",
          (2, 3, 100, 64),
          (64, 200),
          dict(row_bias=True, residual="float32", config=GemmConfig(cluster=(2, 1), stages=2)),
      ),
      Check(
          "NT e4m3 rowbias+residual+silu+clamp 1000x1016x1024",
          (1000, 1024),
          (1016, 1024),
          dict(
              transpose_b=True,
              row_bias=True,
              residual="bfloat16",
              activation="silu",
              clamp=(-3.0, 3.0),
          ),
          dtype="float8_e4m3fn",
      ),
      # y and pre from one epilogue (return_pre: what training saves); pre checked too.
      Check(
          "NT return_pre bias+gelu 1000x1016x520",
          (1000, 520),
          (1016, 520),
          dict(transpose_b=True, bias=True, activation="gelu_tanh", return_pre=True),
      ),
      Check(
          "TN return_pre rowbias+residual+silu+clamp 520x1000x1056 pingpong",
          (1056, 520),
          (1056, 1000),
          dict(
              transpose_a=True,
              row_bias=True,
              residual="bfloat16",
              activation="silu",
              clamp=(-1.0, 2.0),
              return_pre=True,
              config=GemmConfig(schedule="pingpong", tile_n=128, stages=4),
          ),
      ),
  ]
  return (
      checks
      + odd_row_checks()
      + skinny_checks()
      + short_k_checks()
      + split_k_checks()
      + shipped_table_checks()
  )


def odd_row_checks() -> list[Check]:
  """Arrays whose rows are not a multiple of 8 (names contain "rows%8"): TMA copies them
  through a row-wise view of the SMEM tile, unpadded, where the tile's rows are one
  swizzle span (K-major A and B, 16-bit and fp8 epilogue tiles); the rest is still
  padded (MN-major operands, f32 outputs and residuals), side by side in one kernel."""
  odd = (1001, 1000)
  return [
      Check("NN rows%8 1001x1016x1000", odd, (1000, 1016)),
      Check("NT rows%8 A and B 1001x1003x1000", odd, (1003, 1000), dict(transpose_b=True)),
      Check("TT rows%8 output (A MN-major) 1001x1000x1056", (1056, 1001), (1000, 1056),
            dict(transpose_a=True, transpose_b=True)),
      Check("NN rows%8 batch3 77x264x200", (3, 77, 200), (3, 200, 264)),
      Check("NN rows%8 a-batched b-2D 3x13x200x64", (3, 13, 64), (64, 200)),
      Check(
          "NN rows%8 alpha,beta*c+bias+gelu+residual 1001x1016x1000",
          odd,
          (1000, 1016),
          dict(bias=True, activation="gelu_tanh", alpha=0.5, beta=-1.5, residual="bfloat16"),
          c_shape=(1001, 1016),
      ),
      Check(
          "NN rows%8 f32 out+f32 residual (padded) 1001x1016x1000",
          odd,
          (1000, 1016),
          dict(out_dtype="float32", residual="float32", row_bias=True),
      ),
      Check(
          "NT rows%8 return_pre bias+gelu 1001x1016x520",
          (1001, 520),
          (1016, 520),
          dict(transpose_b=True, bias=True, activation="gelu_tanh", return_pre=True),
      ),
      Check("NN rows%8 cluster21 1001x1016x1000", odd, (1000, 1016),
            dict(config=GemmConfig(cluster=(2, 1)))),
      Check("NN rows%8 cluster12 1001x1016x1000", odd, (1000, 1016),
            dict(config=GemmConfig(cluster=(1, 2)))),
      Check("NN rows%8 pingpong 1001x1016x1000", odd, (1000, 1016),
            dict(config=GemmConfig(schedule="pingpong", tile_m=128, tile_n=128, stages=4))),
      Check("NN rows%8 streamk 1001x1016x1000", odd, (1000, 1016),
            dict(config=GemmConfig(stream_k=True))),
      Check("NN rows%8 splitk3 41x136x1000", (41, 1000), (1000, 136),
            dict(config=GemmConfig(tile_m=64, tile_n=128, wg_split="n", split_k=3))),
      Check("NT rows%8 e4m3 1001x1016x1024", (1001, 1024), (1016, 1024),
            dict(transpose_b=True), dtype="float8_e4m3fn"),
      Check("NT rows%8 e4m3 out e4m3 1001x1016x1024", (1001, 1024), (1016, 1024),
            dict(transpose_b=True, out_dtype="float8_e4m3fn", out_scale=0.25),
            dtype="float8_e4m3fn"),
      Check("NN rows%8 12345x1024x768", (12345, 768), (768, 1024)),
  ]  # fmt: skip


def skinny_checks() -> list[Check]:
  """Outputs of N <= 32 columns (names contain "skinny"): the default's 16- or 32-wide
  tile (`heuristics.narrow_tile_n`), the output written unwidened; every layout, odd
  rows and N, epilogues, and the split-K a short M takes."""
  return [
      Check("NN skinny 8192x32x2048", (8192, 2048), (2048, 32)),
      Check("NT skinny 8192x16x2048", (8192, 2048), (16, 2048), dict(transpose_b=True)),
      Check("NT skinny rows%8 1001x16x1000 bias+gelu+residual", (1001, 1000), (16, 1000),
            dict(transpose_b=True, bias=True, activation="gelu_tanh", residual="bfloat16")),
      Check("NT skinny rows%8 1001x16x1000 gelu+residual", (1001, 1000), (16, 1000),
            dict(transpose_b=True, activation="gelu_tanh", residual="bfloat16")),
      Check("NT skinny 8192x16x2048 bias", (8192, 2048), (16, 2048),
            dict(transpose_b=True, bias=True)),
      Check("TN skinny 4096x32x1024 bias", (1024, 4096), (1024, 32),
            dict(transpose_a=True, bias=True)),
      Check("NN skinny 4096x24x1000 f32 out", (4096, 1000), (1000, 24),
            dict(out_dtype="float32")),
      Check("NN skinny 4096x16x2048 alpha,beta*c", (4096, 2048), (2048, 16),
            dict(alpha=0.5, beta=-1.5), c_shape=(4096, 16)),
      Check("TN skinny 4096x32x1024", (1024, 4096), (1024, 32), dict(transpose_a=True)),
      Check("TT skinny 4096x16x1024", (1024, 4096), (16, 1024),
            dict(transpose_a=True, transpose_b=True)),
      Check("NT skinny 256x16x8192 (split-K)", (256, 8192), (16, 8192), dict(transpose_b=True)),
      Check("NT skinny batch4 512x8x512", (4, 512, 512), (4, 8, 512), dict(transpose_b=True)),
      Check("NT skinny e4m3 8192x16x1024", (8192, 1024), (16, 1024), dict(transpose_b=True),
            dtype="float8_e4m3fn"),
      Check("NN skinny f32 4096x16x1024", (4096, 1024), (1024, 16), dtype="float32"),
  ]  # fmt: skip


def short_k_checks() -> list[Check]:
  """K <= 128 (names contain "short_k"): the default stores each warpgroup tile at once
  (`heuristics.short_k_stores`); every layout, a batch, odd extents, epilogues, and the
  cases that keep 64x64 chunks (a residual, f32 out) beside them."""
  return [
      Check("NN short_k 4097x3001x96", (4097, 96), (96, 3001)),
      Check("NT short_k batch16 1000x1016x64", (16, 1000, 64), (16, 1016, 64),
            dict(transpose_b=True)),
      Check("TN short_k 2000x3000x128 bias+gelu", (128, 2000), (128, 3000),
            dict(transpose_a=True, bias=True, activation="gelu_tanh")),
      Check("TT short_k 3000x2000x72 alpha,beta*c", (72, 3000), (2000, 72),
            dict(transpose_a=True, transpose_b=True, alpha=0.5, beta=-1.5),
            c_shape=(3000, 2000)),
      Check("NN short_k rows%8 1001x2048x64 f16", (1001, 64), (64, 2048), dtype="float16"),
      Check("NN short_k 4096x4096x64 residual (chunks)", (4096, 64), (64, 4096),
            dict(residual="bfloat16")),
      Check("NN short_k 4096x4096x64 f32 out (chunks)", (4096, 64), (64, 4096),
            dict(out_dtype="float32")),
  ]  # fmt: skip


def split_k_checks() -> list[Check]:
  """Split-K (names contain "splitk"): decode shapes, every layout, K tails whose
  last slice has whole tile_k steps past K (TMA zero fill of fully out-of-bounds
  boxes), batches with the XLA epilogue, clusters, fp8, and the defaults."""
  decode = GemmConfig(tile_m=64, tile_n=128, wg_split="n", stages=8, epilogue_tile=(64, 32))
  with_split = lambda s, **kw: dataclasses.replace(decode, split_k=s, **kw)
  return [
      Check("NN splitk4 decode 1x4096x4096", (1, 4096), (4096, 4096), dict(config=with_split(4))),
      Check(
          "NN splitk3 40x136x1000 bias+gelu (2 steps past K)",
          (40, 1000),
          (1000, 136),
          dict(config=with_split(3), bias=True, activation="gelu_tanh"),
      ),
      Check(
          "NT splitk6 64x1024x8192 silu",
          (64, 8192),
          (1024, 8192),
          dict(config=with_split(6), transpose_b=True, activation="silu"),
      ),
      Check(
          "TT splitk8 16x1024x8192",
          (8192, 16),
          (1024, 8192),
          dict(config=with_split(8), transpose_a=True, transpose_b=True),
      ),
      Check(
          "TN splitk default 128x128x65536 (dW-like)",
          (65536, 128),
          (65536, 128),
          dict(transpose_a=True, out_dtype="float32"),
      ),
      Check(
          "NN splitk4 batch2 c+rowbias+residual f32 out 72x136x700",
          (2, 72, 700),
          (2, 700, 136),
          dict(
              config=GemmConfig(tile_n=128, split_k=4, epilogue_tile=(64, 32)),
              alpha=0.5,
              beta=-1.5,
              row_bias=True,
              residual="bfloat16",
              activation="relu",
              out_dtype="float32",
          ),
          c_shape=(72, 136),
      ),
      Check("NN splitk default cluster21 256x512x32768", (256, 32768), (32768, 512)),
      Check("NN splitk default decode 16x1024x8192", (16, 8192), (8192, 1024)),
      Check("NN splitk default 64x4096x4096", (64, 4096), (4096, 4096)),
      Check(
          "NT e4m3 splitk4 64x1024x8192",
          (64, 8192),
          (1024, 8192),
          dict(transpose_b=True, config=with_split(4, tile_k=128, stages=4)),
          dtype="float8_e4m3fn",
      ),
  ]


def shipped_table_checks() -> list[Check]:
  """Every config of the shipped tuning table (names contain "shipped"), run
  explicitly at the M it was tuned for and at the smallest M within its reach
  (`tuning_cache.packaged_config`) or below, so a tuned winner is never trusted for
  speed alone. Only NN bf16 entries without epilogues are shipped today."""
  from pallas_gemm import tuning_cache

  found = []
  for record in tuning_cache.TuningCache(tuning_cache.PACKAGED_PATH).records().values():
    p = record.key.problem
    assert not (p.transpose_a or p.transpose_b or p.has_bias or p.has_c or p.batch > 1), p
    smallest = next(
        m for m in range(1, p.m + 1) if p.m <= max(16, tuning_cache.PACKAGED_M_REACH * m)
    )
    for m in sorted({smallest, p.m}):
      found.append(
          Check(
              f"NN shipped {m}x{p.n}x{p.k} (tuned at M={p.m})",
              (m, p.k),
              (p.k, p.n),
              dict(config=record.config),
              dtype=p.dtype,
          )
      )
  return found


def _poison(nbytes: int):
  buf = jnp.full((nbytes // 4 + 1,), jnp.nan, jnp.float32)
  buf.block_until_ready()
  del buf


def _reference(a, b, check: Check, bias, c, row_bias=None, residual=None):
  kw = check.kwargs
  flops = (
      2
      * np.prod(a.shape[:-2] or (1,))
      * a.shape[-1]
      * a.shape[-2]
      * (b.shape[-2] if kw.get("transpose_b") else b.shape[-1])
  )
  alpha, beta = kw.get("alpha", 1.0), kw.get("beta", 0.0)
  if flops > 2**31:  # f32 on the GPU: exact products of bf16/f16, f32 sums
    f = jax.jit(
        lambda a, b: jnp.matmul(
            jnp.swapaxes(a, -1, -2) if kw.get("transpose_a") else a,
            jnp.swapaxes(b, -1, -2) if kw.get("transpose_b") else b,
            precision=jax.lax.Precision.HIGHEST,
            preferred_element_type=jnp.float32,
        )
    )
    acc = np.asarray(f(a.astype(jnp.float32), b.astype(jnp.float32)), np.float64)
  else:
    a64 = np.asarray(a.astype(jnp.float32), np.float64)
    b64 = np.asarray(b.astype(jnp.float32), np.float64)
    a64 = np.swapaxes(a64, -1, -2) if kw.get("transpose_a") else a64
    b64 = np.swapaxes(b64, -1, -2) if kw.get("transpose_b") else b64
    acc = np.matmul(a64, b64)
  y = alpha * acc
  if c is not None and beta != 0.0:
    y = y + beta * np.asarray(c, np.float64)
  if bias is not None:
    y = y + np.asarray(bias, np.float64)
  if row_bias is not None:
    y = y + np.asarray(row_bias, np.float64)[:, None]
  act = kw.get("activation")
  if act == "relu":
    y = np.maximum(y, 0)
  elif act == "gelu_tanh":
    y = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
  elif act == "gelu_exact":
    from math import erf

    y = 0.5 * y * (1 + np.vectorize(erf)(y / np.sqrt(2)))
  elif act == "silu":
    y = y / (1 + np.exp(-y))
  elif act == "sigmoid":
    y = 1 / (1 + np.exp(-y))
  if residual is not None:
    y = y + np.asarray(residual.astype(jnp.float32), np.float64)
  lo, hi = kw.get("clamp") or (None, None)
  y = y if lo is None else np.maximum(y, lo)
  y = y if hi is None else np.minimum(y, hi)
  out_dtype = kw.get("out_dtype") or (
      "bfloat16" if check.dtype.startswith("float8") else check.dtype
  )
  if out_dtype.startswith("float8"):
    fp8_max = float(jnp.finfo(out_dtype).max)
    y = np.clip(y * kw.get("out_scale", 1.0), -fp8_max, fp8_max)
  return y


def run_check(check: Check, seed: int, export_only: bool = False) -> dict:
  keys = jax.random.split(jax.random.key(seed), 6)
  a = jax.random.normal(keys[0], check.a_shape, jnp.float32).astype(check.dtype)
  b = jax.random.normal(keys[1], check.b_shape, jnp.float32).astype(check.b_dtype or check.dtype)
  kw = dict(check.kwargs)
  out_dtype = kw.get("out_dtype") or (
      "bfloat16" if check.dtype.startswith("float8") else check.dtype
  )
  n = check.b_shape[-2] if kw.get("transpose_b") else check.b_shape[-1]
  m = check.a_shape[-1] if kw.get("transpose_a") else check.a_shape[-2]
  lead = check.a_shape[:-2] or check.b_shape[:-2]
  bias = jax.random.normal(keys[2], (n,), jnp.float32) if kw.pop("bias", False) else None
  c = (
      jax.random.normal(keys[3], check.c_shape, jnp.float32).astype(out_dtype)
      if check.c_shape
      else None
  )
  row_bias = jax.random.normal(keys[4], (m,), jnp.float32) if kw.pop("row_bias", False) else None
  res_dtype = kw.pop("residual", None)
  residual = (
      jax.random.normal(keys[5], (*lead, m, n), jnp.float32).astype(res_dtype)
      if res_dtype
      else None
  )
  entry = kernel_matmul if kw.get("return_pre") else matmul  # the public matmul has no pre
  fn = jax.jit(
      lambda a, b, bias, c, rb, res: entry(
          a, b, bias=bias, c=c, row_bias=rb, residual=res, implementation="pallas", **kw
      )
  )
  args = (a, b, bias, c, row_bias, residual)
  if export_only:  # CPU dry run: lower for CUDA, run nothing
    jax.export.export(fn, platforms=["cuda"])(*args)
    return dict(name=check.name, ok=True, exported=True)
  t0 = time.time()
  fn.lower(*args).compile()
  compile_s = time.time() - t0
  _poison(8 * m * n * int(np.prod(lead or (1,))) + (1 << 20))
  out = fn(*args)
  ref = _reference(
      a, b, dataclasses.replace(check, kwargs=dict(check.kwargs)), bias, c, row_bias, residual
  )
  if kw.get("return_pre"):  # check pre like an output, y below
    out, pre = out
    affine = {key: v for key, v in check.kwargs.items() if key not in ("activation", "clamp")}
    pre_ref = _reference(a, b, dataclasses.replace(check, kwargs=affine), bias, c, row_bias)
    pre = np.asarray(pre.astype(jnp.float32), np.float64)
    pre_err = float(
        np.linalg.norm(np.nan_to_num(pre - pre_ref, nan=1e30)) / max(np.linalg.norm(pre_ref), 1e-30)
    )
  out = np.asarray(out.astype(jnp.float32), np.float64)
  nan = int(np.isnan(out).sum())
  err = float(np.linalg.norm(np.nan_to_num(out - ref, nan=1e30)) / max(np.linalg.norm(ref), 1e-30))
  limit = bound(out_dtype, check.dtype)
  ok = nan == 0 and err <= limit and out.shape == ref.shape
  result = dict(
      name=check.name,
      ok=bool(ok),
      rel_err=err,
      nan=nan,
      shape=list(out.shape),
      compile_s=round(compile_s, 2),
      bound=limit,
  )
  if kw.get("return_pre"):
    result.update(pre_rel_err=pre_err, ok=bool(ok and pre_err <= limit))
  if (
      check.dtype.startswith("float8")
      and check.b_dtype is None
      and not kw.get("residual")
      and (out_dtype == "float32" and len(check.a_shape) == 2)
  ):  # XLA's fp8 dot, same inputs
    ta, tb = kw.get("transpose_a", False), kw.get("transpose_b", False)
    xla = jax.jit(
        lambda a, b: jax.lax.dot_general(
            a,
            b,
            (((0 if ta else 1,), (1 if tb else 0,)), ((), ())),
            preferred_element_type=jnp.float32,
        )
    )(a, b)
    xla = np.asarray(xla, np.float64)
    result["xla_rel_err"] = float(np.linalg.norm(xla - ref) / np.linalg.norm(ref))
  return result


def correctness(log, export_only=False, only=None) -> list[dict]:
  results = []
  for i, check in enumerate(checks()):
    if only and not any(word in check.name for word in only):
      continue
    try:
      r = run_check(check, seed=1000 + i, export_only=export_only)
    except Exception as e:
      r = dict(name=check.name, ok=False, error=f"{type(e).__name__}: {e}"[:2000])
      traceback.print_exc()
    results.append(r)
    log(("PASS " if r["ok"] else "FAIL ") + json.dumps(r))
  return results


SWEEP = {
    "C0 128x256 s4 coop-m": GemmConfig(),
    "C1 +cluster21": GemmConfig(cluster=(2, 1)),
    "C2 +cluster12": GemmConfig(cluster=(1, 2)),
    "C3 s3 whole-epi": GemmConfig(stages=3, epilogue_tile=None),
    "C4 pingpong 128x128 s6": GemmConfig(schedule="pingpong", tile_m=128, tile_n=128, stages=6),
    "C5 pingpong cluster21": GemmConfig(
        schedule="pingpong", tile_m=128, tile_n=128, stages=6, cluster=(2, 1)
    ),
    "C6 group16": GemmConfig(group=16),
    "C7 along_m g8": GemmConfig(raster="along_m"),
    "C8 256x128 coop-m": GemmConfig(tile_m=256, tile_n=128),
    "C9 cluster21 group16": GemmConfig(cluster=(2, 1), group=16),
    "C12 pingpong s4 whole-epi cluster21": GemmConfig(
        schedule="pingpong", tile_m=128, tile_n=128, stages=4, epilogue_tile=None, cluster=(2, 1)
    ),
    "C13 pingpong cluster12": GemmConfig(
        schedule="pingpong", tile_m=128, tile_n=128, stages=6, cluster=(1, 2)
    ),
    "C10 cluster21 s3 whole-epi": GemmConfig(cluster=(2, 1), stages=3, epilogue_tile=None),
    "C11 cluster21 s3 epi64x128": GemmConfig(cluster=(2, 1), stages=3, epilogue_tile=(64, 128)),
}


def timing(log, quick: bool, sweep_names=None) -> list[dict]:
  sweep = {k: v for k, v in SWEEP.items() if sweep_names is None or k.split()[0] in sweep_names}
  shapes = (
      [(4096, 8192, 4096)]
      if quick
      else [(4096, 8192, 4096), (8192, 8192, 8192), (4096, 4096, 4096)]
  )
  cases = [harness.Case(m, n, k) for m, n, k in shapes]
  if not quick:
    cases += [harness.Case(4096, 8192, 4096, layout=l) for l in ("NT", "TN", "TT")]
    cases += [harness.Case(4096, 8192, 4096, epilogue="bias_gelu"), harness.Case(4000, 8000, 4000)]

  def contenders(case):
    fns = {"pallas_gemm": harness.pallas_fn(case)}  # the default (heuristic) config
    for name, cfg in sweep.items():
      if case.transpose_a and cfg.schedule == "cooperative":
        cfg = dataclasses.replace(cfg, wg_split="n")
      fns[f"pallas_best[{name}]"] = harness.pallas_fn(case, cfg)
    fns["xla"] = harness.xla_fn(case)
    fns.update(harness.jax_mgpu_fns(case))
    return fns

  return harness.run_cases(cases, contenders, rounds=3, iterations=10, log=log)


def timing_dtypes(log) -> list[dict]:
  """fp8 and tf32: our kernel (K-major operands, and NN with its XLA transpose of B)
  against XLA's own fp8 / tf32 GEMM on the same stored operands."""
  cases = [
      harness.Case(8192, 8192, 8192, "float8_e4m3fn", "NT"),
      harness.Case(8192, 8192, 8192, "float8_e4m3fn", "NN"),
      harness.Case(4096, 8192, 4096, "float8_e4m3fn", "NT"),
      harness.Case(4096, 8192, 4096, "float32", "NT"),
      harness.Case(4096, 8192, 4096, "float32", "NN"),
  ]

  def contenders(case):
    return {"pallas_gemm": harness.pallas_fn(case), "xla": harness.xla_fn(case)}

  return harness.run_cases(cases, contenders, rounds=3, iterations=10, log=log)


EXPERIMENTS = {
    # name: (config, extra compiler params); each is timed in every round (no family pruning).
    "exp-noautobar": (None, dict(unsafe_no_auto_barriers=True)),
    "exp-tk128-s2": (GemmConfig(cluster=(2, 1), tile_k=128, stages=2), {}),
    "exp-group4": (GemmConfig(cluster=(2, 1), group=4), {}),
    "exp-group2": (GemmConfig(cluster=(2, 1), group=2), {}),
    # cuBLAS (nvjet) runs 128x160 tiles with 5 stages at 4096x8192x4096 (ncu, NOTES exp. 20):
    # more stages and narrower tiles than our default.
    "exp-n192-s5": (GemmConfig(cluster=(2, 1), tile_n=192, stages=5, epilogue_tile=(64, 32)), {}),
    "exp-n128-s6": (GemmConfig(cluster=(2, 1), tile_n=128, stages=6), {}),
    "exp-epi64x32": (GemmConfig(cluster=(2, 1), epilogue_tile=(64, 32)), {}),
    "exp-nocluster": (GemmConfig(), {}),
    "exp-along-m": (GemmConfig(cluster=(2, 1), raster="along_m"), {}),
    # All three shapes run 15.5, 7.8 or 3.9 waves of 128x256 tiles on 132 SMs (NOTES exp. 31).
    "exp-streamk": (GemmConfig(cluster=(2, 1), stream_k=True), {}),
}
"""Performance experiments of NOTES.md (issue 4), timed next to the default, XLA and jax."""


def with_compiler_params(fn, params):
  """Runs `fn` with extra compiler params in force while it is traced."""
  from pallas_gemm import hopper_gemm

  def wrapped(*args):
    saved = dict(hopper_gemm.EXPERIMENT_COMPILER_PARAMS)
    hopper_gemm.EXPERIMENT_COMPILER_PARAMS.update(params)
    try:
      return fn(*args)
    finally:
      hopper_gemm.EXPERIMENT_COMPILER_PARAMS.clear()
      hopper_gemm.EXPERIMENT_COMPILER_PARAMS.update(saved)

  return wrapped


def timing_experiments(log, names=None) -> list[dict]:
  cases = [
      harness.Case(m, n, k)
      for m, n, k in ((4096, 8192, 4096), (8192, 8192, 8192), (4096, 4096, 4096))
  ]

  def contenders(case):
    fns = {"pallas_gemm": harness.pallas_fn(case)}
    for name, (cfg, params) in EXPERIMENTS.items():
      if names and name not in names:
        continue
      fn = harness.pallas_fn(case, cfg)
      fns[name] = with_compiler_params(fn, params) if params else fn
    fns["xla"] = harness.xla_fn(case)
    fns.update(harness.jax_mgpu_fns(case))
    return fns

  return harness.run_cases(cases, contenders, rounds=3, iterations=10, log=log)


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--skip-correctness", action="store_true")
  parser.add_argument("--skip-timing", action="store_true")
  parser.add_argument("--quick", action="store_true", help="timing at 4096x8192x4096 only")
  parser.add_argument("--sweep", default=None, help="comma list of sweep ids (C0,C1,..)")
  parser.add_argument(
      "--only", default=None, help="comma list: run correctness cases whose name contains one"
  )
  parser.add_argument("--dtypes", action="store_true", help="time fp8/tf32 against XLA")
  parser.add_argument(
      "--experiments", default=None, help="comma list of EXPERIMENTS names, or 'all'"
  )
  parser.add_argument(
      "--export-only",
      action="store_true",
      help="CPU dry run: lower every correctness case for CUDA, time nothing",
  )
  args = parser.parse_args(argv)
  out_dir = os.environ.get("OUT", "out")
  log = harness.file_logger("device_check.log")

  env = harness.environment()
  log(json.dumps(env))
  results = dict(environment=env)
  if not args.skip_correctness:
    results["correctness"] = correctness(log, args.export_only, args.only and args.only.split(","))
  if args.dtypes:
    results["timing_dtypes"] = timing_dtypes(log)
  if args.experiments:
    names = None if args.experiments == "all" else args.experiments.split(",")
    results["timing_experiments"] = timing_experiments(log, names)
  if not args.skip_timing:
    results["timing"] = timing(log, args.quick, args.sweep and args.sweep.split(","))
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  if "correctness" in results:
    bad = [r["name"] for r in results["correctness"] if not r["ok"]]
    log(
        f"correctness: {len(results['correctness']) - len(bad)}/{len(results['correctness'])} passed"
        + (f"; FAILED: {bad}" if bad else "")
    )
  log(f"{env['device']}, jax {env['jax']}, {env['method']}")
  if "timing_dtypes" in results:
    log(harness.format_table(results["timing_dtypes"]))
  if "timing_experiments" in results:
    log(harness.format_table(results["timing_experiments"], ours=("pallas_gemm", *EXPERIMENTS)))
  if "timing" in results:
    log(harness.format_table(results["timing"]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
