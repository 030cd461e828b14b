"""Public grouped GEMM: `ragged_dot` with `jax.lax.ragged_dot`'s semantics.

>>> import jax.numpy as jnp
>>> lhs = jnp.ones((5, 2), jnp.bfloat16)
>>> rhs = jnp.stack([jnp.full((2, 3), i + 1.0, jnp.bfloat16) for i in range(2)])
>>> ragged_dot(lhs, rhs, jnp.array([2, 2]), implementation="xla")[:, 0].tolist()
[2.0, 2.0, 4.0, 4.0, 0.0]

Rows of `lhs` are consecutive groups; group g uses `rhs[g]`; rows past
`sum(group_sizes)` are zero; empty groups are allowed; a sum larger than M is
cut at M (as lax does). `transpose_rhs=True` means rhs is stored (G, N, K)
(the kernel reads it with TMA and hands WGMMA a transposed SMEM view: no copy).

Differentiable (custom_vjp, kernel path): dlhs is the same kernel with the
rhs layout flipped (dout @ rhs[g]^T, no transposed copy); drhs is the
ragged-contracting product lhs[rows_g]^T @ dout[rows_g], computed by the
`ragged_tgmm` kernel (same structure; boundary rows masked in SMEM).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import sharding
from pallas_gemm import smem
from pallas_gemm import tuning_cache
from pallas_gemm.config import INPUT_DTYPES, OUTPUT_DTYPES
from pallas_gemm.gemm import IMPLEMENTATIONS, INTERPRET_NUM_SMS
from pallas_gemm.tma_padding import pad_last2, round_up, tma_operand_cols, tma_rows
from pallas_gemm.ragged_gemm import (
    RaggedConfig,
    RaggedProblem,
    default_ragged_config,
    ragged_gemm,
    row_views,
)
from pallas_gemm.ragged_tgmm import TgmmProblem, default_tgmm_config, ragged_tgmm


def ragged_dot(
    lhs,
    rhs,
    group_sizes,
    precision=None,
    preferred_element_type=None,
    group_offset=None,
    out_sharding=None,
    *,
    transpose_rhs: bool = False,
    config: RaggedConfig | None = None,
    implementation: str | None = None,
):
  """Grouped matrix product: `out[r] = lhs[r] @ rhs[g(r)]`, f32 accumulation.

  Args:
    lhs: (M, K); bf16 or f16 for the kernel (any type lax accepts for "xla").
    rhs: (G, K, N), or (G, N, K) with `transpose_rhs=True`; lhs's dtype.
    group_sizes: (G,) integer array; group g owns the next `group_sizes[g]`
      rows. Negative sizes count as 0 in the kernel (lax leaves them undefined).
    precision: passed to XLA; the kernel always multiplies 16-bit inputs
      exactly and accumulates in f32, so it ignores it.
    preferred_element_type: output dtype (bf16, f16 or f32 for the kernel);
      None means lhs's dtype, as in lax.
    group_offset: must be None: lax's `ragged_dot` takes it and raises
      NotImplementedError for any other value, and so does this function.
    out_sharding: the result is resharded to it (as `dot_general` does).
    transpose_rhs: rhs is stored (G, N, K).
    config: a `RaggedConfig`, or None for `default_ragged_config`.
    implementation: None (the kernel on a Hopper GPU when the dtypes are ones
      it takes, XLA otherwise), "pallas", "interpret" (the kernel in GPU
      interpret mode) or "xla".
      Empty arrays (M, N, K or G zero) always take the XLA path.
  Returns:
    (M, N) array.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  if group_offset is not None:
    raise NotImplementedError(
        "group_offset: only None is supported (as in jax.lax.ragged_dot, "
        "whose implementations all refuse it)"
    )
  if config is not None and not isinstance(config, RaggedConfig):
    raise TypeError(f"config must be a RaggedConfig or None, got {type(config).__name__}")
  lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
  _check(lhs, rhs, group_sizes, transpose_rhs)
  out_dtype = jnp.dtype(preferred_element_type or lhs.dtype)
  if implementation is None:
    kernel_dtypes = (
        lhs.dtype == rhs.dtype
        and lhs.dtype.name in INPUT_DTYPES
        and out_dtype.name in OUTPUT_DTYPES
    )
    implementation = "pallas" if kernel_dtypes and _compat.on_hopper() else "xla"
  if implementation == "xla" or 0 in (*lhs.shape, *rhs.shape):  # empty: nothing to launch
    return _xla_ragged_dot(
        lhs, rhs, group_sizes, precision, preferred_element_type, transpose_rhs, out_sharding
    )
  if lhs.dtype != rhs.dtype:
    raise TypeError(
        f"lhs and rhs must have the same dtype for the kernel, got {lhs.dtype} and {rhs.dtype}"
    )
  if lhs.dtype.name not in INPUT_DTYPES:
    raise TypeError(
        f"lhs must be one of {INPUT_DTYPES} for the kernel, got {lhs.dtype} "
        "(use implementation='xla')"
    )
  if out_dtype.name not in OUTPUT_DTYPES:
    raise TypeError(
        f"preferred_element_type must be one of {OUTPUT_DTYPES} for the kernel, got {out_dtype}"
    )
  kernel = lambda lhs, rhs, sizes: _ragged_dot_vjp(
      lhs,
      rhs,
      sizes.astype(jnp.int32),
      bool(transpose_rhs),
      out_dtype.name,
      config,
      implementation == "interpret",
  )
  mesh = sharding.explicit_mesh(lhs, rhs, group_sizes)
  if mesh is None:
    out = kernel(lhs, rhs, group_sizes)
  else:
    out = _per_shard(kernel, mesh, lhs, rhs, group_sizes, transpose_rhs)
  return out if out_sharding is None else jax.sharding.reshard(out, out_sharding)


