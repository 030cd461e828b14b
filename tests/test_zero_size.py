"""Zero-size extents (issue 20): M, N or K = 0, or an empty batch, give what lax gives, on
every implementation: an empty array, or the epilogue applied to zeros when K = 0, and
gradients of the same shapes and values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_gemm
from pallas_gemm import _compat

from interpret_support import hang_guard  # noqa: F401 (autouse: a hang fails the test)

CASES = [((), 0, 4, 3), ((), 2, 0, 3), ((), 2, 4, 0), ((0,), 2, 4, 3), ((3,), 0, 4, 3)]


def _reference(a, b, bias):
  return jax.nn.gelu(jnp.matmul(a, b) + bias, approximate=True)


@pytest.mark.parametrize("implementation", ["xla", "interpret"])
@pytest.mark.parametrize("batch, m, k, n", CASES)
def test_empty_extents_match_lax(implementation, batch, m, k, n):
  if implementation == "interpret" and not _compat.INTERPRET_SUPPORTS_TRANSPOSED_OPERANDS:
    pytest.skip("jax 0.10.2's GPU interpreter cannot run the backward's transposed operands")
  key_a, key_b, key_c = jax.random.split(jax.random.key(m * 100 + k * 10 + n), 3)
  a = jax.random.normal(key_a, (*batch, m, k), jnp.float32)
  b = jax.random.normal(key_b, (*batch, k, n), jnp.float32)
  bias = jax.random.normal(key_c, (n,), jnp.float32)
  ours = lambda a, b, bias: pallas_gemm.matmul(
      a, b, bias=bias, activation="gelu_tanh", implementation=implementation
  )
  reference = jax.jit(_reference)  # lax's answer, one compile (ours runs as called)
  np.testing.assert_allclose(ours(a, b, bias), reference(a, b, bias), rtol=1e-6, atol=1e-6)
  loss = lambda f: lambda a, b, bias: jnp.sum(f(a, b, bias) ** 2)
  got = jax.grad(loss(ours), argnums=(0, 1, 2))(a, b, bias)
  want = jax.jit(jax.grad(loss(_reference), argnums=(0, 1, 2)))(a, b, bias)
  for g, w in zip(got, want):
    assert g.shape == w.shape
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("implementation", ["xla", "interpret"])
@pytest.mark.parametrize("m, n, k", [(0, 16, 32), (8, 0, 32), (8, 16, 0)])
@pytest.mark.parametrize("return_amax", [False, True])
def test_scaled_matmul_empty_extents(implementation, m, n, k, return_amax):
  """fp8: an empty product is what the XLA path gives (zeros through the epilogue when
  K = 0), and its amax is 0 (nothing to scale), not a reduction error."""
  a = jnp.ones((m, k), jnp.float8_e4m3fn)
  b = jnp.ones((n, k), jnp.float8_e4m3fn)
  bias = jnp.arange(n, dtype=jnp.float32)
  out = pallas_gemm.scaled_matmul(
      a,
      b,
      2.0,
      3.0,
      out_dtype=jnp.bfloat16,
      bias=bias,
      activation="relu",
      return_amax=return_amax,
      implementation=implementation,
  )
  y, amax = out if return_amax else (out, None)
  assert y.shape == (m, n) and y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(
      np.asarray(y, np.float32), np.broadcast_to(np.asarray(bias), (m, n))
  )
  if return_amax:
    assert float(amax) == (float(bias.max()) if m and n else 0.0)
