"""Gradients of `pallas_gemm.autodiff.matmul` against jax.grad of a float64 XLA reference.

XLA implementation for the broad matrix (every layout, epilogue and dtype),
finite differences in f32, jax transformations, and which kernels the
differentiated program contains (traced for the Pallas kernel, not run).
A few cases run the kernel itself in GPU interpret mode.
"""

import zlib

import jax
from jax.extend import core as jax_core
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from pallas_gemm import _compat
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm.autodiff import matmul
from pallas_gemm.config import GemmConfig

M, K, N = 24, 40, 16
LAYOUTS = ["NN", "NT", "TN", "TT"]
ACTIVATIONS_F64 = {
    None: lambda z: z,
    "relu": lambda z: jnp.maximum(z, 0.0),
    "gelu_tanh": lambda z: jax.nn.gelu(z, approximate=True),
    "gelu_exact": lambda z: jax.nn.gelu(z, approximate=False),
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
}
EPILOGUES = {
    "none": dict(),
    "bias": dict(bias=True),
    **{act: dict(bias=True, activation=act) for act in ACTIVATIONS_F64 if act},
    "alpha_beta_c": dict(c=True, alpha=0.5, beta=-1.5),
    "row_bias_residual": dict(row_bias=True, residual=True),
    "everything": dict(
        bias=True,
        row_bias=True,
        c=True,
        residual=True,
        alpha=1.5,
        beta=0.5,
        activation="gelu_tanh",
        clamp=(-0.25, 2.0),
    ),
}
TOLERANCE = {"bfloat16": 1.5e-2, "float16": 2e-3, "float32": 1e-5}
"""Norm-wise relative error of outputs and gradients (bf16 eps 3.9e-3, f16 4.9e-4)."""

needs_transposed_interpret = pytest.mark.skipif(
    not _compat.INTERPRET_SUPPORTS_TRANSPOSED_OPERANDS,
    reason="the backward GEMMs are transposed problems, which the GPU interpreter of "
    f"jax {jax.__version__} cannot run (transposed WGMMA operands)",
)


def _rng(*parts):
  return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def _normal(rng, shape, dtype):
  return jnp.asarray(rng.standard_normal(shape).astype(dtype))


def _problem(
    layout,
    dtype,
    *,
    bias=False,
    c=False,
    row_bias=False,
    residual=False,
    activation=None,
    alpha=1.0,
    beta=0.0,
    clamp=None,
    batch_a=(),
    batch_b=(),
    seed=(),
    scalar=False,
):
  """Fresh random operands (never zeros), a random cotangent and matmul's keyword args."""
  ta, tb = layout[0] == "T", layout[1] == "T"
  rng = _rng(layout, dtype, activation, batch_a, batch_b, seed)
  args = {
      "a": _normal(rng, (*batch_a, *((K, M) if ta else (M, K))), dtype),
      "b": _normal(rng, (*batch_b, *((N, K) if tb else (K, N))), dtype),
      "bias": _normal(rng, (N,), jnp.float32) if bias else None,
      "c": _normal(rng, (M, N), dtype) if c else None,
      "row_bias": _normal(rng, (M,), jnp.float32) if row_bias else None,
      "residual": _normal(rng, (*(batch_a or batch_b), M, N), dtype) if residual else None,
  }
  if scalar:  # a user's epilogue scalar (a soft cap's), away from 0
    args["scalar"] = jnp.float32(rng.uniform(2.0, 6.0))
  cotangent = _normal(rng, (*(batch_a or batch_b), M, N), jnp.float32)
  static = dict(
      transpose_a=ta, transpose_b=tb, activation=activation, alpha=alpha, beta=beta, clamp=clamp
  )
  return args, cotangent, static


def _reference(
    a,
    b,
    bias,
    c,
    row_bias,
    residual,
    scalar=None,
    *,
    transpose_a,
    transpose_b,
    activation,
    alpha,
    beta,
    clamp,
):
  op_a = jnp.swapaxes(a, -1, -2) if transpose_a else a
  op_b = jnp.swapaxes(b, -1, -2) if transpose_b else b
  z = alpha * jnp.matmul(op_a, op_b, precision="highest")
  if c is not None:
    z = z + beta * c
  routed = epilogue_lib.routed_operands(activation)  # a user's epilogue takes these
  if bias is not None and "bias" not in routed:
    z = z + bias
  if row_bias is not None and "row_bias" not in routed:
    z = z + row_bias[:, None]
  if routed:  # y = fn(pre, *operands)
    given = dict(
        residual=residual,
        bias=bias,
        row_bias=None if row_bias is None else row_bias[:, None],
        scalar=scalar,
    )
    y = activation.fn(z, *(given[name] for name in routed))
    residual = None if "residual" in routed else residual
  else:
    y = ACTIVATIONS_F64[activation](z)
  if residual is not None:
    y = y + residual
  return y if clamp is None else jnp.clip(y, *clamp)