def _per_shard(kernel, mesh, lhs, rhs, group_sizes, transpose_rhs):
  """The kernel on the local blocks of arrays on a mesh with Explicit axes (a Mosaic
  kernel is a custom call XLA cannot partition): rhs's N axes split the output columns;
  K's axes (rhs's, else lhs's) split the contraction, their partial sums added by psum
  in the output dtype (as XLA's sharded dot adds them); lhs rows and the groups are
  gathered, since a group's rows may lie on any device."""
  spec_l, spec_r = sharding.explicit_spec(lhs), sharding.explicit_spec(rhs)
  k_r, n = (spec_r[2], spec_r[1]) if transpose_rhs else (spec_r[1], spec_r[2])
  k = k_r or spec_l[1]
  n = tuple(axis for axis in n if axis not in k)
  specs = ((), k), ((), n, k) if transpose_rhs else ((), k, n), ((),)

  def local(lhs, rhs, sizes):
    out = kernel(lhs, rhs, sizes)
    return jax.lax.psum(out, k) if k else out

  run = jax.shard_map(
      local,
      mesh=mesh,
      in_specs=tuple(sharding.partition_spec(spec) for spec in specs),
      out_specs=sharding.partition_spec(((), n)),
      check_vma=False,
  )
  arrays = (lhs, rhs, group_sizes)
  return jax.jit(run)(*(sharding.reshard(x, spec, mesh) for x, spec in zip(arrays, specs)))


def _check(lhs, rhs, group_sizes, transpose_rhs):
  if lhs.ndim != 2:
    raise ValueError(f"lhs must be 2-D (M, K), got shape {lhs.shape}")
  if rhs.ndim != 3:
    raise ValueError(
        f"rhs must be 3-D ({'(G, N, K)' if transpose_rhs else '(G, K, N)'}), "
        f"got shape {rhs.shape}"
    )
  if group_sizes.ndim != 1 or group_sizes.shape[0] != rhs.shape[0]:
    raise ValueError(
        f"group_sizes must have shape (G,) = ({rhs.shape[0]},) (rhs's groups), "
        f"got {group_sizes.shape}"
    )
  if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise TypeError(f"group_sizes must be an integer array, got {group_sizes.dtype}")
  k_rhs = rhs.shape[2] if transpose_rhs else rhs.shape[1]
  if lhs.shape[1] != k_rhs:
    raise ValueError(
        f"contracting dims differ: lhs {lhs.shape} has K={lhs.shape[1]}, rhs "
        f"{rhs.shape} has K={k_rhs} (transpose_rhs={transpose_rhs})"
    )


def _xla_ragged_dot(
    lhs, rhs, group_sizes, precision, preferred_element_type, transpose_rhs, out_sharding=None
):
  if transpose_rhs:
    rhs = jnp.swapaxes(rhs, 1, 2)
  return lax.ragged_dot(
      lhs,
      rhs,
      group_sizes.astype(jnp.int32),
      precision=precision,
      preferred_element_type=preferred_element_type,
      out_sharding=out_sharding,
  )


