"""The backward's elementwise pass in one kernel: dPre and its column sums (the bias gradient).

Given the saved pre-activation `pre`, the output cotangent `g` (both (R, N),
16-bit) and the activation's derivative `act'`, one persistent Pallas kernel
streams them once and writes

    d_acc = g * act'(pre)          in the operand dtype (what the dA/dB GEMMs read)
    sums[t] = sum of d_acc's f32 values over the rows of row tile t   (f32, (R/64, N))

so that the bias gradient is `sums.sum(0)`: a 4 MB read instead of a second
pass over d_acc (XLA's column reduction runs at ~1 TB/s; NOTES exps. 32, 34).
Work units are (row tile, column block) pairs, dealt round-robin to the SMs;
each CTA keeps `stages` units' loads in flight and double-buffers its stores.

>>> import jax, jax.numpy as jnp
>>> step = lambda x: jnp.where(x > 0, 1.0, 0.0)  # relu's derivative
>>> pre = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
>>> f = jax.jit(lambda p, g: dpre_and_column_sums(p, g, slope=step, num_sms=2))
>>> [o.shape for o in jax.export.export(f, platforms=["cuda"])(pre, pre).out_avals]
[(256, 256), (4, 256)]
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
from pallas_gemm import smem
from pallas_gemm.config import DEFAULT_NUM_SMS

BLOCK_M = 64
BLOCK_N = 128
STAGES = 4
INTERPRET_SMS = 2
"""Grid of the kernel in GPU interpret mode (each SM is a thread there)."""


@dataclasses.dataclass(frozen=True)
class _Plan:
  rows: int
  cols: int
  num_sms: int

  @property
  def row_tiles(self) -> int:
    return pl.cdiv(self.rows, BLOCK_M)

  @property
  def col_blocks(self) -> int:
    return self.cols // BLOCK_N

  @property
  def units(self) -> int:
    return self.row_tiles * self.col_blocks


def supported(shape, dtype) -> bool:
  """Whether `dpre_and_column_sums` takes (R, N) arrays of `dtype`: 16-bit, N a
  multiple of BLOCK_N, R a multiple of 8 (TMA tiles the whole array) and at least
  one row tile."""
  return (
      len(shape) == 2
      and jnp.dtype(dtype).itemsize == 2
      and shape[1] % BLOCK_N == 0
      and shape[0] % 8 == 0
      and shape[0] >= BLOCK_M
  )


def _kernel(pre_gmem, g_gmem, d_gmem, sums_gmem, *, slope, p: _Plan):
  dtype = d_gmem.dtype
  transforms = smem.tile_transforms(jnp.dtype(dtype).name, 128, (BLOCK_M, BLOCK_N))

  def scoped(pre_smem, g_smem, loaded, out_smem, sums_smem):
    sm = lax.axis_index("sm")
    count = lax.div(p.units - sm + p.num_sms - 1, p.num_sms)  # this CTA's units

    def where(j):
      """(row tile, rows, cols) of this CTA's j-th unit."""
      unit = sm + j * p.num_sms
      row_tile, col_block = lax.div(unit, p.col_blocks), lax.rem(unit, p.col_blocks)
      return row_tile, pl.ds(row_tile * BLOCK_M, BLOCK_M), pl.ds(col_block * BLOCK_N, BLOCK_N)

    def issue(j):
      slot = lax.rem(j, STAGES)
      _, rows, cols = where(j)
      plgpu.copy_gmem_to_smem(pre_gmem.at[rows, cols], pre_smem.at[slot], loaded.at[slot])
      plgpu.copy_gmem_to_smem(g_gmem.at[rows, cols], g_smem.at[slot], loaded.at[slot])

    for j in range(STAGES - 1):
      pl.when(j < count)(functools.partial(issue, j))

    @pl.loop(0, count)
    def _(j):
      # The slot refilled here was read (into registers) by unit j - 1: fence the
      # generic-proxy reads before the TMA writes.
      plgpu.commit_smem()
      pl.when(j + STAGES - 1 < count)(lambda: issue(j + STAGES - 1))
      slot = lax.rem(j, STAGES)
      plgpu.barrier_wait(loaded.at[slot])
      pre = pre_smem[slot].astype(jnp.float32)
      g = g_smem[slot].astype(jnp.float32)
      d = g * slope(pre)
      out = lax.rem(j, 2)
      plgpu.wait_smem_to_gmem(1, wait_read_only=True)
      out_smem[out] = d.astype(dtype)
      sums_smem[out] = jnp.sum(d, axis=0)
      plgpu.commit_smem()
      row_tile, rows, cols = where(j)
      plgpu.copy_smem_to_gmem(out_smem.at[out], d_gmem.at[rows, cols], commit_group=False)
      plgpu.copy_smem_to_gmem(sums_smem.at[out], sums_gmem.at[row_tile, cols])

    plgpu.wait_smem_to_gmem(0)

  pl.run_scoped(
      scoped,
      pre_smem=plgpu.SMEM((STAGES, BLOCK_M, BLOCK_N), dtype, transforms=transforms),
      g_smem=plgpu.SMEM((STAGES, BLOCK_M, BLOCK_N), dtype, transforms=transforms),
      loaded=plgpu.Barrier(num_arrivals=2, num_barriers=STAGES),
      out_smem=plgpu.SMEM((2, BLOCK_M, BLOCK_N), dtype, transforms=transforms),
      sums_smem=plgpu.SMEM((2, BLOCK_N), jnp.float32),
  )


