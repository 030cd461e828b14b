"""Ragged-contracting grouped GEMM for Hopper: out[g] = x[rows_g]^T @ y[rows_g].

The backward of `ragged_dot` w.r.t. rhs: x (M, P), y (M, Q) share their rows,
grouped by `group_sizes` (G,); out (G, P, Q). Groups with no rows give zeros.

Kernel (the structure of `ragged_gemm` / `hopper_gemm`):
  - 3 warpgroups: a TMA producer and two cooperative consumers that split the
    (tile_p, tile_q) output tile along Q (x's tile is the transposed, MN-major
    WGMMA A operand, which cannot be split along its M).
  - Persistent grid over (group, P tile, Q tile) items; each item's K loop runs
    over the 64-row chunks its group touches (a dynamic trip count: the ring
    slot is a step counter carried through the item loop, as in `ragged_gemm`).
  - A chunk on a group boundary holds rows of other groups: each consumer
    zeroes those rows of its half of the y tile in SMEM (iota mask in
    registers, written back, `commit_smem` before the WGMMA reads it), so they
    contribute nothing. (x's rows are not masked: a non-finite value in another
    group's row of the same chunk would still reach this group as NaN.)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import compile_once
from pallas_gemm import pipeline
from pallas_gemm import raster
from pallas_gemm import smem
from pallas_gemm.config import DEFAULT_NUM_SMS, INPUT_DTYPES, tiles
from pallas_gemm.ragged_gemm import group_bounds, int32_row_sums

UNROLL_PREFIX = 8
"""Up to this many groups a work item sums the sizes before its group by unrolled code;
beyond, it reads its group's rows from `group_bounds`, which XLA lists (a loop over the
sizes where their int32 sums could overflow). The list is as fast at 8 groups and 1.4-9.3%
faster at 16-32, 2.8x at 256 (H200, NOTES exps. 117-118)."""


@dataclasses.dataclass(frozen=True)
class TgmmProblem:
  m: int  # rows shared by x and y (the ragged contraction)
  p: int
  q: int
  groups: int
  dtype: str = "bfloat16"
  out_dtype: str = "bfloat16"


@dataclasses.dataclass(frozen=True)
class TgmmConfig:
  """tile_p x tile_q output tiles (split along Q between the consumers),
  tile_r rows per pipeline stage, `stages` deep ring, 64x64 epilogue stores."""

  tile_p: int = 128
  tile_q: int = 256
  tile_r: int = 64
  stages: int = 4
  raster: str = "along_n"
  group: int = 8
  num_sms: int | None = None

  @property
  def wg_tile(self) -> tuple[int, int]:
    return self.tile_p, self.tile_q // 2

  def smem_bytes(self, problem: TgmmProblem) -> int:
    return smem.footprint(
        ((self.stages, self.tile_r, self.tile_p), problem.dtype),
        ((self.stages, self.tile_r, self.tile_q), problem.dtype),
        ((2, 2, 64, 64), problem.out_dtype),
    )

  def validate(self, problem: TgmmProblem) -> None:
    def fail(field, msg):
      raise ValueError(f"TgmmConfig.{field}={getattr(self, field)!r}: {msg}")

    if problem.dtype not in INPUT_DTYPES:
      raise ValueError(
          f"input dtype {problem.dtype} not supported by the kernel; use one of {INPUT_DTYPES}"
      )
    span = smem.swizzle_span(problem.dtype, 128)
    if self.tile_p % span or not span <= self.tile_p <= 256:
      fail("tile_p", f"must be a multiple of {span} and <= 256")
    wm, wn = self.wg_tile
    if self.tile_q % (2 * span) or wn > 256 or wm * wn > 128 * 128:
      fail(
          "tile_q",
          f"must be a multiple of {2 * span}, with a per-warpgroup accumulator of at most 128x128",
      )
    if self.tile_r % span:
      fail("tile_r", f"must be a multiple of {span}")
    if self.stages < 2:
      fail("stages", "must be >= 2")
    if self.raster not in raster.ORDERS:
      fail("raster", f"must be one of {raster.ORDERS}")
    need = self.smem_bytes(problem)
    if need > smem.LIMIT_BYTES:
      fail("stages", f"needs {need} bytes of shared memory, the limit is {smem.LIMIT_BYTES}")


def default_tgmm_config(problem: TgmmProblem) -> TgmmConfig:
  return smem.deepest(
      lambda stages: TgmmConfig(stages=stages),
      (4, 3, 2),
      lambda cfg: cfg.smem_bytes(problem) <= smem.LIMIT_BYTES,
  )


def _lists_bounds(problem: TgmmProblem) -> bool:
  """Whether the kernel reads `group_bounds` (past UNROLL_PREFIX groups, int32 sums)."""
  return problem.groups > UNROLL_PREFIX and int32_row_sums(problem.groups, problem.m)


def _group_rows(sizes_gmem, g, problem: TgmmProblem):
  """[start, end) rows of group g (sizes clamped to >= 0, ends cut at m); `sizes_gmem`
  is `group_bounds`' where `_lists_bounds`."""
  if _lists_bounds(problem):
    return sizes_gmem[g], sizes_gmem[g + 1]

  def body(i, start):  # sizes clipped before adding: offsets stay <= m, no int32 overflow
    return start + jnp.where(
        i < g, jnp.minimum(jnp.maximum(sizes_gmem[i], 0), problem.m - start), 0
    )

  start = jnp.int32(0)
  if problem.groups <= UNROLL_PREFIX:
    for i in range(problem.groups):
      start = body(i, start)
  else:
    start = lax.fori_loop(0, problem.groups, body, start)
  size = jnp.minimum(jnp.maximum(sizes_gmem[g], 0), problem.m - start)
  return start, start + size


