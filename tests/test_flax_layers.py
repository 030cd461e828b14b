"""Flax drop-ins: `dot_general` injection into Flax's layers, and `pallas_gemm.flax`'s
fused layers against Flax's own (same parameters, same outputs and gradients)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

flax = pytest.importorskip("flax")
from flax import linen, nnx  # noqa: E402

from pallas_gemm import _compat  # noqa: E402
from pallas_gemm import flax as pflax  # noqa: E402
from pallas_gemm.dot import dot_general  # noqa: E402
from tests.interpret_support import hang_guard  # noqa: E402,F401

ACTIVATIONS = {
    None: lambda y: y,
    "relu": jax.nn.relu,
    "gelu_tanh": lambda y: jax.nn.gelu(y, approximate=True),
    "gelu_exact": lambda y: jax.nn.gelu(y, approximate=False),
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
}
TOLERANCE = {jnp.bfloat16: 1.5e-2, jnp.float32: 1e-5}


def _x(shape=(2, 6, 32), seed=0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _rel_err(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return np.linalg.norm(x - ref) / np.linalg.norm(ref)


def _assert_close(tree, ref, tol):
  leaves, ref_leaves = jax.tree.leaves(tree), jax.tree.leaves(ref)
  assert jax.tree.structure(tree) == jax.tree.structure(ref)
  for x, r in zip(leaves, ref_leaves):
    assert x.shape == r.shape and x.dtype == r.dtype
    assert _rel_err(x, r) < tol


def _nnx_loss(model, x):
  return jnp.mean(model(x).astype(jnp.float32) ** 2)


@nnx.jit
def _nnx_value_and_grad(model, x):
  return nnx.value_and_grad(_nnx_loss)(model, x)


# -- injection into Flax's own layers -----------------------------------------------------
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_nnx_linear_takes_dot_general(dtype):
  ours = nnx.Linear(32, 16, dtype=dtype, dot_general=dot_general, rngs=nnx.Rngs(0))
  ref = nnx.Linear(32, 16, dtype=dtype, rngs=nnx.Rngs(0))
  x = _x()
  _assert_close(ours(x), ref(x), TOLERANCE[dtype])
  _assert_close(_nnx_value_and_grad(ours, x), _nnx_value_and_grad(ref, x), TOLERANCE[dtype])


def test_nnx_linear_with_preferred_element_type():
  kw = dict(dtype=jnp.bfloat16, preferred_element_type=jnp.float32)
  ours = nnx.Linear(32, 16, dot_general=dot_general, rngs=nnx.Rngs(0), **kw)
  ref = nnx.Linear(32, 16, rngs=nnx.Rngs(0), **kw)
  x = _x()
  assert ours(x).dtype == ref(x).dtype == jnp.float32
  _assert_close(ours(x), ref(x), 1e-6)


def test_linen_dense_takes_dot_general():
  ours = linen.Dense(16, dtype=jnp.bfloat16, dot_general=dot_general)
  ref = linen.Dense(16, dtype=jnp.bfloat16)
  x = _x()
  params = ref.init(jax.random.key(0), x)
  loss = lambda model: lambda p: jnp.mean(model.apply(p, x).astype(jnp.float32) ** 2)
  _assert_close(ours.apply(params, x), ref.apply(params, x), 1.5e-2)
  _assert_close(jax.grad(loss(ours))(params), jax.grad(loss(ref))(params), 1.5e-2)


# -- pallas_gemm.flax.Linear (nnx) ---------------------------------------------------------
@pytest.mark.parametrize("use_bias", [True, False])
def test_linear_has_nnx_linears_parameters(use_bias):
  ours = pflax.Linear(32, 16, use_bias=use_bias, activation="gelu_tanh", rngs=nnx.Rngs(3))
  ref = nnx.Linear(32, 16, use_bias=use_bias, rngs=nnx.Rngs(3))
  ours_state, ref_state = nnx.state(ours, nnx.Param), nnx.state(ref, nnx.Param)
  assert jax.tree.structure(ours_state) == jax.tree.structure(ref_state)
  for x, r in zip(jax.tree.leaves(ours_state), jax.tree.leaves(ref_state)):
    np.testing.assert_array_equal(x, r)
  # checkpoints interchange: Flax's parameters load into ours and back
  other = nnx.Linear(32, 16, use_bias=use_bias, rngs=nnx.Rngs(4))
  nnx.update(ours, nnx.state(other, nnx.Param))
  nnx.update(ref, nnx.state(ours, nnx.Param))
  np.testing.assert_array_equal(ref.kernel[...], other.kernel[...])


@pytest.mark.parametrize(
    "dtype,activation",
    [
        *((jnp.bfloat16, act) for act in ACTIVATIONS),
        (jnp.float32, None),
        (jnp.float32, "gelu_exact"),
    ],
)
def test_linear_matches_nnx_linear_then_activation(dtype, activation):
  ours = pflax.Linear(32, 16, activation=activation, dtype=dtype, rngs=nnx.Rngs(1))
  ref = nnx.Linear(32, 16, dtype=dtype, rngs=nnx.Rngs(1))
  act = ACTIVATIONS[activation]
  ref_fused = lambda model, x: act(model(x).astype(jnp.float32)).astype(dtype)
  ref_loss = lambda model, x: jnp.mean(ref_fused(model, x).astype(jnp.float32) ** 2)

  @nnx.jit
  def both(ours, ref, x):
    return (
        (ours(x), nnx.value_and_grad(_nnx_loss)(ours, x)),
        (ref_fused(ref, x), nnx.value_and_grad(ref_loss)(ref, x)),
    )

  ours_results, ref_results = both(ours, ref, _x())
  _assert_close(ours_results, ref_results, TOLERANCE[dtype])


def test_linear_under_nnx_transforms():
  ours = pflax.Linear(32, 16, activation="silu", dtype=jnp.bfloat16, rngs=nnx.Rngs(2))
  ref = nnx.Linear(32, 16, dtype=jnp.bfloat16, rngs=nnx.Rngs(2))
  ref_loss = lambda model, x: jnp.mean(jax.nn.silu(model(x).astype(jnp.float32)) ** 2)
  xs = _x((3, 4, 32))
  # jit + grad, remat, and vmap over examples with shared parameters
  _assert_close(
      nnx.jit(_nnx_value_and_grad)(ours, xs[0]), nnx.value_and_grad(ref_loss)(ref, xs[0]), 1.5e-2
  )
  _assert_close(nnx.grad(nnx.remat(_nnx_loss))(ours, xs[0]), nnx.grad(ref_loss)(ref, xs[0]), 1.5e-2)
  per_example = nnx.vmap(lambda model, x: model(x), in_axes=(None, 0))(ours, xs)
  _assert_close(per_example, jax.nn.silu(ref(xs).astype(jnp.float32)).astype(jnp.bfloat16), 1.5e-2)


def test_linear_on_one_input_vector():
  layer = pflax.Linear(32, 16, activation="relu", dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  assert layer(_x((32,))).shape == (16,)


@pytest.mark.skipif(
    not _compat.INTERPRET_SUPPORTS_TRANSPOSED_OPERANDS,
    reason="the backward GEMMs are transposed problems, which the GPU "
    f"interpreter of jax {jax.__version__} cannot run",
)
@pytest.mark.slow
def test_linear_trains_through_the_kernel_in_interpret_mode():
  ours = pflax.Linear(
      32,
      16,
      activation="gelu_exact",
      dtype=jnp.bfloat16,
      implementation="interpret",
      rngs=nnx.Rngs(5),
  )
  ref = nnx.Linear(32, 16, dtype=jnp.bfloat16, rngs=nnx.Rngs(5))
  ref_loss = lambda m, x: jnp.mean(jax.nn.gelu(m(x).astype(jnp.float32), approximate=False) ** 2)
  x = _x((2, 8, 32))
  _assert_close(_nnx_value_and_grad(ours, x), nnx.value_and_grad(ref_loss)(ref, x), 1.5e-2)


# -- pallas_gemm.flax.Dense (linen) --------------------------------------------------------
@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
def test_dense_matches_linen_dense(activation):
  ours = pflax.Dense(16, activation=activation, dtype=jnp.bfloat16)
  ref = linen.Dense(16, dtype=jnp.bfloat16)
  x = _x()
  params = ours.init(jax.random.key(7), x)
  ref_params = ref.init(jax.random.key(7), x)
  assert jax.tree.structure(params) == jax.tree.structure(ref_params)
  for p, r in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
    np.testing.assert_array_equal(p, r)
  act = ACTIVATIONS[activation]
  ref_apply = lambda p: act(ref.apply(p, x).astype(jnp.float32)).astype(jnp.bfloat16)
  _assert_close(ours.apply(params, x), ref_apply(params), 1.5e-2)
  loss = lambda f: lambda p: jnp.mean(f(p).astype(jnp.float32) ** 2)
  _assert_close(
      jax.grad(loss(lambda p: ours.apply(p, x)))(params), jax.grad(loss(ref_apply))(params), 1.5e-2
  )


def test_example_trains_an_mlp(capsys):
  import importlib.util  # noqa: PLC0415
  import pathlib  # noqa: PLC0415

  path = pathlib.Path(__file__).parents[1] / "examples" / "train_mlp.py"
  spec = importlib.util.spec_from_file_location("train_mlp", path)
  example = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(example)
  assert (
      example.main(
          [
              "--steps",
              "40",
              "--batch",
              "64",
              "--sizes",
              "32,64,16",
              "--implementation",
              "xla",
              "--log-every",
              "20",
          ]
      )
      == 0
  )
  assert "loss went down for both: True" in capsys.readouterr().out


@pytest.mark.parametrize(
    "implementation",
    [
        "xla",
        pytest.param(
            "interpret",
            marks=[
                pytest.mark.slow,
                pytest.mark.skipif(
                    not _compat.INTERPRET_SUPPORTS_TRANSPOSED_OPERANDS,
                    reason="the backward's GEMMs read transposed operands",
                ),
            ],
        ),
    ],
)
def test_gated_mlp_matches_three_flax_linears(implementation):
  """`GatedMLP` against `down(silu(gate(x)) * up(x)) + x` of three `nnx.Linear`s with
  the same parameters: outputs and gradients; parameter names as in Llama ports."""
  kw = dict(use_bias=False, dtype=jnp.bfloat16, param_dtype=jnp.float32)
  ours = pflax.GatedMLP(32, 72, implementation=implementation, rngs=nnx.Rngs(3), **kw)
  ref = {
      name: nnx.Linear(*getattr(ours, name).kernel.shape, rngs=nnx.Rngs(0), **kw)
      for name in ("gate_proj", "up_proj", "down_proj")
  }
  for name, layer in ref.items():
    layer.kernel[...] = getattr(ours, name).kernel[...]
  names = {path for path, _ in jax.tree_util.tree_flatten_with_path(nnx.state(ours, nnx.Param))[0]}
  assert {tuple(str(getattr(k, "key", k)) for k in path[:2]) for path in names} == {
      (name, "kernel") for name in ("gate_proj", "up_proj", "down_proj")
  }
  x = _x((2, 36, 32)).astype(jnp.bfloat16)

  def ours_loss(model, x):
    return model(x, residual=x).astype(jnp.float32).sum()

  def ref_loss(layers, x):
    h = jax.nn.silu(layers["gate_proj"](x)) * layers["up_proj"](x)
    return (layers["down_proj"](h) + x).astype(jnp.float32).sum()

  y = ours(x, residual=x)
  y_ref = ref["down_proj"](jax.nn.silu(ref["gate_proj"](x)) * ref["up_proj"](x)) + x
  assert y.dtype == jnp.bfloat16 and _rel_err(y, y_ref) < 2e-2
  grads = nnx.grad(ours_loss)(ours, x)
  grads_ref = nnx.grad(ref_loss)(ref, x)
  for name in ref:
    got, want = getattr(grads, name).kernel[...], grads_ref[name].kernel[...]
    assert got.shape == want.shape and _rel_err(got, want) < 3e-2, name


def test_gated_mlp_rejects_an_activation_the_epilogue_lacks():
  with pytest.raises(ValueError, match="activation must be None, one of"):
    pflax.GatedMLP(8, 16, activation=jnp.tanh, rngs=nnx.Rngs(0))


def test_linen_dense_checks_its_activation_at_construction():
  with pytest.raises(ValueError, match="activation must be None, one of"):
    pflax.Dense(4, activation="tanh")
  layer = pflax.Dense(4, activation=jax.nn.gelu, dtype=jnp.bfloat16)
  assert layer.init(jax.random.key(0), jnp.ones((2, 8)))["params"]["kernel"].shape == (8, 4)


@pytest.mark.slow
def test_blockwise_fp8_linear_layer_tracks_nnx_linear():
  kw = dict(dtype=jnp.bfloat16, param_dtype=jnp.float32)
  ours = pflax.BlockwiseFp8Linear(256, 136, implementation="xla", rngs=nnx.Rngs(0), **kw)
  ref = nnx.Linear(256, 136, rngs=nnx.Rngs(0), **kw)
  x = _x((2, 70, 256))
  y, y_ref = ours(x), ref(x)
  assert y.dtype == jnp.bfloat16 and 1e-3 < _rel_err(y, y_ref) < 6e-2
  loss = lambda m, x: m(x).astype(jnp.float32).sum()
  g, g_ref = nnx.grad(loss)(ours, x), nnx.grad(loss)(ref, x)
  assert _rel_err(g.kernel[...], g_ref.kernel[...]) < 6e-2
  with pytest.raises(TypeError, match="fp8_dtype must be"):
    pflax.BlockwiseFp8Linear(8, 8, fp8_dtype=jnp.int8, rngs=nnx.Rngs(0))


def test_linear_split_and_cross_entropy_match_the_layer_output():
  # `Linear.split` (an attention's q, k, v) and `Linear.cross_entropy` (an LM head's loss)
  # are the layer's own output, split, or fed to optax's loss.
  optax = pytest.importorskip("optax")
  layer = pflax.Linear(32, 96, dtype=jnp.bfloat16, implementation="xla", rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (2, 5, 32), jnp.bfloat16)
  whole = layer(x)
  for got, want in zip(layer.split(x, (64, 16, 16)), jnp.split(whole, [64, 80], axis=-1)):
    np.testing.assert_array_equal(got, want)
  labels = jax.random.randint(jax.random.key(2), (2, 5), 0, 96)
  want = optax.softmax_cross_entropy_with_integer_labels(whole.astype(jnp.float32), labels)
  np.testing.assert_allclose(layer.cross_entropy(x, labels), want, rtol=1e-5, atol=1e-5)
  gelu = pflax.Linear(32, 96, activation="gelu", implementation="xla", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="activation must be None"):
    gelu.split(x, (48, 48))
  with pytest.raises(ValueError, match="activation must be None"):
    gelu.cross_entropy(x, labels)
