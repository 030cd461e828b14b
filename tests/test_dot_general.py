"""`pallas_gemm.dot_general` against `jax.lax.dot_general`: same results, same gradients,
the kernel wherever the docstring says so (with no transposed copies), lax elsewhere."""

import zlib

import jax
from jax import lax
from jax.extend import core as jax_core
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_gemm import _compat
from pallas_gemm.dot import dot_general, make_dot_general

XLA = make_dot_general(implementation="xla")
KERNEL = make_dot_general(implementation="pallas")
"""The kernel's path (traced, not run, where a test looks for its custom_jvp): the XLA
path is plain XLA ops, with no custom_jvp to find."""

# name: (lhs shape, rhs shape, dimension_numbers, kernel layout)
ON_KERNEL = {
    "NN_dense": ((2, 5, 24), (24, 16), (((2,), (0,)), ((), ())), "NN"),
    "NT": ((12, 24), (16, 24), (((1,), (1,)), ((), ())), "NT"),
    "TN": ((24, 12), (24, 16), (((0,), (0,)), ((), ())), "TN"),
    "TT": ((24, 12), (16, 24), (((0,), (1,)), ((), ())), "TT"),
    "attention_scores": ((2, 3, 8, 16), (2, 3, 6, 16), (((3,), (3,)), ((0, 1), (0, 1))), "NT"),
    "attention_values": ((2, 3, 8, 6), (2, 3, 6, 16), (((3,), (2,)), ((0, 1), (0, 1))), "NN"),
    "two_contracting_dims": ((6, 4, 8), (4, 8, 10), (((1, 2), (0, 1)), ((), ())), "NN"),
    "contracting_dims_given_reversed": ((6, 4, 8), (4, 8, 10), (((2, 1), (1, 0)), ((), ())), "NN"),
    "lhs_contracts_first_free_dims_after": ((8, 3, 5), (8, 10), (((0,), (0,)), ((), ())), "TN"),
    "vector_matrix": ((24,), (24, 16), (((0,), (0,)), ((), ())), "NN"),
    "batched_TT": ((3, 24, 12), (3, 16, 24), (((1,), (2,)), ((0,), (0,))), "TT"),
}

# name: (lhs, rhs, dimension_numbers, dtypes, precision)
TO_LAX = {
    "f32_operands": ((8, 24), (24, 16), (((1,), (0,)), ((), ())), ("float32", "float32"), None),
    "int8": ((8, 24), (24, 16), (((1,), (0,)), ((), ())), ("int8", "int8"), None),
    "mixed_dtypes": ((8, 24), (24, 16), (((1,), (0,)), ((), ())), ("bfloat16", "float16"), None),
    "non_leading_batch": (
        (8, 3, 24),
        (3, 24, 16),
        (((2,), (1,)), ((1,), (0,))),
        ("bfloat16", "bfloat16"),
        None,
    ),
    "non_adjacent_contracting": (
        (4, 6, 8),
        (4, 8, 10),
        (((0, 2), (0, 1)), ((), ())),
        ("bfloat16", "bfloat16"),
        None,
    ),
    "contracting_in_the_middle": (
        (6, 8, 5),
        (8, 10),
        (((1,), (0,)), ((), ())),
        ("bfloat16", "bfloat16"),
        None,
    ),
    "outer_product": ((6,), (10,), (((), ()), ((), ())), ("bfloat16", "bfloat16"), None),
    "f32_algorithm": (
        (8, 24),
        (24, 16),
        (((1,), (0,)), ((), ())),
        ("bfloat16", "bfloat16"),
        lax.DotAlgorithmPreset.F32_F32_F32,
    ),
}


def _operands(lhs_shape, rhs_shape, dtypes=("bfloat16", "bfloat16"), seed=""):
  rng = np.random.default_rng(zlib.crc32(repr((lhs_shape, rhs_shape, dtypes, seed)).encode()))
  draw = lambda shape, dtype: jnp.asarray(
      (rng.standard_normal(shape) * 4 if "int" in dtype else rng.standard_normal(shape)).astype(
          dtype
      )
  )
  return draw(lhs_shape, dtypes[0]), draw(rhs_shape, dtypes[1])


