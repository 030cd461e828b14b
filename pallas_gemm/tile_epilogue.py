"""The fused epilogue of one warpgroup tile of `hopper_gemm`: its vectors and first
residual chunks staged during the K loop, then chunk by chunk from registers through
SMEM slots to TMA stores.

`build` returns the three functions the kernel calls (`TileEpilogue`); `scratch` gives
the SMEM buffers and barriers they use, for the kernel's `pl.run_scoped`. The formula
applied to each chunk is `pallas_gemm.epilogue`'s (the XLA path runs the same one).

Per chunk (em x en of the warpgroup's wm x wn accumulator): affine part (alpha, runtime
scales, beta * c, biases), stream-K partials added first; `pre` stored when asked
(or, with `gated_slope`, the up cotangent); then activation and residual, amax, the
fp8 quantization, the store. Stores rotate through `slots` SMEM buffers with at most
`slots - 1` in flight; a residual chunk past the first `slots` is loaded right after
the store that freed its slot (NOTES exps. 57-58).

>>> import jax.numpy as jnp
>>> from pallas_gemm.config import GemmConfig
>>> refs = scratch(GemmConfig(), jnp.bfloat16, (), vectors=("bias",), c=False,
...                residual_dtype=None, residuals=0, residual_transforms=None, amax=False)
>>> [name for name, ref in sorted(refs.items()) if ref is not None]
['bias_loaded', 'bias_smem', 'out_smem']
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from jax import lax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import operands
from pallas_gemm import smem
from pallas_gemm.operands import OPERANDS


def at(ref, batch_idx, rows, cols):
  """`ref[batch_idx, rows, cols]` for a 3-D ref, `ref[rows, cols]` for 2-D."""
  if len(ref.shape) == 3:
    return ref.at[batch_idx, rows, cols]
  return ref.at[rows, cols]


@dataclasses.dataclass(frozen=True)
class Partials:
  """Partial sums of a warpgroup tile that its epilogue adds to each chunk first: `count`
  of them (traced; at most 0 adds none), the c-th the GMEM tile `tile_of(c)`. One loop
  over them, so the kernel holds one copy of the add whatever the count (NOTES exp. 149).

  >>> Partials(0, lambda c: None).count
  0
  """

  count: object
  tile_of: Callable

  def add_to(self, acc, rows, cols):
    """`acc` (a chunk of the tile, WGMMA layout) plus rows/cols of every partial."""

    def add(c, acc):
      part = _compat.load_registers(self.tile_of(c).at[rows, cols], plgpu.Layout.WGMMA)
      return acc + part.astype(jnp.float32)

    return lax.fori_loop(0, self.count, add, acc)


@dataclasses.dataclass(frozen=True)
class TileEpilogue:
  """What the kernel calls, per warpgroup tile at (batch_idx, row0, col0).

  stage_vectors(batch_idx, row0, col0): issues the loads of the tile's bias and scale
    vectors and first residual chunks (before the K loop, so they hide behind it).
  run(result, batch_idx, row0, col0, scalars, partials=None): the epilogue of an f32
    accumulator; `partials` (`Partials`) are added first: stream-K contributors' (f32)
    or a reduce-scatter's running sum (`device_rings`).
  run_gated(gate, up, batch_idx, row0, col0): a gated GEMM's (`EpilogueSpec.gated`).
  """

  stage_vectors: Callable
  run: Callable
  run_gated: Callable


def scratch(
    config,
    out_dtype,
    out_transforms,
    *,
    vectors,
    c,
    residual_dtype,
    residuals,
    residual_transforms,
    amax,
    row_lse=False,
    out_copy_transforms=None,
    residual_copy_transforms=None,
):
  """The SMEM buffers and barriers of the epilogue (None where unused), by name: the
  keyword arguments of `build`, for `pl.run_scoped`. `vectors`: the vector operands
  present (`operands.VECTORS`), each staged as `{name}_smem` (a warpgroup tile's worth per
  consumer, f32)
  with its barrier `{name}_loaded`. `out_copy_transforms` / `residual_copy_transforms`:
  a second, TMA-side view of the output / residual slots (`smem.tile_buffer`), for
  arrays whose rows are not a multiple of 8."""
  em, en = config.epilogue_shape
  wm, wn = config.wg_tile
  slots, wgs = config.epilogue_slots, config.consumers
  staged = {}
  for name in operands.VECTORS:
    present = name in vectors
    extent = OPERANDS[name].kind.along(wm, wn)
    staged[f"{name}_smem"] = plgpu.SMEM((wgs, extent), jnp.float32) if present else None
    staged[f"{name}_loaded"] = plgpu.Barrier(num_arrivals=1, num_barriers=wgs) if present else None
  return dict(
      staged,
      out_smem=smem.tile_buffer(
          (wgs, slots, em, en), out_dtype, out_transforms, out_copy_transforms
      ),
      c_loaded=plgpu.Barrier(num_arrivals=1, num_barriers=wgs * slots) if c else None,
      res_smem=None
      if residual_dtype is None
      else smem.tile_buffer(
          (wgs, slots, residuals, em, en),
          residual_dtype,
          residual_transforms,
          residual_copy_transforms,
      ),
      res_loaded=None
      if residual_dtype is None
      else plgpu.Barrier(num_arrivals=residuals, num_barriers=wgs * slots),
      amax_smem=plgpu.SMEM((wgs, wm), jnp.float32) if amax else None,
      lse_smem=plgpu.SMEM((wgs, 2, wm), jnp.float32) if row_lse else None,
  )


def _vector_chunk(name, staged, wg, i, j, em, en):
  """Operand `name`'s slice for epilogue chunk (i, j) of a warpgroup tile, from its
  staged vector, broadcast to the (em, en) chunk as its kind lines up."""
  start, size, dim = OPERANDS[name].kind.along((i * em, em, 0), (j * en, en, 1))
  return lax.broadcast_in_dim(staged[wg, pl.ds(start, size)], (em, en), (dim,))


def build_store_only(p, wg, *, out_gmem, out_smem) -> TileEpilogue:
  """`build` for an epilogue that only adds its partials and stores the sum in
  `out_gmem`'s dtype (no epilogue spec, operands or extra outputs); `out_smem` is the
  kernel epilogue's, shared (each store is waited for before a slot is reused)."""
  absent = (
      "pre_gmem up_pre_gmem amax_gmem lse_gmem c_gmem c_loaded res_smem res_loaded amax_smem "
      "lse_smem"
  )
  staged = [f"{name}_{part}" for name in operands.VECTORS for part in ("smem", "loaded")]
  plain = dataclasses.replace(p, epilogue=epilogue_lib.EpilogueSpec(), return_pre=False)
  return build(
      plain, wg, out_gmem=out_gmem, vectors={}, residuals=(), out_smem=out_smem,
      **dict.fromkeys(absent.split() + staged),
  )  # fmt: skip