def _grads(fn, args, cotangent):
  """Output and gradients of sum(fn(**args) * cotangent) w.r.t. every non-None arg."""
  names = [name for name, x in args.items() if x is not None]

  def loss(*xs):
    y = fn(**dict(args, **dict(zip(names, xs))))
    return jnp.sum(y.astype(cotangent.dtype) * cotangent), y

  (_, y), grads = jax.value_and_grad(loss, argnums=tuple(range(len(names))), has_aux=True)(
      *(args[name] for name in names)
  )
  return y, dict(zip(names, grads))


def _reference_grads(args, cotangent, static):
  with jax.enable_x64(True):
    args64 = {
        k: None if x is None else jnp.asarray(np.asarray(x, np.float64)) for k, x in args.items()
    }
    y, grads = _grads(
        lambda **kw: _reference(**kw, **static),
        args64,
        jnp.asarray(np.asarray(cotangent, np.float64)),
    )
    return np.asarray(y), {k: np.asarray(g) for k, g in grads.items()}


def _rel_err(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return np.linalg.norm(x - ref) / np.linalg.norm(ref)


def _check_against_reference(args, cotangent, static, tol, **kw):
  # the interpreter (if any) done before the float64 reference dispatches
  y, grads = jax.block_until_ready(_grads(lambda **x: matmul(**x, **static, **kw), args, cotangent))
  y_ref, grads_ref = _reference_grads(args, cotangent, static)
  assert _rel_err(y, y_ref) < tol
  assert grads.keys() == grads_ref.keys()
  for name, g in grads.items():
    assert g.shape == args[name].shape and g.dtype == args[name].dtype, name
    assert _rel_err(g, grads_ref[name]) < tol, name


# -- the matrix: every layout x epilogue x dtype (XLA implementation) ----------------------
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("epilogue", list(EPILOGUES))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradients_match_float64_reference(layout, epilogue, dtype):
  args, cotangent, static = _problem(layout, dtype, **EPILOGUES[epilogue])
  _check_against_reference(args, cotangent, static, TOLERANCE[dtype], implementation="xla")


@pytest.mark.parametrize(
    "batch_a,batch_b",
    [((3,), ()), ((2, 3), ()), ((3,), (3,)), ((), (3,))],
    ids=["shared_b", "shared_b_2d_batch", "both", "shared_a"],
)
@pytest.mark.parametrize("layout", ["NN", "TT"])  # NN folds the batch into dB's K; TT sums
def test_batched_gradients_sum_over_shared_operands(layout, batch_a, batch_b):
  # c is (M, N) against a batched output: its gradient sums over the batch too.
  args, cotangent, static = _problem(
      layout,
      "bfloat16",
      bias=True,
      c=True,
      activation="silu",
      alpha=2.0,
      beta=0.5,
      batch_a=batch_a,
      batch_b=batch_b,
  )
  _check_against_reference(args, cotangent, static, TOLERANCE["bfloat16"], implementation="xla")


@pytest.mark.parametrize("activation", ["relu", "gelu_exact", "sigmoid"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_numerical_gradients_f32(layout, activation):
  args, _, static = _problem(
      layout,
      "float32",
      bias=True,
      c=True,
      row_bias=True,
      residual=True,
      activation=activation,
      alpha=0.75,
      beta=1.25,
      seed="numerical",
  )
  names = list(args)
  fn = lambda *xs: matmul(**dict(zip(names, xs)), implementation="xla", **static)
  check_grads(fn, tuple(args.values()), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)


def test_fp8_is_not_differentiable():
  a = jnp.ones((32, 64), jnp.float8_e4m3fn)
  b = jnp.ones((16, 64), jnp.float8_e4m3fn)
  f = lambda a, b: jnp.sum(matmul(a, b, transpose_b=True, implementation="xla").astype(jnp.float32))
  assert f(a, b) == 32 * 16 * 64
  with pytest.raises(NotImplementedError, match="fp8"):
    jax.grad(f)(a, b)


# -- mixed precision -----------------------------------------------------------------
def _eqns(jaxpr):
  """Every equation of a jaxpr, nested ones included."""
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if isinstance(sub, jax_core.ClosedJaxpr):
          yield from _eqns(sub.jaxpr)
        elif isinstance(sub, jax_core.Jaxpr):
          yield from _eqns(sub)


def _kernels(fn, *args):
  """Pallas kernel launches in fn's jaxpr (traced for the GPU, never run): their output avals."""
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  return [eqn.outvars[0].aval for eqn in _eqns(jaxpr) if eqn.primitive.name == "mpmd_map"]


@pytest.mark.parametrize("implementation", ["xla", "pallas"])
def test_f32_forward_output_keeps_the_backward_gemms_bf16(implementation):
  args, cotangent, static = _problem("NN", "bfloat16", bias=True, activation="gelu_tanh")
  loss = lambda a, b, bias: jnp.sum(
      cotangent
      * matmul(a, b, bias=bias, out_dtype=jnp.float32, implementation=implementation, **static)
  )
  grad = jax.grad(loss, argnums=(0, 1, 2))
  jaxpr = jax.make_jaxpr(grad)(args["a"], args["b"], args["bias"]).jaxpr
  if implementation == "xla":
    dots = [eqn for eqn in _eqns(jaxpr) if eqn.primitive.name == "dot_general"]
    assert len(dots) == 4  # forward, dA, dB, and the bias gradient as a ones-row GEMV
    assert all(v.aval.dtype == jnp.bfloat16 for eqn in dots for v in eqn.invars)
    da, db, dbias = grad(args["a"], args["b"], args["bias"])
    assert (da.dtype, db.dtype, dbias.dtype) == (jnp.bfloat16, jnp.bfloat16, jnp.float32)
  else:
    kernels = [eqn for eqn in _eqns(jaxpr) if eqn.primitive.name == "mpmd_map"]
    assert len(kernels) == 4
    # forward: f32 pre-activation; backward: bf16 gradients accumulated in f32 in the
    # kernel, and the f32 bias gradient (a ones-row GEMV)
    assert sorted(eqn.outvars[0].aval.dtype.name for eqn in kernels) == [
        "bfloat16",
        "bfloat16",
        "float32",
        "float32",
    ]


# -- which kernels run ----------------------------------------------------------------
def _mlp(x, w1, w2, implementation="pallas"):
  h = matmul(x, w1, activation="relu", implementation=implementation)
  return matmul(h, w2, implementation=implementation)


def _mlp_args():
  rng = _rng("mlp")
  return (
      _normal(rng, (128, 64), jnp.bfloat16),
      _normal(rng, (64, 128), jnp.bfloat16),
      _normal(rng, (128, 64), jnp.bfloat16),
  )


def _loss(fn):
  return lambda *args: jnp.sum(fn(*args).astype(jnp.float32))


@pytest.mark.parametrize("shape", [(8192, 8192, 8192), (16384, 4096, 4096)])
def test_benchmark_training_step_lowers_for_cuda_as_four_kernels(shape):
  """Forward, dX, dW, and the bias gradient's ones-row GEMV."""
  from benchmarks.train_step import layers, training_step  # noqa: PLC0415

  m, n, k = shape
  args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in [(m, k), (k, n), (n,), (m, n)]]
  step = training_step(layers("pallas")["pallas_gemm"])
  module = jax.export.export(step, platforms=["cuda"])(*args).mlir_module()
  assert module.count("@mosaic_gpu_v2") == 4


def test_unrequested_gradients_are_not_computed():
  args = _mlp_args()
  assert len(_kernels(jax.grad(_loss(_mlp), argnums=(0, 1, 2)), *args)) == 2 + 4
  # frozen input: layer 1 needs no dX
  assert len(_kernels(jax.grad(_loss(_mlp), argnums=(1, 2)), *args)) == 2 + 3
  # frozen weights: no dW anywhere
  assert len(_kernels(jax.grad(_loss(_mlp), argnums=0), *args)) == 2 + 2
  # only the last weight: nothing flows into layer 1
  assert len(_kernels(jax.grad(_loss(_mlp), argnums=2), *args)) == 2 + 1


def test_remat_recomputes_only_what_the_backward_reads():
  args = _mlp_args()
  plain = _kernels(jax.grad(_loss(_mlp), argnums=(0, 1, 2)), *args)
  remat = _kernels(jax.grad(_loss(jax.checkpoint(_mlp)), argnums=(0, 1, 2)), *args)
  # Layer 1's pre-activation is recomputed (its residual, and layer 2's input);
  # layer 2's forward kernel is not, since its residuals are its inputs.
  assert len(remat) == len(plain) + 1


def test_vmap_batch_becomes_the_kernel_batch():
  x, w, _ = _mlp_args()
  xs = jnp.stack([x, -x, 2 * x])
  # shared weight: the vmapped batch folds into M of one kernel launch
  assert [
      k.shape for k in _kernels(jax.vmap(lambda x: matmul(x, w, implementation="pallas")), xs)
  ] == [(3 * 128, 128)]
  # both operands vmapped: one batched launch
  ws = jnp.stack([w, w, w])
  shapes = [
      k.shape
      for k in _kernels(jax.vmap(lambda x, w: matmul(x, w, implementation="pallas")), xs, ws)
  ]
  assert shapes == [(3, 128, 128)]


# -- jax transformations (XLA implementation, checked against plain XLA autodiff) ----------
def _xla_mlp_loss(x, w1, w2, implementation):
  h = matmul(x, w1, activation="gelu_tanh", implementation=implementation, out_dtype=jnp.float32)
  y = matmul(h.astype(x.dtype), w2, implementation=implementation)
  return jnp.mean(y.astype(jnp.float32) ** 2)


def _reference_mlp_loss(x, w1, w2):
  h = jax.nn.gelu(jnp.dot(x, w1, preferred_element_type=jnp.float32), approximate=True)
  y = jnp.dot(h.astype(x.dtype), w2, preferred_element_type=jnp.float32).astype(x.dtype)
  return jnp.mean(y.astype(jnp.float32) ** 2)


def _assert_close_trees(x, y, tol=TOLERANCE["bfloat16"]):
  for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y)):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert _rel_err(a, b) < tol


