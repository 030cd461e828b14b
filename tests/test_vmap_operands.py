"""`vmap` over every combination of batched operands (issue 20: only `c` or only
`residual` batched used to raise a shape error on a valid program)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_gemm

from interpret_support import hang_guard  # noqa: F401 (autouse: a hang fails the test)

NAMES = ("a", "b", "bias", "c", "residual")
SIZE = 3


def _operands(key):
  ka, kb, kbias, kc, kr = jax.random.split(key, 5)
  shapes = dict(a=(8, 16), b=(16, 24), bias=(24,), c=(8, 24), residual=(8, 24))
  keys = dict(a=ka, b=kb, bias=kbias, c=kc, residual=kr)
  return {n: jax.random.normal(keys[n], (SIZE, *shapes[n]), jnp.float32) for n in NAMES}


def _gemm(implementation):
  def f(a, b, bias, c, residual):
    return pallas_gemm.matmul(
        a,
        b,
        bias=bias,
        c=c,
        beta=0.5,
        residual=residual,
        activation="relu",
        implementation=implementation,
    )

  return f


@pytest.mark.parametrize(
    "batched",
    [combo for r in range(1, len(NAMES) + 1) for combo in itertools.combinations(NAMES, r)],
)
def test_vmap_matches_a_loop(batched):
  ops = _operands(jax.random.key(len(batched)))
  args = [ops[n] if n in batched else ops[n][0] for n in NAMES]
  axes = [0 if n in batched else None for n in NAMES]
  f = _gemm("xla")
  got = jax.vmap(f, in_axes=axes)(*args)
  want = jnp.stack([f(*[x[i] if ax == 0 else x for x, ax in zip(args, axes)]) for i in range(SIZE)])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batched", [("c",), ("residual",), ("a", "residual")])
def test_vmap_of_the_kernel_in_interpret_mode(batched):
  # bf16 operands: f32 ones would be made K-major (a transposed B), which jax 0.10.2's
  # interpreter cannot run.
  ops = {n: x.astype(jnp.bfloat16) for n, x in _operands(jax.random.key(7)).items()}
  args = [ops[n] if n in batched else ops[n][0] for n in NAMES]
  axes = [0 if n in batched else None for n in NAMES]
  got = jax.vmap(_gemm("interpret"), in_axes=axes)(*args).astype(jnp.float32)
  want = jax.vmap(_gemm("xla"), in_axes=axes)(*args).astype(jnp.float32)
  np.testing.assert_allclose(got, want, rtol=2e-2, atol=5e-2)  # bf16 outputs