@compile_once.kernel_entry(static_argnames=("slope", "num_sms", "interpret"))
def dpre_and_column_sums(pre, g, *, slope, num_sms=None, interpret=None):
  """(d_acc, sums): `g * slope(pre)` in `pre`'s dtype, and its f32 column sums
  per 64-row tile ((ceil(R / 64), N); sum axis 0 for the bias gradient).

  `slope` is the derivative of the elementwise activation, an f32 function
  (`epilogue.ACTIVATION_SLOPES`; hashable: it keys the kernel, `compile_once`).
  Requires `supported(pre.shape, pre.dtype)`; `g` is like `pre`.
  """
  if not supported(pre.shape, pre.dtype) or g.shape != pre.shape or g.dtype != pre.dtype:
    raise ValueError(
        f"dpre_and_column_sums: pre {pre.shape} {pre.dtype} and g {g.shape} "
        f"{g.dtype} must match, 16-bit, with N a multiple of {BLOCK_N} and R a "
        "multiple of 8"
    )
  rows = pre.shape[0]
  if interpret is not None and rows % BLOCK_M:
    # GPU interpret mode (jax 0.10) drops partially out-of-bounds stores and refuses
    # out-of-bounds reads: run whole row tiles (zero rows add nothing to the sums).
    pad = ((0, -rows % BLOCK_M), (0, 0))
    d, sums = dpre_and_column_sums(
        jnp.pad(pre, pad), jnp.pad(g, pad), slope=slope, num_sms=num_sms, interpret=interpret
    )
    return d[:rows], sums
  num_sms = num_sms or _compat.device_sm_count() or DEFAULT_NUM_SMS
  p = _Plan(pre.shape[0], pre.shape[1], num_sms)
  kernel = plgpu.kernel(
      compile_once.named_body("pallas_gemm_dpre", _kernel, slope=slope, p=p),
      out_type=(
          jax.ShapeDtypeStruct(pre.shape, pre.dtype),
          jax.ShapeDtypeStruct((p.row_tiles, p.cols), jnp.float32),
      ),
      grid=(num_sms,),
      grid_names=("sm",),
      compiler_params=_compat.compiler_params(approx_math=True),
      interpret=interpret,
  )
  return kernel(pre, g)