# -- kernel path --------------------------------------------------------------
def ragged_layout(lhs, rhs, transpose_rhs, out_dtype, config, interpret):
  """Pads lhs/rhs only where TMA cannot read them as they are (as `matmul` does).

  Returns (lhs, rhs, out_rows, out_cols). Interpret mode pads everything to
  whole tiles (the interpreter drops partially out-of-bounds stores and
  rejects out-of-bounds loads).
  """
  (m, k), n = lhs.shape, rhs.shape[1] if transpose_rhs else rhs.shape[2]
  tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
  if interpret:
    # A row box starts at any row below round_up(m, tm): one more box of rows keeps
    # every box inside the array (the interpreter rejects out-of-bounds loads).
    lhs = pad_last2(lhs, round_up(m, tm) + tm, round_up(k, tk))
    if transpose_rhs:
      rhs = pad_last2(rhs, round_up(n, tn), round_up(k, tk))
    else:
      rhs = pad_last2(rhs, round_up(k, tk), round_up(n, tn))
    return lhs, rhs, round_up(m, tm), round_up(n, tn)
  dtype = lhs.dtype
  common = smem.widest_swizzle(dtype, tk, lhs.shape[-1], rhs.shape[-1])
  if common is not None and common >= 64:
    lhs_cols, rhs_cols = lhs.shape[-1], rhs.shape[-1]
  else:
    lhs_cols, rhs_cols = tma_operand_cols(lhs.shape[-1], dtype), tma_operand_cols(
        rhs.shape[-1], dtype
    )
  # Output columns: a whole number of boundary staging chunks, because Mosaic
  # tiles the unswizzled staging buffer (64, sn) by its full width, and a TMA
  # store from it needs the GMEM minor extent to be a multiple of that tile.
  sn = config.stage_cols(out_dtype)
  cols = n if n % sn == 0 else round_up(n, sn)
  # Rows that are not a multiple of 8 stay where the kernel has a row-wise TMA view of
  # the tile (`ragged_gemm.row_views`; as `matmul`'s, DESIGN.md "odd shapes").
  lhs_view, out_view = row_views(
      dtype,
      out_dtype,
      config,
      smem.widest_swizzle(dtype, tk, lhs_cols, rhs_cols),
      smem.widest_swizzle(out_dtype, config.epilogue_tile[1], cols),
  )
  rows = m if lhs_view and out_view else tma_rows(m)  # lhs and output share the row extent
  lhs = pad_last2(lhs, rows, lhs_cols)
  rhs = pad_last2(rhs, tma_rows(rhs.shape[-2]), rhs_cols)
  return lhs, rhs, rows, cols


def _run_kernel(lhs, rhs, group_sizes, transpose_rhs, out_dtype, config, interpret):
  (m, k), g = lhs.shape, rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  problem = RaggedProblem(
      m=m,
      n=n,
      k=k,
      groups=g,
      dtype=lhs.dtype.name,
      out_dtype=out_dtype,
      transpose_rhs=transpose_rhs,
  )
  if config is None and not interpret:  # a tuned config (`ragged_tuning`), else the default
    config = tuning_cache.lookup_ragged_config(problem)
  config = config or default_ragged_config(problem)
  if interpret and config.num_sms is None:
    config = dataclasses.replace(config, num_sms=INTERPRET_NUM_SMS)
  config.validate(problem)
  lhs_p, rhs_p, rows, cols = ragged_layout(lhs, rhs, transpose_rhs, out_dtype, config, interpret)
  kernel_problem = dataclasses.replace(problem, n=cols, m_out=rows)
  out = ragged_gemm(
      lhs_p,
      rhs_p,
      group_sizes,
      problem=kernel_problem,
      config=config,
      interpret=_compat.interpret_params(zero_fill=False) if interpret else None,
  )
  return out[:m, :n]


