"""Warp-specialized persistent GEMM for Hopper (Pallas Mosaic GPU).

One producer warpgroup streams A and B tiles with TMA into a ring of swizzled
SMEM stages; two (or three) consumer warpgroups run WGMMA on them with f32 accumulators,
keeping one WGMMA group in flight, and run the fused epilogue through SMEM with
asynchronous TMA stores. The grid is persistent: each CTA (or 2-CTA cluster,
with TMA multicast of the shared operand) walks its share of output tiles in
the order `raster.tile_coords` gives, and the SMEM ring runs on across tiles.

Schedules:
  cooperative: the consumers (2, or 3: `GemmConfig.consumers`) work on one tile, split
    along M or N.
  pingpong: each consumer owns whole tiles, alternating, so one warpgroup's
    epilogue overlaps the other's main loop; the ring is shared and both
    warpgroups release every stage (see `skim`).

>>> import jax, jax.numpy as jnp
>>> from pallas_gemm.config import GemmConfig, GemmProblem
>>> p = GemmProblem(m=256, n=256, k=128)
>>> f = lambda a, b: hopper_gemm(a, b, problem=p, config=GemmConfig(num_sms=2))
>>> a = jax.ShapeDtypeStruct((256, 128), jnp.bfloat16)
>>> b = jax.ShapeDtypeStruct((128, 256), jnp.bfloat16)
>>> jax.export.export(jax.jit(f), platforms=["cuda"])(a, b).out_avals
(ShapedArray(bfloat16[256,256]),)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
from jax import lax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp

from pallas_gemm import block_mma
from pallas_gemm import _compat
from pallas_gemm import compile_once
from pallas_gemm import device_rings
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import operands
from pallas_gemm import pipeline
from pallas_gemm import raster
from pallas_gemm import schedules
from pallas_gemm import smem
from pallas_gemm import stream_k as stream_k_lib
from pallas_gemm import tile_epilogue
from pallas_gemm.config import B_SCALE_BOX, DEFAULT_NUM_SMS, INT_DTYPES, GemmConfig, GemmProblem, tiles
from pallas_gemm.operands import OPERANDS
from pallas_gemm.tile_epilogue import at

EXPERIMENT_COMPILER_PARAMS: dict = {}
"""Extra `plgpu.CompilerParams` fields for benchmark experiments only (NOTES.md);
read when a kernel is traced. Empty in normal use."""


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Everything static the kernel body needs, derived once in the wrapper."""

  problem: GemmProblem
  config: GemmConfig
  epilogue: epilogue_lib.EpilogueSpec
  a_transforms: tuple
  b_transforms: tuple
  out_transforms: tuple
  residual_transforms: tuple | None
  valid_n: int
  """Output columns that count in amax (the rest are padding)."""
  return_pre: bool = False
  """Write the affine part (pre-activation) to a second output as well."""
  workers: int = 1
  """Persistent CTAs (clusters) of the grid."""
  ring_kind: str | None = None
  """A collective inside the kernel (`device_rings.KINDS`), or None."""
  ring_axis: str | None = None
  """The mesh axis of its ring."""
  ring_size: int = 1
  """Devices along `ring_axis`: the device steps, each over one row chunk."""
  fresh_blocks: bool = False
  """Blockwise fp8: each K block's WGMMAs overwrite fresh registers (`block_mma`), as
  on hardware; False in GPU interpret mode, which cannot run inline Mosaic GPU code."""
  copy_views: tuple = (None, None, None, None)
  """TMA-side transforms of the A, B, output and residual tiles whose arrays' rows do
  not come in groups of 8 (`smem.row_copy_transforms`), None where the rows do."""

  @property
  def splits(self) -> int:
    """K slices (split-K): each is a batch of output tiles of its own."""
    return self.config.k_splits(self.problem)[0]

  @property
  def k_iters(self) -> int:
    """tile_k steps per tile (per K slice)."""
    return self.config.k_splits(self.problem)[1]

  @property
  def m_tiles(self) -> int:
    return tiles(self.problem.m, self.config.tile_m)

  @property
  def n_tiles(self) -> int:
    return tiles(self.problem.n, self.config.tile_n)

  @property
  def cluster_tiles(self) -> tuple[int, int]:
    cm, cn = self.config.cluster
    return tiles(self.m_tiles, cm), tiles(self.n_tiles, cn)

  @property
  def step_tiles(self) -> int:
    """Output tiles of one device step (of the whole problem without a ring)."""
    mc, nc = self.cluster_tiles
    return self.splits * self.problem.batch * mc * nc

  @property
  def num_tiles(self) -> int:
    return self.ring_size * self.step_tiles

  @property
  def stream_k(self) -> stream_k_lib.Schedule | stream_k_lib.TailSplit | None:
    """The stream-K schedule, or None: every tile whole, round-robin over the workers."""
    if not self.config.stream_k:
      return None
    plan = stream_k_lib.TailSplit if self.config.split_tail else stream_k_lib.Schedule
    schedule = plan.plan(self.num_tiles, self.workers, self.k_iters)
    return schedule if schedule.enabled else None

  @property
  def partial_slots(self) -> int:
    """Stream-K workspace slots: one f32 warpgroup tile per contributor (the schedule's
    `slots`), CTA and consumer."""
    return self.stream_k.slots * self.config.cluster_size * self.config.consumers


def _tile_position(p: _Plan, tile_index):
  """(batch, m_tile, n_tile) of this CTA for a linear cluster-tile index.

  With split-K, `batch` counts K slices too (slice-major): it indexes the
  (splits * batch, M, N) output of partial sums.
  """
  mc, nc = p.cluster_tiles
  batch_idx = lax.div(tile_index, mc * nc)
  m_c, n_c = raster.tile_coords(
      lax.rem(tile_index, mc * nc), mc, nc, group=p.config.group, order=p.config.raster
  )
  cm, cn = p.config.cluster
  if p.config.cluster_size > 1:
    cta = lax.axis_index("cluster")
    return batch_idx, m_c * cm + (cta if cm > 1 else 0), n_c * cn + (cta if cn > 1 else 0)
  return batch_idx, m_c, n_c


