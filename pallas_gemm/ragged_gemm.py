"""Grouped (ragged) GEMM for Hopper: out[r] = lhs[r] @ rhs[group(r)], one launch.

The rows of `lhs` (M, K) are split into consecutive groups by `group_sizes`
(G,); group g multiplies `rhs[g]`, stored (K, N), or (N, K) with
`transpose_rhs`. Rows past `sum(group_sizes)` come out zero.

Kernel (shares its structure and helpers with `hopper_gemm`):
  - 3 warpgroups: a TMA producer (`setmaxnreg` 40) and two cooperative
    consumers (64 x tile_n rows each, f32 WGMMA accumulators, one WGMMA group in
    flight), one SMEM ring that runs on across work items.
  - Persistent grid, `plgpu.nd_loop` over `max_items x n_tiles` work items in
    `raster.tile_coords` order. A work item is (group, row box): each group
    is cut into tile_m-row boxes from its own first row, so only its last box
    is partial (on average half a box of extra work per group, where boxes on
    a fixed grid would compute every boundary box twice), plus the "tail"
    items that write zeros to rows past sum(group_sizes) without a K loop.
    A box starts on a multiple of 8 rows (Mosaic's row tiling of swizzled
    operands), so it may begin with up to 7 rows of the previous group, which
    it does not store; rows past the array are zero-filled by TMA. Items past the dynamic item count are idle (no loads, no stores).
    The item list is decoded in the kernel from `group_sizes` (a scan over
    the G sizes, scalars read from GMEM); nothing is precomputed by XLA.
  - Boundary handling: each consumer warpgroup clips the item's row range
    [lo, hi) to its own 64 rows. All rows valid: the dense kernel's epilogue
    (swizzled, double-buffered SMEM slots, TMA stores). No rows valid: no store.
    Some rows valid: the sub-tile goes to a staging buffer without explicit
    transforms (Mosaic infers a row tiling of 1, so any row may start a slice)
    and is stored with a ladder of power-of-two row counts (32, 16, ..., 1),
    each a TMA store whose box is static (TMA boxes cannot be dynamic), as
    jax's `ragged_dot_mgpu` does; rows of the other group are never written.
    A TMA store's SMEM source must start on a 128-byte boundary, so a staging
    row is at least 128 bytes wide (`STAGE_ROW_BYTES`): with 64-byte rows an
    odd first row faults with CUDA_ERROR_MISALIGNED_ADDRESS on the H100.
  - The ring slot of a stage is a running step counter carried through the
    item loop (items without a K loop consume no stages).

>>> import jax, jax.numpy as jnp
>>> p = RaggedProblem(m=512, n=256, k=128, groups=3)
>>> f = lambda a, b, gs: ragged_gemm(a, b, gs, problem=p, config=RaggedConfig(num_sms=2))
>>> args = (jax.ShapeDtypeStruct((512, 128), jnp.bfloat16),
...         jax.ShapeDtypeStruct((3, 128, 256), jnp.bfloat16),
...         jax.ShapeDtypeStruct((3,), jnp.int32))
>>> jax.export.export(jax.jit(f), platforms=["cuda"])(*args).out_avals
(ShapedArray(bfloat16[512,256]),)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np

from pallas_gemm import block_mma
from pallas_gemm import _compat
from pallas_gemm import compile_once
from pallas_gemm import pipeline
from pallas_gemm import raster
from pallas_gemm import smem
from pallas_gemm.config import B_SCALE_BOX, DEFAULT_NUM_SMS, FP8_DTYPES, INPUT_DTYPES, OUTPUT_DTYPES, tiles

UNROLL_GROUPS = 8
"""Up to this many groups the kernel decodes its items itself (unrolled selects on the
group sizes); beyond, it reads them from `item_table`, which XLA lists: 2-27% faster for
bf16 and 18-65% for blockwise fp8 at 16-256 groups (H200, NOTES exp. 113)."""

LADDER_MAX_ROWS = 64
"""Rows of one consumer warpgroup's sub-tile: the largest step of the store ladder."""