def build(
    p,
    wg,
    *,
    out_gmem,
    pre_gmem,
    up_pre_gmem,
    amax_gmem,
    vectors,
    c_gmem,
    lse_gmem=None,
    residuals,
    out_smem,
    c_loaded,
    res_smem,
    res_loaded,
    amax_smem,
    lse_smem=None,
    **staged,
) -> TileEpilogue:
  """The epilogue functions of warpgroup `wg` for the kernel plan `p` (`hopper_gemm._Plan`:
  its config, problem, epilogue spec and valid_n), over the GMEM operands and outputs
  (None where absent; `vectors`: the vector operands' by name, `operands.VECTORS`;
  `residuals`: the residual operands, loaded side by side) and the SMEM of `scratch`
  (`staged`: each vector's `{name}_smem` and `{name}_loaded`)."""
  cfg = p.config
  em, en = cfg.epilogue_shape
  wm, wn = cfg.wg_tile
  slots = cfg.epilogue_slots
  out_dtype = (out_gmem[0] if isinstance(out_gmem, tuple) else out_gmem).dtype
  # TMA copies go through the copy views, registers through the others (the same
  # refs unless the rows of an array are not a multiple of 8: `smem.tile_buffer`).
  out_copy, out_smem = smem.copy_and_register_views(out_smem)
  res_copy = None
  if res_smem is not None:
    res_copy, res_smem = smem.copy_and_register_views(res_smem)
  chunks = (wm // em) * (wn // en)  # epilogue chunks of a warpgroup tile
  present = [name for name in operands.VECTORS if staged[f"{name}_smem"] is not None]
  bias_smem, bias_loaded = staged["bias_smem"], staged["bias_loaded"]  # the gated epilogue's

  def chunk_window(chunk, row0, col0):
    """The (rows, cols) slices of epilogue chunk `chunk` of the tile at (row0, col0)."""
    i, j = divmod(chunk, wn // en)
    return pl.ds(row0 + i * em, em), pl.ds(col0 + j * en, en)

  def load_residuals(chunk, slot, batch_idx, row0, col0):
    """TMA-loads every residual operand's epilogue chunk `chunk` into residual slot `slot`."""
    for r, source in enumerate(residuals):
      plgpu.copy_gmem_to_smem(
          at(source, batch_idx, *chunk_window(chunk, row0, col0)),
          res_copy.at[wg, slot, r],
          res_loaded.at[wg * slots + slot],
      )

  def stage_vectors(batch_idx, row0, col0):
    """Per-column and per-row vectors of this warpgroup's tile, loaded during the K loop."""
    for name in present:
      start, extent = OPERANDS[name].kind.along((row0, wm), (col0, wn))
      plgpu.copy_gmem_to_smem(
          vectors[name].at[pl.ds(start, extent)],
          staged[f"{name}_smem"].at[wg],
          staged[f"{name}_loaded"].at[wg],
      )
    if res_smem is not None:
      # The residual's first chunks too: a load issued in the epilogue would stall
      # it for a whole HBM round trip (NOTES exp. 57); later chunks load one chunk
      # ahead in the epilogue.
      for chunk in range(min(slots, chunks)):
        load_residuals(chunk, chunk % slots, batch_idx, row0, col0)

  def _epilogue(result, batch_idx, row0, col0, scalars, partials=None):
    """Epilogue of one warpgroup tile, chunk by chunk; `partials` (`Partials`) added to
    each chunk first."""
    for name in present:
      plgpu.barrier_wait(staged[f"{name}_loaded"].at[wg])
    row_maxima = []  # amax: per-row max |y| of each row chunk, over the column chunks
    row_lses = []  # row_lse: per-row (max, sum of exp(y - max)) of each row chunk
    # Each chunk is one store (two with `pre_gmem`: the affine part, then y).
    # With a store count that is not a multiple of the slots, the next tile's
    # first store reuses the slot of this tile's last one: keep none in flight.
    per_chunk = 1 if pre_gmem is None else 2
    in_flight = slots - 1 if (wm // em) * (wn // en) * per_chunk % slots == 0 else 0
    for i in range(wm // em):
      row_max = row_lse = None
      for j in range(wn // en):
        store = (i * (wn // en) + j) * per_chunk
        out_slot = store % slots
        buf, buf_copy = out_smem.at[wg, out_slot], out_copy.at[wg, out_slot]
        rows, cols = pl.ds(row0 + i * em, em), pl.ds(col0 + j * en, en)
        plgpu.wait_smem_to_gmem(in_flight, wait_read_only=True)
        c_tile = res_tile = None
        barrier = wg * slots + out_slot
        chunk = i * (wn // en) + j
        if res_smem is not None:  # loaded with the vectors, or after chunk - slots
          res_barrier = res_loaded.at[wg * slots + chunk % slots]
        if c_gmem is not None:
          plgpu.copy_gmem_to_smem(at(c_gmem, batch_idx, rows, cols), buf_copy, c_loaded.at[barrier])
          plgpu.barrier_wait(c_loaded.at[barrier])
          c_tile = buf[...]
        chunk_of = lambda name: _vector_chunk(name, staged[f"{name}_smem"], wg, i, j, em, en)
        addends = {name: chunk_of(name) for name in present if name in operands.ADDENDS}
        if res_smem is not None:
          plgpu.barrier_wait(res_barrier)
          res_tile = tuple(res_smem[wg, chunk % slots, r] for r in range(len(residuals)))
          res_tile = res_tile if len(res_tile) > 1 else res_tile[0]
        scales = []
        if scalars is not None:
          scales.append(scalars[0])
        scales += [chunk_of(name) for name in present if name in operands.MULTIPLIERS]
        acc_chunk = result[i * em : (i + 1) * em, j * en : (j + 1) * en]
        if partials is not None:
          acc_chunk = partials.add_to(acc_chunk, pl.ds(i * em, em), pl.ds(j * en, en))
        y = epilogue_lib.affine(p.epilogue, acc_chunk, c=c_tile, scales=tuple(scales), **addends)
        if pre_gmem is not None:
          # pre; or, with `gated_slope`, the up pre-activation's cotangent
          second = y
          if p.epilogue.gated_slope is not None:
            second = epilogue_lib.up_cotangent(p.epilogue, y, gate=res_tile[0])
          buf[...] = second.astype(out_dtype)
          plgpu.commit_smem()
          plgpu.copy_smem_to_gmem(buf_copy, at(pre_gmem, batch_idx, rows, cols))
          buf, buf_copy = out_smem.at[wg, (store + 1) % slots], out_copy.at[wg, (store + 1) % slots]
          plgpu.wait_smem_to_gmem(in_flight, wait_read_only=True)
        y = epilogue_lib.finish(
            p.epilogue,
            y,
            residual=res_tile,
            scalar=None if scalars is None or len(scalars) < 3 else scalars[2],
            **addends,
        )
        last_chunk = i == wm // em - 1 and j == wn // en - 1
        if amax_smem is not None:
          chunk_max = _row_abs_max(y, col0 + j * en)
          row_max = chunk_max if row_max is None else jnp.maximum(row_max, chunk_max)
          if last_chunk:
            # The wait before this chunk's (last) store left at most one store in
            # flight, so the previous tile's amax store, issued before it, has
            # finished reading amax_smem[wg].
            for ii, maxima in enumerate((*row_maxima, row_max)):
              amax_smem[wg, pl.ds(ii * em, em)] = lax.bitcast_convert_type(maxima, jnp.float32)
        y = epilogue_lib.quantize(p.epilogue, y, None if scalars is None else scalars[1])
        stored = y.astype(out_dtype)
        if lse_smem is not None:
          row_lse = _row_lse_update(row_lse, stored.astype(jnp.float32), col0 + j * en)
          if last_chunk:  # ordered after the previous tile's stores as amax's is
            for ii, (maxima, sums) in enumerate((*row_lses, row_lse)):
              lse_smem[wg, 0, pl.ds(ii * em, em)] = maxima
              lse_smem[wg, 1, pl.ds(ii * em, em)] = sums
        buf[...] = stored
        plgpu.commit_smem()
        store_output(buf_copy, batch_idx, rows, col0 + j * en)
        if res_smem is not None and chunk + slots < chunks:
          # This chunk's residual slot is free (commit_smem ordered every read of it):
          # load the chunk `slots` ahead now, so the next chunk's work hides its latency.
          load_residuals(chunk + slots, chunk % slots, batch_idx, row0, col0)
        if amax_smem is not None and last_chunk:
          plgpu.copy_smem_to_gmem(
              amax_smem.at[wg], at(amax_gmem, batch_idx, lax.div(col0, wn), pl.ds(row0, wm))
          )
        if lse_smem is not None and last_chunk:
          where = (lax.div(col0, wn), slice(None), pl.ds(row0, wm))
          target = lse_gmem.at[(batch_idx, *where) if len(lse_gmem.shape) == 4 else where]
          plgpu.copy_smem_to_gmem(lse_smem.at[wg], target)
      row_maxima.append(row_max)
      row_lses.append(row_lse)

  def _gated_epilogue(gate, up, batch_idx, row0, col0):
    """Epilogue of a gated warpgroup tile: the gate and up accumulators of output
    columns col0/2 + [0, wn/2) (col0 counts both halves, as the bias does).
    Each output chunk is act(gate + bias) * (up + bias); with `pre_gmem`, the two
    pre-activations are stored first (what the backward reads)."""
    if bias_smem is not None:
      plgpu.barrier_wait(bias_loaded.at[wg])
    half = wn // 2
    per_chunk = 1 if pre_gmem is None else 3
    in_flight = slots - 1 if (wm // em) * (half // en) * per_chunk % slots == 0 else 0
    affine_spec = dataclasses.replace(p.epilogue, activation=None, gated=False)
    store = 0
    out_col0 = pl.multiple_of(lax.div(col0, 2), half)
    for i in range(wm // em):
      for j in range(half // en):
        rows, cols = pl.ds(row0 + i * em, em), pl.ds(out_col0 + j * en, en)
        pres = []
        for offset, result in ((0, gate), (half, up)):
          bias_tile = None
          if bias_smem is not None:
            bias_tile = lax.broadcast_in_dim(
                bias_smem[wg, pl.ds(offset + j * en, en)], (em, en), (1,)
            )
          acc_chunk = result[i * em : (i + 1) * em, j * en : (j + 1) * en]
          pres.append(epilogue_lib.affine(affine_spec, acc_chunk, bias=bias_tile))
        values = [epilogue_lib.gated(p.epilogue, *pres)]
        targets = [out_gmem]
        if pre_gmem is not None:
          values, targets = [*pres, *values], [pre_gmem, up_pre_gmem, out_gmem]
        for value, target in zip(values, targets):
          buf = out_smem.at[wg, store % slots]
          plgpu.wait_smem_to_gmem(in_flight, wait_read_only=True)
          buf[...] = value.astype(out_dtype)
          plgpu.commit_smem()
          plgpu.copy_smem_to_gmem(out_copy.at[wg, store % slots], at(target, batch_idx, rows, cols))
          store += 1

  def store_output(buf_copy, batch_idx, rows, first_col):
    """TMA-stores an output chunk whose first column is `first_col`: into the output, or
    with `problem.out_splits` into the array that holds that column. A chunk past N (a
    tile the grid rounds up to) stores nothing and waits for every store in flight
    instead: the slot rotation assumes one store per chunk."""
    if not isinstance(out_gmem, tuple):
      plgpu.copy_smem_to_gmem(buf_copy, at(out_gmem, batch_idx, rows, pl.ds(first_col, en)))
      return
    start = 0
    for piece, width in zip(out_gmem, p.problem.out_splits):

      @pl.when((first_col >= start) & (first_col < start + width))
      def _(piece=piece, start=start):
        cols = pl.ds(first_col - start, en)
        plgpu.copy_smem_to_gmem(buf_copy, at(piece, batch_idx, rows, cols))

      start += width

    @pl.when(first_col >= start)
    def _():
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  def _row_lse_update(running, y, first_col):
    """(max, sum of exp(y - max)) along each row of an epilogue chunk folded into the
    running pair of the row's earlier chunks (None for the first); columns >= valid_n
    left out. A masked entry counts as the lowest finite f32 and adds 0, so a chunk
    past valid_n leaves the pair as it was (no inf - inf)."""
    if p.valid_n % wn:
      valid = first_col + lax.broadcasted_iota(jnp.int32, y.shape, 1) < p.valid_n
      y = jnp.where(valid, y, jnp.finfo(jnp.float32).min)
    chunk_max = jnp.max(y, axis=1)
    new_max = chunk_max if running is None else jnp.maximum(running[0], chunk_max)
    e = jnp.exp(y - lax.broadcast_in_dim(new_max, y.shape, (0,)))
    if p.valid_n % wn:
      e = jnp.where(valid, e, 0.0)
    sums = jnp.sum(e, axis=1)
    if running is not None:
      sums = sums + running[1] * jnp.exp(running[0] - new_max)
    return new_max, sums

  def _row_abs_max(y, first_col):
    """max |y| along each row of an epilogue chunk, columns >= valid_n left out, as
    the int32 bits of the f32 result (bitcast back when stored).

    |y|'s bits order like |y| and put NaN above Inf, so an integer max propagates
    NaN as XLA's max does (a float max on the GPU returns the other operand). A
    reduction along rows stays inside each warp (shuffles): no shared scratch,
    which the two consumer warpgroups would otherwise race on.
    """
    bits = lax.bitcast_convert_type(y, jnp.int32) & jnp.int32(0x7FFFFFFF)
    if p.valid_n % wn:  # the column tiles past valid_n are dropped by the caller
      cols = first_col + lax.broadcasted_iota(jnp.int32, y.shape, 1)
      bits = jnp.where(cols < p.valid_n, bits, 0)
    return jnp.max(bits, axis=1)

  return TileEpilogue(stage_vectors, _epilogue, _gated_epilogue)
