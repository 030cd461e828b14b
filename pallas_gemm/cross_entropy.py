"""A language model's head and its cross-entropy in one kernel's epilogue.

    logits = x @ w + bias                  (rounded to x's dtype, as the head stores them)
    loss[r] = logsumexp(logits[r]) - logits[r, labels[r]]

The head's kernel stores the logits and, from the same epilogue, each row's log-sum-exp
in two parts per column tile (the max m and the sum of exp(logits - m); the problem's
`row_lse`), combined in XLA over a few tiles a row. So the forward reads none of the
logits again but the labels' own; the backward makes `dlogits = (softmax - onehot) * g`
in x's dtype in one XLA pass (one read of the logits, one write) and runs the head's two
backward GEMMs. The usual path (`optax.softmax_cross_entropy_with_integer_labels` on f32
logits) reads the logits twice in the forward and writes f32 dlogits then converts them:
~8 GB a step at 16k tokens and a 32k vocabulary against ~3 GB here (NOTES exp. 136).

>>> import jax.numpy as jnp
>>> x = jnp.ones((2, 4), jnp.bfloat16); w = jnp.zeros((4, 8), jnp.bfloat16)
>>> loss = head_cross_entropy(x, w, jnp.array([0, 5]), implementation="xla")
>>> [round(float(v), 4) for v in loss]  # uniform logits: log 8
[2.0794, 2.0794]
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import gemm as gemm_lib
from pallas_gemm.config import GemmConfig

HEAD_DTYPES = ("bfloat16", "float16")


def head_cross_entropy(
    x, w, labels, *, bias=None, implementation: str | None = None, config: GemmConfig | None = None
):
  """Per-token cross-entropy of the logits `x @ w + bias` against integer `labels`.

  Args:
    x: (..., K) bf16 or f16 hidden states.
    w: (K, N) head weights of x's dtype (`nnx.Linear`'s kernel layout).
    labels: (...) integers in [0, N), x's leading shape. A label outside gives NaN, as
      `optax.softmax_cross_entropy_with_integer_labels` does under jit.
    bias: (N,) or None, added in f32 before the logits are rounded.
    implementation: None (the kernel on a Hopper GPU, XLA elsewhere), "auto" or
      "pallas" (the kernel), "interpret" (its GPU interpreter), "xla".
    config: the head GEMM's `GemmConfig`, or None (the default's).
  Returns:
    f32 (...) losses; differentiable in x, w and bias (the backward's GEMMs run in
    `implementation` too).
  """
  x, w, labels = jnp.asarray(x), jnp.asarray(w), jnp.asarray(labels)
  if x.dtype.name not in HEAD_DTYPES or w.dtype != x.dtype:
    raise TypeError(f"x and w must share one of {HEAD_DTYPES}; got {x.dtype} and {w.dtype}")
  gemm_lib.check_projection(x, w, bias, implementation, config)
  bias = None if bias is None else jnp.asarray(bias)
  if not jnp.issubdtype(labels.dtype, jnp.integer) or labels.shape != x.shape[:-1]:
    raise ValueError(
        f"labels must be integers of x's leading shape {x.shape[:-1]}; got {labels.dtype} "
        f"{labels.shape}"
    )
  if implementation is None:
    implementation = "pallas" if _compat.on_hopper() else "xla"
  if implementation == "auto":
    implementation = "pallas"
  if 0 in (*x.shape, w.shape[1]):
    implementation = "xla"
  lead = x.shape[:-1]
  loss = _loss(x.reshape(-1, x.shape[-1]), w, labels.reshape(-1), bias, implementation, config)
  return loss.reshape(lead)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _loss(x, w, labels, bias, implementation, config):
  return _forward(x, w, labels, bias, implementation, config)[0]


def _forward(x, w, labels, bias, implementation, config):
  logits, lse = logits_and_lse(x, w, bias, implementation, config)
  picked = jnp.take_along_axis(logits, labels[:, None].astype(jnp.int32), axis=1)[:, 0]
  return lse - picked.astype(jnp.float32), (x, w, labels, bias, logits, lse)


def logits_and_lse(x, w, bias, implementation, config=None):
  """(logits (M, N) in x's dtype, f32 (M,) log-sum-exp of each row of them): the head's
  GEMM with `row_lse` in the kernel, or XLA's dot and `logsumexp`."""
  problem, _ = gemm_lib.gemm_problem(x, w, False, False, bias, None, 0.0, None)
  if implementation == "xla":
    return gemm_lib.xla_gemm(x, w, problem, epilogue_lib.EpilogueSpec(), bias, None, row_lse=True)
  return gemm_lib.plain_kernel_gemm(
      x, w, problem, bias=bias, config=config, interpret=implementation == "interpret", row_lse=True
  )


def _loss_fwd(x, w, labels, bias, implementation, config):
  return _forward(x, w, labels, bias, implementation, config)


def _loss_bwd(implementation, config, residuals, g):
  del config  # the backward's GEMMs take their own defaults
  x, w, labels, bias, logits, lse = residuals
  columns = lax.broadcasted_iota(jnp.int32, logits.shape, 1)
  onehot = columns == labels[:, None].astype(jnp.int32)
  probs = jnp.exp(logits.astype(jnp.float32) - lse[:, None])
  dlogits = ((probs - onehot) * g[:, None]).astype(x.dtype)
  dx = gemm_lib.gemm(dlogits, w, transpose_b=True, implementation=implementation)
  dw = gemm_lib.gemm(x, dlogits, transpose_a=True, implementation=implementation)
  dbias = None
  if bias is not None:
    dbias = jnp.sum(dlogits.astype(jnp.float32), axis=0).astype(bias.dtype)
  return dx, dw, None, dbias


_loss.defvjp(_loss_fwd, _loss_bwd)
