"""Activations as users bring them from jax.nn and Flax (issue 20): "gelu" is the tanh
form (as `jax.nn.gelu`), the jax.nn / flax.nnx functions the epilogue implements are
accepted everywhere an activation is taken, anything else is refused naming the argument,
by a Flax layer at construction."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_gemm
from pallas_gemm import epilogue

FORMS = [
    ("gelu", "gelu_tanh"),
    (jax.nn.gelu, "gelu_tanh"),
    (functools.partial(jax.nn.gelu, approximate=True), "gelu_tanh"),
    (functools.partial(jax.nn.gelu, approximate=False), "gelu_exact"),
    (jax.nn.relu, "relu"),
    (jax.nn.silu, "silu"),
    (jax.nn.swish, "silu"),
    ("swish", "silu"),
    (jax.nn.sigmoid, "sigmoid"),
    ("sigmoid", "sigmoid"),
    (None, None),
]


@pytest.mark.parametrize("given, name", FORMS)
def test_every_form_names_one_epilogue_activation(given, name):
  assert epilogue.activation_name(given) == name


@pytest.mark.parametrize(
    "bad", ["tanh", jax.nn.tanh, functools.partial(jax.nn.gelu, 1.0), lambda x: x, 3]
)
def test_others_are_refused_naming_the_argument(bad):
  with pytest.raises(ValueError, match="^activation must be None"):
    epilogue.activation_name(bad)


@pytest.mark.parametrize("given, name", [f for f in FORMS if f[0] is not None])
def test_matmul_applies_what_jax_nn_would(given, name):
  k1, k2 = jax.random.split(jax.random.key(0))
  a = jax.random.normal(k1, (16, 32), jnp.float32)
  b = jax.random.normal(k2, (32, 8), jnp.float32)
  reference = {
      "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
      "gelu_exact": functools.partial(jax.nn.gelu, approximate=False),
      "relu": jax.nn.relu,
      "silu": jax.nn.silu,
      "sigmoid": jax.nn.sigmoid,
  }[name]
  y = pallas_gemm.matmul(a, b, activation=given, implementation="xla")
  np.testing.assert_allclose(y, reference(a @ b), rtol=2e-5, atol=2e-5)


def test_flax_layers_check_at_construction():
  nnx = pytest.importorskip("flax.nnx")
  rngs = nnx.Rngs(0)
  layer = pallas_gemm.flax.Linear(4, 8, activation=nnx.gelu, rngs=rngs)
  assert layer.activation == "gelu_tanh"
  with pytest.raises(ValueError, match="^activation must be None"):
    pallas_gemm.flax.Linear(4, 8, activation=nnx.tanh, rngs=rngs)
  with pytest.raises(ValueError, match="^activation must be None"):
    pallas_gemm.flax.Fp8Linear(4, 8, activation="tanh", rngs=rngs)


# -- other inputs that were accepted and should not be (issue 20) -----------------
A = jnp.ones((8, 16), jnp.float32)
B = jnp.ones((16, 4), jnp.float32)


@pytest.mark.parametrize("flag", ["transpose_a", "transpose_b"])
def test_transpose_flags_must_be_bools(flag):
  with pytest.raises(TypeError, match=f"^{flag} must be a bool, got 'False'"):
    pallas_gemm.matmul(A, B, implementation="xla", **{flag: "False"})
  assert pallas_gemm.matmul(A, B, implementation="xla", **{flag: np.False_}).shape == (8, 4)


@pytest.mark.parametrize(
    "name, value", [("bias", jnp.ones((4,), jnp.complex64)), ("c", jnp.ones((8, 4), jnp.complex64))]
)
def test_complex_addends_are_refused(name, value):
  with pytest.raises(TypeError, match=f"^{name} must be real"):
    pallas_gemm.matmul(A, B, implementation="xla", beta=1.0, **{name: value})


def test_nan_clamp_bounds_are_refused():
  with pytest.raises(ValueError, match="clamp bounds must not be NaN"):
    pallas_gemm.matmul(A, B, clamp=(float("nan"), 1.0), implementation="xla")
