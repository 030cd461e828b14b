"""`matmul`, differentiable in reverse mode: a `jax.custom_vjp` around the kernel.

    y = act(alpha * op(a) @ op(b) + beta * c + bias)

Forward under differentiation: without an activation it is the kernel with
the whole epilogue fused, and the residuals are the inputs (a for dB, b for
dA, only those a requested gradient needs). With an activation, the kernel
writes the pre-activation `pre = alpha * op(a) @ op(b) + beta * c + bias`
(bias and c still fused) in `out_dtype`, XLA applies the activation (one
elementwise pass), and `pre` is saved beside the inputs: the derivative of
gelu or silu cannot be had from their output.

Backward (`g` = cotangent of y):
  dPre = g * act'(pre)       XLA, one elementwise pass (the kernel has no prologue
                             to fuse it into), cast to the operand dtype in the
                             same pass; skipped without activation when g already
                             has the operand dtype.
  d op(a) = alpha * dPre @ op(b)^T,  d op(b) = alpha * op(a)^T @ dPre
                             the same kernel, with transpose flags instead of
                             transposed copies (NN forward: dA is an NT problem,
                             dB a TN one), alpha fused, f32 accumulation, output in
                             the operand dtype whatever `out_dtype` was.
  dbias = sum of dPre over rows, dc = beta * dPre (summed over batch if c was 2-D)
                             XLA reductions of the f32 dPre.
A shared 2-D operand's gradient folds the batch into the contraction where
the layout allows (dB of an untransposed A) and otherwise sums an f32
batched GEMM.

Gradients nobody asked for are skipped (`symbolic_zeros=True`): frozen
weights cost no dB GEMM, inputs no dA. jax does not allow `optimize_remat`
together with `symbolic_zeros`; it is not needed here, since the residuals
are inputs (or `pre`, which the kernel computes alone), so under
`jax.checkpoint` a forward kernel whose output the backward does not need is
removed like any other unused value (tests/test_autodiff.py counts them).

Forward mode (`jax.jvp`, `jacfwd`) is not supported: jax raises
"can't apply forward-mode autodiff (jvp) to a custom_vjp function".

>>> import jax, jax.numpy as jnp
>>> a = jnp.ones((4, 3), jnp.bfloat16); b = jnp.ones((3, 2), jnp.bfloat16)
>>> loss = lambda a, b: matmul(a, b, activation="relu", implementation="xla").sum()
>>> jax.grad(loss, argnums=1)(a, b).tolist()
[[4.0, 4.0], [4.0, 4.0], [4.0, 4.0]]
"""

from __future__ import annotations

import dataclasses
import functools
import numbers

import jax
from jax.custom_derivatives import SymbolicZero
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import sharding
from pallas_gemm.batching import GemmCall
from pallas_gemm.config import GemmConfig
from pallas_gemm.matmul import IMPLEMENTATIONS


