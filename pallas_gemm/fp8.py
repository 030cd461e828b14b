"""Delayed fp8 scaling (TransformerEngine's recipe) as pure functions on arrays.

    scale    = fp8_max / (max(amax_history) * 2**margin)   (kept while the history is all 0)
    x_fp8    = saturate_cast(x * scale)                      (`quantize`)
    x       ~= x_fp8 / scale                                 (1 / scale: the dequantization
                                                              scale `scaled_matmul` takes)
    history  = [amax(x), *history[:-1]]                      (`update_history`, newest first)

"Delayed": a step quantizes with the scale computed from the amaxes of the
steps before it, and then records its own amax. Gradients use "current"
scaling instead (`current_scale`: from the tensor's own amax, one more pass
over it), which needs no state carried between backward passes.

>>> import jax.numpy as jnp
>>> history = update_history(jnp.zeros(4), jnp.float32(2.0))
>>> history.tolist(), float(scale_from_history(history, jnp.float32(1.0)))
([2.0, 0.0, 0.0, 0.0], 224.0)
>>> quantize(jnp.array([1.0, 1000.0]), jnp.float32(2.0)).astype(jnp.float32).tolist()
[2.0, 448.0]
>>> float(current_scale(jnp.array([-4.0, 2.0]), jnp.float8_e5m2))  # 57344 / 4
14336.0
"""

from __future__ import annotations

import jax.numpy as jnp


def quantize(x, scale, dtype=jnp.float8_e4m3fn):
  """`x * scale` cast to the fp8 `dtype`, saturating at its largest finite value."""
  fp8_max = float(jnp.finfo(dtype).max)
  y = x.astype(jnp.float32) * scale
  return jnp.clip(y, -fp8_max, fp8_max).astype(dtype)


def amax(x):
  """max |x| as an f32 scalar."""
  return jnp.max(jnp.abs(x)).astype(jnp.float32)


def update_history(history, new_amax):
  """The amax history with `new_amax` first and the oldest entry dropped."""
  return jnp.concatenate([jnp.reshape(new_amax, (1,)).astype(history.dtype), history[:-1]])


def scale_from_history(history, scale, dtype=jnp.float8_e4m3fn, margin: int = 0):
  """fp8_max / (max(history) * 2**margin); the previous `scale` where that is not finite and > 0."""
  fp8_max = float(jnp.finfo(dtype).max)
  peak = jnp.max(history)
  fresh = fp8_max / (peak * 2.0**margin)
  return jnp.where((peak > 0) & jnp.isfinite(fresh), fresh, scale).astype(jnp.float32)


def current_scale(x, dtype=jnp.float8_e4m3fn, margin: int = 0):
  """fp8_max / (amax(x) * 2**margin) from `x` itself; 1 where x is all zero or not finite."""
  return scale_from_history(jnp.reshape(amax(x), (1,)), jnp.float32(1), dtype, margin)
