"""A projection whose output is several arrays side by side (an attention's q, k and v),
stored apart by the kernel.

    q, k, v = matmul_split(x, w_qkv, (2048, 512, 512))  # jnp.split(x @ w_qkv, ...) without
                                                        # the split's copies

`jnp.split` of a GEMM's output along its minor dim makes XLA copy each piece (a slice of
the minor dim is not an array of its own): 0.77 ms a step of the GPT model's 16k tokens
(NOTES exps. 132, 137). Here the kernel's epilogue stores each output chunk into the
array that holds its columns (`GemmProblem.out_splits`), where every width is a whole
number of the config's epilogue chunks (64 or 32 columns); elsewhere the output is split
in XLA as before. The backward's two GEMMs read the pieces' cotangents where they are
(dX's A and dW's B in pieces, `GemmProblem.a_splits` / `b_splits`), so dq, dk and dv are
not concatenated either.

>>> import jax.numpy as jnp
>>> x = jnp.ones((4, 8), jnp.bfloat16); w = jnp.ones((8, 6), jnp.bfloat16)
>>> [p.shape for p in matmul_split(x, w, (2, 4), implementation="xla")]
[(4, 2), (4, 4)]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import gemm as gemm_lib
from pallas_gemm import route
from pallas_gemm.config import GemmConfig


def matmul_split(
    x, w, sizes, *, bias=None, implementation: str | None = None, config: GemmConfig | None = None
):
  """`jnp.split(x @ w + bias, cumsum(sizes)[:-1], -1)`, each piece stored apart.

  Args:
    x: (..., K) bf16 or f16.
    w: (K, N) of x's dtype.
    sizes: positive ints summing to N, the pieces' widths.
    bias: (N,) or None, added in f32.
    implementation: as `pallas_gemm.matmul` (None: the kernel on a Hopper GPU where
      `route` takes it, XLA elsewhere).
    config: the forward GEMM's `GemmConfig`, or None (the default's).
  Returns:
    a tuple of (..., size) arrays of x's dtype; differentiable in x, w and bias.
  """
  x, w = jnp.asarray(x), jnp.asarray(w)
  if x.dtype.name not in ("bfloat16", "float16") or w.dtype != x.dtype:
    raise TypeError(f"x and w must share bf16 or f16; got {x.dtype} and {w.dtype}")
  gemm_lib.check_projection(x, w, bias, implementation, config)
  sizes = tuple(sizes)
  if not sizes or any(not isinstance(s, int) or s <= 0 for s in sizes) or sum(sizes) != w.shape[1]:
    raise ValueError(f"sizes must be positive ints summing to N={w.shape[1]}, got {sizes}")
  lead = x.shape[:-1]
  x2 = x.reshape(-1, x.shape[-1])
  problem, _ = gemm_lib.gemm_problem(x2, w, False, False, bias, None, 0.0, None)
  if implementation in (None, "auto"):
    on_gpu = _compat.on_hopper() and 0 not in (problem.m, problem.n, problem.k)
    implementation = route.choose(problem)[0] if on_gpu else "xla"
  pieces = _split(x2, w, bias, sizes, implementation, config)
  return tuple(p.reshape(*lead, p.shape[-1]) for p in pieces)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _split(x, w, bias, sizes, implementation, config):
  if implementation == "xla":
    y = gemm_lib.gemm(x, w, bias=bias, implementation="xla")
    starts = [sum(sizes[:i]) for i in range(1, len(sizes))]
    return tuple(jnp.split(y, starts, axis=-1))
  problem, _ = gemm_lib.gemm_problem(x, w, False, False, bias, None, 0.0, None)
  interpret = implementation == "interpret"
  return gemm_lib.plain_kernel_gemm(
      x, w, problem, bias=bias, config=config, interpret=interpret, out_splits=sizes
  )


def _split_fwd(x, w, bias, sizes, implementation, config):
  return _split(x, w, bias, sizes, implementation, config), (x, w, bias)


def _split_bwd(sizes, implementation, config, saved, grads):
  del config  # the backward's GEMMs take their own defaults
  x, w, bias = saved
  pieces = tuple(gi.astype(x.dtype) for gi in grads)
  if implementation == "xla":
    g = jnp.concatenate(pieces, axis=-1)
    dx = gemm_lib.gemm(g, w, transpose_b=True, implementation="xla")
    dw = gemm_lib.gemm(x, g, transpose_a=True, implementation="xla")
  else:  # the kernels read the pieces where they are (no concatenation where they can)
    g = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), x.dtype)
    interpret = implementation == "interpret"
    problem, _ = gemm_lib.gemm_problem(g, w, False, True, None, None, 0.0, None)
    dx = gemm_lib.plain_kernel_gemm(pieces, w, problem, interpret=interpret)
    problem, _ = gemm_lib.gemm_problem(x, g, True, False, None, None, 0.0, None)
    dw = gemm_lib.plain_kernel_gemm(x, pieces, problem, interpret=interpret)
  dbias = None
  if bias is not None:
    dbias = jnp.concatenate([jnp.sum(p.astype(jnp.float32), axis=0) for p in pieces]).astype(
        bias.dtype
    )
  return dx, dw.astype(w.dtype), dbias


_split.defvjp(_split_fwd, _split_bwd)
