"""The epilogue operands by kind (`pallas_gemm.operands`): each kind's rules agree with
one another (a cotangent is the adjoint of the broadcast, a folded or per-example operand
is the broadcast one), and every consumer of the registry sees every operand."""

from __future__ import annotations

import dataclasses
import inspect

from hypothesis import given, settings, strategies as st
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_gemm
from pallas_gemm import epilogue, gemm, hopper_gemm, operands
from pallas_gemm.config import GemmConfig, GemmProblem
from pallas_gemm.operands import COLUMN, OPERANDS, ROW, SCALAR, TILE
from hypothesis_budget import examples

KINDS = (COLUMN, ROW, TILE, SCALAR)
dims = st.integers(1, 5)


def _shape(kind, m, n):
  return {"n": (n,), "m": (m,), "mn": (m, n), "": ()}[kind.axes]


@settings(max_examples=examples(40), deadline=None)
@given(
    kind=st.sampled_from(KINDS), batch=st.integers(1, 3), m=dims, n=dims, seed=st.integers(0, 99)
)
def test_cotangent_is_the_adjoint_of_the_broadcast(kind, batch, m, n, seed):
  # <broadcast(x), d> = <x, cotangent(d)> for every x and d: the reduction each kind's
  # gradient uses is exactly what its broadcast into the output needs.
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(_shape(kind, m, n))
  d = rng.standard_normal((batch, m, n))
  broadcast = np.broadcast_to(np.asarray(kind.broadcastable(jnp.asarray(x))), d.shape)
  lhs = float(np.sum(broadcast * d))
  rhs = float(np.sum(x * np.asarray(kind.cotangent(jnp.asarray(d), x.shape))))
  assert lhs == pytest.approx(rhs, rel=1e-5, abs=1e-5)


@settings(max_examples=examples(30), deadline=None)
@given(
    kind=st.sampled_from(KINDS), batch=st.integers(1, 3), m=dims, n=dims, seed=st.integers(0, 99)
)
def test_folded_operand_is_the_broadcast_one_per_batch_entry(kind, batch, m, n, seed):
  # Folding a batch into M must give row block b the operand as batch entry b sees it.
  x = np.random.default_rng(seed).standard_normal(_shape(kind, m, n)).astype(np.float32)
  folded = np.asarray(kind.folded(jnp.asarray(x), (batch,), m, n))
  per_entry = np.broadcast_to(np.asarray(kind.broadcastable(jnp.asarray(x))), (m, n))
  if kind is TILE:
    np.testing.assert_array_equal(folded, np.concatenate([per_entry] * batch))
  elif kind is ROW:
    np.testing.assert_array_equal(folded, np.tile(x, batch))
  else:  # columns and scalars are the same for every row
    np.testing.assert_array_equal(folded, x)


@settings(max_examples=examples(30), deadline=None)
@given(kind=st.sampled_from((COLUMN, ROW, SCALAR)), size=st.integers(1, 3), m=dims, n=dims)
def test_per_example_operand_broadcasts_like_each_example(kind, size, m, n):
  x = np.random.default_rng(size * 31 + m).standard_normal((size, *_shape(kind, m, n)))
  out = (size, 2, m, n)  # a vmapped, batched output
  mapped = np.broadcast_to(np.asarray(kind.per_example(jnp.asarray(x), size, len(out))), out)
  for i in range(size):
    one = np.broadcast_to(np.asarray(kind.broadcastable(jnp.asarray(x[i]))), out[1:])
    np.testing.assert_array_equal(mapped[i], one)


@pytest.mark.parametrize("name", list(OPERANDS))
def test_bad_shapes_are_named_with_the_rule(name):
  op = OPERANDS[name]
  op.check(jnp.ones(_shape(op.kind, 4, 5)), 4, 5)  # the right shape passes
  with pytest.raises(ValueError, match=rf"^my_{name} must (have shape|be a scalar)"):
    op.check(jnp.ones((7, 7, 7)), 4, 5, argument=f"my_{name}")


def test_a_residual_of_an_integer_dtype_is_named():
  with pytest.raises(TypeError, match="residual must be one of"):
    OPERANDS["residual"].check(jnp.ones((4, 5), jnp.int32), 4, 5)


def test_every_consumer_sees_every_operand():
  problem_fields = {f.name for f in dataclasses.fields(GemmProblem)}
  for op in OPERANDS.values():
    assert op.flag is None or op.flag in problem_fields, op
  # the public ones are arguments of the differentiable entry and of the kernel entry
  for entry in (pallas_gemm.matmul, gemm.gemm):
    assert set(operands.PUBLIC) <= set(inspect.signature(entry).parameters), entry
  # the kernel takes every operand (a user's scalar inside its runtime scalars)
  kernel_inputs = set(hopper_gemm._INPUTS)
  assert {("scalars" if n == "scalar" else n) for n in OPERANDS} <= kernel_inputs
  assert set(epilogue.OPERAND_KINDS) == {n for n, op in OPERANDS.items() if op.routable}


@pytest.mark.parametrize("name", operands.VECTORS)
def test_a_vector_operand_costs_its_staging_in_shared_memory(name):
  # Two tiles' worth of f32, 1 KiB aligned (the SMEM budget reads the registry).
  config = GemmConfig(tile_m=128, tile_n=256)
  plain = GemmProblem(m=4096, n=4096, k=4096)
  with_vector = dataclasses.replace(plain, **{OPERANDS[name].flag: True})
  extent = config.wg_tile[1] if OPERANDS[name].kind is COLUMN else config.wg_tile[0]
  grown = config.smem_bytes(with_vector) - config.smem_bytes(plain)
  assert grown == -(-2 * extent * 4 // 1024) * 1024
  assert operands.present(with_vector) == (name,)