def _primitives(fn, *args):
  names = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      names.append(eqn.primitive.name)
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
          if isinstance(sub, jax_core.ClosedJaxpr):
            walk(sub.jaxpr)
          elif isinstance(sub, jax_core.Jaxpr):
            walk(sub)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return names


def _rel_err(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return np.linalg.norm(x - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("name", list(ON_KERNEL))
def test_kernel_cases_match_lax_and_take_no_transposed_copy(name):
  lhs_shape, rhs_shape, dn, _ = ON_KERNEL[name]
  lhs, rhs = _operands(lhs_shape, rhs_shape)
  ours = XLA(lhs, rhs, dn, preferred_element_type=jnp.float32)
  ref = lax.dot_general(lhs, rhs, dn, preferred_element_type=jnp.float32)
  assert ours.shape == ref.shape and ours.dtype == ref.dtype
  assert _rel_err(ours, ref) < 1e-6
  traced = _primitives(lambda x, y: KERNEL(x, y, dn), lhs, rhs)
  assert "custom_jvp_call" in traced
  pallas = make_dot_general(implementation="pallas")
  kernel = _primitives(lambda x, y: pallas(x, y, dn), lhs, rhs)
  assert kernel.count("mpmd_map") == 1 and "transpose" not in kernel


@pytest.mark.parametrize("name", list(ON_KERNEL))
def test_gradients_match_lax(name):
  lhs_shape, rhs_shape, dn, _ = ON_KERNEL[name]
  lhs, rhs = _operands(lhs_shape, rhs_shape, seed="grad")
  out_shape = lax.dot_general(lhs, rhs, dn).shape
  cotangent = jnp.asarray(np.random.default_rng(0).standard_normal(out_shape), jnp.float32)
  loss = lambda f: lambda x, y: jnp.sum(f(x, y, dn).astype(jnp.float32) * cotangent)
  ours = jax.jit(jax.grad(loss(XLA), argnums=(0, 1)))(lhs, rhs)
  with jax.enable_x64(True):
    as64 = lambda x: jnp.asarray(np.asarray(x, np.float64))
    ref = jax.jit(jax.grad(loss(lax.dot_general), argnums=(0, 1)))(as64(lhs), as64(rhs))
  for g, r, x in zip(ours, ref, (lhs, rhs)):
    assert g.shape == x.shape and g.dtype == x.dtype
    assert _rel_err(g, r) < 1e-2


@pytest.mark.skipif(
    _compat.JAX_VERSION < (0, 11, 0),
    reason="jax 0.10's GPU interpreter cannot run the transposed operands these layouts have",
)
@pytest.mark.parametrize(
    "name", [pytest.param("NN_dense", marks=pytest.mark.slow), "attention_scores"]
)
def test_forward_mode_through_the_kernel_matches_lax(name):
  """jax.jvp and jax.jacfwd through the kernel's dot_general (issue 20), in GPU interpret mode."""
  lhs_shape, rhs_shape, dn, _ = ON_KERNEL[name]
  lhs, rhs = _operands(lhs_shape, rhs_shape, seed="jvp")
  dlhs, drhs = _operands(lhs_shape, rhs_shape, seed="jvp tangents")
  interpret = make_dot_general(implementation="interpret")
  f = lambda g: lambda x, y: g(x, y, dn, preferred_element_type=jnp.float32)
  _, ours = jax.jvp(f(interpret), (lhs, rhs), (dlhs, drhs))
  with jax.enable_x64(True):
    as64 = lambda x: jnp.asarray(np.asarray(x, np.float64))
    _, ref = jax.jvp(f(lax.dot_general), (as64(lhs), as64(rhs)), (as64(dlhs), as64(drhs)))
  assert ours.shape == ref.shape and _rel_err(ours, ref) < 1e-2
  if name == "NN_dense":  # a Jacobian column by column: every basis tangent through the kernel
    small = lhs[:2], rhs[:, :3]
    jac = jax.jacfwd(f(interpret), argnums=1)(*small)
    with jax.enable_x64(True):
      jac_ref = jax.jacfwd(f(lax.dot_general), argnums=1)(*(as64(x) for x in small))
    assert _rel_err(jac, jac_ref) < 1e-2


@pytest.mark.parametrize("name", list(TO_LAX))
def test_other_cases_fall_back_to_lax(name):
  lhs_shape, rhs_shape, dn, dtypes, precision = TO_LAX[name]
  lhs, rhs = _operands(lhs_shape, rhs_shape, dtypes)
  f = lambda x, y: KERNEL(x, y, dn, precision=precision)
  assert "custom_jvp_call" not in _primitives(f, lhs, rhs)
  np.testing.assert_array_equal(f(lhs, rhs), lax.dot_general(lhs, rhs, dn, precision=precision))


@pytest.mark.parametrize(
    "precision",
    [
        None,
        lax.Precision.HIGHEST,
        "highest",
        (lax.Precision.DEFAULT, lax.Precision.HIGH),
        lax.DotAlgorithmPreset.BF16_BF16_F32,
    ],
)
def test_precisions_the_kernel_honours(precision):
  lhs, rhs = _operands((8, 24), (24, 16))
  f = lambda x, y: KERNEL(x, y, (((1,), (0,)), ((), ())), precision=precision)
  assert "custom_jvp_call" in _primitives(f, lhs, rhs)


@pytest.mark.parametrize("out_dtype", [None, "bfloat16", "float32"])
def test_preferred_element_type_is_the_output_dtype(out_dtype):
  lhs, rhs = _operands((8, 24), (24, 16))
  out = XLA(lhs, rhs, (((1,), (0,)), ((), ())), preferred_element_type=out_dtype)
  assert (
      out.dtype
      == lax.dot_general(lhs, rhs, (((1,), (0,)), ((), ())), preferred_element_type=out_dtype).dtype
  )


def test_einsum_injection():
  q, k = _operands((2, 3, 8, 16), (2, 3, 6, 16))
  ours = jnp.einsum("bhtd,bhsd->bhts", q, k, _dot_general=XLA, preferred_element_type=jnp.float32)
  ref = jnp.einsum("bhtd,bhsd->bhts", q, k, preferred_element_type=jnp.float32)
  assert _rel_err(ours, ref) < 1e-6


def test_signature_is_lax_dot_general_and_out_sharding_is_accepted():
  import inspect

  assert (
      inspect.signature(dot_general).parameters.keys()
      == inspect.signature(lax.dot_general).parameters.keys()
  )
  lhs, rhs = _operands((8, 24), (24, 16))
  out = dot_general(lhs, rhs, (((1,), (0,)), ((), ())), out_sharding=None)
  assert out.shape == (8, 16)


def test_vmap_over_dot_general():
  lhs, rhs = _operands((4, 8, 24), (24, 16))
  dn = (((1,), (0,)), ((), ()))
  ours = jax.vmap(lambda x: XLA(x, rhs, dn, preferred_element_type=jnp.float32))(lhs)
  ref = jax.vmap(lambda x: lax.dot_general(x, rhs, dn, preferred_element_type=jnp.float32))(lhs)
  assert _rel_err(ours, ref) < 1e-6


# -- lax's inputs and errors (issue 20) ------------------------------------------------
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_bare_int_dimension_numbers_are_lax_s_too(dtype):
  a, b = jnp.ones((3, 4), dtype), jnp.ones((4, 5), dtype)
  for dn in [((1, 0), ((), ())), (((1,), (0,)), ((), ()))]:
    assert dot_general(a, b, dn).shape == jax.lax.dot_general(a, b, dn).shape


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize(
    "dn, precision",
    [
        ((((2,), (1,)), ((0,), (0,))), "bogus"),  # not a precision
        ((((0,), (0,)), ((0,), (0,))), None),  # a batch dim that also contracts
        ((((2,), (2,)), ((0,), (0,))), None),  # contracting extents differ
    ],
)
def test_what_lax_refuses_is_refused_with_lax_s_error(dtype, dn, precision):
  lhs, rhs = jnp.ones((2, 3, 4), dtype), jnp.ones((2, 4, 5), dtype)
  with pytest.raises(Exception) as theirs:
    jax.lax.dot_general(lhs, rhs, dn, precision=precision)
  with pytest.raises(type(theirs.value)) as ours:
    dot_general(lhs, rhs, dn, precision=precision)
  assert str(ours.value) == str(theirs.value)
