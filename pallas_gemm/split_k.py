"""Split-K: when few output tiles leave SMs idle, cut K into slices as well.

The kernel runs every (K slice, output tile) pair as a work unit of its own
(`GemmConfig.split_k`; the slices are an extra batch dimension of the
persistent tile loop, and each slice's K offset is applied where the producer
issues its TMA loads, so no operand is copied in any layout). It writes f32
partial sums of shape (splits * batch, M, N); `reduce` adds them and applies
the epilogue in XLA (one fusion: the sum, `epilogue.apply`, the cast).

Whether to split is decided by `choose`, a small time model of the kernel on
an H100 (numbers from NOTES.md): per-SM tensor-core rate, per-CTA operand
intake (at most its bytes in flight over latency), the time to stream the
unique bytes from HBM (fitted to measured decode GEMMs), a fixed cost per tile, and the partial sums' extra traffic plus the XLA
reduction. It picks the split count with the least predicted time, and only
splits when that beats no split by `MIN_GAIN`.

>>> from pallas_gemm.config import GemmProblem
>>> choose(GemmProblem(m=16, n=1024, k=8192), tile_m=64, tile_n=128, tile_k=64, stages=8)
16
>>> choose(GemmProblem(m=8192, n=8192, k=8192), tile_m=128, tile_n=256, tile_k=64, stages=4)
1
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from pallas_gemm.config import GemmProblem, tiles

PEAK_FLOPS = 989e12
"""H100 SXM dense bf16 tensor-core peak (FLOP/s); fp8 doubles it, tf32 halves it."""

MAIN_LOOP_EFFICIENCY = 0.87
"""Measured k-step rate of the main loop as a fraction of the peak (NOTES.md exp. 6)."""

HBM_BYTES_PER_S = 3.0e12
"""Achievable HBM3 bandwidth (3.35 TB/s spec)."""

SM_BYTES_PER_S = 80e9
"""Most one CTA takes in through TMA per second (~45 B/clk at 1.8 GHz), L2 hits included:
the bound of the loaded (not unique) bytes; with it the model reproduces 4096^3 and 8192^3."""

CTA_HBM_BYTES_PER_S = 56e9
STREAM_BYTES_PER_S = 5.0e12
"""Streaming the unique bytes from HBM with u CTAs pulling: time = unique / u / CTA_HBM +
unique / STREAM, an aggregate rate that keeps rising with u. Fitted to the H100's decode
runs (2026-11-22, NOTES.md exps. 25-26): 1.32 TB/s with 32 CTAs, 2.02 with 64, 2.4 with 96,
2.96 with 128. (The first model, a fixed intake per CTA under a hard 3.0 TB/s cap, split
decode GEMMs too little: it saw no gain past ~100 CTAs.)"""

LOAD_LATENCY_S = 1.0e-6
"""Loaded HBM latency; an SM's intake is at most its bytes in flight per latency."""

FIXED_S_PER_TILE = 1.35e-6
"""Per-tile cost outside the k-steps (pipeline fill, epilogue): NOTES.md exp. 6."""

REDUCE_FIXED_S = 2.0e-6
"""The extra XLA reduction kernel's own fixed cost (launch, tail)."""

MIN_GAIN = 0.9
"""Split only if the predicted time is below this fraction of the unsplit one."""

