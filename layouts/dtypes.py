"""Element widths in bits, from any way of naming a dtype.

Accepts numpy and jax dtypes and scalar types (``np.float32``,
``jnp.bfloat16``), anything with a ``.dtype`` (arrays,
``jax.ShapeDtypeStruct``), short and long names (``"bf16"``, ``"bfloat16"``,
``"float8_e4m3fn"``, ``"e5m2"``, ``"tf32"``, ``"s8"``), or a width in bits
given as an int. jax is never imported here.

>>> dtype_bits("bf16"), dtype_bits("tf32"), dtype_bits(np.int8), dtype_bits(16)
(16, 32, 8, 16)
"""

from __future__ import annotations

import numpy as np

from .int_tuple import is_int

__all__ = ["dtype_bits"]

_BITS_BY_NAME = {
    "tf32": 32,
    "tfloat32": 32,
    "bf16": 16,
    "bfloat16": 16,
    "f16": 16,
    "fp16": 16,
    "half": 16,
    "f32": 32,
    "fp32": 32,
    "f64": 64,
    "fp64": 64,
    "fp8": 8,
    "f8": 8,
    "e4m3": 8,
    "e5m2": 8,
    "s8": 8,
    "u8": 8,
    "i8": 8,
    "s16": 16,
    "u16": 16,
    "i16": 16,
    "s32": 32,
    "u32": 32,
    "i32": 32,
    "s64": 64,
    "u64": 64,
    "i64": 64,
    "s4": 4,
    "u4": 4,
    "i4": 4,
    "int4": 4,
    "uint4": 4,
}
"""Names numpy does not know (or knows with another width: numpy stores int4
in a byte)."""

_BITS_BY_PREFIX = (("float8_", 8), ("float6_", 6), ("float4_", 4), ("int2", 2), ("uint2", 2))
"""ml_dtypes families (``float8_e4m3fn``, ``float4_e2m1fn``, ...): numpy
would report their storage width, not their bit width."""


def _bits_of_name(name: str) -> int | None:
  key = name.lower()
  if key in _BITS_BY_NAME:
    return _BITS_BY_NAME[key]
  for prefix, bits in _BITS_BY_PREFIX:
    if key.startswith(prefix):
      return bits
  return None


def dtype_bits(dtype) -> int:
  """Width in bits of one element of ``dtype`` (see the module docstring).

  >>> dtype_bits("float8_e4m3fn"), dtype_bits(np.dtype("float32"))
  (8, 32)
  """
  if is_int(dtype):
    if dtype <= 0:
      raise ValueError(f"dtype_bits: a width in bits must be positive, got {dtype}")
    return int(dtype)
  if isinstance(dtype, str):
    bits = _bits_of_name(dtype)
    if bits is not None:
      return bits
  elif not isinstance(dtype, type) and hasattr(dtype, "dtype"):
    dtype = dtype.dtype
  try:
    np_dtype = np.dtype(dtype)
  except TypeError:
    raise ValueError(f"dtype_bits: {dtype!r} is not a dtype") from None
  bits = _bits_of_name(np_dtype.name)
  return bits if bits is not None else np_dtype.itemsize * 8
