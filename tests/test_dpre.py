"""The fused backward pass (`pallas_gemm.dpre`): numerics in GPU interpret mode against
float64, the activation derivatives against autodiff, shape rules, CUDA lowering."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_gemm import _compat, dpre, epilogue

from interpret_support import hang_guard  # noqa: F401 (autouse)


def test_docstring_examples():
  assert doctest.testmod(dpre).failed == 0
  assert doctest.testmod(epilogue).failed == 0


@pytest.mark.parametrize("name", sorted(epilogue.ACTIVATIONS))
def test_slopes_are_the_activation_derivatives(name):
  x = jnp.linspace(-6.0, 6.0, 1001, dtype=jnp.float32)
  autodiff = jax.vmap(jax.grad(epilogue.ACTIVATIONS[name]))(x)
  np.testing.assert_allclose(epilogue.ACTIVATION_SLOPES[name](x), autodiff, rtol=0, atol=3e-6)


@pytest.mark.parametrize(
    "rows, cols, name",
    [(200, 256, "gelu_tanh"), (64, 128, "relu"), (328, 384, "silu"), (136, 128, "gelu_exact")],
)
def test_interpret_matches_float64(rows, cols, name):
  rng = np.random.default_rng(rows + cols)
  pre = jnp.asarray(rng.standard_normal((rows, cols)), jnp.bfloat16)
  g = jnp.asarray(rng.standard_normal((rows, cols)), jnp.bfloat16)
  d, sums = dpre.dpre_and_column_sums(
      pre,
      g,
      slope=epilogue.ACTIVATION_SLOPES[name],
      num_sms=dpre.INTERPRET_SMS,
      interpret=_compat.interpret_params(zero_fill=False),
  )
  x = np.asarray(pre, np.float64)
  ref = np.asarray(g, np.float64) * np.asarray(
      jax.vmap(jax.grad(epilogue.ACTIVATIONS[name]))(jnp.asarray(x.ravel(), jnp.float32)),
      np.float64,
  ).reshape(x.shape)
  assert sums.shape == (-(-rows // dpre.BLOCK_M), cols)
  d = np.asarray(d, np.float64)
  assert not np.isnan(d).any() and not np.isnan(np.asarray(sums)).any()
  assert np.linalg.norm(d - ref) / np.linalg.norm(ref) < 4e-3  # bf16 rounding of d
  db = np.asarray(sums, np.float64).sum(0)
  assert np.linalg.norm(db - ref.sum(0)) / np.linalg.norm(ref.sum(0)) < 1e-5


@pytest.mark.parametrize(
    "shape, dtype, ok",
    [
        ((256, 256), jnp.bfloat16, True),
        ((256, 256), jnp.float16, True),
        ((256, 200), jnp.bfloat16, False),
        ((252, 256), jnp.bfloat16, False),
        ((32, 256), jnp.bfloat16, False),
        ((256, 256), jnp.float32, False),
    ],
)
def test_supported_shapes(shape, dtype, ok):
  assert dpre.supported(shape, dtype) == ok


def test_unsupported_input_names_the_rule():
  x = jnp.ones((256, 200), jnp.bfloat16)
  with pytest.raises(ValueError, match="N a multiple of 128"):
    dpre.dpre_and_column_sums(x, x, slope=epilogue.ACTIVATION_SLOPES["relu"])
