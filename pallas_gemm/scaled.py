"""Scaled fp8 GEMM: `scaled_matmul`, with the scales as runtime values.

    y = act(a_scale * b_scale * (a @ b) + bias)             (f32)
    amax = max |y|                                          (return_amax=True)
    out = saturate_cast(y * out_scale)                      (fp8 out_dtype)

`a_scale` and `b_scale` are dequantization multipliers (real a = a_scale * a,
as in `jax.lax.scaled_dot` and cuBLASLt's scale_a/scale_b): per tensor (a
scalar) or per row of `a` (M,) / per column of the result (N,). `out_scale`
is the output's quantization multiplier (TransformerEngine's `scale`,
cuBLASLt's scale_d). All three are arrays passed to the kernel, never
compiled into it: under `jax.jit` a new scale value reuses the compiled
kernel (delayed scaling changes them every step).

In the kernel: the product of the per-tensor scales and `out_scale` are two
f32 scalars the epilogue reads from device memory at each tile's start; a
per-row or per-column scale is a vector staged into shared memory per tile,
like a bias. The amax is reduced in the epilogue too: each warpgroup writes
the per-row maxima of its tile, and XLA takes the max of that small array
(M * N / 256 floats).

>>> import jax.numpy as jnp
>>> a = jnp.ones((4, 32), jnp.float8_e4m3fn); b = jnp.ones((8, 32), jnp.float8_e4m3fn)
>>> y, amax = scaled_matmul(a, b, jnp.float32(0.5), jnp.full((8,), 0.25), out_dtype=jnp.bfloat16,
...                         return_amax=True, implementation="xla")
>>> y[0, :2].tolist(), float(amax)
([4.0, 4.0], 4.0)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import autodiff
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import fp8
from pallas_gemm.config import FP8_DTYPES, INT_DTYPES, GemmConfig
from pallas_gemm.gemm import (IMPLEMENTATIONS, epilogue_spec, kernel_gemm, gemm_problem, xla_gemm)


def scaled_matmul(
    a,
    b,
    a_scale,
    b_scale,
    *,
    out_dtype,
    bias=None,
    activation=None,
    out_scale=None,
    return_amax=False,
    transpose_b=True,
    config: GemmConfig | None = None,
    implementation: str | None = None,
):
  """`act(a_scale * b_scale * (a @ b) + bias)`, fp8 (or int8) operands, one kernel.

  Args:
    a: (..., M, K) float8_e4m3fn or float8_e5m2 (leading dims fold into M), or int8
      with an int8 `b` (s8 x s8 WGMMA, exact s32 accumulation; `pallas_gemm.int8_matmul`).
    b: (N, K) with `transpose_b=True` (the default: the layout the fp8 kernel
      reads without a copy, as `jax.nn.scaled_matmul`'s rhs), else (K, N),
      which costs an XLA transpose of `b`. fp8, the dtype of `a` (e4m3 x e5m2
      mixes need jax >= 0.11).
    a_scale: f32 dequantization scale of `a`: a scalar (or shape (1,)), or (M,)
      per row. A runtime value: changing it does not recompile.
    b_scale: likewise for `b`: a scalar, or (N,) per column of the result.
    out_dtype: bfloat16, float16, float32, float8_e4m3fn or float8_e5m2.
    bias: (N,) added in f32 after the scales, or None.
    activation: None, "relu", "gelu_tanh" (or "gelu"), "gelu_exact", "silu" (or "swish"),
      "sigmoid", or the jax.nn function of one (`epilogue.activation_name`).
    out_scale: fp8 `out_dtype` only: a runtime scalar multiplying y before the
      saturating cast (+-448 e4m3, +-57344 e5m2); None means 1.
    return_amax: also return amax = max |y| (f32 scalar), taken in the kernel's
      epilogue on the f32 result *before* `out_scale` and the cast
      (TransformerEngine's convention: the next scale is fp8_max / amax).
    transpose_b: see `b`.
    config: a `GemmConfig`, or None for the cached or default one.
    implementation: None (the Pallas kernel on a GPU, XLA elsewhere), "pallas",
      "interpret" or "xla".
  Returns:
    (..., M, N) array of `out_dtype`, or (that, amax) with `return_amax`.

  Not differentiable (its operands are already fp8), no vmap or sharding
  rules: to train, use `fp8_linear` (quantizes inside, `custom_vjp`) or
  `pallas_gemm.flax.Fp8Linear`.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, " f"got {implementation!r}")
  if config is not None and not isinstance(config, GemmConfig):
    raise TypeError(f"config must be a GemmConfig or None, got {type(config).__name__}")
  if not isinstance(return_amax, bool):
    raise TypeError(f"return_amax must be a bool, got {type(return_amax).__name__}")
  a, b = jnp.asarray(a), jnp.asarray(b)
  integer = a.dtype.name in INT_DTYPES
  for name, x in (("a", a), ("b", b)):
    if x.dtype.name not in (INT_DTYPES if integer else FP8_DTYPES):
      raise TypeError(
          f"{name} must be one of {FP8_DTYPES}, or int8 with an int8 other operand; "
          f"got a {a.dtype} and b {b.dtype}"
      )
  if b.ndim != 2:
    raise ValueError(f"b must be 2-D ((N, K) with transpose_b, else (K, N)), got shape {b.shape}")
  if out_dtype is None:
    raise TypeError("out_dtype must be a dtype, got None")
  problem, batch_shape = gemm_problem(a, b, False, transpose_b, bias, None, 0.0, out_dtype)
  spec = epilogue_spec(problem, epilogue_lib.activation_name(activation), 1.0, 0.0, None, None)
  m, n = problem.m, problem.n
  a_scale = _scale("a_scale", a_scale, m, "M")
  b_scale = _scale("b_scale", b_scale, n, "N")
  if out_scale is not None:
    if problem.out_dtype not in FP8_DTYPES:
      raise ValueError(f"out_scale applies to fp8 outputs only; out_dtype is {problem.out_dtype}")
    out_scale = _scale("out_scale", out_scale, 1, "")
  per_tensor = jnp.float32(1)
  for scale in (a_scale, b_scale):
    if scale.shape == ():
      per_tensor = per_tensor * scale
  scalars = jnp.stack([per_tensor, jnp.float32(1) if out_scale is None else out_scale])
  vectors = dict(
      row_scale=a_scale if a_scale.shape else None, col_scale=b_scale if b_scale.shape else None
  )
  if bias is not None:
    bias = jnp.asarray(bias, jnp.float32)
  if implementation is None:
    implementation = "pallas" if _compat.on_hopper() else "xla"
  if 0 in (problem.m, problem.n, problem.k, problem.batch):
    implementation = "xla"  # empty: what lax returns (the epilogue of zeros when K = 0)
  if implementation == "interpret" and not _compat.INTERPRET_SUPPORTS_TRANSPOSED_OPERANDS:
    # It would hang: the interpreter's callback fails inside a warp-specialized kernel.
    raise NotImplementedError(
        f"the GPU interpreter of jax {jax.__version__} cannot run fp8 operands (the kernel "
        "reads B through a transposed shared-memory view); use jax >= 0.11 or "
        "implementation='xla'"
    )
  if implementation == "xla":
    return xla_gemm(a, b, problem, spec, bias, None, scalars=scalars, amax=return_amax, **vectors)
  return kernel_gemm(
      a,
      b,
      problem,
      batch_shape,
      spec,
      bias,
      None,
      config,
      interpret=implementation == "interpret",
      autotune=None,
      scalars=scalars,
      amax=return_amax,
      **vectors,
  )


def _scale(name, value, extent, dim):
  """`value` as f32 of shape () (per tensor) or (extent,); TypeError/ValueError naming `name`."""
  try:
    x = jnp.asarray(value)
  except TypeError as e:
    raise TypeError(f"{name} must be a real scalar or array, got {type(value).__name__}") from e
  if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)) or (
      x.dtype == jnp.bool_
  ):
    raise TypeError(f"{name} must be a real number or array, got dtype {x.dtype}")
  if x.shape in ((), (1,)):
    return x.reshape(()).astype(jnp.float32)
  if dim and x.shape == (extent,):
    return x.astype(jnp.float32)
  allowed = "() or (1,)" + (f" (per tensor) or ({dim},) = ({extent},)" if dim else "")
  raise ValueError(f"{name} must have shape {allowed}, got {x.shape}")