def _kernel(sizes_gmem, x_gmem, y_gmem, out_gmem, *, problem, config, swizzle, out_swizzle):
  cfg, prob = config, problem
  tp, tq, tr = cfg.tile_p, cfg.tile_q, cfg.tile_r
  wm, wn = cfg.wg_tile
  em, en = 64, 64
  in_dtype, out_dtype = x_gmem.dtype, out_gmem.dtype
  tf = smem.tile_transforms(in_dtype, swizzle)
  out_tf = smem.tile_transforms(out_dtype, out_swizzle)
  p_tiles, q_tiles = tiles(prob.p, tp), tiles(prob.q, tq)
  items = prob.groups * p_tiles * q_tiles
  stores = pipeline.StoreSlots()
  in_flight = stores.in_flight((wm // em) * (wn // en))

  def position(index):
    gp, qi = raster.tile_coords(
        index, prob.groups * p_tiles, q_tiles, group=cfg.group, order=cfg.raster
    )
    g, pi = lax.div(gp, p_tiles), lax.rem(gp, p_tiles)
    start, end = _group_rows(sizes_gmem, g, prob)
    first = lax.div(start, tr)
    count = jnp.where(end > start, lax.div(end + tr - 1, tr) - first, 0)
    return g, pi, qi, start, end, first, count

  def scoped(ring_refs, out_smem):
    ring = pipeline.Ring.of(ring_refs)
    wg = lax.axis_index("wg")

    def producer():
      def load_item(index, _, step0):
        g, pi, qi, start, end, first, count = position(index)

        @pl.loop(0, count)
        def _(c):
          rows = pl.ds((first + c) * tr, tr)
          ring.fill(
              step0 + c, (x_gmem.at[rows, pl.ds(pi * tp, tp)], y_gmem.at[rows, pl.ds(qi * tq, tq)])
          )

        return count

      ring.drain(pipeline.persistent_loop(items, load_item))

    def consumer():
      def compute_item(index, _, step0):
        g, pi, qi, start, end, first, count = position(index)

        def operands(c, x_stage, y_stage):
          y_half = y_stage.at[:, pl.ds(wg * wn, wn)]
          row0 = (first + c) * tr
          lo, hi = start - row0, end - row0

          @pl.when((lo > 0) | (hi < tr))  # a chunk on a group boundary
          def _():
            v = y_half[...]
            r = lax.broadcasted_iota(jnp.int32, v.shape, 0)
            y_half[...] = jnp.where((r >= lo) & (r < hi), v, jnp.zeros_like(v))
            plgpu.commit_smem()

          return _compat.transpose_2d(x_stage), y_half

        @functools.partial(pl.run_scoped, acc=plgpu.ACC((wm, wn), jnp.float32))
        def _(acc):
          ring.mma(acc, step0, 0, count, operands)
          result = acc[...]
          col0 = qi * tq + wg * wn
          for i in range(wm // em):
            for j in range(wn // en):
              stores.store(
                  out_smem.at[wg],
                  i * (wn // en) + j,
                  result[i * em : (i + 1) * em, j * en : (j + 1) * en].astype(out_dtype),
                  out_gmem.at[g, pl.ds(pi * tp + i * em, em), pl.ds(col0 + j * en, en)],
                  in_flight=in_flight,
              )

        return count

      pipeline.persistent_loop(items, compute_item)
      plgpu.wait_smem_to_gmem(0)

    pipeline.warp_specialized(producer, consumer)

  pl.run_scoped(
      scoped,
      ring_refs=pipeline.ring_scratch(
          cfg.stages, [((tr, tp), in_dtype, tf), ((tr, tq), in_dtype, tf)]
      ),
      out_smem=plgpu.SMEM((pipeline.CONSUMERS, stores.slots, em, en), out_dtype, transforms=out_tf),
      collective_axes="wg",
  )


def ragged_tgmm(x, y, group_sizes, *, problem: TgmmProblem, config: TgmmConfig, interpret=None):
  """out[g] = x[rows_g]^T @ y[rows_g] on arrays laid out for TMA.

  x: (rows, P') and y: (rows, Q') with P', Q' multiples of 64 (zero padding),
  rows >= problem.m; returns (G, problem.p, problem.q) with p, q the padded
  extents the caller slices.
  """
  sizes = group_sizes.astype(jnp.int32)
  if _lists_bounds(problem):  # listed out here: the kernel's entry stays one custom call
    sizes = group_bounds(sizes, problem.m)
  return _tgmm_kernel(sizes, x, y, problem=problem, config=config, interpret=interpret)


@compile_once.kernel_entry(static_argnames=("problem", "config", "interpret"))
def _tgmm_kernel(sizes, x, y, *, problem, config, interpret):
  """`ragged_tgmm`'s kernel; `sizes` is the group sizes or `group_bounds`', made
  outside so that the entry lowers to its custom call alone (what `kernel_cache`
  stores)."""
  config.validate(problem)
  swizzle = smem.widest_swizzle(x.dtype, 64, x.shape[-1], y.shape[-1])
  if swizzle != 128:
    raise ValueError(f"x {x.shape} and y {y.shape} need minor dims that are multiples of 64")
  out_swizzle = smem.widest_swizzle(problem.out_dtype, 64, problem.q)
  num_sms = config.num_sms or _compat.device_sm_count() or DEFAULT_NUM_SMS
  kernel = pipeline.launch(
      compile_once.named_body(
          "pallas_gemm_ragged_tgmm",
          _kernel,
          problem=problem,
          config=config,
          swizzle=swizzle,
          out_swizzle=out_swizzle,
      ),
      out_type=jax.ShapeDtypeStruct(
          (problem.groups, problem.p, problem.q), jnp.dtype(problem.out_dtype)
      ),
      workers=num_sms,
      interpret=interpret,
  )
  return kernel(sizes, x, y)