STAGE_ROW_BYTES = 128
"""Bytes per row of the boundary staging buffer: TMA needs its SMEM source
128-byte aligned, and a ladder store may start at any row."""


@dataclasses.dataclass(frozen=True)
class RaggedProblem:
  """One grouped GEMM launch: out (m_out, n) from lhs (m_out, k) and rhs (groups, k, n).

  `m` is the number of rows that belong to groups at most (`lhs`'s logical
  rows); `m_out` >= m is the row extent of the arrays (padding in interpret mode).
  """

  m: int
  n: int
  k: int
  groups: int
  dtype: str = "bfloat16"
  out_dtype: str = "bfloat16"
  transpose_rhs: bool = False
  m_out: int | None = None
  block_scaled: bool = False
  """fp8 operands with a scale per (1 x 128) block of lhs and (128 x 128) block of each
  group's (N, K) rhs, applied per K block in registers (`pipeline.Ring.mma_promoted`)."""

  @property
  def rows(self) -> int:
    return self.m_out or self.m

  @property
  def flops(self) -> int:
    return 2 * self.m * self.n * self.k


@dataclasses.dataclass(frozen=True)
class RaggedConfig:
  """Tiles and schedule of the grouped GEMM kernel (hashable: a static jit arg).

  Attributes:
    tile_m, tile_n: output tile of one CTA; the two consumer warpgroups split
      it along M (tile_m / 2 rows each, which must be 64: the store ladder's span).
    tile_k: K extent of one pipeline stage.
    stages: SMEM ring depth.
    raster, group: work-item order (see `raster.tile_coords`); `group` is the
      band width in (group, row box) items.
    epilogue_tile: (rows, cols) of one epilogue store; rows must be 64. Two
      swizzled slots per warpgroup plus one staging buffer for boundary rows,
      so (64, 32) is what fits next to 4 stages of 128x256x64 (bf16 out).
    num_sms: persistent grid size; None means the device's SM count.
  """

  tile_m: int = 128
  tile_n: int = 256
  tile_k: int = 64
  stages: int = 4
  raster: str = "along_n"
  group: int = 8
  epilogue_tile: tuple[int, int] = (64, 32)
  num_sms: int | None = None

  def __post_init__(self):
    """Types, checked at construction: positive ints where counts go, the epilogue tile
    as a tuple (a list would make the config unhashable)."""

    def fail(field, msg):
      raise ValueError(f"RaggedConfig.{field}={getattr(self, field)!r}: {msg}")

    def positive_int(x):
      return isinstance(x, int) and not isinstance(x, bool) and x >= 1

    for field in ("tile_m", "tile_n", "tile_k", "stages", "group"):
      if not positive_int(getattr(self, field)):
        fail(field, "must be an int >= 1")
    if self.num_sms is not None and not positive_int(self.num_sms):
      fail("num_sms", "must be None or an int >= 1")
    tile = self.epilogue_tile
    if not isinstance(tile, (tuple, list)) or len(tile) != 2 or not all(map(positive_int, tile)):
      fail("epilogue_tile", "must be a pair of ints >= 1")
    object.__setattr__(self, "epilogue_tile", tuple(tile))
    if not isinstance(self.raster, str):
      fail("raster", "must be a str")

  @property
  def wg_tile(self) -> tuple[int, int]:
    return self.tile_m // 2, self.tile_n

  def stage_cols(self, out_dtype) -> int:
    """Columns of one boundary staging chunk: >= the epilogue tile, rows >= 128 bytes."""
    return max(self.epilogue_tile[1], STAGE_ROW_BYTES // np.dtype(out_dtype).itemsize)

  def smem_bytes(self, problem: RaggedProblem) -> int:
    em, en = self.epilogue_tile
    return smem.footprint(
        ((self.stages, self.tile_m, self.tile_k), problem.dtype),
        ((self.stages, self.tile_k, self.tile_n), problem.dtype),
        ((2, 2, em, en), problem.out_dtype),  # swizzled slots
        ((2, em, self.stage_cols(problem.out_dtype)), problem.out_dtype),  # boundary staging
        ((self.stages, 1, self.tile_m), "float32") if problem.block_scaled else None,
        ((self.stages, 1, B_SCALE_BOX), "float32") if problem.block_scaled else None,
    )

  def validate(self, problem: RaggedProblem) -> None:
    """Raises ValueError naming the first field that breaks a limit for `problem`."""

    def fail(field, msg):
      raise ValueError(f"RaggedConfig.{field}={getattr(self, field)!r}: {msg}")

    dtypes = FP8_DTYPES if problem.block_scaled else INPUT_DTYPES
    if problem.dtype not in dtypes:
      raise ValueError(
          f"input dtype {problem.dtype} not supported by the kernel; use one of {dtypes}"
      )
    if problem.block_scaled:  # one scale block per K step and per rhs tile, K-major rhs
      if not problem.transpose_rhs:
        raise ValueError("a blockwise-scaled grouped GEMM reads rhs as (G, N, K): transpose_rhs")
      for field in ("tile_k", "tile_n"):
        if getattr(self, field) != 128:
          fail(field, "a blockwise-scaled grouped GEMM runs 128 (one scale block)")
    if problem.out_dtype not in OUTPUT_DTYPES:
      raise ValueError(
          f"output dtype {problem.out_dtype} not supported; use one of {OUTPUT_DTYPES}"
      )
    if self.tile_m != 2 * LADDER_MAX_ROWS:
      fail("tile_m", "must be 128 (two consumer warpgroups of 64 rows)")
    if self.tile_n % 8 or not 8 <= self.tile_n <= 256:
      fail("tile_n", "must be a multiple of 8 and <= 256 (WGMMA N)")
    span = smem.swizzle_span(problem.dtype, 128)
    if self.tile_k % span:
      fail("tile_k", f"must be a multiple of {span} ({problem.dtype}: one 128-byte swizzle span)")
    if not problem.transpose_rhs and self.tile_n % span:
      fail("tile_n", f"is the minor dim of the (K, N) rhs tile; must be a multiple of {span}")
    if self.stages < 2:
      fail("stages", "must be >= 2")
    if self.raster not in raster.ORDERS:
      fail("raster", f"must be one of {raster.ORDERS}")
    if self.group < 1:
      fail("group", "must be >= 1")
    if self.num_sms is not None and self.num_sms < 1:
      fail("num_sms", "must be >= 1")
    em, en = self.epilogue_tile
    out_span = smem.swizzle_span(problem.out_dtype, 32)
    if em != LADDER_MAX_ROWS or self.tile_n % en or en % out_span:
      fail("epilogue_tile", f"must be (64, c) with c dividing tile_n and a multiple of {out_span}")
    if self.tile_n % self.stage_cols(problem.out_dtype):
      fail(
          "tile_n",
          f"must be a multiple of {self.stage_cols(problem.out_dtype)} (the boundary "
          f"staging chunk: {STAGE_ROW_BYTES}-byte rows for aligned TMA stores)",
      )
    need = self.smem_bytes(problem)
    if need > smem.LIMIT_BYTES:
      fail(
          "stages",
          f"needs {need} bytes of shared memory, the limit is {smem.LIMIT_BYTES} "
          "(fewer stages, smaller tiles or a smaller epilogue_tile)",
      )


def default_ragged_config(problem: RaggedProblem) -> RaggedConfig:
  """128x256x64 tiles, as many stages as shared memory allows (4 for 16-bit outputs).

  >>> default_ragged_config(RaggedProblem(m=4096, n=4096, k=4096, groups=8)).stages
  4
  >>> default_ragged_config(RaggedProblem(m=4096, n=4096, k=4096, groups=8, out_dtype="float32")).stages
  3
  """
  return smem.deepest(
      lambda stages: RaggedConfig(stages=stages),
      (4, 3, 2),
      lambda cfg: cfg.smem_bytes(problem) <= smem.LIMIT_BYTES,
  )


def max_items(problem: RaggedProblem, config: RaggedConfig) -> int:
  """Static bound on (group, row box) work items. Each of the G groups and the
  tail is cut into boxes from its first row rounded down to BOX_ROW_ALIGN (fewer
  than BOX_ROW_ALIGN extra rows each), with one partial box at most."""
  segments = problem.groups + 1
  return tiles(problem.rows + BOX_ROW_ALIGN * segments, config.tile_m) + segments


@dataclasses.dataclass(frozen=True)
class _Plan:
  problem: RaggedProblem
  config: RaggedConfig
  ab_swizzle: int
  out_swizzle: int
  copy_views: tuple = (None, None)
  """TMA views of the lhs and output tiles where those arrays' rows are not a multiple
  of 8 (`smem.row_copy_transforms`), else None."""
  fresh_blocks: bool = False
  """Blockwise fp8: each K block's WGMMAs overwrite fresh registers (`block_mma`), as
  on hardware; False in GPU interpret mode, which cannot run inline Mosaic GPU code."""
  item_table: bool = False
  """The kernel reads its work items from `item_table` (many groups) instead of the
  group sizes."""

  @property
  def k_iters(self) -> int:
    return tiles(self.problem.k, self.config.tile_k)

  @property
  def n_tiles(self) -> int:
    return tiles(self.problem.n, self.config.tile_n)

  @property
  def m_items(self) -> int:
    return max_items(self.problem, self.config)


@dataclasses.dataclass(frozen=True)
class _Item:
  """What one (group, row box) work item does. All fields are int32 scalars."""

  group: jax.Array  # rhs group; `groups` for the zero tail
  row0: jax.Array  # first row of the item's tile_m-row box (any row: tiles start at the group)
  lo: jax.Array  # the group's rows [lo, hi): the item writes those inside its box
  hi: jax.Array
  active: jax.Array  # False: idle item past the end of the list
  compute: jax.Array  # True: run the K loop (a real group, not the tail)


BOX_ROW_ALIGN = 8
"""Row boxes start on a multiple of this: Mosaic tiles a swizzled operand's rows
by 8 and needs a TMA's row offset to be a multiple of the tile."""


def _box_base(start):
  """The first row of a group's first box: its first row, rounded down to BOX_ROW_ALIGN
  (the rows before it belong to the previous group and are not stored)."""
  return lax.div(start, BOX_ROW_ALIGN) * BOX_ROW_ALIGN


def _clipped(size, room):
  """A group's size in [0, room]: clipped before it is added to a row offset, so that
  sizes near 2^31 cannot overflow int32 (offsets stay <= M)."""
  return jnp.minimum(jnp.maximum(size, 0), room)


def group_bounds(group_sizes, m: int):
  """(G + 1,) int32: group g's rows are [bounds[g], bounds[g + 1]) (sizes clamped to
  >= 0, ends cut at m). Needs `int32_row_sums(G, m)`.

  >>> group_bounds(jnp.array([3, -1, 9, 4]), 10).tolist()
  [0, 3, 3, 10, 10]
  """
  sizes = _clipped(group_sizes.astype(jnp.int32), m)
  return jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.minimum(jnp.cumsum(sizes), m)])