@pytest.mark.parametrize(
    "transform", ["jit_value_and_grad", "checkpoint", "vmap_of_grad", "grad_of_vmap", "scan"]
)
def test_transformations(transform):
  x, w1, w2 = _mlp_args()
  ours = lambda x, w1, w2: _xla_mlp_loss(x, w1, w2, "xla")
  ref = _reference_mlp_loss
  grad = lambda f: jax.grad(f, argnums=(0, 1, 2))
  if transform == "jit_value_and_grad":
    _assert_close_trees(
        jax.jit(jax.value_and_grad(ours, argnums=(1, 2)))(x, w1, w2),
        jax.value_and_grad(ref, argnums=(1, 2))(x, w1, w2),
    )
  elif transform == "checkpoint":
    _assert_close_trees(jax.jit(grad(jax.checkpoint(ours)))(x, w1, w2), grad(ref)(x, w1, w2))
  elif transform == "vmap_of_grad":
    xs = jnp.stack([x[:64], x[64:]])
    _assert_close_trees(
        jax.vmap(grad(ours), in_axes=(0, None, None))(xs, w1, w2),
        jax.vmap(grad(ref), in_axes=(0, None, None))(xs, w1, w2),
    )
  elif transform == "grad_of_vmap":
    xs = jnp.stack([x[:64], x[64:]])
    batched = lambda f: lambda xs, w1, w2: jnp.sum(jax.vmap(f, in_axes=(0, None, None))(xs, w1, w2))
    _assert_close_trees(grad(batched(ours))(xs, w1, w2), grad(batched(ref))(xs, w1, w2))
  else:

    def layers(f):
      def loss(x, ws):
        def step(h, w):
          y = f(h, w)
          return y.astype(h.dtype), None

        return jnp.mean(jax.lax.scan(step, x, ws)[0].astype(jnp.float32) ** 2)

      return loss

    ws = 0.1 * jnp.stack([w1[:, :64], w2[:64]])
    ours_layer = lambda h, w: matmul(h, w, activation="silu", implementation="xla")
    ref_layer = lambda h, w: jax.nn.silu(jnp.dot(h, w, preferred_element_type=jnp.float32))
    _assert_close_trees(
        jax.grad(layers(ours_layer), argnums=(0, 1))(x[:, :64], ws),
        jax.grad(layers(ref_layer), argnums=(0, 1))(x[:, :64], ws),
    )


