"""Public entry point: `matmul` = act(alpha * op(a) @ op(b) + beta * c + bias).

>>> import jax.numpy as jnp
>>> a = jnp.ones((4, 3), jnp.bfloat16); b = jnp.ones((3, 2), jnp.bfloat16)
>>> matmul(a, b, bias=jnp.array([1.0, -9.0]), activation="relu", implementation="xla")[0].tolist()
[4.0, 0.0]

Operand layouts are free: `transpose_a=True` means `a` is stored (..., K, M),
`transpose_b=True` that `b` is stored (..., N, K); the kernel reads either with
TMA and hands WGMMA a transposed SMEM view, so no transposed copy is made.

Shapes TMA cannot address as they are (see `_tma_layout`) are handled by
zero-padding only the offending array, at the cost of one copy of it; every
such copy is listed in NOTES.md ("odd shapes").
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import smem
from pallas_gemm.config import GemmConfig, GemmProblem, default_config, INPUT_DTYPES, OUTPUT_DTYPES
from pallas_gemm.autotune import resolve_config
from pallas_gemm.hopper_gemm import hopper_gemm

IMPLEMENTATIONS = (None, "pallas", "interpret", "xla")
INTERPRET_NUM_SMS = 2
"""Persistent grid size in interpret mode (grid points run one after another there)."""


def matmul(a, b, *, transpose_a=False, transpose_b=False, bias=None, activation=None,
           c=None, alpha=1.0, beta=0.0, out_dtype=None, config: GemmConfig | None = None,
           implementation: str | None = None, autotune: bool | None = None):
  """Computes `act(alpha * op(a) @ op(b) + beta * c + bias)` with f32 accumulation.

  Args:
    a: (..., M, K), or (..., K, M) with `transpose_a`; bf16 or f16.
    b: (..., K, N), or (..., N, K) with `transpose_b`; same dtype as `a`.
      Leading (batch) dims of `a` and `b` must be equal, or one operand 2-D.
    bias: (N,) per-column bias, added in f32, or None.
    activation: None, "relu", "gelu_tanh", "gelu_exact", "silu" or "sigmoid".
    c: (..., M, N) or (M, N) addend, read only when `beta != 0` (as in BLAS).
    alpha, beta: Python numbers (compiled into the kernel).
    out_dtype: bf16, f16 or f32; defaults to `a.dtype`.
    config: a `GemmConfig`, or None: the autotuning cache's entry for this
      problem on this device, else the heuristic default.
    implementation: None (the Pallas kernel on a GPU, XLA elsewhere), "pallas",
      "interpret" (the kernel in GPU interpret mode, on any backend) or "xla".
    autotune: tune this problem now if the cache has no entry (outside jit
      only); None defers to the environment variable PALLAS_GEMM_AUTOTUNE=1.
  Returns:
    (..., M, N) array of `out_dtype`.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  for name, value in (("alpha", alpha), ("beta", beta)):
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
      raise TypeError(f"{name} must be a Python number (it is compiled into the kernel), got {type(value).__name__}")
  if config is not None and not isinstance(config, GemmConfig):
    raise TypeError(f"config must be a GemmConfig or None, got {type(config).__name__}")
  a, b = jnp.asarray(a), jnp.asarray(b)
  spec = epilogue_lib.EpilogueSpec(activation=activation, alpha=float(alpha), beta=float(beta))
  problem, batch_shape = _problem(a, b, transpose_a, transpose_b, bias, c, beta, out_dtype)
  if c is not None and beta == 0.0:
    c = None
  if implementation is None:
    implementation = "pallas" if _compat.device_sm_count() else "xla"
  if implementation == "xla":
    return _xla_matmul(a, b, problem, spec, bias, c)
  return _kernel_matmul(a, b, problem, batch_shape, spec, bias, c, config,
                        interpret=implementation == "interpret", autotune=autotune)


