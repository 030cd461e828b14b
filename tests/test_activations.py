"""Activations as users bring them from jax.nn and Flax (issue 20): "gelu" is the tanh
form (as `jax.nn.gelu`), the jax.nn / flax.nnx functions the epilogue implements are
accepted everywhere an activation is taken; the dense GEMM (`matmul`, `flax.Linear`,
the collective GEMMs) also takes any other elementwise function, traced into the
kernel's epilogue and differentiated by jax (issue 19); anything else is refused naming
the argument, by a Flax layer at construction."""

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
  assert pallas_gemm.flax.Linear(4, 8, activation=nnx.tanh, rngs=rngs).activation.name == "tanh"
  with pytest.raises(ValueError, match="^activation must be None"):
    pallas_gemm.flax.Linear(4, 8, activation="tanh", rngs=rngs)
  with pytest.raises(ValueError, match="^activation must be None"):
    pallas_gemm.flax.Fp8Linear(4, 8, activation="tanh", rngs=rngs)
  with pytest.raises(ValueError, match="^activation must be None"):  # its fused backward
    pallas_gemm.flax.MLP(4, 8, activation=nnx.tanh, rngs=rngs)  # needs a closed-form slope


# -- custom activations (issue 19) ---------------------------------------------------
def squared_relu(x):  # Primer's activation
  return jnp.square(jnp.maximum(x, 0.0))


def softcap(x):  # Gemma-style logit soft-capping
  return 30.0 * jnp.tanh(x / 30.0)


CUSTOM = [squared_relu, softcap, jax.nn.tanh]


@pytest.mark.parametrize("fn", CUSTOM, ids=lambda f: f.__name__)
def test_matmul_takes_a_custom_activation_and_its_gradient(fn):
  rng = np.random.default_rng(3)
  a, b, bias = rng.standard_normal((24, 40)), rng.standard_normal((40, 20)), rng.standard_normal(20)
  f = lambda a, b, bias: pallas_gemm.matmul(a, b, bias=bias, activation=fn, implementation="xla")
  loss = lambda f: lambda *v: jnp.sum(f(*v) ** 2)
  args32 = [jnp.asarray(v, jnp.float32) for v in (a, b, bias)]
  y, grads = f(*args32), jax.grad(loss(f), (0, 1, 2))(*args32)
  with jax.enable_x64(True):
    ref = lambda a, b, bias: fn(a @ b + bias)
    y_ref, grads_ref = ref(a, b, bias), jax.grad(loss(ref), (0, 1, 2))(a, b, bias)
  rel = lambda x, r: np.linalg.norm(np.asarray(x, np.float64) - r) / np.linalg.norm(r)
  assert rel(y, y_ref) < 1e-5
  for g, r in zip(grads, grads_ref):
    assert rel(g, r) < 1e-4


@pytest.mark.parametrize(
    "fn, rule",
    [
        (lambda x: jnp.sum(x), "keeps x's shape"),
        (lambda x: x.astype(jnp.bfloat16), "keeps x's shape and f32"),
        (lambda x, y: x + y, "calling it on one failed"),
    ],
    ids=["reduces", "casts", "two_arguments"],
)
def test_a_custom_activation_that_is_not_elementwise_is_named(fn, rule):
  with pytest.raises(ValueError, match=rf"^activation: .* must be .*{rule}"):
    pallas_gemm.matmul(jnp.ones((4, 8)), jnp.ones((8, 2)), activation=fn, implementation="xla")


def test_a_custom_activation_is_one_static_value_per_function():
  a, b = epilogue.activation_name(softcap, custom=True), epilogue.activation_name(
      softcap, custom=True
  )
  assert a == b and hash(a) == hash(b) and a.name == "softcap"
  assert epilogue.activation_name(a, custom=True) is a
  assert epilogue.tuning_activation(a) is None and epilogue.tuning_activation("relu") == "relu"
  with pytest.raises(ValueError, match="^activation must be None, .* an elementwise function"):
    epilogue.activation_name("tanh", custom=True)


@pytest.mark.parametrize("fn", CUSTOM, ids=lambda f: f.__name__)
def test_custom_activations_lower_into_the_kernel_forward_and_backward(fn):
  def loss(a, b, bias):
    y = pallas_gemm.matmul(a, b, bias=bias, activation=fn, implementation="pallas")
    return jnp.sum(y.astype(jnp.float32))

  sds = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((256, 128), (128, 256), (256,))]
  text = jax.export.export(jax.jit(jax.grad(loss, (0, 1, 2))), platforms=["cuda"])(
      *sds
  ).mlir_module()
  assert f"_NN_{fn.__name__}" in text  # the forward kernel, named after the function


def _tanh_gate(pre, gate):  # a user's epilogue of the accumulator and the residual tile
  return pre * jnp.tanh(gate)


TANH_GATE = epilogue.with_residual(_tanh_gate)


def _biased_gate(pre, col, gate, row):
  return pre * col + jnp.tanh(gate) * row


BIASED_GATE = epilogue.with_operands(_biased_gate, "bias", "residual", "row_bias")