@pytest.mark.parametrize("batched", ["everything", "bias_only", "operands_only"])
def test_vmap_matches_a_loop_over_examples(batched):
  args, _, static = _problem(
      "NT",
      "bfloat16",
      bias=True,
      c=True,
      row_bias=True,
      residual=True,
      activation="silu",
      alpha=2.0,
      beta=0.5,
      seed="vmap",
  )
  stacked = {k: jnp.stack([x, -x, 2 * x]) for k, x in args.items()}
  in_axes = {
      k: (
          0
          if (
              batched == "everything"
              or k == "a"
              or (batched == "bias_only" and k in ("bias", "row_bias"))
              or (batched == "operands_only" and k == "b")
          )
          else None
      )
      for k in args
  }
  inputs = {k: stacked[k] if in_axes[k] == 0 else args[k] for k in args}
  fn = lambda kw: matmul(**kw, implementation="xla", **static)
  ours = jax.vmap(fn, in_axes=(in_axes,))(inputs)
  loop = jnp.stack(
      [fn({k: x[i] if in_axes[k] == 0 else x for k, x in inputs.items()}) for i in range(3)]
  )
  np.testing.assert_allclose(
      np.asarray(ours, np.float32), np.asarray(loop, np.float32), rtol=2e-2, atol=2e-2
  )