# -- argument checking --------------------------------------------------------
def _problem(a, b, transpose_a, transpose_b, bias, c, beta, out_dtype):
  """Checks the arguments; returns the GemmProblem and the batch shape."""
  for name, x in (("a", a), ("b", b)):
    if x.ndim < 2:
      raise ValueError(f"{name} must have at least 2 dims, got shape {x.shape}")
    if x.dtype.name not in INPUT_DTYPES:
      raise TypeError(f"{name} must be one of {INPUT_DTYPES}, got {x.dtype}")
  if a.dtype != b.dtype:
    raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
  m, k = a.shape[-2:][::-1] if transpose_a else a.shape[-2:]
  kb, n = b.shape[-2:][::-1] if transpose_b else b.shape[-2:]
  if k != kb:
    raise ValueError(f"contracting dims differ: a gives K={k}, b gives K={kb} "
                     f"(shapes {a.shape}, {b.shape}, transpose_a={transpose_a}, transpose_b={transpose_b})")
  if min(m, n, k) < 1:
    raise ValueError(f"M, N, K must be >= 1, got M={m}, N={n}, K={k}")
  batch_a, batch_b = a.shape[:-2], b.shape[:-2]
  if batch_a and batch_b and batch_a != batch_b:
    raise ValueError(f"batch dims of a {batch_a} and b {batch_b} must be equal (or one operand 2-D)")
  batch_shape = batch_a or batch_b
  out_dtype = jnp.dtype(out_dtype or a.dtype)
  if out_dtype.name not in OUTPUT_DTYPES:
    raise TypeError(f"out_dtype must be one of {OUTPUT_DTYPES}, got {out_dtype}")
  if bias is not None and jnp.shape(bias) != (n,):
    raise ValueError(f"bias must have shape (N,) = ({n},), got {jnp.shape(bias)}")
  if c is not None and jnp.shape(c) not in ((*batch_shape, m, n), (m, n)):
    raise ValueError(f"c must have shape {(*batch_shape, m, n)} or {(m, n)}, got {jnp.shape(c)}")
  if c is None and beta != 0.0:
    raise ValueError(f"beta={beta} needs c")
  problem = GemmProblem(
      m=m, n=n, k=k, batch=math.prod(batch_shape), dtype=a.dtype.name,
      out_dtype=out_dtype.name, transpose_a=bool(transpose_a), transpose_b=bool(transpose_b),
      has_bias=bias is not None, has_c=c is not None and beta != 0.0)
  return problem, batch_shape


# -- XLA reference path -------------------------------------------------------
def _xla_matmul(a, b, problem, spec, bias, c):
  op_a = jnp.swapaxes(a, -1, -2) if problem.transpose_a else a
  op_b = jnp.swapaxes(b, -1, -2) if problem.transpose_b else b
  acc = jnp.matmul(op_a, op_b, preferred_element_type=jnp.float32)
  y = epilogue_lib.apply(spec, acc, c=c, bias=bias)
  return y.astype(problem.out_dtype)