BACKWARDS = ("bf16", "e5m2")
"""`fp8_linear(backward=...)`: the operands of the backward GEMMs."""


def fp8_linear(
    x,
    kernel,
    bias,
    x_scale,
    kernel_scale,
    *,
    out_dtype=jnp.bfloat16,
    backward: str = "bf16",
    implementation: str | None = None,
):
  """`x @ kernel + bias` with x and kernel quantized to e4m3 by the given scales; differentiable.

  Args:
    x: (M, K) input in a floating dtype (the backward's "bf16" GEMMs run in it).
    kernel: (K, N) weights (stored (in, out), as Flax stores them).
    bias: (N,) f32, or None.
    x_scale, kernel_scale: f32 quantization scales (`fp8.quantize`: x8 = x * scale,
      saturated); the kernel gets their inverses as dequantization scales.
    out_dtype: the result's dtype.
    backward: "bf16": dx = g @ kernel^T and dkernel = x^T @ g as `matmul`s in
      x's dtype, straight through the quantization; "e5m2": g quantized to
      e5m2 with its own current scale (`fp8.current_scale`), both GEMMs as
      `scaled_matmul` on fp8 operands (g e5m2 against the e4m3 kernel and x,
      quantized with the forward's scales; x^T and g^T are transposed in the
      quantizing XLA pass). The scales get zero cotangents.
    implementation: as `scaled_matmul`.

  >>> import jax, jax.numpy as jnp
  >>> x, w = jnp.ones((4, 32), jnp.bfloat16), jnp.ones((32, 8), jnp.bfloat16)
  >>> one = jnp.float32(1)
  >>> dx = jax.grad(lambda x: fp8_linear(x, w, None, one, one, backward="e5m2",
  ...                                    implementation="xla").astype(jnp.float32).sum())(x)
  >>> float(dx[0, 0])
  8.0
  """
  if backward not in BACKWARDS:
    raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
  return _fp8_dense(
      jnp.dtype(out_dtype).name,
      implementation,
      backward,
      x,
      kernel,
      bias,
      _scale("x_scale", x_scale, 0, None),
      _scale("kernel_scale", kernel_scale, 0, None),
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _fp8_dense(out_dtype, implementation, backward, x, kernel, bias, x_scale, kernel_scale):
  del backward  # the backward rule's choice
  x8 = fp8.quantize(x, x_scale)
  w8 = fp8.quantize(kernel.T, kernel_scale)  # (out, in): K-major, as the kernel reads it
  return scaled_matmul(
      x8,
      w8,
      1.0 / x_scale,
      1.0 / kernel_scale,
      bias=bias,
      out_dtype=out_dtype,
      implementation=implementation,
  )


def _fp8_dense_fwd(out_dtype, implementation, backward, x, kernel, bias, x_scale, kernel_scale):
  y = _fp8_dense(out_dtype, implementation, backward, x, kernel, bias, x_scale, kernel_scale)
  return y, (x, kernel, bias is not None, x_scale, kernel_scale)


def _fp8_dense_bwd(out_dtype, implementation, backward, saved, g):
  x, kernel, has_bias, x_scale, kernel_scale = saved
  g = g.astype(x.dtype)
  dbias = jnp.sum(g, axis=0, dtype=jnp.float32) if has_bias else None
  if backward == "e5m2":
    g_scale = fp8.current_scale(g, jnp.float8_e5m2)
    e5m2 = functools.partial(fp8.quantize, scale=g_scale, dtype=jnp.float8_e5m2)
    # dx (M, K) = g (M, N) . kernel (K, N)^T: the kernel (in, out) is already (N_out=K, contracted).
    dx = scaled_matmul(
        e5m2(g),
        fp8.quantize(kernel, kernel_scale),
        1.0 / g_scale,
        1.0 / kernel_scale,
        out_dtype=x.dtype,
        implementation=implementation,
    )
    # dkernel (K, N) = x^T (K, M) . g (M, N): both operands transposed while quantized.
    dkernel = scaled_matmul(
        fp8.quantize(x.T, x_scale),
        e5m2(g.T),
        1.0 / x_scale,
        1.0 / g_scale,
        out_dtype=jnp.float32,
        implementation=implementation,
    )
  else:
    dx = autodiff.matmul(g, kernel, transpose_b=True, implementation=implementation)
    dkernel = autodiff.matmul(
        x, g, transpose_a=True, out_dtype=jnp.float32, implementation=implementation
    )
  return (
      dx,
      dkernel.astype(kernel.dtype),
      dbias,
      jnp.zeros_like(x_scale),
      jnp.zeros_like(kernel_scale),
  )


_fp8_dense.defvjp(_fp8_dense_fwd, _fp8_dense_bwd)