def test_forward_mode_and_higher_orders_on_the_xla_path_match_lax():
  rng = np.random.default_rng(11)
  a = jnp.asarray(rng.standard_normal((5, 3)), jnp.float32)
  b = jnp.asarray(rng.standard_normal((3, 4)), jnp.float32)
  bias = jnp.asarray(rng.standard_normal(4), jnp.float32)
  ours = lambda a: jnp.sum(
      matmul(a, b, bias=bias, activation="gelu_tanh", implementation="xla") ** 2
  )
  ref = lambda a: jnp.sum(jax.nn.gelu(a @ b + bias, approximate=True) ** 2)
  tangent = jnp.asarray(rng.standard_normal(a.shape), jnp.float32)
  np.testing.assert_allclose(
      jax.jvp(ours, (a,), (tangent,))[1], jax.jvp(ref, (a,), (tangent,))[1], rtol=1e-5
  )
  np.testing.assert_allclose(jax.jacfwd(ours)(a), jax.jacfwd(ref)(a), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jax.hessian(ours)(a), jax.hessian(ref)(a), rtol=1e-4, atol=1e-5)
  grad_of_grad = lambda f: jax.grad(lambda a: jnp.sum(jax.grad(f)(a) ** 2))(a)
  np.testing.assert_allclose(grad_of_grad(ours), grad_of_grad(ref), rtol=1e-4, atol=1e-5)


needs_the_011_interpreter = pytest.mark.skipif(
    _compat.JAX_VERSION < (0, 11, 0),
    reason=f"jax {jax.__version__}'s GPU interpreter hung in a full run of the forward-mode "
    "tests (the tangent's two GEMMs are independent kernels, interpreted at once; each case "
    "passes alone); 0.11's does not hang",
)


def _tangents(args, seed):
  """A fresh random tangent for every operand given (the scalar's too)."""
  rng = _rng("tangents", seed)
  return {k: None if x is None else _normal(rng, jnp.shape(x), x.dtype) for k, x in args.items()}


def _jvp_errors(args, static, seed, **kw):
  """Relative errors of matmul's output and its tangent (every operand perturbed) against
  jax.jvp of the float64 reference."""
  tangents = _tangents(args, seed)
  names = [k for k, x in args.items() if x is not None]
  ours = lambda *xs: matmul(**dict(args, **dict(zip(names, xs))), **static, **kw)
  y, y_dot = jax.block_until_ready(
      jax.jvp(
          ours,
          [args[k] for k in names],
          [tangents[k] for k in names],
      )
  )
  with jax.enable_x64(True):
    as64 = lambda x: jnp.asarray(np.asarray(x, np.float64))
    args64 = {k: None if x is None else as64(x) for k, x in args.items()}
    reference = lambda *xs: _reference(**dict(args64, **dict(zip(names, xs))), **static)
    y_ref, y_dot_ref = jax.jvp(
        reference, [args64[k] for k in names], [as64(tangents[k]) for k in names]
    )
  assert y_dot.dtype == y.dtype and y_dot.shape == y.shape
  return _rel_err(y, y_ref), _rel_err(y_dot, y_dot_ref)