# -- kernel path --------------------------------------------------------------
def _round_up(x, multiple):
  return -(-x // multiple) * multiple


def _pad_last2(x, rows, cols):
  """Zero-pads the last two dims of `x` up to (rows, cols); no-op if already there."""
  pad_r, pad_c = rows - x.shape[-2], cols - x.shape[-1]
  if pad_r <= 0 and pad_c <= 0:
    return x
  widths = [(0, 0)] * (x.ndim - 2) + [(0, max(pad_r, 0)), (0, max(pad_c, 0))]
  return jnp.pad(x, widths)


def _tma_rows(rows):
  """Second-minor extent TMA accepts: a multiple of 8, or fewer than 8 rows."""
  return rows if rows < 8 else _round_up(rows, 8)


def _tma_operand_cols(cols, dtype):
  """Minor extent for a WGMMA operand: 16-byte rows and a 128-byte swizzle."""
  span = smem.swizzle_span(dtype, 128)
  if smem.is_tma_compatible_extent(dtype, cols, 128):
    return cols
  return _round_up(cols, span)


def _tma_layout(a, b, problem, config, interpret):
  """Pads A and B only where TMA cannot read them as they are.

  A and B share one swizzle. 128 bytes is preferred; 64 bytes is accepted when
  it avoids a copy (e.g. K=4000 bf16). Anything narrower is padded instead.
  In interpret mode everything is padded to whole tiles, because the
  interpreter drops partially out-of-bounds TMA stores and rejects
  out-of-bounds loads, and NaN poisoning of unwritten memory must stay on.
  """
  if interpret:
    tm, tn, tk = (config.tile_m * config.cluster[0], config.tile_n * config.cluster[1],
                  config.tile_k)
    a_rows, a_cols = (tk, tm) if problem.transpose_a else (tm, tk)
    b_rows, b_cols = (tn, tk) if problem.transpose_b else (tk, tn)
    return (_pad_last2(a, _round_up(a.shape[-2], a_rows), _round_up(a.shape[-1], a_cols)),
            _pad_last2(b, _round_up(b.shape[-2], b_rows), _round_up(b.shape[-1], b_cols)))
  dtype = problem.dtype
  common = smem.widest_swizzle(dtype, config.tile_k, a.shape[-1], b.shape[-1])
  if common is not None and common >= 64:
    a_cols, b_cols = a.shape[-1], b.shape[-1]
  else:
    a_cols, b_cols = _tma_operand_cols(a.shape[-1], dtype), _tma_operand_cols(b.shape[-1], dtype)
  return (_pad_last2(a, _tma_rows(a.shape[-2]), a_cols),
          _pad_last2(b, _tma_rows(b.shape[-2]), b_cols))


def _out_extent(problem, config, interpret):
  """(rows, cols) of the output the kernel writes (>= (M, N); sliced afterwards)."""
  if interpret:
    cm, cn = config.cluster
    return _round_up(problem.m, config.tile_m * cm), _round_up(problem.n, config.tile_n * cn)
  em, en = config.epilogue_shape
  cols = problem.n
  if smem.widest_swizzle(problem.out_dtype, en, cols) is None:
    cols = _round_up(cols, smem.swizzle_span(problem.out_dtype, 32))
  return _tma_rows(problem.m), cols


def _interpret_config(config, problem):
  """A config the GPU interpreter can run: a small grid, clusters only where supported."""
  if config is None:
    config = default_config(problem)
    if not _compat.INTERPRET_SUPPORTS_CLUSTERS:
      config = dataclasses.replace(config, cluster=(1, 1))
  elif config.cluster_size > 1 and not _compat.INTERPRET_SUPPORTS_CLUSTERS:
    raise ValueError(f"GemmConfig.cluster={config.cluster}: jax {jax.__version__}'s GPU "
                     "interpreter has no cluster barriers; use cluster=(1, 1) there")
  if config.num_sms is None:
    config = dataclasses.replace(config, num_sms=INTERPRET_NUM_SMS * config.cluster_size)
  return config


def _kernel_matmul(a, b, problem, batch_shape, spec, bias, c, config, interpret, autotune):
  m, n = problem.m, problem.n
  # A 2-D B with a batched, untransposed A is one big GEMM: fold the batch into M.
  fold = bool(batch_shape) and b.ndim == 2 and not problem.transpose_a
  if fold:
    a = a.reshape(-1, a.shape[-1])
    if c is not None and c.ndim > 2:
      c = c.reshape(-1, n)
    elif c is not None:
      c = jnp.broadcast_to(c, (*batch_shape, m, n)).reshape(-1, n)
    problem = dataclasses.replace(problem, m=a.shape[0], batch=1)
  else:
    a = a.reshape(-1, *a.shape[-2:]) if a.ndim > 2 else a
    b = b.reshape(-1, *b.shape[-2:]) if b.ndim > 2 else b
    if c is not None and c.ndim > 2:
      c = c.reshape(-1, *c.shape[-2:])
  if config is None and not interpret:  # keyed by the problem the kernel runs
    config = resolve_config(problem, spec.activation, operands=(a, b), tune=autotune)
  if interpret:
    config = _interpret_config(config, problem)
  config = config or default_config(problem)
  config.validate(problem)
  a, b = _tma_layout(a, b, problem, config, interpret)
  rows, cols = _out_extent(problem, config, interpret)
  if c is not None:
    c = _pad_last2(c.astype(problem.out_dtype), rows, cols)
  if bias is not None:
    bias_cols = _round_up(cols, config.tile_n * config.cluster[1])
    bias = _pad_last2(jnp.asarray(bias, jnp.float32)[None], 1, bias_cols)[0]
  kernel_problem = dataclasses.replace(problem, m=rows, n=cols)
  out = hopper_gemm(
      a, b, bias, c, problem=kernel_problem, config=config, epilogue=spec,
      interpret=_compat.interpret_params(zero_fill=False) if interpret else None)
  return out[..., :problem.m, :n].reshape(*batch_shape, m, n)
