"""One GEMM as jax transformations see it: a static `GemmCall` plus arrays.

`gemm` runs the kernel module's `matmul` and gives it a vmap rule: vmapped
dimensions become the kernel's own batch dimension (instead of the kernel's
generic rule, which multiplies the persistent grid), and a shared operand
stays 2-D so that its batch folds into M. A vmapped vector or scalar operand
does not fit the kernel's single row; its epilogue then runs in XLA.

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
from pallas_gemm.operands import OPERANDS, PUBLIC, TILE


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


def gemm(call: GemmCall, a, b, **operands):
  """What `pallas_gemm.gemm.gemm` computes for `call` and these arrays; `operands`: the
  epilogue's, by name (`operands.PUBLIC`: bias, row_bias, c, residual, scalar)."""
  unknown = sorted(set(operands) - set(PUBLIC))
  if unknown:
    raise TypeError(f"gemm takes the epilogue operands {list(PUBLIC)}, got {unknown}")
  return _vmappable(call)(a, b, *(operands.get(name) for name in PUBLIC))


def finish_epilogue(call: GemmCall, acc, **operands):
  """`call`'s epilogue after alpha, in XLA, on an f32 `alpha * op(a) @ op(b)`.

  The operands (by name, as `gemm`'s) must broadcast against `acc` (a row vector as
  (..., M, 1): `Kind.broadcastable`, a per-example one as `Kind.per_example`).
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
  tail = dict(residual=operands.pop("residual", None), scalar=operands.pop("scalar", None))
  c = operands.pop("c", None)
  pre = epilogue_lib.affine(spec, acc, c=c, **operands)
  y = epilogue_lib.finish(spec, pre, **tail, **operands)
  y = epilogue_lib.quantize(spec, y)
  y = y.astype(call.out_dtype)
  return (y, pre.astype(call.out_dtype)) if call.return_pre else y


def _vmappable(call):
  @jax.custom_batching.custom_vmap
  def vmappable(a, b, *operands):
    return run(call, a, b, *operands)

  @vmappable.def_vmap
  def rule(axis_size, in_batched, *args):
    return _batched(call, axis_size, in_batched, *args), (True, True) if call.return_pre else True

  return vmappable


def run(call, a, b, *operands):
  """`call` on unbatched operands (the epilogue's in `operands.PUBLIC` order): the entry
  of `pallas_gemm.gemm.gemm`, as jax traces it (no custom batching rule: the XLA
  implementation batches and differentiates natively)."""
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
      activation=call.activation,
      alpha=call.alpha,
      beta=call.beta,
      out_dtype=call.out_dtype,
      config=call.config,
      implementation=call.implementation,
      autotune=call.autotune,
      clamp=call.clamp,
      out_scale=call.out_scale,
      return_pre=call.return_pre,
      residual_slope=call.residual_slope,
      **dict(zip(PUBLIC, operands)),
  )


def _batched(call, size, in_batched, a, b, *values):
  """The vmap rule: batched arrays carry the vmapped dim first (custom_vmap's convention)."""
  a_batched, b_batched, *flags = in_batched
  given, batched = dict(zip(PUBLIC, values)), dict(zip(PUBLIC, flags))
  # The kernel wants equal batch dims on A and B, or one of them 2-D.
  batch = (size, *(a.shape[a_batched:-2] or b.shape[b_batched:-2]))
  a, b = (
      _broadcast_batch(x, mapped, batch) if mapped or x.ndim > 2 else x
      for x, mapped in ((a, a_batched), (b, b_batched))
  )
  tiles = [name for name in PUBLIC if OPERANDS[name].kind is TILE and given[name] is not None]
  for name in tiles:  # the kernel batches tiles itself
    if batched[name] or given[name].ndim > 2:
      given[name] = _broadcast_batch(given[name], batched[name], batch)
  if a.ndim == b.ndim == 2 and any(given[name].ndim > 2 for name in tiles):
    a = _broadcast_batch(a, False, batch)  # only an addend is batched: so is the product
  if not any(batched[name] for name in PUBLIC if name not in tiles and given[name] is not None):
    return gemm(call, a, b, **given)
  # The kernel's vectors are single rows and its scalar one value: the epilogue of
  # per-example ones runs in XLA.
  acc = gemm(call.product(), a, b)  # (size, *batch, M, N)
  for name, x in given.items():
    if x is not None and name not in tiles:
      kind = OPERANDS[name].kind
      given[name] = kind.per_example(x, size, acc.ndim) if batched[name] else kind.broadcastable(x)
  return finish_epilogue(call, acc, **{name: x for name, x in given.items() if x is not None})


def _broadcast_batch(x, batched, batch):
  """`x` with batch dims `batch` (the vmapped dim first), broadcasting where it has fewer."""
  if not batched:
    x = x[None]
  if x.shape[:-2] == batch:
    return x
  x = x.reshape(x.shape[0], *(1,) * (len(batch) - x.ndim + 2), *x.shape[1:])
  return jnp.broadcast_to(x, (*batch, *x.shape[-2:]))