@pytest.mark.parametrize(
    "layout,epilogue,batch_a",
    [
        ("NN", "everything", ()),
        pytest.param("TN", "alpha_beta_c", (), marks=needs_transposed_interpret),
        ("NN", "row_bias_residual", (2,)),
        ("NN", "capped_gate", ()),
    ],
)
@needs_the_011_interpreter
def test_forward_mode_through_the_kernel_matches_float64(layout, epilogue, batch_a):
  """jax.jvp through the kernel (issue 20): the tangent is the kernel's own GEMMs,
  op(a') @ op(b) + op(a) @ op(b'), and XLA's derivative of the epilogue's tail."""
  if epilogue in USER_EPILOGUES:
    args, _, static = _user_epilogue_problem(layout, "bfloat16", epilogue, "jvp")
  else:
    args, _, static = _problem(
        layout, "bfloat16", batch_a=batch_a, seed="jvp", **EPILOGUES[epilogue]
    )
  errors = _jvp_errors(args, static, (layout, epilogue), implementation="interpret")
  assert max(errors) < TOLERANCE["bfloat16"], errors


@needs_the_011_interpreter
def test_forward_mode_under_vmap_with_a_frozen_weight():
  args, _, static = _problem("NN", "bfloat16", bias=True, activation="silu", seed="jvp vmap")
  w, bias = args["b"], args["bias"]
  xs = jnp.stack([args["a"], 2.0 * args["a"]])
  tangent = _normal(_rng("jvp vmap tangent"), xs.shape, xs.dtype)
  layer = lambda impl: lambda x: matmul(x, w, bias=bias, implementation=impl, **static)

  def per_example(impl):  # vmap of jvp: the tangent map is batched
    return jax.vmap(lambda x, t: jax.jvp(layer(impl), (x,), (t,))[1])(xs, tangent)

  def of_the_batch(impl):  # jvp of vmap: the kernel's batch
    return jax.jvp(jax.vmap(layer(impl)), (xs,), (tangent,))[1]

  for fn in (per_example, of_the_batch):
    assert _rel_err(fn("interpret"), fn("xla")) < TOLERANCE["bfloat16"], fn.__name__


@pytest.mark.slow  # ~8 s
@needs_transposed_interpret
def test_higher_orders_through_the_kernel_match_xla():
  """jacfwd, hessian and a gradient of a gradient through the kernel (issue 20), against
  the same program on the XLA path (itself checked against lax above)."""
  args, _, static = _problem("NN", "float32", bias=True, activation="gelu_tanh", seed="hessian")
  a, b, bias = args["a"][:4, :8], args["b"][:8, :4], args["bias"][:4]
  loss = lambda impl: lambda a: jnp.sum(matmul(a, b, bias=bias, implementation=impl, **static) ** 2)
  grad_of_grad = lambda f: jax.grad(lambda a: jnp.sum(jax.grad(f)(a) ** 2))(a)
  for transform in (jax.jacfwd, jax.hessian):
    assert _rel_err(transform(loss("interpret"))(a), transform(loss("xla"))(a)) < 1e-4
  assert _rel_err(grad_of_grad(loss("interpret")), grad_of_grad(loss("xla"))) < 1e-4


def test_c_is_ignored_when_beta_is_zero_and_required_otherwise():
  args, _, _ = _problem("NN", "bfloat16", c=True)
  grad_c = jax.grad(
      lambda c: jnp.sum(matmul(args["a"], args["b"], c=c, implementation="xla").astype(jnp.float32))
  )(args["c"])
  assert not np.any(np.asarray(grad_c, np.float32))
  with pytest.raises(ValueError, match="needs c"):
    matmul(args["a"], args["b"], beta=1.0, implementation="xla")
  with pytest.raises(TypeError, match="Python number"):
    matmul(args["a"], args["b"], alpha=jnp.float32(2.0), implementation="xla")


# -- the kernel itself, in GPU interpret mode ----------------------------------------------
INTERPRET_CONFIG = GemmConfig(tile_m=128, tile_n=64, stages=2)


def test_interpret_forward_under_vmap_matches_xla():
  args, _, static = _problem(
      "NN", "bfloat16", bias=True, activation="gelu_exact", batch_a=(2,), seed="interpret"
  )

  def run(implementation, **kw):
    layer = lambda a: matmul(
        a, args["b"], bias=args["bias"], implementation=implementation, **kw, **static
    )
    return jax.vmap(layer)(args["a"])

  assert _rel_err(run("interpret", config=INTERPRET_CONFIG), run("xla")) < 1e-2