def _capped_gate(pre, col, gate, row, cap):  # every kind: a soft cap's runtime scale too
  return cap * jnp.tanh(_biased_gate(pre, col, gate, row) / cap)


CAPPED_GATE = epilogue.with_operands(_capped_gate, "bias", "residual", "row_bias", "scalar")
USER_EPILOGUES = [TANH_GATE, BIASED_GATE, CAPPED_GATE]


@pytest.mark.parametrize("act", USER_EPILOGUES, ids=lambda a: a.name)
def test_a_user_epilogue_lowers_into_the_kernel_forward_and_backward(act):
  def loss(a, b, r, bias, row_bias, cap):
    y = pallas_gemm.matmul(
        a,
        b,
        residual=r,
        bias=bias,
        row_bias=row_bias,
        scalar=cap if "scalar" in act.operands else None,
        activation=act,
        implementation="pallas",
    )
    return jnp.sum(y.astype(jnp.float32))

  shapes = ((256, 128), (128, 256), (256, 256), (256,), (256,), ())
  dtypes = (jnp.bfloat16,) * 3 + (jnp.float32,) * 3
  sds = [jax.ShapeDtypeStruct(s, d) for s, d in zip(shapes, dtypes)]
  text = jax.export.export(jax.jit(jax.grad(loss, (0, 1, 2, 3, 4, 5))), platforms=["cuda"])(
      *sds
  ).mlir_module()
  assert f"_NN_{act.name}" in text  # the forward kernel, named after the function


SOFTCAP = epilogue.with_operands(lambda pre, cap: cap * jnp.tanh(pre / cap), "scalar")


@pytest.mark.parametrize(
    "implementation", ["xla", pytest.param("interpret", marks=pytest.mark.slow)]
)
def test_a_runtime_scalar_under_vmap_is_per_example(implementation):
  # Batched scalars leave the kernel a plain product and run the epilogue in XLA.
  rng = np.random.default_rng(21)
  a = jnp.asarray(rng.standard_normal((3, 200, 72)), jnp.bfloat16)
  b = jnp.asarray(rng.standard_normal((72, 136)), jnp.bfloat16)
  caps = jnp.asarray([1.5, 3.0, 6.0], jnp.float32)
  f = lambda a, cap: pallas_gemm.matmul(
      a, b, activation=SOFTCAP, scalar=cap, implementation=implementation
  )
  batched = jax.vmap(f)(a, caps)
  for i in range(3):
    np.testing.assert_allclose(
        np.asarray(batched[i], np.float32), np.asarray(f(a[i], caps[i]), np.float32), rtol=2e-2
    )
  shared = jax.vmap(f, in_axes=(0, None))(a, caps[1])  # one scalar: the kernel's own
  for i in range(3):
    np.testing.assert_allclose(
        np.asarray(shared[i], np.float32), np.asarray(f(a[i], caps[1]), np.float32), rtol=2e-2
    )


def test_a_runtime_scalar_is_checked():
  a, b = jnp.ones((4, 8)), jnp.ones((8, 2))
  with pytest.raises(ValueError, match="scalar is read only by a user's epilogue"):
    pallas_gemm.matmul(a, b, scalar=2.0, implementation="xla")
  with pytest.raises(ValueError, match=r"scalar must be a scalar \(shape \(\)\), got shape \(2,\)"):
    pallas_gemm.matmul(a, b, activation=SOFTCAP, scalar=jnp.ones(2), implementation="xla")
  with pytest.raises(TypeError, match="scalar must be real"):
    pallas_gemm.matmul(a, b, activation=SOFTCAP, scalar=1j, implementation="xla")
  with pytest.raises(ValueError, match=r"takes \['scalar'\]: it needs each of them given"):
    pallas_gemm.matmul(a, b, activation=SOFTCAP, implementation="xla")


def test_a_flax_layer_hands_a_learned_scalar_to_the_epilogue():
  from flax import nnx

  layer = pallas_gemm.flax.Linear(8, 4, activation=SOFTCAP, rngs=nnx.Rngs(0))
  cap = nnx.Param(jnp.float32(2.0))
  x = jax.random.normal(jax.random.key(1), (5, 8))
  y = layer(x, scalar=cap[...])
  np.testing.assert_allclose(
      y, 2.0 * jnp.tanh((x @ layer.kernel[...] + layer.bias[...]) / 2.0), rtol=1e-5
  )
  grad = jax.grad(lambda c: jnp.sum(layer(x, scalar=c)))(jnp.float32(2.0))
  assert np.isfinite(grad) and grad != 0


@pytest.mark.parametrize(
    "fn, operands, rule",
    [
        (jnp.tanh, ("residual",), r"of 2 f32 arrays \(pre, residual\); calling it so failed"),
        (lambda p, r: jnp.sum(p * r), ("residual",), "keeps their shape"),
        (_tanh_gate, ("bias", "bias"), "distinct names"),
        (_tanh_gate, ("scale",), "distinct names"),
        (_tanh_gate, (), "distinct names"),
    ],
    ids=["one_argument", "reduces", "repeated", "unknown", "none"],
)
def test_a_user_epilogue_that_breaks_a_rule_is_named(fn, operands, rule):
  with pytest.raises(ValueError, match=rf"^with_operands: .*{rule}"):
    epilogue.with_operands(fn, *operands)


