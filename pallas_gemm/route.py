"""Which implementation runs a GEMM when the caller leaves it to the library.

`matmul(..., implementation=None)` runs the Pallas kernel on a Hopper GPU, except
where the kernel cannot win, measured (issue 16, H100 and H200, against `jnp.dot`):

- K below one 64-deep K step (4096x4096x8: 0.65-0.76x): the problem is an outer
  product that streams its output, and the kernel's pipeline has nothing to overlap;
- well under a microsecond of work at the roofline (384^3): the kernel's 4 us on the
  GPU beat cuBLAS's 5.7-6.5, but a chain of them is bound by the host's few us per
  Mosaic launch and runs at 0.85-0.95x `jnp.dot` (NOTES exp. 79). From 512^3 the
  kernel wins both ways (1.17-2.1x in kernel time, ~1.1x in a chain's wall clock);
- decode: M <= 64 rows against a weight streamed from HBM (1x14336x4096 0.83-0.93x,
  8x14336x4096 0.86-0.97x, 1x8192x28672 0.90x; never above 1.01x, NOTES exps. 53, 75):
  cuBLAS's GEMV streams the weights at least as fast as the kernel's tiles;
- a memory-bound GEMM whose B is stored (K, N) with rows under 64 bytes (N < 32 for
  16-bit types): the kernel pads B, computes a 64-wide tile and writes its output widened,
  or runs A at a 32-byte swizzle; 0.72-1.00x at every such shape measured (65536x16x2048
  0.88, 8192x16x4096 TN 0.78, 64x(1024x16x1024) 0.72; NOTES exp. 101). Stored (N, K), B
  takes a 16- or 32-wide tile (`heuristics.narrow_tile_n`): 0.98-1.09x;
- a compute-bound GEMM whose tiles fill the SMs badly: the time model's best schedule
  (`heuristics.over_ideal`) at least `MAX_OVER_IDEAL` x the time of its FLOPs spread on
  every SM, with K >= `UNDERFILLED_MIN_K` (`UNDERFILLED_WIDE_MIN_K` for tiles of 128 rows
  or more), where that schedule is not of the smallest tiles (`SMALL_TILE`). Under one
  wave (768x3072x16384 TN, the weight gradient of a 768-wide model: 72 tiles on 132 SMs,
  0.80x with the tail split, no schedule of ours above 0.82x) and at 1.1-1.5 waves
  (6144x768x2048 TN: 0.66x) cuBLAS's split schedules win (NOTES exps. 140-141, 144).
  Where the model takes 64x128 tiles instead (or 64-row tiles at K under 2048), the
  kernel's many small CTAs beat what XLA runs (512x1536x3072 1.25x, 1024x1024x5120 1.13x,
  2048x896x1152 TN 1.40x). Not batched, not with a row stride off a multiple of
  `ALIGNED` (XLA's GEMMs run 1.5-3x slower there; `xla_aligned`), not where a tuned
  config exists;
- an array that TMA cannot read or write as it is (a minor extent off the swizzle spans,
  rows off a multiple of 8 in an MN-major tile), where XLA's GEMM reads every row stride
  as it is (`xla_aligned`: 9280x14072x320 0.52x, 5568x5440x2701 TN 0.82x, 65536x64x72
  0.21x; 21 of 21 shapes lost). Odd shapes that XLA's GEMM runs off its alignment keep the
  kernel: with the copy it is 1.3-2.6x faster there (K=7001, 7872x15005x512 TN), memory-
  bound ones too (13 of 18 held out at 1.02-2.19x, NOTES exp. 151; 65536x64x73 0.60x);
- an N off `ALIGNED` where A and B are not (only C's row stride is off; cuBLAS runs those
  at speed) and XLA's copy of the kernel's widened output into the (M, N) result, at
  `SLICE_BYTES_PER_S`, takes at least `MAX_SLICE_SHARE` of the GEMM's roofline time
  (`slow_output_slice`: 14893x7671x1024 NT 0.43x, 12 of 16 held-out shapes at 0.70-0.91x).

There XLA's GEMM runs, with the epilogue applied as XLA would. `choose` says which
and why, so harnesses can report it. Only 16-bit operands are routed: fp8 and tf32
GEMMs keep the kernel (their epilogues and scalings are what they are used for).

>>> from pallas_gemm.config import GemmProblem
>>> choose(GemmProblem(m=4096, n=4096, k=8))
('xla', 'K=8 < 64: one partial K step (XLA is faster at tiny K)')
>>> choose(GemmProblem(m=8192, n=8192, k=8192))
('pallas', 'the kernel')
>>> choose(GemmProblem(m=256, n=256, k=256))[0]
'xla'
>>> choose(GemmProblem(m=1, n=14336, k=4096))[0]
'xla'
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp

from pallas_gemm import heuristics
from pallas_gemm.config import GemmProblem
from pallas_gemm.heuristics import NARROW_SPAN_BYTES
from pallas_gemm.split_k import PEAK_FLOPS  # H100 SXM dense bf16; an H200's is the same

MIN_K = 64
"""Below one K step of the default tile (64 bf16 elements, a 128-byte swizzle span)."""

MIN_ROOFLINE_US = 0.3
"""GEMMs shorter than this at the roofline are bound by the host's per-launch cost, a few
us more for a Mosaic kernel than for cuBLAS (NOTES exps. 48, 79)."""

DECODE_MAX_M = 64
"""Memory-bound GEMMs with at most this many rows (decode steps) go to XLA."""

ALIGNED_COPY_FRACTION = 0.25
"""A GEMM whose row strides XLA reads as they are (`xla_aligned`) and whose padding copies
(`padding_copy_bytes`) move at least this fraction of its own bytes goes to XLA: at
0.26-2.0 of them the kernel ran at 0.50-0.97x `jnp.dot`, 21 of 21 shapes (H200, NOTES
exp. 147; e.g. 9280x14072x320, whose output the wrapper slices: 0.52x); held out, 19 of
22 at 0.52-0.91x, three small-M TN shapes at 1.23-1.33x."""

HBM_BYTES_PER_S = 3.35e12
"""H100 SXM HBM3 (an H200's 4.8 TB/s only makes more GEMMs short)."""

MAX_OVER_IDEAL = 1.4
"""Compute-bound GEMMs whose modeled best schedule is this far from full SMs go to XLA:
on the H200, 1.42-2.06 ran at 0.65-0.91x `jnp.dot`, 1.04-1.34 at 0.88-1.04x (NOTES
exp. 140)."""

UNDERFILLED_MIN_K = 2048
"""...and K at least this long (cuBLAS splits K there: 0.66-0.99x at 2048-7168 on the
H200, NOTES exp. 141; at shorter K and small squares XLA runs Triton's kernels, which
the kernel beats by 1.2-2x)..."""

ALIGNED = 8
"""Extents that are multiples of this (16 bytes of 16-bit elements) XLA's GEMMs run at
speed; off it the kernel is 1.5-3x faster (K = 7001: 1.5-2.4x, issue 16; 4097^3: 3.1x,
NOTES exp. 139). Only the extents that set a row stride count (`xla_aligned`)."""

UNDERFILLED_WIDE_MIN_K = 1024
"""...from this K where the model's tiles have 128 rows or more: at K 1024-1920 eight such
ran at 0.82-0.90x, six of 64x256 at 1.34-1.40x (H200, NOTES exp. 144); held out, 9 of the
10 it routed at 0.78-0.95x (one at 1.10x)."""

SMALL_TILE = (64, 128)
"""...unless the model's schedule is of tiles this small: 1.13-1.28x `jnp.dot` at all
six such shapes measured (NOTES exp. 141)."""

SLICE_BYTES_PER_S = 0.85e12
"""XLA's copy of the kernel's output, widened for TMA, into the (M, N) result when N is off
`ALIGNED` (rows of an odd number of 16-bit elements, copied element by element): 539 us for
the 457 MB of 14893x7671x1024 NT, whose kernel ran 304 us (H200, NOTES exp. 150)."""

MAX_SLICE_SHARE = 0.75
"""A GEMM whose only row stride off `ALIGNED` is C's and whose output copy takes at least
this fraction of its roofline time goes to XLA: fit on 15 shapes (the kernel lost on the 5
such of at least 4 us, 0.43-0.88x; NOTES exp. 150); held out (`benchmarks.copy_route
--group drawn210`), the kernel lost on 12 of 16 (0.70-0.91x), won on 4 (1.01-1.24x)..."""

MIN_SLICE_ROOFLINE_US = 4.0
"""...of at least this many microseconds at the roofline: below it the copy stays in L2
and XLA's GEMM for such an N is slow too (the kernel 1.02-1.40x at five such shapes)."""

ROUTED_DTYPES = ("bfloat16", "float16")


def min_bytes(problem: GemmProblem) -> int:
  """One read of A and B and one write of C (16-bit elements)."""
  p = problem
  return 2 * p.batch * (p.m * p.k + p.k * p.n + p.m * p.n)


def roofline_us(problem: GemmProblem) -> float:
  """The larger of the tensor-core time and the HBM time of `min_bytes`, in microseconds.

  >>> round(roofline_us(GemmProblem(m=1, n=4096, k=4096)), 1)
  10.0
  """
  flops = 2.0 * problem.batch * problem.m * problem.n * problem.k
  return 1e6 * max(flops / PEAK_FLOPS, min_bytes(problem) / HBM_BYTES_PER_S)


def padding_copy_bytes(problem: GemmProblem, config=None) -> int:
  """Bytes the kernel path moves to lay A, B and the output out for TMA (read + write of
  each array that `gemm.tma_layout` pads, and of the output that `gemm.out_extent` widens
  and the wrapper slices), with `config` (default: the one `matmul` would run).

  >>> padding_copy_bytes(GemmProblem(m=65536, n=64, k=72))   # A (65536, 72) padded to 128
  26214400
  >>> padding_copy_bytes(GemmProblem(m=4096, n=4096, k=4096))
  0
  """
  return _copy_bytes(problem, config or _default_config(problem))


@functools.lru_cache(maxsize=4096)
def _copy_bytes(p: GemmProblem, config) -> int:
  """`padding_copy_bytes` for a resolved config (asked at every call site's trace)."""
  import jax  # local: the shapes come from the wrapper's own layout functions

  from pallas_gemm import gemm

  lead = (p.batch,) if p.batch > 1 else ()
  a_dims = (p.k, p.m) if p.transpose_a else (p.m, p.k)
  b_dims = (p.n, p.k) if p.transpose_b else (p.k, p.n)
  arrays = [
      jax.ShapeDtypeStruct((*lead, *a_dims), p.dtype),
      jax.ShapeDtypeStruct((*lead, *b_dims), p.dtype_b),
  ]
  padded = jax.eval_shape(lambda a, b: gemm.tma_layout(a, b, p, config, False), *arrays)
  moved = lambda x, y: (math.prod(x.shape) + math.prod(y.shape)) * x.dtype.itemsize
  copied = sum(moved(x, y) for x, y in zip(arrays, padded) if x.shape != y.shape)
  return int(copied) + _slice_bytes(p, config)


@functools.lru_cache(maxsize=4096)
def _slice_bytes(p: GemmProblem, config) -> int:
  """Bytes of the wrapper's copy of the kernel's widened output into (M, N) (read + write),
  0 where the kernel writes (M, N) as it is."""
  from pallas_gemm import gemm  # local: gemm imports this module

  rows, cols = gemm.out_extent(p, config, False)
  if config.split_k > 1 or (rows, cols) == (p.m, p.n):
    return 0
  return p.batch * (rows * cols + p.m * p.n) * jnp.dtype(p.out_dtype).itemsize


def _default_config(problem: GemmProblem):
  """The config `matmul` would run (the user's cache, the shipped table, the model)."""
  from pallas_gemm import tuning_cache  # local: it reads the user's cache

  return tuning_cache.lookup_config(problem) or heuristics.default_config(problem)


def slow_output_slice(problem: GemmProblem, config=None) -> float:
  """Microseconds of the output copy (`SLICE_BYTES_PER_S`) where it is what the kernel
  path adds and XLA's GEMM would not need: only C's row stride is off `ALIGNED`, and the
  GEMM takes at least `MIN_SLICE_ROOFLINE_US`; else 0. `config` as in
  `padding_copy_bytes`.

  >>> round(slow_output_slice(GemmProblem(m=14893, n=7671, k=1024, transpose_b=True)))
  538
  >>> slow_output_slice(GemmProblem(m=14893, n=7671, k=1024))   # B's rows are odd too
  0.0
  """
  a_stride, b_stride, c_stride = _row_strides(problem)
  if a_stride % ALIGNED or b_stride % ALIGNED or not c_stride % ALIGNED:
    return 0.0
  if roofline_us(problem) < MIN_SLICE_ROOFLINE_US:
    return 0.0
  return 1e6 * _slice_bytes(problem, config or _default_config(problem)) / SLICE_BYTES_PER_S


def narrow_n_major_b(problem: GemmProblem) -> bool:
  """Whether B is stored (K, N) with rows of fewer than `NARROW_SPAN_BYTES` bytes: no
  tile of the kernel streams A well there (`heuristics.narrow_tile_n`).

  >>> narrow_n_major_b(GemmProblem(m=65536, n=16, k=2048))
  True
  >>> narrow_n_major_b(GemmProblem(m=65536, n=16, k=2048, transpose_b=True))
  False
  """
  itemsize = jnp.dtype(problem.dtype_b).itemsize
  return not problem.transpose_b and problem.n * itemsize < NARROW_SPAN_BYTES


def xla_aligned(problem: GemmProblem) -> bool:
  """Whether every row stride of XLA's GEMM is a multiple of `ALIGNED` elements: A's
  (K for A stored (M, K), M for (K, M)), B's (N for (K, N), K for (N, K)) and C's (N).
  Off it cuBLAS runs 1.5-3x slower; on it, whatever the other extents, at speed: an odd
  M with A stored (M, K) (under-filled: the kernel ran at 0.53-1.01x `jnp.dot` on 25 of
  28 random shapes, NOTES exp. 146), an odd K in TN (XLA at 765 TFLOP/s at
  5568x5440x2701 TN, exp. 147).

  >>> xla_aligned(GemmProblem(m=539, n=1472, k=4576))
  True
  >>> xla_aligned(GemmProblem(m=4096, n=4096, k=7001))
  False
  >>> xla_aligned(GemmProblem(m=5568, n=5440, k=2701, transpose_a=True))
  True
  """
  return all(extent % ALIGNED == 0 for extent in _row_strides(problem))


def _row_strides(p: GemmProblem) -> tuple[int, int, int]:
  """The row strides (in elements) of A, B and C as stored."""
  return (p.m if p.transpose_a else p.k, p.k if p.transpose_b else p.n, p.n)


def _memory_bound(problem: GemmProblem) -> bool:
  flops = 2.0 * problem.batch * problem.m * problem.n * problem.k
  return flops / PEAK_FLOPS < min_bytes(problem) / HBM_BYTES_PER_S


def is_decode(problem: GemmProblem) -> bool:
  """A decode step's GEMM: at most `DECODE_MAX_M` rows against a weight streamed from HBM.

  >>> is_decode(GemmProblem(m=1, n=14336, k=4096)), is_decode(GemmProblem(m=4096, n=4096, k=4096))
  (True, False)
  """
  return problem.batch == 1 and problem.m <= DECODE_MAX_M and _memory_bound(problem)


def choose(problem: GemmProblem) -> tuple[str, str]:
  """("pallas" or "xla", why) for a GEMM on a Hopper GPU."""
  if problem.dtype not in ROUTED_DTYPES or problem.dtype_b != problem.dtype:
    return "pallas", "the kernel"
  if problem.k < MIN_K:
    return "xla", f"K={problem.k} < {MIN_K}: one partial K step (XLA is faster at tiny K)"
  t = roofline_us(problem)
  if t < MIN_ROOFLINE_US:
    return "xla", (
        f"{t:.2f} us at the roofline < {MIN_ROOFLINE_US}: bound by the host's per-launch "
        "cost (a Mosaic launch costs a few us more than cuBLAS's)"
    )
  if is_decode(problem):
    return "xla", (
        f"decode: M={problem.m} <= {DECODE_MAX_M}, memory-bound (cuBLAS's GEMV streams the "
        "weights at least as fast)"
    )
  if narrow_n_major_b(problem) and _memory_bound(problem):
    return "xla", (
        f"N={problem.n}: B's (K, N) rows are under {NARROW_SPAN_BYTES} bytes, memory-bound "
        "(no tile of the kernel streams A there as fast as XLA)"
    )
  if (
      problem.k >= UNDERFILLED_WIDE_MIN_K
      and problem.batch == 1
      and not _memory_bound(problem)
      and xla_aligned(problem)
      and (ratio := _over_ideal(problem)) >= MAX_OVER_IDEAL
  ):
    return "xla", (
        f"the best schedule of the kernel's tiles is {ratio:.2f}x the time of the FLOPs on "
        f"every SM (>= {MAX_OVER_IDEAL}): the tiles fill the SMs badly"
    )
  config = _default_config(problem)
  copied, own = padding_copy_bytes(problem, config), min_bytes(problem)
  if xla_aligned(problem) and copied >= ALIGNED_COPY_FRACTION * own:
    return "xla", (
        f"XLA's GEMM reads every row stride as it is; the kernel would copy "
        f"{copied / 1e6:.1f} MB to lay the arrays out for TMA (the GEMM's own {own / 1e6:.1f} MB)"
    )
  if (sliced := slow_output_slice(problem, config)) >= MAX_SLICE_SHARE * t:
    return "xla", (
        f"N={problem.n} sets only C's row stride off {ALIGNED} (XLA's GEMM runs at speed); "
        f"the kernel's output copied into (M, N) takes ~{sliced:.0f} us, the GEMM "
        f"{t:.1f} us at the roofline"
    )
  return "pallas", "the kernel"


def _over_ideal(problem: GemmProblem) -> float:
  """`heuristics.over_ideal` of the default config on this board; 0 where a tuned config
  (the user's cache or the shipped table) would run instead, where the default takes
  `SMALL_TILE`s, or 64-row tiles at K under `UNDERFILLED_MIN_K`."""
  from pallas_gemm import _compat, tuning_cache  # local: jax is only needed to ask

  if tuning_cache.lookup_config(problem) is not None:
    return 0.0
  num_sms = _compat.device_sm_count() or heuristics.DEFAULT_NUM_SMS
  hbm = _compat.hbm_scale()
  config = heuristics.default_config(problem, num_sms, hbm)
  if (config.tile_m, config.tile_n) == SMALL_TILE:
    return 0.0
  if problem.k < UNDERFILLED_MIN_K and config.tile_m < 128:
    return 0.0
  return heuristics.over_ideal(problem, config, num_sms, hbm)
