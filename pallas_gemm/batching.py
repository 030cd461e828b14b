"""One GEMM as jax transformations see it: a static `GemmCall` plus arrays.

`gemm` runs the kernel module's `matmul` and gives it a vmap rule: vmapped
dimensions become the kernel's own batch dimension (instead of the kernel's
generic rule, which multiplies the persistent grid), and a shared operand
stays 2-D so that its batch folds into M.

The "xla" implementation is an einsum with f32 accumulation followed by the
kernel's own epilogue function; it also takes f32 operands (at HIGHEST
precision), which keeps numerical gradient checks and f32 Flax layers on
this code path. The kernel takes bf16 and f16 only.

>>> import jax, jax.numpy as jnp
>>> call = GemmCall(out_dtype="float32", implementation="xla")
>>> x = jnp.ones((3, 8, 4), jnp.bfloat16); w = jnp.ones((4, 2), jnp.bfloat16)
>>> jax.vmap(lambda x: gemm(call, x, w))(x).shape
(3, 8, 2)
"""

from __future__ import annotations

import dataclasses

import jax
from jax import lax
import jax.numpy as jnp

from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm.config import GemmConfig, INPUT_DTYPES
from pallas_gemm.matmul import matmul as kernel_matmul

FLOAT_DTYPES = (*INPUT_DTYPES, "float32")
"""Operand dtypes of the "xla" implementation."""


@dataclasses.dataclass(frozen=True)
class GemmCall:
  """Everything static about one GEMM (hashable; the arrays come separately).

  Attributes mirror `pallas_gemm.matmul`'s keyword arguments; `out_dtype` is
  a dtype name and `implementation` is resolved ("pallas", "interpret", "xla").
  """

  out_dtype: str
  implementation: str
  transpose_a: bool = False
  transpose_b: bool = False
  activation: str | None = None
  alpha: float = 1.0
  beta: float = 0.0
  config: GemmConfig | None = None

  @property
  def epilogue(self) -> epilogue_lib.EpilogueSpec:
    return epilogue_lib.EpilogueSpec(self.activation, self.alpha, self.beta)

  def linear(self, out_dtype: str = "float32") -> GemmCall:
    """The same GEMM without the nonlinear part of the epilogue (alpha kept)."""
    return dataclasses.replace(self, activation=None, beta=0.0, out_dtype=out_dtype)


def gemm(call: GemmCall, a, b, bias=None, c=None):
  """`act(alpha * op(a) @ op(b) + beta * c + bias)` as `call` describes it."""
  return _vmappable(call)(a, b, bias, c)


def finish_epilogue(call: GemmCall, acc, bias=None, c=None):
  """Applies `call`'s epilogue, minus alpha, to an f32 `alpha * op(a) @ op(b)`, in XLA."""
  spec = epilogue_lib.EpilogueSpec(call.activation, 1.0, call.beta)
  return epilogue_lib.apply(spec, acc, c=c, bias=bias).astype(call.out_dtype)


def _vmappable(call):
  @jax.custom_batching.custom_vmap
  def run(a, b, bias, c):
    return _run(call, a, b, bias, c)

  @run.def_vmap
  def rule(axis_size, in_batched, a, b, bias, c):
    return _batched(call, axis_size, in_batched, a, b, bias, c), True

  return run


def _run(call, a, b, bias, c):
  if call.implementation == "xla":
    return _xla(call, a, b, bias, c)
  return kernel_matmul(
      a, b, transpose_a=call.transpose_a, transpose_b=call.transpose_b, bias=bias,
      activation=call.activation, c=c, alpha=call.alpha, beta=call.beta,
      out_dtype=call.out_dtype, config=call.config, implementation=call.implementation)


def _xla(call, a, b, bias, c):
  """The XLA implementation: an f32-accumulating einsum and the same epilogue function.

  (An einsum rather than matmul of swapped axes: XLA:CPU cannot run a bf16 dot
  with f32 output whose 2-D lhs contracts its major dim against a batched rhs.)
  """
  if a.dtype != b.dtype or a.dtype.name not in FLOAT_DTYPES:
    raise TypeError(f"a and b must have the same dtype, one of {FLOAT_DTYPES}; "
                    f"got {a.dtype} and {b.dtype}")
  lhs = "...km" if call.transpose_a else "...mk"
  rhs = "...nk" if call.transpose_b else "...kn"
  precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  acc = jnp.einsum(f"{lhs},{rhs}->...mn", a, b, precision=precision,
                   preferred_element_type=jnp.float32)
  return epilogue_lib.apply(call.epilogue, acc, c=c, bias=bias).astype(call.out_dtype)


def _batched(call, size, in_batched, a, b, bias, c):
  """The vmap rule: batched operands carry the vmapped dim first (custom_vmap's convention)."""
  a_batched, b_batched, bias_batched, c_batched = in_batched
  # The kernel wants equal batch dims on A and B, or one of them 2-D.
  per_example = (a.shape[a_batched:-2] or b.shape[b_batched:-2])
  batch = (size, *per_example)
  if a_batched or a.ndim > 2:
    a = _broadcast_batch(a, a_batched, batch)
  if b_batched or b.ndim > 2:
    b = _broadcast_batch(b, b_batched, batch)
  if c is not None and (c_batched or c.ndim > 2):
    c = _broadcast_batch(c, c_batched, batch)
  if not bias_batched:
    return gemm(call, a, b, bias, c)
  # The kernel's bias is one row: a per-example bias is added in XLA, after an f32 GEMM.
  linear = dataclasses.replace(call.linear(), beta=call.beta)
  acc = gemm(linear, a, b, None, c)
  bias = bias.reshape(size, *(1,) * (acc.ndim - 2), bias.shape[-1])
  return finish_epilogue(dataclasses.replace(call, beta=0.0), acc, bias=bias)


def _broadcast_batch(x, batched, batch):
  """`x` with batch dims `batch` (the vmapped dim first), broadcasting where it has fewer."""
  if not batched:
    x = x[None]
  if x.shape[:-2] == batch:
    return x
  x = x.reshape(x.shape[0], *(1,) * (len(batch) - x.ndim + 2), *x.shape[1:])
  return jnp.broadcast_to(x, (*batch, *x.shape[-2:]))