MIN_STEPS_PER_SLICE = 4
"""A K slice is at least this many tile_k steps (fixed costs stay amortized)."""


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Predicted seconds of one split count, and what bounds it."""

  split_k: int
  seconds: float
  bound: str  # "compute", "sm intake", "hbm"


def estimate(
    problem: GemmProblem,
    split_k: int,
    *,
    tile_m: int,
    tile_n: int,
    tile_k: int,
    stages: int,
    num_sms: int = 132,
    hbm_scale: float = 1.0,
) -> Estimate:
  """The time model for one split count (see the module docstring); `hbm_scale`
  multiplies the HBM rates (the board's bandwidth over the H100 SXM's).

  >>> e = estimate(GemmProblem(m=1, n=8192, k=8192), 1, tile_m=64, tile_n=128, tile_k=64,
  ...              stages=6)
  >>> e.bound, round(e.seconds * 1e6, 1)  # measured unsplit (8 stages): 66.4 us
  ('hbm', 65.7)
  """
  in_bytes = _itemsize(problem.dtype)
  steps = tiles(problem.k, tile_k)
  k_iters = tiles(steps, split_k)
  splits = tiles(steps, k_iters)
  m_tiles, n_tiles = tiles(problem.m, tile_m), tiles(problem.n, tile_n)
  units = problem.batch * m_tiles * n_tiles * splits
  waves = tiles(units, num_sms)
  peak = PEAK_FLOPS * 2 / in_bytes if in_bytes != 2 else PEAK_FLOPS
  compute = waves * 2 * tile_m * tile_n * tile_k * k_iters / (peak * MAIN_LOOP_EFFICIENCY / num_sms)
  # TMA zero-fills rows past M and columns past N without reading memory.
  rows, cols = min(tile_m, problem.m), min(tile_n, problem.n)
  stage_bytes = (rows + cols) * tile_k * in_bytes
  intake = min(SM_BYTES_PER_S, stages * stage_bytes / LOAD_LATENCY_S)
  feed = waves * k_iters * stage_bytes / intake
  out_bytes = (
      problem.batch * problem.m * problem.n * (4 if splits > 1 else _itemsize(problem.out_dtype))
  )
  unique = problem.batch * (problem.m + problem.n) * problem.k * in_bytes + splits * out_bytes
  active = min(units, num_sms)
  hbm = (unique / (active * CTA_HBM_BYTES_PER_S) + unique / STREAM_BYTES_PER_S) / hbm_scale
  seconds, bound = max((compute, "compute"), (feed, "sm intake"), (hbm, "hbm"))
  seconds += waves * FIXED_S_PER_TILE
  if splits > 1:
    final = problem.batch * problem.m * problem.n * _itemsize(problem.out_dtype)
    seconds += REDUCE_FIXED_S + (splits * out_bytes + final) / (HBM_BYTES_PER_S * hbm_scale)
  return Estimate(splits, seconds, bound)


def choose(
    problem: GemmProblem,
    *,
    tile_m: int,
    tile_n: int,
    tile_k: int,
    stages: int,
    num_sms: int = 132,
    hbm_scale: float = 1.0,
) -> int:
  """The split count `estimate` predicts fastest (1 unless it gains `MIN_GAIN`).

  Tried: every count up to one wave of work units, each slice keeping at
  least `MIN_STEPS_PER_SLICE` steps.
  """
  kw = dict(
      tile_m=tile_m,
      tile_n=tile_n,
      tile_k=tile_k,
      stages=stages,
      num_sms=num_sms,
      hbm_scale=hbm_scale,
  )
  best = best_split(problem, **kw)
  if best is None or best.seconds > MIN_GAIN * estimate(problem, 1, **kw).seconds:
    return 1
  return best.split_k


def best_split(
    problem: GemmProblem,
    *,
    tile_m: int,
    tile_n: int,
    tile_k: int,
    stages: int,
    num_sms: int = 132,
    hbm_scale: float = 1.0,
) -> Estimate | None:
  """The fastest predicted split count >= 2 (None if K or the tile count allows none)."""
  steps = tiles(problem.k, tile_k)
  mn_tiles = problem.batch * tiles(problem.m, tile_m) * tiles(problem.n, tile_n)
  most = min(num_sms // mn_tiles, steps // MIN_STEPS_PER_SLICE)
  kw = dict(
      tile_m=tile_m,
      tile_n=tile_n,
      tile_k=tile_k,
      stages=stages,
      num_sms=num_sms,
      hbm_scale=hbm_scale,
  )
  return min(
      (estimate(problem, s, **kw) for s in range(2, most + 1)),
      key=lambda e: e.seconds,
      default=None,
  )


def sum_partials(partials, splits: int):
  """Sums the kernel's (splits * batch, M, N) f32 partials (slice-major) to (batch, M, N).

  >>> sum_partials(jnp.ones((3, 2, 2), jnp.float32), 3).tolist()  # 3 slices of a 2x2 output
  [[[3.0, 3.0], [3.0, 3.0]]]
  """
  return partials.reshape(splits, -1, *partials.shape[-2:]).sum(axis=0)


def _itemsize(dtype: str) -> int:
  return jnp.dtype(dtype).itemsize