def ragged_weight_gradient(x, dy, group_sizes, *, out_dtype=None, implementation=None):
  """dw[g] = x[rows_g]^T @ dy[rows_g] for the contiguous row groups of `ragged_dot`: the
  gradient of its (G, K, N) rhs, by the ragged-contraction kernel (`ragged_tgmm`).

  Args:
    x: (M, K) and dy: (M, N), the same 16-bit dtype for the kernel; group_sizes: (G,).
    out_dtype: the result's dtype (default x's).
    implementation: None (the kernel on a Hopper GPU, else XLA), "pallas", "interpret"
      or "xla" (the transpose of `lax.ragged_dot`).

  >>> x = jnp.ones((3, 2), jnp.bfloat16); dy = jnp.ones((3, 4), jnp.bfloat16)
  >>> ragged_weight_gradient(x, dy, jnp.array([1, 2]), implementation="xla")[:, 0, 0].tolist()
  [1.0, 2.0]
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  x, dy, group_sizes = jnp.asarray(x), jnp.asarray(dy), jnp.asarray(group_sizes)
  if x.ndim != 2 or dy.ndim != 2 or x.shape[0] != dy.shape[0] or group_sizes.ndim != 1:
    raise ValueError(
        f"x (M, K), dy (M, N) and group_sizes (G,) expected, got {x.shape}, {dy.shape}, "
        f"{group_sizes.shape}"
    )
  out_dtype = jnp.dtype(out_dtype or x.dtype)
  if implementation is None:
    kernel = x.dtype == dy.dtype and x.dtype.name in INPUT_DTYPES and _compat.on_hopper()
    implementation = "pallas" if kernel else "xla"
  if implementation == "xla" or 0 in (*x.shape, dy.shape[1], group_sizes.shape[0]):
    zeros = jnp.zeros((group_sizes.shape[0], x.shape[1], dy.shape[1]), jnp.float32)
    x32, sizes = x.astype(jnp.float32), group_sizes.astype(jnp.int32)
    _, transpose = jax.vjp(
        lambda w: jax.lax.ragged_dot(x32, w, sizes, precision=jax.lax.Precision.HIGHEST), zeros
    )
    return transpose(dy.astype(jnp.float32))[0].astype(out_dtype)
  if x.dtype != dy.dtype or x.dtype.name not in INPUT_DTYPES:
    raise TypeError(f"x and dy must share a dtype of {INPUT_DTYPES}, got {x.dtype}, {dy.dtype}")
  return _run_tgmm(
      x, dy, group_sizes.astype(jnp.int32), out_dtype.name, implementation == "interpret"
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _ragged_dot_vjp(lhs, rhs, group_sizes, transpose_rhs, out_dtype, config, interpret):
  return _run_kernel(lhs, rhs, group_sizes, transpose_rhs, out_dtype, config, interpret)


def _fwd(lhs, rhs, group_sizes, transpose_rhs, out_dtype, config, interpret):
  out = _run_kernel(lhs, rhs, group_sizes, transpose_rhs, out_dtype, config, interpret)
  return out, (lhs, rhs, group_sizes)


def _run_tgmm(x, y, group_sizes, out_dtype, interpret):
  """out[g] = x[rows_g]^T @ y[rows_g] with the ragged-contracting kernel."""
  (m, p), q, g = x.shape, y.shape[1], group_sizes.shape[0]
  problem = TgmmProblem(m=m, p=p, q=q, groups=g, dtype=x.dtype.name, out_dtype=out_dtype)
  config = default_tgmm_config(problem)
  if interpret:
    config = dataclasses.replace(config, num_sms=INTERPRET_NUM_SMS)
    rows = round_up(m, config.tile_r)
    p_cols, q_cols = round_up(p, config.tile_p), round_up(q, config.tile_q)
  else:
    rows, p_cols, q_cols = tma_rows(m), round_up(p, 64), round_up(q, 64)
  x, y = pad_last2(x, rows, p_cols), pad_last2(y, rows, q_cols)
  out = ragged_tgmm(
      x,
      y,
      group_sizes,
      problem=dataclasses.replace(problem, p=p_cols, q=q_cols),
      config=config,
      interpret=_compat.interpret_params(zero_fill=False) if interpret else None,
  )
  return out[:, :p, :q]


def _bwd(transpose_rhs, out_dtype, config, interpret, residuals, dout):
  """dlhs: `ragged_gemm` with rhs's layout flipped (dout @ rhs[g]^T, no copy);
  drhs: `ragged_tgmm`, lhs[rows_g]^T @ dout[rows_g] (or its transpose for a
  (G, N, K) rhs, computed as dout[rows_g]^T @ lhs[rows_g], no copy).

  The forward config is not reused (the backward problems differ); a cotangent
  wider than the inputs (f32 output) is rounded to the input dtype first.
  """
  lhs, rhs, group_sizes = residuals
  del out_dtype, config
  dout = dout.astype(rhs.dtype)
  dlhs = _run_kernel(dout, rhs, group_sizes, not transpose_rhs, lhs.dtype.name, None, interpret)
  x, y = (dout, lhs) if transpose_rhs else (lhs, dout)
  drhs = _run_tgmm(x, y, group_sizes, rhs.dtype.name, interpret)
  return dlhs, drhs, None


_ragged_dot_vjp.defvjp(_fwd, _bwd)
