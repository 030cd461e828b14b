"""INT8 W8A8 GEMM: int8 activations times int8 weights, exact s32 accumulation, f32 scales.

    y = act(a_scale[m] * b_scale[n] * (a_q @ b_q^T) + bias[n])

The kernel is the dense one (`hopper_gemm`) with s8 x s8 WGMMA into an s32
accumulator, converted to f32 for the fused epilogue; the scales are runtime
operands of the epilogue as in `scaled_matmul` (per tensor, per token (M,),
per channel (N,)). WGMMA reads 8-bit operands K-major only, so the weights are
stored (N, K), as `quantize_per_channel` returns them.

The quantizers are symmetric, as in SmoothQuant's W8A8 and cuBLASLt's int8
GEMMs: q = round(x / s) with s = max|x| / 127 over the reduced axis, |q| <= 127.

>>> import jax.numpy as jnp
>>> x = jnp.array([[1.0, -2.0], [0.5, -0.5]]); w = jnp.array([[1.0, 0.0], [0.0, 1.0]])
>>> xq, xs = quantize_per_token(x); wq, ws = quantize_per_channel(w)
>>> xq.tolist(), wq.tolist()          # wq is (N, K)
([[64, -127], [127, -127]], [[127, 0], [0, 127]])
>>> int8_matmul(xq, wq, xs, ws, out_dtype=jnp.float32, implementation="xla").round(1).tolist()
[[1.0, -2.0], [0.5, -0.5]]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_gemm.scaled import scaled_matmul

INT8_MAX = 127
"""Largest quantized magnitude: the symmetric range [-127, 127] (-128 is never produced)."""


def quantize_int8(x, axis=-1):
  """Symmetric int8 quantization of `x` with one scale per slice along `axis`.

  Returns (q, scale): q int8 of x's shape, scale f32 with `axis` removed, such
  that x ~= q * expand_dims(scale, axis). An all-zero slice gets scale 1.
  """
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"x must be a floating array, got {x.dtype}")
  if x.ndim == 0:
    raise ValueError("x must have at least one dim, got a scalar")
  axis = axis % x.ndim
  amax = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=axis)
  scale = jnp.where(amax > 0, amax / INT8_MAX, 1.0)
  q = jnp.round(x.astype(jnp.float32) / jnp.expand_dims(scale, axis))
  return jnp.clip(q, -INT8_MAX, INT8_MAX).astype(jnp.int8), scale


def quantize_per_token(x):
  """Dynamic per-token quantization of activations (..., M, K): (q, scale (..., M))."""
  return quantize_int8(x, axis=-1)


def quantize_per_channel(w):
  """Per-output-channel quantization of weights (K, N): (q (N, K), scale (N,)).

  q is stored K-major ((N, K)), the layout the int8 kernel reads without a copy.
  """
  w = jnp.asarray(w)
  if w.ndim != 2:
    raise ValueError(f"w must be (K, N), got shape {w.shape}")
  return quantize_int8(w.T, axis=1)


def int8_matmul(
    a,
    b,
    a_scale,
    b_scale,
    *,
    out_dtype=jnp.bfloat16,
    bias=None,
    activation=None,
    transpose_b=True,
    config=None,
    implementation=None,
):
  """`act(a_scale * b_scale * (a @ b) + bias)` for int8 `a` (..., M, K) and `b` (N, K).

  Args:
    a: (..., M, K) int8 (leading dims fold into M).
    b: (N, K) int8 (`transpose_b=True`, the default and the kernel's layout), or
      (K, N) with `transpose_b=False` (costs an XLA transpose of `b`).
    a_scale: f32 scalar or (M,) per token (the leading dims of `a` folded in).
    b_scale: f32 scalar or (N,) per output channel.
    out_dtype: bfloat16 (default), float16, float32 or an fp8 dtype.
    bias, activation, config, implementation: as in `scaled_matmul`.
  Returns:
    (..., M, N) array of `out_dtype`.
  """
  a, b = jnp.asarray(a), jnp.asarray(b)
  for name, x in (("a", a), ("b", b)):
    if x.dtype != jnp.int8:
      raise TypeError(f"{name} must be int8, got {x.dtype}")
  if a.ndim < 2:
    raise ValueError(f"a must be (..., M, K), got shape {a.shape}")
  lead, a_scale = a.shape[:-1], jnp.asarray(a_scale)
  if a_scale.ndim and a_scale.shape == lead:  # per-token scales of a batched a: fold like a
    a_scale = a_scale.reshape(-1)
  y = scaled_matmul(
      a.reshape(-1, a.shape[-1]),
      b,
      a_scale,
      b_scale,
      out_dtype=out_dtype,
      bias=bias,
      activation=activation,
      transpose_b=transpose_b,
      config=config,
      implementation=implementation,
  )
  return y.reshape(*lead, y.shape[-1])


def make_int8_dot_general(*, implementation=None):
  """A `dot_general` for Flax's `dot_general=` that runs W8A8 inference GEMMs.

  The lhs (activations) is quantized per token and the rhs (the (K, N) kernel)
  per output channel on every call, then multiplied by `int8_matmul`; other
  dimension numbers than a Dense layer's (contract lhs's last dim with rhs's
  first, no batch dims) fall back to `jax.lax.dot_general`. Inference only: for
  load-time quantized weights use `pallas_gemm.flax.QuantizedLinear`.
  """

  def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **_):
    (lc, rc), (lb, rb) = dimension_numbers
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    dense = (
        tuple(lc) == (lhs.ndim - 1,) and tuple(rc) == (0,) and rhs.ndim == 2 and not lb and not rb
    )
    if not dense:
      return jax.lax.dot_general(
          lhs, rhs, dimension_numbers, precision, preferred_element_type=preferred_element_type
      )
    out_dtype = preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype)
    xq, xs = quantize_per_token(lhs)
    wq, ws = quantize_per_channel(rhs)
    return int8_matmul(
        xq, wq, xs.reshape(-1), ws, out_dtype=out_dtype, implementation=implementation
    )

  return dot_general


__all__ = [
    "int8_matmul",
    "make_int8_dot_general",
    "quantize_int8",
    "quantize_per_channel",
    "quantize_per_token",
]