def test_a_user_epilogue_needs_its_operands():
  a, b = jnp.ones((4, 8)), jnp.ones((8, 2))
  with pytest.raises(ValueError, match=r"takes \['residual'\]: it needs each of them given"):
    pallas_gemm.matmul(a, b, activation=TANH_GATE, implementation="xla")
  with pytest.raises(ValueError, match=r"needs the operands \['residual'\]"):
    epilogue.finish(epilogue.EpilogueSpec(activation=TANH_GATE), jnp.ones((2, 2)))
  mesh = jax.make_mesh((1,), ("tp",), axis_types=(jax.sharding.AxisType.Explicit,))
  with jax.set_mesh(mesh), pytest.raises(ValueError, match="take no with_operands epilogue"):
    pallas_gemm.all_gather_matmul(a, b, axis_name="tp", activation=TANH_GATE)


def test_the_gated_and_fused_mlp_paths_refuse_a_custom_activation():
  x, w = jnp.ones((4, 8), jnp.bfloat16), jnp.ones((8, 8), jnp.bfloat16)
  with pytest.raises(ValueError, match="^activation must be None"):
    pallas_gemm.gated_linear_unit(x, w, w, activation=softcap, implementation="xla")
  with pytest.raises(ValueError, match="^activation must be None"):
    pallas_gemm.mlp(x, w, w, activation=softcap, implementation="xla")


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


@pytest.mark.gpu
@pytest.mark.parametrize("fn", CUSTOM, ids=lambda f: f.__name__)
def test_custom_activations_in_the_kernel_on_the_gpu(fn):
  rng = np.random.default_rng(11)
  a, b, bias = (
      rng.standard_normal((1000, 512)),
      rng.standard_normal((512, 768)) / 16,
      rng.standard_normal(768),
  )
  args = [jnp.asarray(v, jnp.bfloat16) for v in (a, b)] + [jnp.asarray(bias, jnp.float32)]
  loss = lambda f: lambda *v: jnp.sum(f(*v).astype(jnp.float32) ** 2)
  ours = lambda a, b, bias: pallas_gemm.matmul(
      a, b, bias=bias, activation=fn, implementation="pallas"
  )
  y, grads = ours(*args), jax.grad(loss(ours), (0, 1, 2))(*args)
  with jax.enable_x64(True):
    ref = lambda a, b, bias: fn(a @ b + bias)
    f64 = [np.asarray(v, np.float64) for v in args]
    y_ref, grads_ref = ref(*f64), jax.grad(loss(ref), (0, 1, 2))(*f64)
  rel = lambda x, r: np.linalg.norm(np.asarray(x, np.float64) - r) / np.linalg.norm(r)
  assert rel(y, y_ref) < 1e-2
  for g, r in zip(grads, grads_ref):
    assert rel(g, r) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("act", USER_EPILOGUES, ids=lambda a: a.name)
def test_a_user_epilogue_in_the_kernel_on_the_gpu(act):
  rng = np.random.default_rng(12)
  a, b, r, bias, row_bias = (
      rng.standard_normal((1000, 512)),
      rng.standard_normal((512, 768)) / 16,
      rng.standard_normal((1000, 768)),
      rng.standard_normal(768),
      rng.standard_normal(1000),
  )
  args = [jnp.asarray(v, jnp.bfloat16) for v in (a, b, r)] + [
      jnp.asarray(v, jnp.float32) for v in (bias, row_bias, 3.0)
  ]
  loss = lambda f: lambda *v: jnp.sum(f(*v).astype(jnp.float32) ** 2)
  takes_scalar = "scalar" in act.operands
  ours = lambda a, b, r, bias, row_bias, cap: pallas_gemm.matmul(
      a,
      b,
      residual=r,
      bias=bias,
      row_bias=row_bias,
      scalar=cap if takes_scalar else None,
      activation=act,
      implementation="pallas",
  )
  wrt = (0, 1, 2, 3, 4, 5) if takes_scalar else (0, 1, 2, 3, 4)
  y, grads = ours(*args), jax.grad(loss(ours), wrt)(*args)

  def ref(a, b, r, bias, row_bias, cap):
    given = dict(residual=r, bias=bias, row_bias=row_bias[:, None], scalar=cap)
    z = a @ b + sum(given[k] for k in ("bias", "row_bias") if k not in act.operands)
    return act.fn(z, *(given[k] for k in act.operands))

  with jax.enable_x64(True):
    f64 = [np.asarray(v, np.float64) for v in args]
    y_ref, grads_ref = ref(*f64), jax.grad(loss(ref), wrt)(*f64)
  rel = lambda x, r: np.linalg.norm(np.asarray(x, np.float64) - r) / np.linalg.norm(r)
  assert rel(y, y_ref) < 1e-2
  for g, r in zip(grads, grads_ref):
    assert rel(g, r) < 2e-2