@pytest.mark.skipif(
    _compat.INTERPRET_SUPPORTS_TRANSPOSED_OPERANDS,
    reason=f"jax {jax.__version__}'s GPU interpreter runs transposed operands",
)
def test_interpret_backward_is_refused_where_the_interpreter_would_hang():
  args, _, static = _problem("NN", "bfloat16", seed="interpret")
  loss = lambda a, b: jnp.sum(
      matmul(a, b, implementation="interpret", **static).astype(jnp.float32)
  )
  with pytest.raises(NotImplementedError, match="transposed operands"):
    jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(args["a"], args["b"])


@needs_transposed_interpret
@pytest.mark.parametrize(
    "layout,epilogue,batch_a",
    [
        ("NN", dict(bias=True, activation="gelu_tanh"), (2,)),
        ("TT", dict(c=True, alpha=0.5, beta=2.0), ()),
    ],
    ids=["NN_bias_gelu_shared_weight", "TT_alpha_beta_c"],
)
def test_interpret_gradients_match_float64_reference(layout, epilogue, batch_a):
  args, cotangent, static = _problem(
      layout, "bfloat16", batch_a=batch_a, seed="interpret", **epilogue
  )
  _check_against_reference(
      args, cotangent, static, TOLERANCE["bfloat16"], implementation="interpret"
  )


def _softcap(z):  # a custom activation (issue 19): traced into the kernel's epilogue
  return 8.0 * jnp.tanh(z / 8.0)


ACTIVATIONS_F64[_softcap] = _softcap


@needs_transposed_interpret
def test_interpret_gradients_with_a_custom_activation_match_float64_reference():
  args, cotangent, static = _problem("NN", "bfloat16", bias=True, seed="custom activation")
  static["activation"] = _softcap  # not in _problem's seed: a function's repr has its address
  _check_against_reference(
      args, cotangent, static, TOLERANCE["bfloat16"], implementation="interpret"
  )


def _sigmoid_gate(pre, gate):  # a user's epilogue of the accumulator and a tile operand
  return pre * (1.0 / (1.0 + jnp.exp(-gate)))


def _scaled_gate(pre, row_scale, gate, col_scale):  # every operand kind, in a user's order
  return _sigmoid_gate(pre * col_scale, gate) + row_scale


def _capped_gate(pre, row_scale, gate, col_scale, cap):  # ... and a runtime scalar
  return cap * jnp.tanh(_scaled_gate(pre, row_scale, gate, col_scale) / cap)


GATE = epilogue_lib.with_residual(_sigmoid_gate)
SCALED_GATE = epilogue_lib.with_operands(_scaled_gate, "row_bias", "residual", "bias")
CAPPED_GATE = epilogue_lib.with_operands(_capped_gate, "row_bias", "residual", "bias", "scalar")
USER_EPILOGUES = {"gate": GATE, "scaled_gate": SCALED_GATE, "capped_gate": CAPPED_GATE}


def _user_epilogue_problem(layout, dtype, name, seed):
  """Every operand kind given (the scalar where the epilogue takes one), `name`'s epilogue."""
  epilogue = USER_EPILOGUES[name]
  args, cotangent, static = _problem(
      layout,
      dtype,
      bias=True,
      row_bias=True,
      residual=True,
      seed=(seed, name),
      scalar="scalar" in epilogue.operands,
  )
  static["activation"] = epilogue
  return args, cotangent, static