_INPUTS = (
    *("scalars" if name == "scalar" else name for name in OPERANDS),
    "b_up",
    "residual_up",
    "a_scales",
    "b_scales",
    "a_rest",
    "b_rest",
)
"""The kernel's inputs after A and B, in order: the epilogue operands (`operands.OPERANDS`;
a user's scalar rides in the runtime `scalars`), then the gated unit's and blockwise
fp8's, then A's and B's pieces after the first (`GemmProblem.a_splits`, `b_splits`)."""


def _kernel(a_gmem, b_gmem, *refs, p: _Plan):
  inputs = dict(zip(_INPUTS, refs))
  outs = refs[len(_INPUTS) :]
  pieces = len(p.problem.out_splits or (None,))
  out_gmem = tuple(outs[:pieces]) if p.problem.out_splits else outs[0]
  extra_refs = outs[pieces:]
  vectors = {name: inputs[name] for name in operands.VECTORS}
  c_gmem, residual_gmem, scalars_gmem = inputs["c"], inputs["residual"], inputs["scalars"]
  b_up_gmem, residual_up_gmem = inputs["b_up"], inputs["residual_up"]
  a_scales_gmem, b_scales_gmem = inputs["a_scales"], inputs["b_scales"]
  a_pieces = (a_gmem, *inputs["a_rest"]) if p.problem.a_splits else None
  b_pieces = (b_gmem, *inputs["b_rest"]) if p.problem.b_splits else None
  extra_refs = iter(extra_refs)
  pre_gmem = next(extra_refs) if p.return_pre else None
  up_pre_gmem = next(extra_refs) if p.return_pre and b_up_gmem is not None else None
  amax_gmem = next(extra_refs) if p.problem.amax else None
  lse_gmem = next(extra_refs) if p.problem.row_lse else None
  ring_gmem = next(extra_refs) if p.ring_kind else None
  sk = p.stream_k
  partials_gmem = next(extra_refs) if sk else None
  # One semaphore per workspace slot, shared by all CTAs (scratch semaphores would be
  # per CTA); Pallas zeroes it before every launch, and every signal is waited for.
  semaphores = pl.get_global(plgpu.SemaphoreType.REGULAR((p.partial_slots,))) if sk else None
  cfg, prob = p.config, p.problem
  gather = device_rings.GatherRing.of(p, ring_gmem) if p.ring_kind == "all_gather" else None
  scatter = device_rings.ScatterRing.of(p, ring_gmem) if p.ring_kind == "reduce_scatter" else None
  # Residual operands, loaded chunk by chunk beside the epilogue: the residual, and with
  # `epilogue.gated_slope` the gated unit's up pre-activation too (slot r of a chunk).
  residuals = [r for r in (residual_gmem, residual_up_gmem) if r is not None]
  tm, tn, tk = cfg.tile_m, cfg.tile_n, cfg.tile_k
  wm, wn = cfg.wg_tile
  schedule = schedules.of(cfg)
  out_dtype = (out_gmem[0] if p.problem.out_splits else out_gmem).dtype
  acc_dtype = jnp.int32 if prob.dtype in INT_DTYPES else jnp.float32
  a_block = (tk, tm) if prob.transpose_a else (tm, tk)
  b_cols = tn // 2 if b_up_gmem is not None else tn  # gated: gate and up tiles of tn/2
  b_block = (b_cols, tk) if prob.transpose_b else (tk, b_cols)
  cm, cn = cfg.cluster
  a_collective = "cluster" if cn > 1 else None  # CTAs along N share the A tile
  b_collective = "cluster" if cm > 1 else None  # CTAs along M share the B tile

  def scoped(ring_refs, **epilogue_refs):
    ring = pipeline.Ring.of(ring_refs)
    wg = lax.axis_index("wg")
    epi = tile_epilogue.build(
        p,
        wg,
        out_gmem=out_gmem,
        pre_gmem=pre_gmem,
        up_pre_gmem=up_pre_gmem,
        amax_gmem=amax_gmem,
        lse_gmem=lse_gmem,
        vectors=vectors,
        c_gmem=c_gmem,
        residuals=residuals,
        **epilogue_refs,
    )

    def for_each_unit(visit):
      """Calls visit(step0, tile_index, kb, ke) for this CTA's work, in order.

      A unit is K steps [kb, ke) of one output tile; step0 counts the ring
      steps before it (the ring runs on across units: slot = step % stages).
      kb and ke are Python ints for whole tiles. Returns the total step count.
      """
      sm, kt = lax.axis_index("sm"), p.k_iters
      if sk is None:
        return pipeline.persistent_loop(
            p.num_tiles,
            lambda index, _, step0: visit(step0, index, 0, kt),
            steps_of=kt,
            workers=p.workers,
        )
      return sk.for_each_unit(visit, sm)

    def partial_slot(worker):
      """This CTA's and warpgroup's stream-K workspace slot (and semaphore) of contributor
      `worker`."""
      cta = lax.axis_index("cluster") if cfg.cluster_size > 1 else 0
      return (sk.slot(worker) * cfg.cluster_size + cta) * cfg.consumers + wg

    def producer():
      def load_unit(step0, tile_index, kb, ke):
        if p.ring_kind:
          device_step, tile_index = device_rings.split(p, tile_index)
        if gather is not None:
          gather.wait_for_chunk(device_step)
        out_batch, mi, ni = _tile_position(p, tile_index)
        # K slice and operand batch of this tile (slice 0 and out_batch without split-K).
        k_slice, batch_idx = out_batch, 0
        if prob.batch > 1:
          k_slice, batch_idx = lax.div(out_batch, prob.batch), lax.rem(out_batch, prob.batch)

        @pl.loop(kb, ke)
        def _(k):
          k0 = (k_slice * p.k_iters + k) * tk  # past K: TMA zero-fills (last slice only)
          rows_a, cols_a = pl.ds(mi * tm, tm), pl.ds(k0, tk)
          if scatter is not None:  # the step's chunk of A
            rows_a = pl.ds(scatter.a_row0(device_step) + mi * tm, tm)
          if prob.transpose_a:
            rows_a, cols_a = cols_a, rows_a
          rows_b, cols_b = pl.ds(k0, tk), pl.ds(ni * tn, tn)
          if b_up_gmem is not None:  # gated: gate and up columns side by side
            cols_b = pl.ds(ni * (tn // 2), tn // 2)
          if prob.transpose_b:
            rows_b, cols_b = cols_b, rows_b
          views = [at(a_gmem, batch_idx, rows_a, cols_a), at(b_gmem, batch_idx, rows_b, cols_b)]
          if a_pieces is not None:  # A's K columns from the piece that holds them
            views[0] = _piece_view(
                a_pieces, prob.a_splits, k0, lambda x, c: at(x, batch_idx, rows_a, pl.ds(c, tk))
            )
          if b_pieces is not None:  # B's N columns likewise
            views[1] = _piece_view(
                b_pieces,
                prob.b_splits,
                ni * tn,
                lambda x, c: at(x, batch_idx, rows_b, pl.ds(c, tn)),
            )
          collectives = [a_collective, b_collective]
          if gather is not None:  # the step's chunk: this device's, or one received
            gather.fill(ring, step0 + k - kb, device_step, views, rows_a, cols_a)
            return
          if b_up_gmem is not None:
            views.append(at(b_up_gmem, batch_idx, rows_b, cols_b))
            collectives.append(b_collective)
          if prob.block_scaled:  # this K block's scales: A's rows of the tile, B's block
            views.append(a_scales_gmem.at[pl.ds(k, 1), pl.ds(mi * tm, tm)])
            if prob.b_scale_rows > 1:  # one (128 x 128) block per tile: the aligned box with it
              box = pl.multiple_of(ni - lax.rem(ni, B_SCALE_BOX), B_SCALE_BOX)
              views.append(b_scales_gmem.at[pl.ds(k, 1), pl.ds(box, B_SCALE_BOX)])
            else:  # a scale per B row: the tile's
              views.append(b_scales_gmem.at[pl.ds(k, 1), pl.ds(ni * tn, tn)])
            collectives += [a_collective, b_collective]
          ring.fill(step0 + k - kb, views, collectives)

      ring.drain(for_each_unit(load_unit))

    def operands(_, a_tile, b_tile, *extra):
      """This warpgroup's WGMMA views of a ring stage's A and B tiles (gated: the
      (A, gate B) and (A, up B) pairs)."""
      b_up_tile = extra[0] if b_up_gmem is not None else None
      if prob.transpose_a:
        a_tile = _compat.transpose_2d(a_tile)
      else:
        a_tile = schedule.a_view(a_tile, wg)
      b_tile = schedule.b_view(b_tile, wg, prob.transpose_b)
      if b_up_tile is not None:
        if prob.transpose_b:
          b_tile, b_up_tile = _compat.transpose_2d(b_tile), _compat.transpose_2d(b_up_tile)
        return (a_tile, b_tile), (a_tile, b_up_tile)
      if prob.transpose_b:
        b_tile = _compat.transpose_2d(b_tile)
      return a_tile, b_tile

    def block_operands(_, a_tile, b_tile, *extra):
      """Blockwise fp8: this warpgroup's K-major views of a stage's A and (N, K) B."""
      del extra
      return schedule.a_view(a_tile, wg), schedule.b_view(b_tile, wg, True)

    def block_scale(ni, _, a_tile, b_tile, a_scales, b_scales):
      """Blockwise fp8: the multiplier of one K block's product, A's per-row scales of
      this warpgroup's rows times B's (128 x 128) block scale (of tile column ni) or
      per-row scales."""
      rows = pl.ds(schedule.scale_rows(wg), wm)
      factor = lax.broadcast_in_dim(a_scales[0, rows], (wm, wn), (0,))
      if prob.b_scale_rows > 1:
        return factor * b_scales[0, lax.rem(ni, B_SCALE_BOX)]
      cols = pl.ds(schedule.scale_cols(wg), wn)
      return factor * lax.broadcast_in_dim(b_scales[0, cols], (wm, wn), (1,))

    def compute_unit(step0, tile_index, kb, ke):
      """K steps [kb, ke) of one tile; then its epilogue, or its stream-K partial."""
      unit_operands = operands
      if p.ring_kind:
        device_step, tile_index = device_rings.split(p, tile_index)
      batch_idx, mi, ni = _tile_position(p, tile_index)
      if gather is not None:
        out_row0 = gather.out_row0(device_step)
        unit_operands = gather.forwarding(operands, wg, device_step, mi, ni)
      whole = isinstance(kb, int)  # static: the whole tile, no stream-K fixup
      row0, col0 = schedule.origin(mi, ni, wg)
      if gather is not None:
        row0 = row0 + out_row0

      # Only units that run the epilogue stage them (each load is waited for once).
      if scatter is not None:  # the last device step's
        pl.when(device_step == p.ring_size - 1)(lambda: epi.stage_vectors(batch_idx, row0, col0))
      elif whole:
        epi.stage_vectors(batch_idx, row0, col0)
      else:
        pl.when(kb == 0)(lambda: epi.stage_vectors(batch_idx, row0, col0))
      # Runtime scalars (scaled fp8; a user's epilogue scalar third): read now, so their
      # latency hides behind the K loop.
      scalars = (
          None
          if scalars_gmem is None
          else tuple(scalars_gmem[i] for i in range(scalars_gmem.shape[0]))
      )

      if prob.block_scaled:
        total = ring.mma_promoted(
            (wm, wn),
            step0,
            kb,
            ke,
            operands,
            functools.partial(block_scale, ni),
            depth=cfg.promotion_depth,
            block_operands=block_operands if p.fresh_blocks else None,
            transforms=p.a_transforms,
        )
        if whole:
          epi.run(total, batch_idx, row0, col0, scalars)
        else:  # stream-K: the promoted sum is this unit's f32 partial
          pl.when(kb > 0)(lambda: contribute(total))
          pl.when(kb == 0)(lambda: finish(total, tile_index, batch_idx, row0, col0, scalars))
        return

      if p.epilogue.gated:

        @functools.partial(pl.run_scoped, acc=[plgpu.ACC((wm, wn // 2), jnp.float32)] * 2)
        def _(acc):
          ring.mma(tuple(acc), step0, kb, ke, operands)
          epi.run_gated(acc[0][...], acc[1][...], batch_idx, row0, col0)

        return

      @functools.partial(pl.run_scoped, acc=plgpu.ACC((wm, wn), acc_dtype))
      def _(acc):
        ring.mma(acc, step0, kb, ke, unit_operands)
        if gather is not None:
          gather.signal_forwarded(wg, device_step, ni)
        result = acc[...].astype(jnp.float32)  # s8 x s8 WGMMA accumulates exactly in s32
        if scatter is not None:
          last = device_step == p.ring_size - 1
          store_only = lambda target: tile_epilogue.build_store_only(
              p, wg, out_gmem=target, out_smem=epilogue_refs["out_smem"]
          )
          pl.when(jnp.logical_not(last))(
              lambda: scatter.send(result, device_step, row0, col0, store_only)
          )

          @pl.when(last)
          def _():
            scatter.wait(device_step, row0, col0)
            partials = scatter.partials(device_step, row0, col0)
            epi.run(result, batch_idx, row0, col0, scalars, partials)

          return
        if whole:
          epi.run(result, batch_idx, row0, col0, scalars)
          return
        pl.when(kb > 0)(lambda: contribute(result))
        pl.when(kb == 0)(lambda: finish(result, tile_index, batch_idx, row0, col0, scalars))

    def contribute(result):
      """Stream-K: store this warpgroup's partial sums, then signal the tile's finisher."""
      me = partial_slot(lax.axis_index("sm"))
      partials_gmem.at[me][...] = result
      # The signal is a warpgroup barrier, then one lane's `red.release.sys`: its
      # release covers the whole warpgroup's stores (cumulativity through the barrier).
      pl.semaphore_signal(semaphores.at[me])

    def finish(result, tile_index, batch_idx, row0, col0, scalars):
      """Stream-K: wait for the tile's contributors, then the epilogue adds their partials."""
      sm, kt = lax.axis_index("sm"), p.k_iters
      # The workers after this one up to the owner of the tile's last step (none for a
      # whole tile, whose last step is its own).
      contributors = jnp.maximum(sk.owner(tile_index * kt + kt - 1) - sm, 0)
      slot = lambda c: partial_slot(jnp.minimum(sm + 1 + c, p.workers - 1))

      @pl.loop(0, contributors)
      def _(c):
        pl.semaphore_wait(semaphores.at[slot(c)], 1)

      partials = tile_epilogue.Partials(contributors, lambda c: partials_gmem.at[slot(c)])
      epi.run(result, batch_idx, row0, col0, scalars, partials)

    def consumer():
      schedule.consume(compute_unit, for_each_unit, ring, p, wg)

    pipeline.warp_specialized(producer, consumer, consumers=cfg.consumers)

  pl.run_scoped(
      scoped,
      ring_refs=pipeline.ring_scratch(
          cfg.stages,
          [(a_block, a_gmem.dtype, p.a_transforms, p.copy_views[0])]
          + [(b_block, b_gmem.dtype, p.b_transforms, p.copy_views[1])]
          * (1 if b_up_gmem is None else 2)
          + (
              [
                  ((1, tm), jnp.float32, ()),
                  ((1, B_SCALE_BOX if prob.b_scale_rows > 1 else tn), jnp.float32, ()),
              ]
              if prob.block_scaled
              else []
          ),
          cluster=cfg.cluster_size > 1,
          consumers=cfg.consumers,
      ),
      **tile_epilogue.scratch(
          cfg,
          out_dtype,
          p.out_transforms,
          vectors=tuple(name for name, ref in vectors.items() if ref is not None),
          c=c_gmem is not None,
          residual_dtype=None if residual_gmem is None else residual_gmem.dtype,
          residuals=len(residuals),
          residual_transforms=p.residual_transforms,
          amax=amax_gmem is not None,
          row_lse=lse_gmem is not None,
          out_copy_transforms=p.copy_views[2],
          residual_copy_transforms=p.copy_views[3],
      ),
      collective_axes="wg",
  )


def _piece_view(pieces, widths, first, view) -> pipeline.OneOf:
  """The copy of an operand box whose first minor-dim index is `first`, from the piece
  (arrays side by side, `widths` wide) that holds it: `view(piece, first within it)`.
  Each box lies in one piece (`_check_operand_splits`)."""
  choices, start = [], 0
  for i, (piece, width) in enumerate(zip(pieces, widths)):
    condition = True  # the first piece has no lower bound, the last no upper one
    if i > 0:
      condition = first >= start
    if i < len(widths) - 1:
      condition = condition & (first < start + width)
    choices.append((condition, view(piece, first - start)))
    start += width
  return pipeline.OneOf(tuple(choices))


def _check_operand_splits(problem, config, a, b, a_rest, b_rest, ring_kind, b_up):
  """A launch with `problem.a_splits` / `b_splits`: pieces of the operand's minor dim
  (A's K, B's N; neither transposed), each but the last a whole number of boxes (tile_k
  columns of A, tile_n of B), the first passed as the operand itself; no ring, gated or
  block-scaled problem."""
  for name, splits, first, rest, box, transposed in (
      ("a", problem.a_splits, a, a_rest, config.tile_k, problem.transpose_a),
      ("b", problem.b_splits, b, b_rest, config.tile_n, problem.transpose_b),
  ):
    if splits is None:
      if rest is not None:
        raise ValueError(f"{name}_rest needs problem.{name}_splits")
      continue
    pieces = (first, *(rest or ()))
    if (
        transposed
        or len(pieces) != len(splits)
        or any(w % box for w in splits[:-1])
        or any(x.shape[-1] != w or x.shape[:-1] != first.shape[:-1] for x, w in zip(pieces, splits))
    ):
      raise ValueError(
          f"problem.{name}_splits={splits}: {name} not transposed, given as {len(splits)} "
          f"arrays of those minor extents and equal leading dims, each but the last a "
          f"multiple of {box}; got {[x.shape for x in pieces]}"
      )
    if ring_kind or b_up is not None or problem.block_scaled:
      raise ValueError(f"problem.{name}_splits: not with a ring, gated or block-scaled GEMM")


def _check_out_splits(problem, config, return_pre, epilogue, ring_kind, copy_views):
  """A launch with `problem.out_splits`'s rules: the widths sum to N, each a whole number
  of epilogue chunks (a chunk's store never straddles two arrays); one plain output."""
  widths, en = problem.out_splits, config.epilogue_shape[1]
  if sum(widths) != problem.n or any(w <= 0 or w % en for w in widths):
    raise ValueError(
        f"problem.out_splits={widths}: the widths must sum to N={problem.n}, each a positive "
        f"multiple of the epilogue chunk's {en} columns"
    )
  others = dict(
      return_pre=return_pre,
      gated=epilogue.gated,
      amax=problem.amax,
      row_lse=problem.row_lse,
      ring=ring_kind is not None,
      row_view=copy_views[2] is not None,
  )
  if any(others.values()):
    raise ValueError(
        f"problem.out_splits: one plain output only, got {[k for k, v in others.items() if v]}"
    )


def _check_gated(
    b_up, b, bias, c, row_bias, residual, scalars, row_scale, col_scale, problem, config, epilogue
):
  """A gated launch's rules (see `hopper_gemm`'s `b_up`)."""
  if (b_up is not None) != epilogue.gated:
    raise ValueError("b_up and epilogue.gated go together (a gated GEMM needs both)")
  if not epilogue.gated:
    return
  if config.consumers != 2:
    raise ValueError(f"GemmConfig.consumers={config.consumers}: a gated GEMM runs 2 consumers")
  if b_up.shape != b.shape or b_up.dtype != b.dtype:
    raise ValueError(f"b_up {b_up.shape} {b_up.dtype} must match b {b.shape} {b.dtype}")
  extras = dict(
      c=c,
      row_bias=row_bias,
      residual=residual,
      scalars=scalars,
      row_scale=row_scale,
      col_scale=col_scale,
  )
  present = [name for name, value in extras.items() if value is not None]
  present += [name for name in ("amax", "row_lse") if getattr(problem, name)]
  if present:
    raise ValueError(f"a gated GEMM takes a bias only as an epilogue operand, got {present}")
  tn = config.tile_n
  if config.schedule == "cooperative" and config.wg_split != "m":
    raise ValueError(
        "GemmConfig.wg_split must be 'm' for a gated GEMM (each warpgroup needs both halves)"
    )
  if config.k_splits(problem)[0] > 1 or config.stream_k:
    raise ValueError("a gated GEMM runs whole tiles: split_k=1 and stream_k=False")
  if problem.n % tn or (tn // 2) % config.epilogue_shape[1]:
    raise ValueError(
        f"gated: problem.n={problem.n} must be a multiple of tile_n={tn}, and tile_n/2 of the "
        f"epilogue tile's {config.epilogue_shape[1]} columns"
    )


def _use_approx_math(problem: GemmProblem, epilogue: epilogue_lib.EpilogueSpec) -> bool:
  """Fast exp/tanh/divide for activations when the output is 16-bit anyway.

  Their error (~2^-11 relative) is below bf16/f16 output rounding; f32 outputs
  keep the precise versions.
  """
  return (
      epilogue.activation is not None
      or epilogue.residual_slope is not None
      or epilogue.gated_slope is not None
  ) and problem.out_dtype != "float32"


def _operand_transforms(problem: GemmProblem, config: GemmConfig, a_minor: int, b_minor: int):
  """SMEM transforms of the A and B tiles: `layouts.gmma_smem_spec`, one shared swizzle.

  The widest swizzle that both tiles and both GMEM arrays allow (TMA tiles the
  whole array); None if there is none.
  """
  tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
  a_major = "MN" if problem.transpose_a else "K"
  b_major = "K" if problem.transpose_b else "MN"
  wm, wn = config.wg_tile  # an MN-major tile is sliced per warpgroup: each slice whole spans
  a_rows = wm if a_major == "MN" else tm
  b_rows = wn if b_major == "MN" else tn
  for width in smem.SWIZZLE_BYTES:
    a_spec = smem.operand_spec(problem.dtype, (a_rows, tk), a_major, a_minor, swizzle=width)
    b_spec = smem.operand_spec(problem.dtype_b, (b_rows, tk), b_major, b_minor, swizzle=width)
    if a_spec is not None and b_spec is not None:
      return (
          smem.tile_transforms(problem.dtype, width, (tm, tk), a_major),
          smem.tile_transforms(problem.dtype_b, width, (tn, tk), b_major),
      )
  return None


def _tile_minors(problem: GemmProblem, config: GemmConfig, gated: bool) -> tuple[int, int]:
  """Minor (contiguous) extents of the A and B ring tiles."""
  tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
  b_cols = tn // 2 if gated else tn
  return (tm if problem.transpose_a else tk), (tk if problem.transpose_b else b_cols)


def operand_row_views(
    problem: GemmProblem, config: GemmConfig, a_minor: int, b_minor: int, gated: bool = False
) -> tuple:
  """(A, B): the TMA views (`smem.row_copy_transforms`) the kernel would copy each
  operand through if its array's rows were not a multiple of 8, None where its tiles
  have no such view (the wrapper then pads the rows). `a_minor`, `b_minor`: the
  arrays' minor extents."""
  transforms = _operand_transforms(problem, config, a_minor, b_minor)
  if transforms is None:
    return None, None
  minors = _tile_minors(problem, config, gated)
  return tuple(smem.row_copy_transforms(t, m) for t, m in zip(transforms, minors))


def epilogue_row_view(dtype, config: GemmConfig, cols: int):
  """The TMA view of an epilogue tile (output, `c` or residual) of `dtype` for an array
  `cols` wide whose rows are not a multiple of 8, or None (pad the rows)."""
  em, en = config.epilogue_shape
  swizzle = smem.widest_swizzle(dtype, en, cols)
  if swizzle is None:
    return None
  return smem.row_copy_transforms(smem.tile_transforms(dtype, swizzle, (em, en)), en)


def _kernel_name(problem: GemmProblem, epilogue: epilogue_lib.EpilogueSpec) -> str:
  """The kernel's symbol in profiles: problem and layout, e.g. `pallas_gemm_4096x512x64_NT`."""
  layout = ("T" if problem.transpose_a else "N") + ("T" if problem.transpose_b else "N")
  batch = f"{problem.batch}x" if problem.batch > 1 else ""
  act = f"_{epilogue_lib.activation_label(epilogue.activation)}" if epilogue.activation else ""
  act += f"_d{epilogue.residual_slope}" if epilogue.residual_slope else ""
  act += "_glu" if epilogue.gated else ""
  act += f"_dglu_{epilogue.gated_slope}" if epilogue.gated_slope else ""
  return f"pallas_gemm_{batch}{problem.m}x{problem.n}x{problem.k}_{layout}{act}"


def hopper_gemm(
    a,
    b,
    bias=None,
    c=None,
    *,
    row_bias=None,
    residual=None,
    scalars=None,
    row_scale=None,
    col_scale=None,
    valid_n=None,
    b_up=None,
    residual_up=None,
    block_scales=None,
    a_rest=None,
    b_rest=None,
    problem: GemmProblem,
    config: GemmConfig,
    epilogue: epilogue_lib.EpilogueSpec = epilogue_lib.EpilogueSpec(),
    return_pre: bool = False,
    all_gather: tuple[str, int] | None = None,
    reduce_scatter: tuple[str, int] | None = None,
    interpret=None,
):
  """Runs the kernel on arrays already laid out for TMA (see `matmul` for the public API).

  Traced and lowered once per distinct kernel in a program (`compile_once`).

  Args:
    a: (batch, M, K) or (M, K); (.., K, M) if `problem.transpose_a`. Extents may
      exceed the logical problem (zero padding); never fall short of it.
    b: (batch, K, N) or (K, N); (.., N, K) if `problem.transpose_b`.
    bias: f32 (n_tiles * tile_n,) zero-padded per-column bias, or None.
    c: out-dtype (batch, M, N) or (M, N) addend scaled by `epilogue.beta`, or None.
    row_bias: f32 (m_tiles * tile_m,) zero-padded per-row bias, or None.
    residual: (batch, M, N) or (M, N) addend of `problem.residual_dtype`, added
      after the activation, or None.
    scalars: f32 (2,) runtime [accumulator multiplier, fp8 output scale], or (3,) with
      a user's epilogue scalar (`with_operands(fn, "scalar")`) third, or None.
    row_scale: f32 (m_tiles * tile_m,) zero-padded per-row multiplier, or None.
    col_scale: f32 (n_tiles * tile_n,) zero-padded per-column multiplier, or None.
    valid_n: with `problem.amax` or `problem.row_lse`, the output columns that count
      (default N).
    b_up: with `epilogue.gated`, the up projection's weights, shaped like `b` (the
      gate's). B tile j then holds gate columns [j, j+1) * tile_n/2 beside the same
      up columns, and the output has `problem.n / 2` columns: `problem.n` counts
      both halves and is a multiple of tile_n. With `return_pre`, (out, gate pre,
      up pre). Not with split-K, stream-K, c, residual, row extras or scales.
    residual_up: with `epilogue.gated_slope`, the gated unit's up pre-activation,
      shaped and typed like `residual` (its gate pre-activation); with `return_pre`
      the outputs are then (d_gate, d_up) = (y * up * act'(gate), y * act(gate)).
    a_rest, b_rest: with `problem.a_splits` / `b_splits`, the operand's pieces after the
      first (`a` / `b` itself): arrays side by side along the minor dim (A's K, B's N),
      read where they are, each box from the piece that holds it.
    block_scales: with `problem.block_scaled` (fp8 A (M, K) and B (N, K), tile_k 128,
      tile_n 128), (a_scales_t, b_scales_t): f32 (K/128, >= M) per-row scales of each
      128-wide K block of A, transposed, and f32 (K/128, >= n_tiles rounded up to
      B_SCALE_BOX) scales of B's (128 x 128) blocks, or with `problem.b_scale_rows == 1`
      (K/128, >= N) per-row scales, transposed; each K block's product is scaled in
      registers before it joins the sum (`Ring.mma_promoted`); with stream-K a unit's
      scaled sum is its f32 partial.
    return_pre: also write `pre = epilogue.affine(...)` (the part before the
      activation) to a second output, from the same epilogue.
    all_gather: (axis, size), inside `shard_map` over a mesh of that one axis with `size`
      devices: `a` (M, K) is this device's row chunk and the result has the rows of
      all `size` chunks in device order, (size * M, N); the chunks travel between the
      devices inside the kernel while it multiplies (`device_rings.GatherRing`), and the last
      output is the (size - 1, M, K) chunks received, device (d + 1 + i) % size's in
      entry i. Cooperative schedule, whole tiles (M a multiple of tile_m), no split-K,
      stream-K, cluster, batch, transposed A, gated or scaled epilogue.
    reduce_scatter: (axis, size), likewise: `a` has `size` row chunks of M rows, and the
      result is this device's chunk of the sum over devices of the product, (M, N),
      with the epilogue applied to the sum; the running sums travel between the
      devices inside the kernel while it multiplies (`device_rings.ScatterRing`), and
      the last output is the buffer they arrived in. The same rules as all_gather.
    interpret: None on hardware, or GPU interpret-mode params.
  Returns:
    (batch, M, N) or (M, N) array of `problem.out_dtype`; with `config.split_k`
    > 1, (splits * batch, M, N) partial sums, slice-major (see `GemmConfig.k_splits`).
    With `problem.out_splits`, the output is a tuple of arrays of those widths instead.
    With `return_pre`, (out, pre) with `pre` like `out`. With `problem.amax`,
    also (last) f32 (batch, n_tiles * tile_n // wg_n, m_tiles * tile_m) partial maxima:
    entry [(b,) j, r] = max |y[(b,) r, c]| over the j-th warpgroup column tile
    (wg_n = `config.wg_tile[1]` columns), before fp8 output scaling, columns
    >= valid_n left out. Reduce `[..., :ceil(valid_n / wg_n), :M]` for the amax.
    With `problem.row_lse`, also (last) f32 (batch, n_tiles * tile_n // wg_n, 2,
    m_tiles * tile_m): entry [(b,) j, 0, r] = m, the max of row r's stored y (the
    output dtype's values) over the j-th warpgroup column tile, and [(b,) j, 1, r] =
    the sum of exp(y - m) there, columns >= valid_n left out (`cross_entropy.lse`).
  """
  return _launch(
      a,
      b,
      bias,
      c,
      row_bias=row_bias,
      residual=residual,
      scalars=scalars,
      row_scale=row_scale,
      col_scale=col_scale,
      valid_n=valid_n,
      b_up=b_up,
      residual_up=residual_up,
      block_scales=block_scales,
      a_rest=a_rest,
      b_rest=b_rest,
      problem=problem,
      config=config,
      epilogue=epilogue,
      return_pre=return_pre,
      all_gather=all_gather,
      reduce_scatter=reduce_scatter,
      interpret=interpret,
      experiment=tuple(sorted(EXPERIMENT_COMPILER_PARAMS.items())),
  )


@compile_once.kernel_entry(
    static_argnames=(
        "valid_n",
        "problem",
        "config",
        "epilogue",
        "return_pre",
        "all_gather",
        "reduce_scatter",
        "interpret",
        "experiment",
    ),
    mesh_dependent=("all_gather", "reduce_scatter"),
)
def _launch(
    a,
    b,
    bias,
    c,
    *,
    row_bias,
    residual,
    scalars,
    row_scale,
    col_scale,
    valid_n,
    b_up,
    residual_up,
    block_scales,
    a_rest,
    b_rest,
    problem,
    config,
    epilogue,
    return_pre,
    all_gather,
    reduce_scatter,
    interpret,
    experiment,
):
  config.validate(problem)
  if all_gather and reduce_scatter:
    raise ValueError("all_gather and reduce_scatter: one ring per kernel")
  ring_kind = "all_gather" if all_gather else "reduce_scatter" if reduce_scatter else None
  if ring_kind and config.consumers != 2:
    raise ValueError(f"GemmConfig.consumers={config.consumers}: {ring_kind} runs 2 consumers")
  ring = all_gather or reduce_scatter
  device_rings.check(
      ring_kind,
      ring,
      problem,
      config,
      epilogue,
      interpret,
      c,
      row_bias,
      residual,
      scalars,
      row_scale,
      col_scale,
      b_up,
  )
  _check_gated(
      b_up, b, bias, c, row_bias, residual, scalars, row_scale, col_scale, problem, config, epilogue
  )
  _check_operand_splits(problem, config, a, b, a_rest, b_rest, ring_kind, b_up)
  if (residual_up is not None) != (epilogue.gated_slope is not None) or (
      residual_up is not None
      and (
          residual is None
          or residual_up.shape != residual.shape
          or residual_up.dtype != residual.dtype
          or not return_pre
      )
  ):
    raise ValueError(
        "residual_up and epilogue.gated_slope go together, with a residual of the same shape "
        "and dtype (the gate pre-activation) and return_pre (the up cotangent's output)"
    )
  if config.stream_k and interpret is not None:
    raise ValueError(
        "GemmConfig.stream_k=True: GPU interpret mode cannot run the GMEM "
        "semaphores of the stream-K reduction; use stream_k=False"
    )
  if config.k_splits(problem)[0] > 1 and (
      config.kernel_problem(problem) != problem or epilogue != epilogue_lib.EpilogueSpec()
  ):
    raise ValueError(
        f"GemmConfig.split_k={config.split_k}: a split-K launch writes f32 partial "
        "sums without an epilogue (pass problem=config.kernel_problem(problem) and "
        "no epilogue; `matmul` sums the slices and applies the epilogue)"
    )
  ab_transforms = _operand_transforms(problem, config, a.shape[-1], b.shape[-1])
  if ab_transforms is None:
    raise ValueError(
        f"A {a.shape} and B {b.shape} have no common TMA swizzle; pad their minor dims"
    )
  em, en = config.epilogue_shape
  out_swizzle = smem.widest_swizzle(problem.out_dtype, en, problem.n)
  if out_swizzle is None:
    raise ValueError(f"N={problem.n} cannot be stored by TMA; pad it to a multiple of 16 bytes")
  residual_transforms = None
  if residual is not None:
    res_swizzle = smem.widest_swizzle(residual.dtype, en, residual.shape[-1])
    if res_swizzle is None:
      raise ValueError(f"residual {residual.shape} cannot be loaded by TMA; pad its minor dim")
    residual_transforms = smem.tile_transforms(residual.dtype, res_swizzle, (em, en))
  a_view, b_view = operand_row_views(problem, config, a.shape[-1], b.shape[-1], b_up is not None)
  copy_views = (
      smem.row_copy_view("a", a.shape[-2], a_view),
      smem.row_copy_view("b", b.shape[-2], b_view),
      smem.row_copy_view(
          "the output", problem.m, epilogue_row_view(problem.out_dtype, config, problem.n)
      ),
      None
      if residual is None
      else smem.row_copy_view(
          "residual",
          residual.shape[-2],
          epilogue_row_view(residual.dtype, config, residual.shape[-1]),
      ),
  )
  if (all_gather or reduce_scatter) and any(copy_views):
    raise ValueError(
        "all_gather / reduce_scatter: the rows of a, b and the output must be a multiple of 8"
    )
  num_sms = config.num_sms or _compat.device_sm_count() or DEFAULT_NUM_SMS
  num_sms -= num_sms % config.cluster_size
  plan = _Plan(
      problem,
      config,
      epilogue,
      *ab_transforms,
      smem.tile_transforms(problem.out_dtype, out_swizzle, (em, en)),
      residual_transforms,
      valid_n=problem.n if valid_n is None else valid_n,
      return_pre=return_pre,
      workers=num_sms // config.cluster_size,
      ring_kind=ring_kind,
      ring_axis=ring[0] if ring else None,
      ring_size=ring[1] if ring else 1,
      copy_views=copy_views,
      fresh_blocks=interpret is None
      and problem.block_scaled
      and problem.transpose_b
      and not problem.transpose_a
      and config.wg_tile[0] == block_mma.ROWS,
  )
  lead = (problem.batch,) if a.ndim == 3 or b.ndim == 3 else ()
  if plan.splits > 1:
    lead = (plan.splits * problem.batch,)
  out_cols = problem.n // 2 if epilogue.gated else problem.n
  out_rows = problem.m * (plan.ring_size if all_gather else 1)
  out = jax.ShapeDtypeStruct((*lead, out_rows, out_cols), jnp.dtype(problem.out_dtype))
  out_type = (out,) + ((out,) * (1 + epilogue.gated) if return_pre else ())
  if problem.out_splits:
    _check_out_splits(problem, config, return_pre, epilogue, ring_kind, copy_views)
    out_type = tuple(
        jax.ShapeDtypeStruct((*lead, out_rows, width), jnp.dtype(problem.out_dtype))
        for width in problem.out_splits
    )
  extra_params = {}
  if problem.amax or problem.row_lse:  # per warpgroup column tile and row: (batch, j, [2,] r)
    cm, cn = config.cluster
    col_tiles = plan.cluster_tiles[1] * cn * config.tile_n // config.wg_tile[1]
    rows = plan.cluster_tiles[0] * cm * config.tile_m
    for stats, present in (((), problem.amax), ((2,), problem.row_lse)):
      if present:
        out_type += (jax.ShapeDtypeStruct((*lead, col_tiles, *stats, rows), jnp.float32),)
    # Row reductions stay inside warps: no cross-warp reduction scratch is needed.
    extra_params["reduction_scratch_bytes"] = 0
  if all_gather:  # the chunks received (and forwarded)
    out_type += (jax.ShapeDtypeStruct((plan.ring_size - 1, problem.m, problem.k), a.dtype),)
  if reduce_scatter:  # the running sums received
    received = device_rings.ScatterRing.received_shape(plan)
    out_type += (jax.ShapeDtypeStruct(received, jnp.dtype(problem.out_dtype)),)
  outputs = len(out_type)
  if plan.stream_k:  # the contributors' f32 partial sums
    out_type += (jax.ShapeDtypeStruct((plan.partial_slots, *config.wg_tile), jnp.float32),)
  kernel = pipeline.launch(
      compile_once.named_body(_kernel_name(problem, epilogue), _kernel, p=plan),
      out_type=out_type if len(out_type) > 1 else out_type[0],
      workers=plan.workers,
      cluster_size=config.cluster_size,
      consumers=config.consumers,
      compiler_params=_compat.compiler_params(
          approx_math=_use_approx_math(problem, epilogue), **extra_params, **dict(experiment)
      ),
      interpret=interpret,
  )
  if (block_scales is not None) != problem.block_scaled:
    raise ValueError("block_scales and problem.block_scaled go together")
  a_scales, b_scales = block_scales if block_scales is not None else (None, None)
  inputs = dict(
      bias=bias,
      row_bias=row_bias,
      c=c,
      residual=residual,
      scalars=scalars,
      row_scale=row_scale,
      col_scale=col_scale,
      b_up=b_up,
      residual_up=residual_up,
      a_scales=a_scales,
      b_scales=b_scales,
      a_rest=a_rest,
      b_rest=b_rest,
  )
  results = kernel(a, b, *(inputs[name] for name in _INPUTS))
  if len(out_type) == 1:
    return results
  return results[:outputs] if outputs > 1 else results[0]
