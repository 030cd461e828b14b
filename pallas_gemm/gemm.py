"""The GEMM entry under `pallas_gemm.matmul`: `gemm` = act(alpha * op(a) @ op(b) + beta * c + bias)
(+ extras), with argument checks, routing, TMA padding and the launch; not differentiable
(`pallas_gemm.autodiff.matmul`, exported as `pallas_gemm.matmul`, wraps it in a `custom_jvp`).

>>> import jax.numpy as jnp
>>> a = jnp.ones((4, 3), jnp.bfloat16); b = jnp.ones((3, 2), jnp.bfloat16)
>>> gemm(a, b, bias=jnp.array([1.0, -9.0]), activation="relu", implementation="xla")[0].tolist()
[4.0, 0.0]

Operand layouts are free: `transpose_a=True` means `a` is stored (..., K, M),
`transpose_b=True` that `b` is stored (..., N, K). For bf16/f16 the kernel reads
either with TMA and hands WGMMA a transposed SMEM view, so no transposed copy is
made. fp8 (e4m3, e5m2) and f32 (tf32) operands must be K-major for WGMMA (A as
(M, K), B as (N, K)): other layouts are transposed by XLA first, one extra HBM
read+write of that operand (measured in NOTES.md exp. 12).

Shapes TMA cannot address as they are (see `tma_layout`) are handled by
zero-padding only the offending array, at the cost of one copy of it; every
such copy is listed in DESIGN.md ("odd shapes").
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from pallas_gemm import _compat
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import route
from pallas_gemm import smem
from pallas_gemm.tma_padding import pad_last2, round_up, tma_operand_cols, tma_rows
from pallas_gemm import split_k
from pallas_gemm.operands import OPERANDS
from pallas_gemm.config import (
    FP8_DTYPES,
    INT_DTYPES,
    K_MAJOR_DTYPES,
    NARROW_DTYPES,
    KERNEL_INPUT_DTYPES,
    KERNEL_OUTPUT_DTYPES,
    GemmConfig,
    GemmProblem,
    fit_stages,
)
from pallas_gemm.heuristics import default_config
from pallas_gemm.tuner import resolve_config
from pallas_gemm.hopper_gemm import epilogue_row_view, hopper_gemm, operand_row_views

IMPLEMENTATIONS = (None, "auto", "pallas", "interpret", "xla")
INTERPRET_NUM_SMS = 2
"""Persistent grid size in interpret mode (grid points run one after another there)."""


def gemm(
    a,
    b,
    *,
    transpose_a=False,
    transpose_b=False,
    bias=None,
    activation=None,
    c=None,
    alpha=1.0,
    beta=0.0,
    out_dtype=None,
    config: GemmConfig | None = None,
    implementation: str | None = None,
    autotune: bool | None = None,
    row_bias=None,
    residual=None,
    clamp=None,
    out_scale=None,
    return_pre=False,
    residual_slope=None,
    scalar=None,
):
  """Computes, with f32 accumulation and every step fused into the kernel's epilogue,

      y = act(alpha * op(a) @ op(b) + beta * c + bias[n] + row_bias[m]) + residual
      y = clamp(y, *clamp)
      y = cast_fp8(clip(y * out_scale, -fp8_max, fp8_max))    (fp8 out_dtype only)

  Args:
    a: (..., M, K), or (..., K, M) with `transpose_a`; bf16, f16, float8_e4m3fn,
      float8_e5m2 or float32 (multiplied in tf32). fp8 and f32 operands are
      K-major in the kernel: `transpose_a=True` costs an XLA transpose of `a`.
    b: (..., K, N), or (..., N, K) with `transpose_b`; same dtype as `a`, except
      that e4m3 and e5m2 may be mixed (jax >= 0.11). fp8 and f32 `b` without
      `transpose_b` costs an XLA transpose of `b` (store it (N, K) to avoid it).
      Leading (batch) dims of `a` and `b` must be equal, or one operand 2-D.
    bias: (N,) per-column bias, added in f32, or None.
    activation: None, "relu", "gelu_tanh" (or "gelu", as jax.nn.gelu), "gelu_exact",
      "silu" (or "swish"), "sigmoid", or the jax.nn function of one (`jax.nn.relu`,
      `functools.partial(jax.nn.gelu, approximate=False)`, ...); or any other
      elementwise function of an f32 array (`jax.nn.tanh`, a squared ReLU, a soft cap),
      traced into the kernel's epilogue and differentiated by jax
      (`epilogue.CustomActivation`: one compile per function object); or a user's
      epilogue of operands by kind, `epilogue.with_operands(fn, "residual", "bias",
      "row_bias", "scalar")` (any of them, in fn's order): y = fn(pre, *operands), the
      residual tile no longer added, the bias vectors no longer in `pre`.
    c: (..., M, N) or (M, N) addend, read only when `beta != 0` (as in BLAS);
      not with fp8 outputs.
    alpha, beta: Python numbers (compiled into the kernel). For fp8 operands
      `alpha` is where a dequantization scale (scale_a * scale_b) goes.
    out_dtype: bf16, f16, f32, float8_e4m3fn or float8_e5m2; defaults to
      `a.dtype` for 16-bit and f32 operands, bf16 for fp8 operands.
    row_bias: (M,) per-row bias, added in f32 with `bias`, or None.
    residual: (..., M, N) or (M, N) array (bf16, f16 or f32) added after the
      activation, or None.
    clamp: (lo, hi) Python numbers (either may be None) applied last, or None.
    out_scale: Python number multiplying the result before an fp8 cast, which
      saturates at the dtype's largest finite value (448 e4m3, 57344 e5m2);
      fp8 `out_dtype` only (default 1.0).
    config: a `GemmConfig`, or None: the autotuning cache's entry for this
      problem on this device, else the heuristic default.
    implementation: None ("auto" on a GPU, "xla" elsewhere), "auto" (the Pallas
      kernel, except where XLA's GEMM is faster: tiny K, a few microseconds of
      work, a TMA copy XLA does not need; `pallas_gemm.route`), "pallas",
      "interpret" (the kernel in GPU interpret mode, on any backend) or "xla".
    autotune: tune this problem now if the cache has no entry (outside jit
      only); None defers to the environment variable PALLAS_GEMM_AUTOTUNE=1.
    return_pre: also return `pre = alpha * op(a) @ op(b) + beta * c + bias +
      row_bias` (what the activation's derivative needs), in `out_dtype`,
      written by the same epilogue (one more store per tile, no extra pass).
    residual_slope: an activation name (as `activation`): `residual` is that
      activation's input and multiplies by its derivative instead of adding,
      y = act(pre) * slope(residual): the backward of an activation fused into
      the GEMM that makes its cotangent (`pallas_gemm.mlp`). Needs `residual`.
    scalar: a real scalar (shape ()) for a user's epilogue that takes one
      (`with_operands(fn, ..., "scalar")`), read from device memory at run time (a
      traced value, not compiled in), or None.
  Returns:
    (..., M, N) array of `out_dtype`; with `return_pre`, the pair (y, pre).
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  for name, value in (("alpha", alpha), ("beta", beta)):
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
      raise TypeError(
          f"{name} must be a Python number (it is compiled into the kernel), got {type(value).__name__}"
      )
  if config is not None and not isinstance(config, GemmConfig):
    raise TypeError(f"config must be a GemmConfig or None, got {type(config).__name__}")
  activation = epilogue_lib.activation_name(activation, custom=True)
  a, b = jnp.asarray(a), jnp.asarray(b)
  problem, batch_shape = gemm_problem(a, b, transpose_a, transpose_b, bias, c, beta, out_dtype)
  problem = check_extras(problem, batch_shape, row_bias, residual)
  spec = epilogue_spec(problem, activation, alpha, beta, clamp, out_scale)
  routed = epilogue_lib.routed_operands(activation)
  given = dict(residual=residual, bias=bias, row_bias=row_bias, scalar=scalar)
  if [name for name in routed if given[name] is None] or (routed and residual_slope):
    raise ValueError(
        f"activation={activation.name} (with_operands) takes {list(routed)}: it needs "
        f"each of them given ({', '.join(f'{n}=' for n in routed)}) and no residual_slope"
    )
  scalars = None if scalar is None else scalar_operand(scalar, routed)
  if residual_slope is not None:
    if residual is None:
      raise ValueError("residual_slope needs residual (the activation's input)")
    slope = epilogue_lib.activation_name(residual_slope, "residual_slope")
    spec = dataclasses.replace(spec, residual_slope=slope)
  if c is not None and beta == 0.0:
    c = None
  if implementation is None:
    implementation = "auto" if _compat.on_hopper() else "xla"
  if 0 in (problem.m, problem.n, problem.k, problem.batch):
    implementation = "xla"  # empty: what lax returns (the epilogue of zeros when K = 0)
  routed = False  # whether `route` chose
  if implementation == "auto":  # a config or tuning asked for means the kernel
    if not _compat.on_hopper():
      implementation = "xla"
    elif config or autotune:
      implementation = "pallas"
    else:
      implementation, routed = route.choose(problem)[0], True
  if implementation == "xla":
    # Routed decode rounds the product to the output dtype before the epilogue, as `jnp.dot`
    # and a bias add do: at M = 1 XLA turns the dot into multiply + reduce, and an f32
    # product makes that reduce f32 (28 against 20 us per 2048x2048 weight, NOTES exp. 81).
    decode = routed and route.is_decode(problem)
    return xla_gemm(
        a,
        b,
        problem,
        spec,
        bias,
        c,
        row_bias,
        residual,
        scalars=scalars,
        return_pre=bool(return_pre),
        product_dtype=problem.out_dtype if decode else None,
    )
  return kernel_gemm(
      a,
      b,
      problem,
      batch_shape,
      spec,
      bias,
      c,
      config,
      interpret=implementation == "interpret",
      autotune=autotune,
      row_bias=row_bias,
      residual=residual,
      scalars=scalars,
      return_pre=bool(return_pre),
  )


# -- argument checking --------------------------------------------------------
def check_flags(**flags) -> None:
  """Transpose flags are bools (numpy's too): a string such as "False" is truthy.

  >>> check_flags(transpose_a="False")
  Traceback (most recent call last):
  ...
  TypeError: transpose_a must be a bool, got 'False'
  """
  for name, value in flags.items():
    if not isinstance(value, (bool, np.bool_)):
      raise TypeError(f"{name} must be a bool, got {value!r}")


def scalar_operand(scalar, routed) -> jax.Array:
  """`scalars` for the kernel and `_epilogue_in_xla` carrying a user's epilogue scalar:
  f32 [1 (accumulator multiplier), 1 (fp8 output scale), scalar]."""
  if "scalar" not in routed:
    raise ValueError(
        "scalar is read only by a user's epilogue that takes it: pass "
        "activation=with_operands(fn, ..., 'scalar')"
    )
  check_real(scalar=scalar)
  OPERANDS["scalar"].check(scalar, m=0, n=0)
  one = jnp.ones((), jnp.float32)
  return jnp.stack([one, one, jnp.asarray(scalar, jnp.float32)])


def check_real(**arrays) -> None:
  """Addends are real: a complex bias or c would lose its imaginary part."""
  for name, x in arrays.items():
    if x is not None and jnp.iscomplexobj(x):
      raise TypeError(f"{name} must be real, got {jnp.result_type(x)}")


def gemm_problem(a, b, transpose_a, transpose_b, bias, c, beta, out_dtype):
  """Checks the arguments; returns the GemmProblem and the batch shape."""
  check_flags(transpose_a=transpose_a, transpose_b=transpose_b)
  check_real(bias=bias, c=c)
  for name, x in (("a", a), ("b", b)):
    if x.ndim < 2:
      raise ValueError(f"{name} must have at least 2 dims, got shape {x.shape}")
    if x.dtype.name not in KERNEL_INPUT_DTYPES:
      raise TypeError(f"{name} must be one of {KERNEL_INPUT_DTYPES}, got {x.dtype}")
  if a.dtype != b.dtype:
    if a.dtype.name not in FP8_DTYPES or b.dtype.name not in FP8_DTYPES:
      raise TypeError(
          f"a and b must have the same dtype (or be e4m3 x e5m2 fp8), "
          f"got {a.dtype} and {b.dtype}"
      )
  m, k = a.shape[-2:][::-1] if transpose_a else a.shape[-2:]
  kb, n = b.shape[-2:][::-1] if transpose_b else b.shape[-2:]
  if k != kb:
    raise ValueError(
        f"contracting dims differ: a gives K={k}, b gives K={kb} "
        f"(shapes {a.shape}, {b.shape}, transpose_a={transpose_a}, transpose_b={transpose_b})"
    )
  batch_a, batch_b = a.shape[:-2], b.shape[:-2]
  if batch_a and batch_b and batch_a != batch_b:
    raise ValueError(
        f"batch dims of a {batch_a} and b {batch_b} must be equal (or one operand 2-D)"
    )
  batch_shape = batch_a or batch_b
  out_dtype = jnp.dtype(out_dtype or (jnp.bfloat16 if a.dtype.name in NARROW_DTYPES else a.dtype))
  if out_dtype.name not in KERNEL_OUTPUT_DTYPES:
    raise TypeError(f"out_dtype must be one of {KERNEL_OUTPUT_DTYPES}, got {out_dtype}")
  if out_dtype.name in FP8_DTYPES and c is not None and beta != 0.0:
    raise ValueError(f"c (beta * c) is not supported with an fp8 out_dtype ({out_dtype})")
  for name, x in (("bias", bias), ("c", c)):
    OPERANDS[name].check(x, m, n, batch_shape)
  if c is None and beta != 0.0:
    raise ValueError(f"beta={beta} needs c")
  problem = GemmProblem(
      m=m,
      n=n,
      k=k,
      batch=math.prod(batch_shape),
      dtype=a.dtype.name,
      out_dtype=out_dtype.name,
      transpose_a=bool(transpose_a),
      transpose_b=bool(transpose_b),
      has_bias=bias is not None,
      has_c=c is not None and beta != 0.0,
      b_dtype=b.dtype.name if b.dtype != a.dtype else None,
  )
  return problem, batch_shape


def check_projection(x, w, bias, implementation, config) -> None:
  """Raises naming the first of a projection's arguments that breaks its rule: x (..., K)
  and w (K, N) agreeing on K, bias (N,) or None, `implementation` and `config` as
  `gemm`'s (`cross_entropy`, `split_outputs`).

  >>> import jax.numpy as jnp
  >>> check_projection(jnp.ones((2, 3)), jnp.ones((4, 5)), None, None, None)
  Traceback (most recent call last):
  ...
  ValueError: x (..., K) and w (K, N) must agree on K; got (2, 3) and (4, 5)
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  if config is not None and not isinstance(config, GemmConfig):
    raise TypeError(f"config must be a GemmConfig or None, got {type(config).__name__}")
  if x.ndim < 1 or w.ndim != 2 or w.shape[0] != x.shape[-1]:
    raise ValueError(f"x (..., K) and w (K, N) must agree on K; got {x.shape} and {w.shape}")
  if bias is not None and jnp.shape(bias) != (w.shape[1],):
    raise ValueError(f"bias must be (N,) = ({w.shape[1]},), got {jnp.shape(bias)}")


def check_extras(problem, batch_shape, row_bias, residual):
  """Checks row_bias and residual (`operands.OPERANDS`); returns the problem with them
  recorded."""
  for name, x in (("row_bias", row_bias), ("residual", residual)):
    OPERANDS[name].check(x, problem.m, problem.n, batch_shape)
  return dataclasses.replace(
      problem,
      has_row_bias=row_bias is not None,
      residual_dtype=None if residual is None else jnp.result_type(residual).name,
  )


def epilogue_spec(problem, activation, alpha, beta, clamp, out_scale):
  bounds = (None, None)
  if clamp is not None:
    if (
        not isinstance(clamp, (tuple, list))
        or len(clamp) != 2
        or not all(
            v is None or (isinstance(v, numbers.Real) and not isinstance(v, bool)) for v in clamp
        )
    ):
      raise TypeError(f"clamp must be a (lo, hi) pair of Python numbers or None, got {clamp!r}")
    bounds = tuple(None if v is None else float(v) for v in clamp)
    if any(v is not None and math.isnan(v) for v in bounds):
      raise ValueError(f"clamp bounds must not be NaN, got {clamp!r}")
    if None not in bounds and bounds[0] > bounds[1]:
      raise ValueError(f"clamp: lo {bounds[0]} > hi {bounds[1]}")
  saturate = None
  if problem.out_dtype in FP8_DTYPES:
    saturate = float(jnp.finfo(problem.out_dtype).max)
  if out_scale is not None:
    if not isinstance(out_scale, numbers.Real) or isinstance(out_scale, bool):
      raise TypeError(
          f"out_scale must be a Python number (it is compiled into the kernel), "
          f"got {type(out_scale).__name__}"
      )
    if saturate is None:
      raise ValueError(f"out_scale applies to fp8 outputs only; out_dtype is {problem.out_dtype}")
  return epilogue_lib.EpilogueSpec(
      activation=activation,
      alpha=float(alpha),
      beta=float(beta),
      clamp_lo=bounds[0],
      clamp_hi=bounds[1],
      out_scale=1.0 if out_scale is None else float(out_scale),
      saturate=saturate,
  )


# -- XLA reference path -------------------------------------------------------
def xla_gemm(
    a,
    b,
    problem,
    spec,
    bias,
    c,
    row_bias=None,
    residual=None,
    *,
    scalars=None,
    row_scale=None,
    col_scale=None,
    amax=False,
    return_pre=False,
    product_dtype=None,
    row_lse=False,
):
  """The XLA implementation (results as `_epilogue_in_xla` returns them); `product_dtype`:
  the dot's output dtype before the f32 epilogue (None: f32)."""
  op_a = jnp.swapaxes(a, -1, -2) if problem.transpose_a else a
  op_b = jnp.swapaxes(b, -1, -2) if problem.transpose_b else b
  if op_a.dtype != op_b.dtype:  # mixed fp8: XLA's dot wants one dtype
    op_a, op_b = op_a.astype(jnp.bfloat16), op_b.astype(jnp.bfloat16)
  plain = (
      spec == epilogue_lib.EpilogueSpec()
      and not return_pre
      and not amax
      and not row_lse
      and all(x is None for x in (bias, c, row_bias, residual, scalars, row_scale, col_scale))
  )
  if plain and op_a.dtype.itemsize >= 2:  # fp8 operands: XLA's fp8 dot wants scales
    # What jnp.dot runs: cuBLAS accumulates in f32 and writes the output dtype itself
    # (an f32 result and a convert cost a second pass over the output: 52 against 45 us
    # at 8192x8192x16 on the H100, NOTES exp. 52).
    return jnp.matmul(op_a, op_b, preferred_element_type=problem.out_dtype)
  if op_a.dtype.name in INT_DTYPES:  # s8 x s8 -> s32 (exact; XLA's integer GEMM), then f32
    acc = jnp.matmul(op_a, op_b, preferred_element_type=jnp.int32).astype(jnp.float32)
  else:
    acc = jnp.matmul(op_a, op_b, preferred_element_type=product_dtype or jnp.float32)
    acc = acc.astype(jnp.float32)
  return _epilogue_in_xla(
      problem.out_dtype,
      spec,
      acc,
      bias=bias,
      c=c,
      row_bias=row_bias,
      residual=residual,
      scalars=scalars,
      row_scale=row_scale,
      col_scale=col_scale,
      amax=amax,
      return_pre=return_pre,
      row_lse=row_lse,
  )


def _epilogue_in_xla(
    out_dtype,
    spec,
    acc,
    *,
    bias=None,
    c=None,
    row_bias=None,
    residual=None,
    scalars=None,
    row_scale=None,
    col_scale=None,
    amax=False,
    return_pre=False,
    row_lse=False,
):
  """The epilogue on an f32 `op(a) @ op(b)` in XLA (the XLA path, and after split-K).

  Returns y; with `return_pre`, (y, pre); with `amax`, max |y| before fp8 output
  scaling is appended; with `row_lse`, then each row's log-sum-exp of y as stored (f32).
  """
  multipliers = dict(row_scale=row_scale, col_scale=col_scale)
  scales = (() if scalars is None else (scalars[0],)) + tuple(
      OPERANDS[name].kind.broadcastable(x) for name, x in multipliers.items() if x is not None
  )
  vectors = {
      name: OPERANDS[name].kind.broadcastable(jnp.asarray(x))
      for name, x in dict(bias=bias, row_bias=row_bias).items()
      if x is not None
  }
  pre = epilogue_lib.affine(spec, acc, c=c, scales=scales, **vectors)
  scalar = None if scalars is None or scalars.shape[0] < 3 else scalars[2]
  y = epilogue_lib.finish(spec, pre, residual=residual, scalar=scalar, **vectors)
  out = epilogue_lib.quantize(spec, y, None if scalars is None else scalars[1]).astype(out_dtype)
  results = (
      (out,)
      + ((pre.astype(out_dtype),) if return_pre else ())
      + ((epilogue_lib.abs_max(y),) if amax else ())
      + ((jax.nn.logsumexp(out.astype(jnp.float32), axis=-1),) if row_lse else ())
  )
  return results if len(results) > 1 else out


# -- kernel path --------------------------------------------------------------
def tma_layout(a, b, problem, config, interpret):
  """Pads A and B only where TMA cannot read them as they are.

  A and B share one swizzle. 128 bytes is preferred; 64 bytes is accepted when
  it avoids a copy (e.g. K=4000 bf16). Anything narrower is padded instead.
  Rows that are not a multiple of 8 stay as they are where the kernel copies the
  operand's tiles through a row-wise view (`hopper_gemm.operand_row_views`: K-major
  tiles one swizzle span wide), and are zero-padded to 8 otherwise.
  In interpret mode everything is padded to whole tiles, because the
  interpreter drops partially out-of-bounds TMA stores and rejects
  out-of-bounds loads, and NaN poisoning of unwritten memory must stay on.
  """
  if interpret:
    tm, tn = config.tile_m * config.cluster[0], config.tile_n * config.cluster[1]
    splits, k_iters = config.k_splits(problem)
    k = splits * k_iters * config.tile_k  # whole K slices: the interpreter has no zero fill
    m, n = round_up(problem.m, tm), round_up(problem.n, tn)
    a_rows, a_cols = (k, m) if problem.transpose_a else (m, k)
    b_rows, b_cols = (n, k) if problem.transpose_b else (k, n)
    return (
        pad_last2(a, max(a_rows, a.shape[-2]), max(a_cols, a.shape[-1])),
        pad_last2(b, max(b_rows, b.shape[-2]), max(b_cols, b.shape[-1])),
    )
  dtype = problem.dtype
  common = smem.widest_swizzle(dtype, config.tile_k, a.shape[-1], b.shape[-1])
  if common is not None and common >= 64:
    a_cols, b_cols = a.shape[-1], b.shape[-1]
  else:
    a_cols, b_cols = tma_operand_cols(a.shape[-1], dtype), tma_operand_cols(b.shape[-1], dtype)
  views = operand_row_views(problem, config, a_cols, b_cols)
  a_rows, b_rows = (
      x.shape[-2] if view is not None else tma_rows(x.shape[-2]) for x, view in zip((a, b), views)
  )
  return pad_last2(a, a_rows, a_cols), pad_last2(b, b_rows, b_cols)


def _box_cols(cols, box, dtype, swizzle):
  """Widens an array whose whole minor extent is one swizzle span (or less) to
  `box` when that is wider. On the H100 an output of N=64 bf16 columns (one
  128-byte span) with tile_n=256 came back all wrong (N=128 and 192 were right):
  the tile's chunk stores past N do not stay outside such an array."""
  if swizzle and cols <= smem.swizzle_span(dtype, swizzle) and cols < box:
    return box
  return cols


def out_extent(problem, config, interpret):
  """(rows, cols) of the output the kernel writes (>= (M, N); sliced afterwards)."""
  if interpret:
    cm, cn = config.cluster
    return round_up(problem.m, config.tile_m * cm), round_up(problem.n, config.tile_n * cn)
  em, en = config.epilogue_shape
  cols = problem.n
  if smem.widest_swizzle(problem.out_dtype, en, cols) is None:
    cols = round_up(cols, smem.swizzle_span(problem.out_dtype, 32))
  # The stores of a tile's epilogue chunks past N must not land on a one-span output.
  cols = _box_cols(
      cols, config.tile_n, problem.out_dtype, smem.widest_swizzle(problem.out_dtype, en, cols)
  )
  rows = problem.m
  if epilogue_row_view(problem.out_dtype, config, cols) is None:
    rows = tma_rows(rows)
  return rows, cols


def residual_cols(dtype, cols, config):
  """Minor extent of the residual: `cols`, widened if TMA cannot read it with any swizzle."""
  _, en = config.epilogue_shape
  if smem.widest_swizzle(dtype, en, cols) is None:
    return round_up(cols, smem.swizzle_span(dtype, 32))
  return cols


def kernel_layout(name, x, problem, config, rows, cols):
  """Epilogue operand `name` as the kernel reads it, for an output the kernel writes
  (rows, cols) wide: vectors in f32, zero-padded to whole (cluster) tiles; tiles padded like
  the output, `c` (a scaled addend) in the output dtype, the residual in its own and as
  wide as TMA can load it (`residual_cols`)."""
  kind = OPERANDS[name].kind
  if kind.vector:
    extent = kind.along(
        round_up(rows, config.tile_m * config.cluster[0]),
        round_up(cols, config.tile_n * config.cluster[1]),
    )
    return pad_last2(x.astype(jnp.float32)[None], 1, extent)[0]
  if OPERANDS[name].role == "scaled addend":  # loaded into the output's slots
    return pad_last2(x.astype(problem.out_dtype), rows, cols)
  res_cols = residual_cols(x.dtype, cols, config)
  if epilogue_row_view(x.dtype, config, res_cols) is None:
    rows = tma_rows(rows)
  return pad_last2(x, rows, res_cols)


def interpret_config(config, problem):
  """A config the GPU interpreter can run: a small grid, clusters only where supported."""
  if config is None:  # no GMEM semaphores for stream-K's fixup in the interpreter
    config = default_config(problem).whole_tiles()
    if not _compat.INTERPRET_SUPPORTS_CLUSTERS:
      config = dataclasses.replace(config, cluster=(1, 1))
  elif config.cluster_size > 1 and not _compat.INTERPRET_SUPPORTS_CLUSTERS:
    raise ValueError(
        f"GemmConfig.cluster={config.cluster}: jax {jax.__version__}'s GPU "
        "interpreter has no cluster barriers; use cluster=(1, 1) there"
    )
  if config.num_sms is None:
    config = dataclasses.replace(config, num_sms=INTERPRET_NUM_SMS * config.cluster_size)
  return config


def usable_config(config, problem):
  """`config` if it is valid for `problem`, else None (the default config then).

  The tuning cache's key leaves out some epilogue extras (row bias, residual,
  scales, amax) that take shared memory, so a cached config may not fit.
  """
  if config is not None:
    try:
      config.validate(problem)
    except ValueError:
      return None
  return config


def plain_kernel_gemm(a, b, problem, *, bias=None, config=None, interpret=False, **results):
  """`kernel_gemm` of a 2-D `problem` whose epilogue adds `bias` at most; `results` as
  kernel_gemm's (`row_lse`, `out_splits`), `a` or `b` in pieces as there.

  >>> import jax.numpy as jnp
  >>> x = jnp.ones((128, 64), jnp.bfloat16); w = jnp.ones((64, 128), jnp.bfloat16)
  >>> problem, _ = gemm_problem(x, w, False, False, None, None, 0.0, None)
  >>> float(plain_kernel_gemm(x, w, problem, interpret=True)[0, 0])
  64.0
  """
  spec = epilogue_lib.EpilogueSpec()
  return kernel_gemm(
      a, b, problem, (), spec, bias, None, config, interpret=interpret, autotune=None, **results
  )


def _pieces_readable(pieces, box, whole_rows, interpret) -> bool:
  """Whether the kernel can read an operand's `pieces` (side by side along the minor dim)
  where they are: each a whole number of `box` columns (a TMA box never straddles two),
  rows TMA tiles by 8, and in the interpreter (no out-of-bounds loads) whole tiles of
  `whole_rows` rows."""
  rows = pieces[0].shape[-2]
  return (
      all(x.shape[-1] % box == 0 for x in pieces)
      and smem.rows_tileable(rows)
      and (not interpret or rows % whole_rows == 0)
  )


def _stored_apart(out_splits, problem, config, rows, cols, splits) -> bool:
  """Whether the kernel can store `out_splits`' arrays apart: whole epilogue chunks of
  each, one K slice, an output not widened for TMA, rows that TMA tiles by 8."""
  return (
      splits == 1
      and cols == problem.n
      and all(w % config.epilogue_shape[1] == 0 for w in out_splits)
      and smem.rows_tileable(rows)
  )


def _k_major(a, b, problem):
  """fp8/f32 operands: transpose (in XLA) whichever operand is not K-major."""
  if problem.dtype not in K_MAJOR_DTYPES:
    return a, b, problem
  if problem.transpose_a:
    a = jnp.swapaxes(a, -1, -2)
  if not problem.transpose_b:
    b = jnp.swapaxes(b, -1, -2)
  return a, b, dataclasses.replace(problem, transpose_a=False, transpose_b=True)


def kernel_gemm(
    a,
    b,
    problem,
    batch_shape,
    spec,
    bias,
    c,
    config,
    interpret,
    autotune,
    row_bias=None,
    residual=None,
    *,
    scalars=None,
    row_scale=None,
    col_scale=None,
    amax=False,
    return_pre=False,
    residual_up=None,
    row_lse=False,
    out_splits=None,
):
  """The kernel path. `scalars` (f32 (2,): accumulator multiplier, fp8 output
  scale; (3,): and a user's epilogue scalar), `row_scale` (M,) and `col_scale` (N,) are
  runtime multipliers; results
  as `_epilogue_in_xla` returns them: y, then pre with `return_pre`, then max |y|
  before fp8 output scaling with `amax`, then each row's log-sum-exp of the stored y
  (f32 (..., M)) with `row_lse`. `out_splits` (widths summing to N; no return_pre,
  amax or row_lse): the output as a tuple of arrays of those widths, stored apart by the
  kernel where each is a whole number of epilogue chunks (else split in XLA). `a` or
  `b` may be a tuple of 2-D arrays side by side along its minor dim (A (M, K) not
  transposed: K; B (K, N) not transposed: N), the pieces of an operand that is never
  concatenated where the kernel can read each box from one piece (else concatenated
  here); `problem` is then the concatenation's, and the GEMM plain. `residual_up` (2-D, with `spec.gated_slope` and `return_pre`): a gated unit's up
  pre-activation beside `residual`, its gate's; the results are then (d_gate, d_up) (`hopper_gemm`).
  """
  if problem.dtype != problem.dtype_b and not _compat.SUPPORTS_MIXED_FP8:
    raise TypeError(
        f"a and b: mixed fp8 ({a.dtype} x {b.dtype}) needs jax >= 0.11 in the kernel "
        f"(this is jax {jax.__version__}); implementation='xla' runs it"
    )
  if out_splits is not None and (return_pre or amax or row_lse or residual_up is not None):
    raise ValueError("out_splits: one plain output only (no return_pre, amax or row_lse)")
  if interpret:  # an error, not a hang, where this jax's interpreter cannot run them
    _compat.require_interpret_transposes(problem.transpose_a, problem.transpose_b)
  parts = {name: x for name, x in (("a", a), ("b", b)) if isinstance(x, tuple)}
  if parts:
    extras = (return_pre, amax, row_lse, batch_shape) + tuple(
        x is not None for x in (out_splits, residual_up, scalars)
    )
    if any(extras) or any(x.ndim != 2 for pieces in parts.values() for x in pieces):
      raise ValueError(f"{' and '.join(parts)} in pieces: a plain 2-D GEMM only")
    a, b = (x[0] if isinstance(x, tuple) else x for x in (a, b))
  m, n = problem.m, problem.n
  problem = dataclasses.replace(
      problem,
      has_scales=scalars is not None,
      has_row_scale=row_scale is not None,
      has_col_scale=col_scale is not None,
      amax=bool(amax),
      row_lse=bool(row_lse),
  )
  if residual_up is not None:
    problem = dataclasses.replace(problem, residual_operands=2)
  a, b, problem = _k_major(a, b, problem)
  # A 2-D B with a batched, untransposed A is one big GEMM: fold the batch into M.
  operands = dict(
      bias=bias,
      c=c,
      row_bias=row_bias,
      residual=residual,
      row_scale=row_scale,
      col_scale=col_scale,
  )
  operands = {name: jnp.asarray(x) for name, x in operands.items() if x is not None}
  fold = bool(batch_shape) and b.ndim == 2 and not problem.transpose_a
  if fold:
    a = a.reshape(-1, a.shape[-1])
    operands = {
        name: OPERANDS[name].kind.folded(x, batch_shape, m, n) for name, x in operands.items()
    }
    problem = dataclasses.replace(problem, m=a.shape[0], batch=1)
  else:
    a = a.reshape(-1, *a.shape[-2:]) if a.ndim > 2 else a
    b = b.reshape(-1, *b.shape[-2:]) if b.ndim > 2 else b
    operands = {
        name: x.reshape(-1, *x.shape[-2:]) if x.ndim > 2 else x for name, x in operands.items()
    }
  if config is None and not interpret:  # keyed by the problem the kernel runs
    config = usable_config(
        resolve_config(
            problem,
            epilogue_lib.tuning_activation(spec.activation),
            operands=(a, b),
            tune=autotune,
        ),
        problem,
    )
  if interpret:
    config = interpret_config(config, problem)
  config = config or default_config(problem)
  if spec.gated_slope is not None:  # the two-output epilogue runs in the kernel only
    config = fit_stages(dataclasses.replace(config, split_k=1), problem, config.stages)
  config.validate(problem)
  splits = config.k_splits(problem)[0]
  if splits > 1:  # the kernel writes f32 partial sums; the epilogue runs after their sum
    extras = dict(operands, scalars=scalars, amax=amax, row_lse=row_lse)
    operands, scalars = {}, None
    out_dtype, final_spec = problem.out_dtype, spec
    problem, spec = config.kernel_problem(problem), epilogue_lib.EpilogueSpec()
  rests = {}
  for name, pieces in parts.items():
    box = config.tile_k if name == "a" else config.tile_n
    whole = config.tile_m * config.cluster[0] if name == "a" else config.tile_k
    if _pieces_readable(pieces, box, whole, interpret):
      rests[name] = pieces[1:]
    elif name == "a":
      a = jnp.concatenate(pieces, axis=-1)
    else:
      b = jnp.concatenate(pieces, axis=-1)
  a_in, b_in = tma_layout(a, b, problem, config, interpret)
  a, b = (a if "a" in rests else a_in), (b if "b" in rests else b_in)  # pieces: read as they are
  rows, cols = out_extent(problem, config, interpret)
  operands = {
      name: kernel_layout(name, x, problem, config, rows, cols) for name, x in operands.items()
  }
  if residual_up is not None:
    residual_up = kernel_layout("residual", residual_up, problem, config, rows, cols)
  kernel_problem = dataclasses.replace(problem, m=rows, n=cols)
  if out_splits is not None and _stored_apart(out_splits, problem, config, rows, cols, splits):
    kernel_problem = dataclasses.replace(kernel_problem, out_splits=tuple(out_splits))
  widths = {f"{name}_splits": tuple(x.shape[-1] for x in parts[name]) for name in rests}
  kernel_problem = dataclasses.replace(kernel_problem, **widths)
  outs = hopper_gemm(
      a,
      b,
      **operands,
      scalars=scalars,
      valid_n=n,
      residual_up=residual_up,
      a_rest=rests.get("a"),
      b_rest=rests.get("b"),
      problem=kernel_problem,
      config=config,
      epilogue=spec,
      return_pre=return_pre and splits == 1,
      interpret=_compat.interpret_params(zero_fill=False) if interpret else None,
  )
  crop = lambda out: out[..., : problem.m, :n].reshape(*batch_shape, m, n)
  if kernel_problem.out_splits:
    return tuple(
        piece[..., : problem.m, :].reshape(*batch_shape, m, width)
        for piece, width in zip(outs, out_splits)
    )
  if out_splits is not None:  # one output, split here
    if splits > 1:
      acc = split_k.sum_partials(outs, splits)[..., : problem.m, :n]
      whole = _epilogue_in_xla(out_dtype, final_spec, acc, **extras).reshape(*batch_shape, m, n)
    else:
      whole = crop(outs)
    return tuple(jnp.split(whole, np.cumsum(out_splits)[:-1].tolist(), axis=-1))
  if splits > 1:
    acc = split_k.sum_partials(outs, splits)[..., : problem.m, :n]
    results = _epilogue_in_xla(out_dtype, final_spec, acc, return_pre=return_pre, **extras)
    if not (return_pre or amax or row_lse):
      return results.reshape(*batch_shape, m, n)
    arrays = tuple(x.reshape(*batch_shape, m, n) for x in results[: 1 + return_pre])
    lse = (results[-1].reshape(*batch_shape, m),) if row_lse else ()
    return arrays + results[1 + return_pre : len(results) - len(lse)] + lse
  if not (return_pre or amax or row_lse):
    return crop(outs)
  results = tuple(map(crop, outs[: 1 + return_pre]))
  col_tiles = -(-n // config.wg_tile[1])
  if amax:
    # partial[..., j, r]: max |y| of row r over the j-th warpgroup column tile.
    partial = outs[1 + return_pre][..., :col_tiles, : problem.m]
    results += (epilogue_lib.abs_max(partial),)
  if row_lse:
    parts = outs[-1][..., :col_tiles, :, : problem.m]
    results += (epilogue_lib.combine_row_lse(parts).reshape(*batch_shape, m),)
  return results