def int32_row_sums(groups: int, m: int) -> bool:
  """Whether sums of `groups` sizes clamped to m fit int32 (`group_bounds` in XLA)."""
  return groups * m < 2**31


def item_table(group_sizes, problem: RaggedProblem, tile_m: int, length: int):
  """The work items of `_item_decoder`, listed by XLA: (4, length) int32 rows group,
  row0, lo, hi per item (`_Item`); past the last item, group is `groups` + 1.

  With many groups the kernel reads an item's four words instead of scanning every
  group's size per item (NOTES exp. 113). Needs groups * m < 2**31 (int32 row sums).

  >>> table = item_table(jnp.array([5, 0, 11]), RaggedProblem(16, 8, 8, 3, m_out=24), 8, 6)
  >>> table.tolist()   # group 0: rows 0-4; group 2: 5-15 in boxes from row 0 and 8; tail: 16-23
  [[0, 2, 2, 3, 4, 4], [0, 0, 8, 16, 0, 0], [0, 5, 5, 16, 0, 0], [5, 16, 16, 24, 0, 0]]
  """
  g = problem.groups
  starts = group_bounds(group_sizes, problem.m)  # the groups', then the tail's
  stops = jnp.concatenate([starts[1:], jnp.array([problem.rows], jnp.int32)])
  bases = (starts // BOX_ROW_ALIGN) * BOX_ROW_ALIGN
  spans = jnp.where(stops > starts, (stops - bases + tile_m - 1) // tile_m, 0)
  last = jnp.cumsum(spans)  # one past each segment's last item
  w = jnp.arange(length, dtype=jnp.int32)
  # the segment of item w: how many segments end at or before it (g + 1: past the end);
  # a comparison count, as jax 0.12 will not lower searchsorted inside the kernel's entry
  seg = jnp.sum(last[None, :] <= w[:, None], axis=1, dtype=jnp.int32)
  at = jnp.minimum(seg, g)
  first = last[at] - spans[at]
  active = seg <= g
  row0 = jnp.where(active, bases[at] + (w - first) * tile_m, 0)
  lo = jnp.where(active, starts[at], 0)
  hi = jnp.where(active, stops[at], 0)
  return jnp.stack([seg, row0, lo, hi])


def _lists_items(problem: RaggedProblem) -> bool:
  """Whether the kernel reads its items from `item_table`: past UNROLL_GROUPS groups,
  where the row sums fit int32."""
  return problem.groups > UNROLL_GROUPS and int32_row_sums(problem.groups, problem.m)


def _item_decoder(sizes_gmem, p: _Plan):
  """Returns decode(w) -> the w-th work item: groups in order, each cut into
  tile_m-row boxes from its first row (rounded down to `BOX_ROW_ALIGN`), then
  the tail rows [sum(group_sizes), rows) cut the same way.

  With `p.item_table`, `sizes_gmem` is `item_table`'s and decode(w) reads item w.
  Else, up to UNROLL_GROUPS groups, the sizes are read and the group bounds scanned
  once, here (call it before the persistent loop), and decode(w) is O(G) selects on
  registers; beyond (where the table's int32 row sums could overflow), decode(w)
  rescans the sizes from GMEM in a loop (code size stays flat)."""
  tm, prob = p.config.tile_m, p.problem

  def span_of(start, stop):
    return jnp.where(stop > start, lax.div(stop - _box_base(start) + tm - 1, tm), 0)

  def visit(w, i, start, stop, span, count, item):
    hit = (count <= w) & (w < count + span)
    group, row0, lo, hi = item
    return (
        jnp.where(hit, i, group),
        jnp.where(hit, _box_base(start) + (w - count) * tm, row0),
        jnp.where(hit, start, lo),
        jnp.where(hit, stop, hi),
    )

  def finish(w, count, item):
    group, row0, lo, hi = item
    active = w < count
    return _Item(group, row0, lo, hi, active, active & (group < prob.groups))

  zero = jnp.int32(0)
  if p.item_table:

    def decode(w):
      group = sizes_gmem[0, w]
      item = (group, sizes_gmem[1, w], sizes_gmem[2, w], sizes_gmem[3, w])
      return _Item(*item, group <= prob.groups, group < prob.groups)

    return decode

  if prob.groups <= UNROLL_GROUPS:
    bounds, end, count = [], zero, zero  # (group, start, stop, span, count) per group
    for i in range(prob.groups + 1):  # the last one is the tail
      start = end
      if i < prob.groups:
        end = start + _clipped(sizes_gmem[i], prob.m - start)
      else:
        end = jnp.int32(prob.rows)
      span = span_of(start, end)
      bounds.append((jnp.int32(i), start, end, span, count))
      count = count + span

    def decode(w):
      item = (zero,) * 4
      for bound in bounds:
        item = visit(w, *bound, item)
      return finish(w, count, item)

    return decode

  def decode(w):
    def body(i, carry):
      end, count, item = carry
      start = end
      end = start + _clipped(sizes_gmem[i], prob.m - start)
      span = span_of(start, end)
      return end, count + span, visit(w, i, start, end, span, count, item)

    end, count, item = lax.fori_loop(0, prob.groups, body, (zero, zero, (zero,) * 4))
    span = span_of(end, jnp.int32(prob.rows))
    item = visit(w, jnp.int32(prob.groups), end, jnp.int32(prob.rows), span, count, item)
    return finish(w, count + span, item)

  return decode


def _kernel(sizes_gmem, lhs_gmem, rhs_gmem, a_scales_gmem, b_scales_gmem, out_gmem, *, p: _Plan):
  cfg, prob = p.config, p.problem
  tm, tn, tk = cfg.tile_m, cfg.tile_n, cfg.tile_k
  wm, wn = cfg.wg_tile
  em, en = cfg.epilogue_tile
  sn = cfg.stage_cols(prob.out_dtype)
  stores = pipeline.StoreSlots()
  slots = stores.slots
  in_dtype, out_dtype = lhs_gmem.dtype, out_gmem.dtype
  ab_tf = smem.tile_transforms(in_dtype, p.ab_swizzle)
  out_tf = smem.tile_transforms(out_dtype, p.out_swizzle)
  rhs_block = (tn, tk) if prob.transpose_rhs else (tk, tn)
  grid_size = p.m_items * p.n_tiles

  def position(decode, tile_index):
    w, ni = raster.tile_coords(tile_index, p.m_items, p.n_tiles, group=cfg.group, order=cfg.raster)
    return decode(w), ni

  def scoped(ring_refs, out_smem, stage_smem):
    ring = pipeline.Ring.of(ring_refs)
    wg = lax.axis_index("wg")
    out_copy, out_smem = smem.copy_and_register_views(out_smem)

    def producer():
      decode = _item_decoder(sizes_gmem, p)

      def load_item(index, _, step0):
        item, ni = position(decode, index)

        @pl.when(item.compute)
        def _():
          @pl.loop(0, p.k_iters)
          def _(k):
            if prob.transpose_rhs:
              rows, cols = pl.ds(ni * tn, tn), pl.ds(k * tk, tk)
            else:
              rows, cols = pl.ds(k * tk, tk), pl.ds(ni * tn, tn)
            row0 = pl.multiple_of(item.row0, BOX_ROW_ALIGN)
            views = [
                lhs_gmem.at[pl.ds(row0, tm), pl.ds(k * tk, tk)],
                rhs_gmem.at[item.group, rows, cols],
            ]
            if prob.block_scaled:  # this K block's scales: the box's rows, the group's block
              views.append(a_scales_gmem.at[pl.ds(k, 1), pl.ds(row0, tm)])
              box = pl.multiple_of(ni - lax.rem(ni, B_SCALE_BOX), B_SCALE_BOX)
              views.append(b_scales_gmem.at[item.group, pl.ds(k, 1), pl.ds(box, B_SCALE_BOX)])
            ring.fill(step0 + k, views)

        return jnp.where(item.compute, p.k_iters, 0)

      ring.drain(pipeline.persistent_loop(grid_size, load_item))

    def operands(_, a_stage, b_stage, *scales):
      a_tile = a_stage.at[pl.ds(wg * wm, wm), :]
      return a_tile, _compat.transpose_2d(b_stage) if prob.transpose_rhs else b_stage

    def block_operands(_, a_stage, b_stage, *scales):
      """Blockwise fp8: this warpgroup's rows of the lhs stage and the (N, K) rhs stage."""
      del scales
      return a_stage.at[pl.ds(wg * wm, wm), :], b_stage

    def block_scale(ni, _, a_stage, b_stage, a_scales, b_scales):
      """Blockwise fp8: this warpgroup's row scales of a K block times the rhs block's
      (of tile column ni)."""
      factor = lax.broadcast_in_dim(a_scales[0, pl.ds(wg * wm, wm)], (wm, wn), (0,))
      return factor * b_scales[0, lax.rem(ni, B_SCALE_BOX)]

    def consumer():
      decode = _item_decoder(sizes_gmem, p)

      def compute_item(index, _, step0):
        item, ni = position(decode, index)

        @pl.when(item.active)
        def _():
          if prob.block_scaled:
            result = lax.cond(
                item.compute,
                lambda: ring.mma_promoted(
                    (wm, wn),
                    step0,
                    0,
                    p.k_iters,
                    operands,
                    functools.partial(block_scale, ni),
                    block_operands=block_operands if p.fresh_blocks else None,
                    transforms=ab_tf,
                ),
                lambda: jnp.zeros((wm, wn), jnp.float32),  # the tail: zeros
            )
            _epilogue(result, item, ni)
            return

          @functools.partial(pl.run_scoped, acc=plgpu.ACC((wm, wn), jnp.float32))
          def _(acc):
            pl.when(item.compute)(lambda: ring.mma(acc, step0, 0, p.k_iters, operands))
            _epilogue(acc[...], item, ni)  # zeros for the tail (no WGMMA ran)

        return jnp.where(item.compute, p.k_iters, 0)

      pipeline.persistent_loop(grid_size, compute_item)
      plgpu.wait_smem_to_gmem(0)

    def _epilogue(result, item, ni):
      row0 = pl.multiple_of(item.row0 + wg * wm, BOX_ROW_ALIGN)
      lo = jnp.clip(item.lo - row0, 0, wm)
      hi = jnp.clip(item.hi - row0, 0, wm)
      full = (lo == 0) & (hi == wm)
      chunks = [(j, result[:, j * en : (j + 1) * en]) for j in range(wn // en)]
      # With an odd number of chunks the next item's first chunk reuses the slot
      # of this item's last one, so only an even count may keep one store in flight.
      in_flight = stores.in_flight(len(chunks))

      @pl.when(full)
      def _():
        for j, y in chunks:
          stores.store(
              out_smem.at[wg],
              j,
              y.astype(out_dtype),
              out_gmem.at[pl.ds(row0, em), pl.ds(ni * tn + j * en, en)],
              in_flight=in_flight,
              copy_slots=out_copy.at[wg],
          )

      @pl.when(jnp.logical_not(full) & (hi > lo))
      def _():
        stage = stage_smem.at[wg]
        for j in range(wn // sn):
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)
          stage[...] = result[:, j * sn : (j + 1) * sn].astype(out_dtype)
          plgpu.commit_smem()
          cols = pl.ds(ni * tn + j * sn, sn)
          start, rows = lo, hi - lo  # 1 <= rows < 64 here (64 rows is the full path)
          size = LADDER_MAX_ROWS // 2
          while size >= 1:
            this = size

            @pl.when((rows & this) != 0)
            def _():
              plgpu.copy_smem_to_gmem(
                  stage.at[pl.ds(start, this)], out_gmem.at[pl.ds(row0 + start, this), cols]
              )

            start = start + (rows & this)
            size //= 2

    pipeline.warp_specialized(producer, consumer)

  pl.run_scoped(
      scoped,
      ring_refs=pipeline.ring_scratch(
          cfg.stages,
          [((tm, tk), in_dtype, ab_tf, p.copy_views[0]), (rhs_block, in_dtype, ab_tf)]
          + (
              [((1, tm), jnp.float32, ()), ((1, B_SCALE_BOX), jnp.float32, ())]
              if prob.block_scaled
              else []
          ),
      ),
      out_smem=smem.tile_buffer(
          (pipeline.CONSUMERS, slots, em, en), out_dtype, out_tf, p.copy_views[1]
      ),
      stage_smem=plgpu.SMEM((pipeline.CONSUMERS, em, sn), out_dtype),
      collective_axes="wg",
  )


def row_views(dtype, out_dtype, config: RaggedConfig, ab_swizzle, out_swizzle) -> tuple:
  """(lhs, output): the TMA views the kernel copies those arrays' tiles through when their
  rows are not a multiple of 8 (`smem.row_copy_transforms`), None where a tile has none
  (its rows are then padded). `ab_swizzle`, `out_swizzle`: the swizzles in use (None:
  no view)."""
  views = []
  for tile_dtype, swizzle, minor in (
      (dtype, ab_swizzle, config.tile_k),
      (out_dtype, out_swizzle, config.epilogue_tile[1]),
  ):
    views.append(
        None
        if swizzle is None
        else smem.row_copy_transforms(smem.tile_transforms(tile_dtype, swizzle), minor)
    )
  return tuple(views)


def ragged_gemm(
    lhs,
    rhs,
    group_sizes,
    block_scales=None,
    *,
    problem: RaggedProblem,
    config: RaggedConfig,
    interpret=None,
):
  """Runs the kernel on arrays already laid out for TMA (see `ragged_dot` for the API).

  Args:
    lhs: (problem.rows, K') with K' >= K zero-padded.
    rhs: (G, K', N') or, with `problem.transpose_rhs`, (G, N', K').
    group_sizes: (G,) int32.
    block_scales: with `problem.block_scaled`, (lhs_scales_t, rhs_scales_t): f32
      (K/128, >= rows + tile_m) per-row scales of each 128-wide K block of lhs, transposed,
      and f32 (G, K/128, >= N/128 rounded up to B_SCALE_BOX) scales of each group's (128 x 128) rhs blocks.
    interpret: None on hardware, or GPU interpret-mode params.
  Returns:
    (problem.rows, problem.n) array of `problem.out_dtype`.
  """
  items = group_sizes.astype(jnp.int32)
  if _lists_items(problem):  # listed out here: the kernel's entry stays one custom call
    items = item_table(items, problem, config.tile_m, max_items(problem, config))
  return _ragged_kernel(
      items, lhs, rhs, block_scales, problem=problem, config=config, interpret=interpret
  )


@compile_once.kernel_entry(static_argnames=("problem", "config", "interpret"))
def _ragged_kernel(items, lhs, rhs, block_scales, *, problem, config, interpret):
  """`ragged_gemm`'s kernel; `items` is the group sizes or `item_table`'s table, made
  outside so that the entry lowers to its custom call alone (what `kernel_cache`
  stores)."""
  config.validate(problem)
  ab_swizzle = smem.widest_swizzle(lhs.dtype, config.tile_k, lhs.shape[-1], rhs.shape[-1])
  if ab_swizzle is None:
    raise ValueError(
        f"lhs {lhs.shape} and rhs {rhs.shape} have no common TMA swizzle; pad their minor dims"
    )
  en = config.epilogue_tile[1]
  out_swizzle = smem.widest_swizzle(problem.out_dtype, en, problem.n)
  if out_swizzle is None:
    raise ValueError(f"N={problem.n} cannot be stored by TMA; pad it to a multiple of 16 bytes")
  lhs_view, out_view = row_views(problem.dtype, problem.out_dtype, config, ab_swizzle, out_swizzle)
  copy_views = (
      smem.row_copy_view("lhs", lhs.shape[0], lhs_view),
      smem.row_copy_view("the output", problem.rows, out_view),
  )
  num_sms = config.num_sms or _compat.device_sm_count() or DEFAULT_NUM_SMS
  fresh_blocks = (
      interpret is None
      and problem.block_scaled
      and problem.transpose_rhs
      and config.wg_tile[0] == block_mma.ROWS
  )
  plan = _Plan(
      problem, config, ab_swizzle, out_swizzle, copy_views, fresh_blocks, _lists_items(problem)
  )
  kernel = pipeline.launch(
      compile_once.named_body(
          "pallas_gemm_ragged" + ("_blockwise" if problem.block_scaled else ""), _kernel, p=plan
      ),
      out_type=jax.ShapeDtypeStruct((problem.rows, problem.n), jnp.dtype(problem.out_dtype)),
      workers=num_sms,
      interpret=interpret,
  )
  if (block_scales is not None) != problem.block_scaled:
    raise ValueError("block_scales and problem.block_scaled go together")
  a_scales, b_scales = block_scales if block_scales is not None else (None, None)
  return kernel(items, lhs, rhs, a_scales, b_scales)
