"""The L2 policy of the harness and the tuner: how many input sets a timed call rotates over,
and the rotation itself."""

import doctest
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import matmul
from benchmarks.matmul import Case

autotune = importlib.import_module("pallas_gemm.tuner")


def test_docstring_examples():
  assert doctest.testmod(matmul).failed == 0


def test_cold_sets_together_exceed_four_l2s_and_one_set_fewer_would_not():
  for case in (
      Case(1, 1024, 8192),
      Case(16, 4096, 4096),
      Case(256, 11008, 4096),
      Case(4096, 4096, 4096),
      Case(64, 1024, 8192, layout="NT"),
  ):
    sets = matmul.input_sets(case)
    need = autotune.COLD_L2_FACTOR * autotune.L2_BYTES
    assert sets * matmul.case_bytes(case) >= need
    assert sets == 1 or (sets - 1) * matmul.case_bytes(case) < need


def test_big_problems_and_warm_l2_use_one_set_and_tiny_ones_are_capped():
  assert matmul.input_sets(Case(8192, 8192, 8192)) == 1
  assert matmul.input_sets(Case(16, 4096, 4096), l2="warm") == 1
  assert matmul.input_sets(Case(1, 128, 64)) == autotune.MAX_INPUT_SETS


def test_case_bytes_count_operands_output_and_bias():
  assert matmul.case_bytes(Case(2, 3, 4)) == (2 * 4 + 4 * 3 + 2 * 3) * 2
  assert matmul.case_bytes(Case(2, 3, 4, epilogue="bias_gelu")) == (2 * 4 + 4 * 3 + 2 * 3) * 2 + 12
  assert matmul.case_bytes(Case(2, 3, 4, dtype="float8_e4m3fn")) == (2 * 4 + 4 * 3) + 2 * 3 * 2


def test_unknown_l2_mode_is_rejected_by_name():
  with pytest.raises(ValueError, match="l2 must be one of"):
    matmul.input_sets(Case(16, 16, 16), l2="flushed")


def test_rotating_runs_each_set_once_in_order():
  fn = jax.jit(lambda a, b, bias: a @ b)
  case = Case(8, 16, 32, dtype="float32")
  sets = tuple(matmul.make_inputs(case, seed=s) for s in range(3))
  outs = autotune.rotating(fn, 3)(sets)
  assert len(outs) == 3
  for out, (a, b, _) in zip(outs, sets):
    np.testing.assert_allclose(np.asarray(out), np.asarray(a) @ np.asarray(b), rtol=1e-4, atol=1e-4)
  assert not np.allclose(np.asarray(outs[0]), np.asarray(outs[1]))  # distinct inputs


def test_rotating_orders_each_call_after_the_previous_output():
  """R calls of the GEMM, and R - 1 optimization barriers between them, in the lowered program."""
  fn = jax.jit(lambda a, b, bias: jnp.dot(a, b))
  case = Case(8, 16, 32, dtype="float32")
  sets = tuple(matmul.make_inputs(case, seed=s) for s in range(4))
  text = autotune.rotating(fn, 4).lower(sets).as_text()
  assert text.count("stablehlo.optimization_barrier") == 3
  assert text.count("call @") == 4
