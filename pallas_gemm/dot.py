"""`dot_general` with `jax.lax.dot_general`'s signature, run by the GEMM kernel.

Drop it into Flax (`nnx.Linear(..., dot_general=pallas_gemm.dot_general)`,
`linen.Dense(..., dot_general=...)`) or `jnp.einsum(..., _dot_general=...)`.

>>> import jax.numpy as jnp
>>> x = jnp.ones((2, 5, 3), jnp.bfloat16); w = jnp.ones((3, 4), jnp.bfloat16)
>>> dot_general(x, w, (((2,), (0,)), ((), ()))).shape
(2, 5, 4)
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from pallas_gemm import autodiff
from pallas_gemm import lowering_pool
from pallas_gemm.config import INPUT_DTYPES, OUTPUT_DTYPES

_ALGORITHMS = {
    "bfloat16": (lax.DotAlgorithmPreset.DEFAULT, lax.DotAlgorithmPreset.BF16_BF16_F32),
    "float16": (lax.DotAlgorithmPreset.DEFAULT, lax.DotAlgorithmPreset.F16_F16_F32),
}
"""Dot algorithms the kernel implements, per operand dtype (f32 accumulation)."""


def dot_general(
    lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *, out_sharding=None
):
  """`jax.lax.dot_general`, on the GEMM kernel wherever it can compute it.

  Every placement of the contracting dims maps onto `matmul` without a
  transposed copy: contracting dims last in lhs (NN) or first after the batch
  dims (TN), first in rhs (NN) or last (NT), so NN, NT, TN and TT all run on
  the kernel; adjacent dims are merged by reshapes (several contracting dims,
  several free dims such as (batch, seq) rows against a shared weight) and
  batch dims become the kernel's batch. Differentiable (`autodiff.matmul`),
  vmappable, and sharded operands run per shard (`sharding.gemm`).

  These go to `lax.dot_general` unchanged:
    - operand dtypes other than equal bf16 or f16 (f32, f64, int, mixed), and
      output dtypes other than bf16, f16, f32;
    - batch dims that are not the leading dims of both operands, in order
      (moving them would take a transposed copy);
    - contracting dims that are not adjacent, or not at one end of the free
      dims, in either operand, or paired in different orders;
    - no contracting dim at all (outer products), and zero-sized dims;
    - `precision` given as a `DotAlgorithm`, or a `DotAlgorithmPreset` other
      than DEFAULT and the operand dtype's own (BF16_BF16_F32, F16_F16_F32).
      Precision enums are accepted: 16-bit products are exact in f32.

  `out_sharding` is honoured by resharding the result (nnx.Linear passes it).
  Use `make_dot_general(implementation=...)` to pick the implementation.

  >>> import jax.numpy as jnp
  >>> q = jnp.ones((2, 4, 8), jnp.bfloat16); k = jnp.ones((2, 6, 8), jnp.bfloat16)
  >>> dot_general(q, k, (((2,), (2,)), ((0,), (0,))), preferred_element_type=jnp.float32).dtype
  dtype('float32')
  """
  return _dot_general(
      lhs,
      rhs,
      dimension_numbers,
      precision,
      preferred_element_type,
      out_sharding,
      implementation=None,
  )


def make_dot_general(*, implementation: str | None = None):
  """`dot_general` running a chosen implementation ("auto", "pallas", "interpret", "xla").

  >>> import jax.numpy as jnp
  >>> f = make_dot_general(implementation="xla")
  >>> x, w = jnp.ones((4, 3), jnp.float16), jnp.ones((3, 2), jnp.float16)
  >>> f(x, w, (((1,), (0,)), ((), ()))).shape
  (4, 2)
  """
  lowering_pool.start(implementation)  # a model's layers take this when they are built

  def dot_general(
      lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *, out_sharding=None
  ):
    return _dot_general(
        lhs,
        rhs,
        dimension_numbers,
        precision,
        preferred_element_type,
        out_sharding,
        implementation=implementation,
    )

  dot_general.__doc__ = f"`pallas_gemm.dot_general` with implementation={implementation!r}."
  return dot_general


def _dot_general(
    lhs, rhs, dimension_numbers, precision, preferred_element_type, out_sharding, *, implementation
):
  lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
  # lax's own checks and errors (a trace, no computation): what lax refuses, so do we.
  jax.eval_shape(
      functools.partial(
          lax.dot_general,
          dimension_numbers=dimension_numbers,
          precision=precision,
          preferred_element_type=preferred_element_type,
      ),
      lhs,
      rhs,
  )
  dimension_numbers = _canonical(dimension_numbers)
  mapping = _Mapping.of(lhs, rhs, dimension_numbers, precision, preferred_element_type)
  if mapping is None:
    return lax.dot_general(
        lhs,
        rhs,
        dimension_numbers,
        precision=precision,
        preferred_element_type=preferred_element_type,
        out_sharding=out_sharding,
    )
  out = autodiff.matmul(
      lhs.reshape(mapping.lhs_shape),
      rhs.reshape(mapping.rhs_shape),
      transpose_a=mapping.transpose_a,
      transpose_b=mapping.transpose_b,
      out_dtype=mapping.out_dtype,
      implementation=implementation,
  )
  out = out.reshape(mapping.out_shape)
  if out_sharding is not None:
    out = jax.sharding.reshard(out, out_sharding)
  return out


def _canonical(dimension_numbers):
  """Dimension numbers with every entry a tuple (lax also takes bare ints).

  >>> _canonical(((1, 0), ((), ())))
  (((1,), (0,)), ((), ()))
  """
  as_tuple = lambda d: (int(d),) if isinstance(d, (int, np.integer)) else tuple(int(x) for x in d)
  (lc, rc), (lb, rb) = dimension_numbers
  return (as_tuple(lc), as_tuple(rc)), (as_tuple(lb), as_tuple(rb))


@dataclasses.dataclass(frozen=True)
class _Mapping:
  """How one dot_general becomes one `matmul`: reshapes and transpose flags."""

  lhs_shape: tuple[int, ...]
  rhs_shape: tuple[int, ...]
  transpose_a: bool
  transpose_b: bool
  out_shape: tuple[int, ...]
  out_dtype: str

  @classmethod
  def of(cls, lhs, rhs, dimension_numbers, precision, preferred_element_type):
    """The mapping, or None where the kernel cannot compute this dot_general."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    out_dtype = jnp.dtype(preferred_element_type or lhs.dtype).name
    dtype = lhs.dtype.name
    if (
        dtype not in INPUT_DTYPES
        or rhs.dtype != lhs.dtype
        or out_dtype not in OUTPUT_DTYPES
        or not _kernel_precision(precision, dtype)
        or not lhs_contract
        or 0 in lhs.shape
        or 0 in rhs.shape
    ):
      return None
    nb = len(lhs_batch)
    if tuple(lhs_batch) != tuple(range(nb)) or tuple(rhs_batch) != tuple(range(nb)):
      return None
    if lhs.shape[:nb] != rhs.shape[:nb] or len(lhs_contract) != len(rhs_contract):
      return None
    lc, rc = zip(*sorted(zip(lhs_contract, rhs_contract)))
    if not (_adjacent(lc) and _adjacent(rc)):
      return None
    if lc[-1] == lhs.ndim - 1:
      transpose_a, lhs_free = False, lhs.shape[nb : lc[0]]
    elif lc[0] == nb:
      transpose_a, lhs_free = True, lhs.shape[lc[-1] + 1 :]
    else:
      return None
    if rc[0] == nb:
      transpose_b, rhs_free = False, rhs.shape[rc[-1] + 1 :]
    elif rc[-1] == rhs.ndim - 1:
      transpose_b, rhs_free = True, rhs.shape[nb : rc[0]]
    else:
      return None
    if [lhs.shape[d] for d in lc] != [rhs.shape[d] for d in rc]:
      return None
    batch = (math.prod(lhs.shape[:nb]),) if nb else ()
    m, n = math.prod(lhs_free), math.prod(rhs_free)
    k = math.prod(lhs.shape[d] for d in lc)
    return cls(
        lhs_shape=(*batch, *((k, m) if transpose_a else (m, k))),
        rhs_shape=(*batch, *((n, k) if transpose_b else (k, n))),
        transpose_a=transpose_a,
        transpose_b=transpose_b,
        out_shape=(*lhs.shape[:nb], *lhs_free, *rhs_free),
        out_dtype=out_dtype,
    )


def _adjacent(dims):
  return list(dims) == list(range(dims[0], dims[0] + len(dims)))


def _kernel_precision(precision, dtype):
  """Whether the kernel (16-bit products, f32 accumulation) honours `precision`."""
  if isinstance(precision, lax.DotAlgorithmPreset):
    return precision in _ALGORITHMS[dtype]
  if isinstance(precision, lax.DotAlgorithm):
    return False
  return True
