"""One GEMM as jax transformations see it: a static `GemmCall` plus arrays.

`gemm` runs the kernel module's `matmul` and gives it a vmap rule: vmapped
dimensions become the kernel's own batch dimension (instead of the kernel's
generic rule, which multiplies the persistent grid), and a shared operand
stays 2-D so that its batch folds into M. A vmapped bias or row bias does
not fit the kernel's single row; its epilogue then runs in XLA.

>>> import jax, jax.numpy as jnp
>>> call = GemmCall(out_dtype="float32", implementation="xla")
>>> x = jnp.ones((3, 8, 4), jnp.bfloat16); w = jnp.ones((4, 2), jnp.bfloat16)
>>> jax.vmap(lambda x: gemm(call, x, w))(x).shape
(3, 8, 2)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm.config import FP8_DTYPES, GemmConfig
from pallas_gemm.gemm import gemm as kernel_matmul


@dataclasses.dataclass(frozen=True)
class GemmCall:
  """Everything static about one GEMM (hashable; the arrays come separately).

  Attributes mirror `pallas_gemm.matmul`'s keyword arguments; `out_dtype` is
  a dtype name, `implementation` is resolved ("auto", "pallas", "interpret", "xla"; "auto" picks per GEMM).
  """

  out_dtype: str
  implementation: str
  transpose_a: bool = False
  transpose_b: bool = False
  activation: str | None = None
  alpha: float = 1.0
  beta: float = 0.0
  clamp: tuple[float | None, float | None] | None = None
  out_scale: float | None = None
  config: GemmConfig | None = None
  autotune: bool | None = None
  return_pre: bool = False
  """Also return the affine part (y, pre), as `matmul(..., return_pre=True)`."""
  residual_slope: str | None = None
  """The residual multiplies by this activation's derivative (`gemm(residual_slope=)`)."""

  @property
  def nonlinear(self) -> bool:
    """Whether the epilogue has a part after the affine one (activation or clamp)."""
    return self.activation is not None or self.clamp is not None

  def affine(self, out_dtype: str | None = None) -> GemmCall:
    """This GEMM up to the activation: alpha * op(a) @ op(b) + beta * c + biases."""
    return dataclasses.replace(
        self,
        activation=None,
        clamp=None,
        out_scale=None,
        out_dtype=out_dtype or self.out_dtype,
        return_pre=False,
        residual_slope=None,
    )

  def product(self) -> GemmCall:
    """alpha * op(a) @ op(b) alone, in f32."""
    return dataclasses.replace(self.affine("float32"), beta=0.0)


def gemm(call: GemmCall, a, b, *, bias=None, c=None, row_bias=None, residual=None, scalar=None):
  """What `pallas_gemm.gemm.gemm` computes for `call` and these arrays."""
  return _vmappable(call)(a, b, bias, c, row_bias, residual, scalar)


def finish_epilogue(
    call: GemmCall, acc, *, bias=None, c=None, row_bias=None, residual=None, scalar=None
):
  """`call`'s epilogue after alpha, in XLA, on an f32 `alpha * op(a) @ op(b)`.

  Biases, c, residual and scalar must broadcast against `acc` (row_bias as (..., M, 1),
  a per-example scalar as (size, 1, ..., 1)).
  Returns y, or (y, pre) when `call.return_pre`.
  """
  saturate = float(jnp.finfo(call.out_dtype).max) if call.out_dtype in FP8_DTYPES else None
  lo, hi = call.clamp or (None, None)
  spec = epilogue_lib.EpilogueSpec(
      activation=call.activation,
      beta=call.beta,
      clamp_lo=lo,
      clamp_hi=hi,
      out_scale=1.0 if call.out_scale is None else call.out_scale,
      saturate=saturate,
      residual_slope=call.residual_slope,
  )
  pre = epilogue_lib.affine(spec, acc, c=c, bias=bias, row_bias=row_bias)
  y = epilogue_lib.finish(spec, pre, residual=residual, bias=bias, row_bias=row_bias, scalar=scalar)
  y = epilogue_lib.quantize(spec, y)
  y = y.astype(call.out_dtype)
  return (y, pre.astype(call.out_dtype)) if call.return_pre else y