def matmul(a, b, *, transpose_a=False, transpose_b=False, bias=None, activation=None,
           c=None, alpha=1.0, beta=0.0, out_dtype=None, config: GemmConfig | None = None,
           implementation: str | None = None):
  """Computes `act(alpha * op(a) @ op(b) + beta * c + bias)`, differentiably.

  Same arguments and result as `pallas_gemm.matmul.matmul` (the kernel entry),
  plus: reverse-mode gradients for a, b, bias and c (see the module doc),
  vmap onto the kernel's batch dimension, sharded operands (`sharding.gemm`),
  and f32 operands with `implementation="xla"`.

  >>> import jax.numpy as jnp
  >>> a = jnp.ones((2, 3), jnp.bfloat16); b = jnp.ones((2, 4), jnp.bfloat16)
  >>> matmul(a, b, transpose_a=True, implementation="xla").shape
  (3, 4)
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  for name, value in (("alpha", alpha), ("beta", beta)):
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
      raise TypeError(f"{name} must be a Python number (it is compiled into the kernel), "
                      f"got {type(value).__name__}")
  if implementation is None:
    implementation = "pallas" if _compat.device_sm_count() else "xla"
  a, b = jnp.asarray(a), jnp.asarray(b)
  call = GemmCall(
      out_dtype=jnp.dtype(out_dtype or a.dtype).name, implementation=implementation,
      transpose_a=bool(transpose_a), transpose_b=bool(transpose_b), activation=activation,
      alpha=float(alpha), beta=float(beta), config=config)
  if c is not None and beta == 0.0:
    c = None  # never read (BLAS convention), so its gradient is zero
  elif c is None and beta != 0.0:
    raise ValueError(f"beta={beta} needs c")
  return _matmul(call, a, b, bias, c)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _matmul(call, a, b, bias, c):
  return sharding.gemm(call, a, b, bias, c)


@dataclasses.dataclass(frozen=True)
class _Grad:
  """Shape, dtype and (Explicit-mesh) sharding a requested gradient must have."""

  shape: tuple[int, ...]
  dtype: str
  spec: tuple | None

  @classmethod
  def of(cls, x):
    return cls(x.shape, x.dtype.name, sharding.explicit_spec(x))


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Wanted:
  """The gradients the backward computes (None: not requested), and the operand dtype."""

  a: _Grad | None
  b: _Grad | None
  bias: _Grad | None
  c: _Grad | None
  operand_dtype: str


def _fwd(call, a, b, bias, c):
  grads = (_Grad.of(x.value) if x is not None and x.perturbed else None
           for x in (a, b, bias, c))
  a, b, bias, c = (None if x is None else x.value for x in (a, b, bias, c))
  wanted = _Wanted(*grads, operand_dtype=a.dtype.name)
  if call.activation is None:
    y, pre = sharding.gemm(call, a, b, bias, c), None
  else:
    pre = sharding.gemm(dataclasses.replace(call, activation=None), a, b, bias, c)
    y = _activate(call.activation, pre).astype(call.out_dtype)
  return y, (a if wanted.b else None, b if wanted.a else None, pre, wanted)


def _bwd(call, residuals, g):
  a, b, pre, wanted = residuals
  if isinstance(g, SymbolicZero):
    return None, None, None, None
  if pre is None:
    dpre = g
  else:
    dpre = jax.vjp(functools.partial(_activate, call.activation), pre)[1](
        g.astype(jnp.float32))[0]
  d_acc = dpre.astype(wanted.operand_dtype)
  da = wanted.a and _grad_a(call, d_acc, b, wanted.a)
  db = wanted.b and _grad_b(call, d_acc, a, wanted.b)
  dbias = wanted.bias and _sum_to(dpre, wanted.bias)
  dc = wanted.c and _sum_to(call.beta * dpre.astype(jnp.float32), wanted.c)
  return da, db, dbias, dc


_matmul.defvjp(_fwd, _bwd, symbolic_zeros=True)


def _activate(name, x):
  return epilogue_lib.ACTIVATIONS[name](x.astype(jnp.float32))


def _grad_a(call, d_acc, b, grad):
  """dA: d op(a) = d_acc @ op(b)^T, stored transposed when A is."""
  if call.transpose_a:
    return _gemm_into(call, b, d_acc, call.transpose_b, True, grad)
  return _gemm_into(call, d_acc, b, False, not call.transpose_b, grad)


def _grad_b(call, d_acc, a, grad):
  """dB: d op(b) = op(a)^T @ d_acc, stored transposed when B is."""
  if call.transpose_b:
    return _gemm_into(call, d_acc, a, True, call.transpose_a, grad)
  return _gemm_into(call, a, d_acc, not call.transpose_a, False, grad)


def _gemm_into(call, x, y, transpose_x, transpose_y, grad):
  """alpha * op(x) @ op(y) as `grad` wants it, summed over batch dims it lacks."""
  linear = GemmCall(out_dtype=grad.dtype, implementation=call.implementation,
                    transpose_a=transpose_x, transpose_b=transpose_y, alpha=call.alpha)
  batch = x.shape[:-2] or y.shape[:-2]
  if batch == grad.shape[:-2]:
    out = sharding.gemm(linear, x, y)
  elif transpose_x and not transpose_y:
    # The contracting dim is second-minor in both: the batch folds into it.
    out = sharding.gemm(linear, x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1]))
  else:
    out = sharding.gemm(dataclasses.replace(linear, out_dtype="float32"), x, y)
    out = _sum_to(out, grad)
  return sharding.reshard(out, grad.spec)


def _sum_to(x, grad):
  """`x` summed over its leading dims down to `grad`'s shape, in grad's dtype and sharding."""
  x = x.sum(axis=tuple(range(x.ndim - len(grad.shape))), dtype=jnp.float32)
  return sharding.reshard(x.astype(grad.dtype), grad.spec)