@pytest.mark.parametrize("name", list(USER_EPILOGUES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_user_epilogue_and_its_gradients_match_float64_on_xla(dtype, name):
  args, cotangent, static = _user_epilogue_problem("NT", dtype, name, "user xla")
  _check_against_reference(args, cotangent, static, TOLERANCE[dtype], implementation="xla")


@needs_transposed_interpret
@pytest.mark.parametrize("name", list(USER_EPILOGUES))
def test_interpret_gradients_with_a_user_epilogue_match_float64_reference(name):
  args, cotangent, static = _user_epilogue_problem("NN", "bfloat16", name, "user")
  _check_against_reference(
      args, cotangent, static, TOLERANCE["bfloat16"], implementation="interpret"
  )


# -- the fused dPre + bias-gradient pass (pallas_gemm.dpre) ---------------------------
def _fused_problem(layout, rows, inner, cols, seed):
  """A bias + GELU layer whose backward takes the fused pass (N a multiple of 128)."""
  ta, tb = layout[0] == "T", layout[1] == "T"
  rng = _rng("fused", layout, seed)
  args = {
      "a": _normal(rng, (inner, rows) if ta else (rows, inner), jnp.bfloat16),
      "b": _normal(rng, (cols, inner) if tb else (inner, cols), jnp.bfloat16),
      "bias": _normal(rng, (cols,), jnp.float32),
      "c": None,
      "row_bias": None,
      "residual": None,
  }
  static = dict(
      transpose_a=ta, transpose_b=tb, activation="gelu_tanh", alpha=1.0, beta=0.0, clamp=None
  )
  return args, _normal(rng, (rows, cols), jnp.float32), static


def _runs_fused_pass(args, cotangent, static, **kw):
  """Whether the backward launches `dpre` (its second output: per-64-row-tile column sums)."""
  rows, cols = cotangent.shape
  loss = lambda a, b, bias: jnp.sum(
      matmul(a, b, bias=bias, **static, **kw).astype(jnp.float32) * cotangent
  )
  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(args["a"], args["b"], args["bias"])
  return any(
      len(eqn.outvars) == 2 and eqn.outvars[1].aval.shape == (-(-rows // 64), cols)
      for eqn in _eqns(jaxpr.jaxpr)
      if eqn.primitive.name == "mpmd_map"
  )


@pytest.mark.slow
@needs_transposed_interpret
def test_interpret_fused_backward_matches_float64_reference():
  args, cotangent, static = _fused_problem("NN", 200, 72, 256, "interpret")
  assert _runs_fused_pass(
      args, cotangent, static, implementation="interpret", config=INTERPRET_CONFIG
  )
  _check_against_reference(
      args,
      cotangent,
      static,
      TOLERANCE["bfloat16"],
      implementation="interpret",
      config=INTERPRET_CONFIG,
  )


@pytest.mark.slow  # ~5 s
@needs_transposed_interpret
def test_per_example_gradients_through_the_fused_pass_match_xla():
  """vmap of grad: the fused dPre kernel runs batched (its launcher under vmap; it raised
  an AttributeError before), per-example gradients of the shared weight and bias."""
  args, cotangent, static = _fused_problem("NN", 64, 72, 128, "per example")
  xs = jnp.stack([args["a"], -0.5 * args["a"]])

  def grads(implementation, **kw):
    loss = lambda a, b, bias: jnp.sum(
        matmul(a, b, bias=bias, implementation=implementation, **kw, **static).astype(jnp.float32)
        * cotangent
    )
    return jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(0, None, None))(
        xs, args["b"], args["bias"]
    )

  assert _runs_fused_pass(args, cotangent, static, implementation="interpret")
  for ours, ref in zip(grads("interpret", config=INTERPRET_CONFIG), grads("xla")):
    assert ours.shape == ref.shape and _rel_err(ours, ref) < TOLERANCE["bfloat16"]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_gradients_match_float64_reference(layout):
  """The real kernels, forward and backward (fused dPre pass included), at an odd shape."""
  args, cotangent, static = _fused_problem(layout, 1000, 520, 1024, "gpu")
  assert _runs_fused_pass(args, cotangent, static, implementation="pallas")
  _check_against_reference(args, cotangent, static, TOLERANCE["bfloat16"], implementation="pallas")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NN", "TN"])
def test_gpu_forward_mode_and_hessian_vector_products_match_float64(layout):
  """jax.jvp through the real kernels at an odd shape (issue 20), and a Hessian-vector
  product (forward over reverse: the backward's kernels differentiated) against XLA's."""
  args, _, static = _fused_problem(layout, 1000, 520, 1024, "gpu jvp")
  errors = _jvp_errors(args, static, ("gpu", layout), implementation="pallas")
  assert max(errors) < TOLERANCE["bfloat16"], errors
  a, b, bias = (args[k].astype(jnp.float32) for k in ("a", "b", "bias"))
  v = _normal(_rng("hvp", layout), a.shape, jnp.float32)
  hvp = lambda impl: jax.jvp(
      jax.grad(lambda a: jnp.sum(matmul(a, b, bias=bias, implementation=impl, **static) ** 2)),
      (a,),
      (v,),
  )[1]
  assert _rel_err(hvp("pallas"), hvp("xla")) < 1e-2