def _vmappable(call):
  @jax.custom_batching.custom_vmap
  def vmappable(a, b, bias, c, row_bias, residual, scalar):
    return run(call, a, b, bias, c, row_bias, residual, scalar)

  @vmappable.def_vmap
  def rule(axis_size, in_batched, *args):
    return _batched(call, axis_size, in_batched, *args), (True, True) if call.return_pre else True

  return vmappable


def run(call, a, b, bias, c, row_bias, residual, scalar=None):
  """`call` on unbatched operands: the entry of `pallas_gemm.gemm.gemm`, as jax traces it
  (no custom batching rule: the XLA implementation batches and differentiates natively)."""
  if call.implementation == "interpret":
    _compat.require_interpret_transposes(call.transpose_a, call.transpose_b)
  if call.implementation == "xla" and call.transpose_a and a.ndim == 2 and b.ndim > 2:
    # XLA:CPU cannot run this dot in bf16 with an f32 result ("Unsupported element
    # type for DotThunk"); with A broadcast to B's batch it can.
    a = jnp.broadcast_to(a, (*b.shape[:-2], *a.shape))
  return kernel_matmul(
      a,
      b,
      transpose_a=call.transpose_a,
      transpose_b=call.transpose_b,
      bias=bias,
      activation=call.activation,
      c=c,
      alpha=call.alpha,
      beta=call.beta,
      out_dtype=call.out_dtype,
      config=call.config,
      implementation=call.implementation,
      autotune=call.autotune,
      row_bias=row_bias,
      residual=residual,
      clamp=call.clamp,
      out_scale=call.out_scale,
      return_pre=call.return_pre,
      residual_slope=call.residual_slope,
      scalar=scalar,
  )


def _batched(call, size, in_batched, a, b, bias, c, row_bias, residual, scalar):
  """The vmap rule: batched arrays carry the vmapped dim first (custom_vmap's convention)."""
  (
      a_batched,
      b_batched,
      bias_batched,
      c_batched,
      row_bias_batched,
      residual_batched,
      scalar_batched,
  ) = in_batched
  # The kernel wants equal batch dims on A and B, or one of them 2-D.
  batch = (size, *(a.shape[a_batched:-2] or b.shape[b_batched:-2]))
  a, b, c, residual = (
      _broadcast_batch(x, batched, batch) if x is not None and (batched or x.ndim > 2) else x
      for x, batched in (
          (a, a_batched),
          (b, b_batched),
          (c, c_batched),
          (residual, residual_batched),
      )
  )
  if a.ndim == b.ndim == 2 and any(x is not None and x.ndim > 2 for x in (c, residual)):
    a = _broadcast_batch(a, False, batch)  # only an addend is batched: so is the product
  if not (bias_batched or row_bias_batched or scalar_batched):
    return gemm(call, a, b, bias=bias, c=c, row_bias=row_bias, residual=residual, scalar=scalar)
  # The kernel's biases are single rows and its scalar one value: the epilogue of
  # per-example ones runs in XLA.
  acc = gemm(call.product(), a, b)  # (size, *batch, M, N)
  ones = (1,) * (acc.ndim - 3)
  if bias is not None and bias_batched:
    bias = bias.reshape(size, *ones, 1, -1)
  if row_bias is not None:
    row_bias = row_bias.reshape(*((size, *ones) if row_bias_batched else ()), -1, 1)
  if scalar is not None and scalar_batched:
    scalar = scalar.reshape(size, *ones, 1, 1)
  return finish_epilogue(
      call, acc, bias=bias, c=c, row_bias=row_bias, residual=residual, scalar=scalar
  )


def _broadcast_batch(x, batched, batch):
  """`x` with batch dims `batch` (the vmapped dim first), broadcasting where it has fewer."""
  if not batched:
    x = x[None]
  if x.shape[:-2] == batch:
    return x
  x = x.reshape(x.shape[0], *(1,) * (len(batch) - x.ndim + 2), *x.shape[1:])
  return jnp.broadcast_to(x, (*batch, *x.shape[-2:]))
