"""int4 weights packed in WGMMA's register order (`pallas_gemm.fragments`,
`pack_fragments`): the packing on the CPU, the kernel's lowering for CUDA, the
interpreter's fallback, and the arithmetic on a GPU."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from interpret_support import hang_guard, needs_transposes  # noqa: F401 (hang_guard: autouse)

import pallas_gemm
from pallas_gemm import fragments
from pallas_gemm import weight_only as wo
from pallas_gemm import weight_only_gemm as kernel_lib


def test_element_map_is_wgmma_a_fragment_order():
  m = fragments.element_map(128, 128)
  assert m.shape == (128, 64, 2)
  assert sorted(m.ravel().tolist()) == list(range(128 * 128))  # each element once
  rows, cols = np.divmod(m, 128)
  # PTX's m64 x k16 A fragment: thread t holds rows 16 * warp + lane // 4 (+ 8) and
  # columns 2 * (lane % 4) (+ 1, + 8) of each 16-wide K slice.
  t = np.arange(128)
  assert (rows[:, 0, 0] == 16 * (t // 32) + (t % 32) // 4).all()
  assert (cols[:, 0, 0] == 2 * (t % 4)).all() and (cols[:, 0, 1] == cols[:, 0, 0] + 1).all()


def test_a_tile_of_units_holds_their_registers_row_units_outermost():
  """What `convert` relies on: a (128, 128) fragment's registers are those of its four
  (64, 64) units, row units outer, K units inner, each in the unit's own order."""
  big, unit = fragments.element_map(128, 128), fragments.element_map(64, 64)
  rows, cols = np.divmod(big, 128)
  for index, (nu, ku) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
    part = slice(16 * index, 16 * (index + 1))
    assert (rows[:, part] // 64 == nu).all() and (cols[:, part] // 64 == ku).all()
    np.testing.assert_array_equal((rows[:, part] % 64) * 64 + cols[:, part] % 64, unit)


@settings(max_examples=5, deadline=None)
@given(n_units=st.integers(1, 3), k_units=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_pack_unpack_round_trip(n_units, k_units, seed):
  q = np.random.default_rng(seed).integers(-8, 8, (64 * n_units, 64 * k_units))
  packed = fragments.pack(q)
  assert packed.dtype == jnp.int32 and packed.shape == (k_units, n_units, 4, 128)
  np.testing.assert_array_equal(np.asarray(fragments.unpack(packed)), q)


def test_pack_fragments_keeps_the_weight_and_names_what_it_cannot_pack():
  w = jnp.asarray(np.random.default_rng(1).standard_normal((256, 192)), jnp.float32)
  qw = wo.quantize_weights(w, bits=4, group_size=128)
  packed = pallas_gemm.pack_fragments(qw)
  assert packed.fragments and packed.shape == qw.shape == (256, 192) and packed.bits == 4
  np.testing.assert_array_equal(wo.dequantize_weights(packed), wo.dequantize_weights(qw))
  assert wo.pack_fragments(packed) is packed
  back = wo.block_weights(packed)
  assert not back.fragments and back.k_block == 128
  with pytest.raises(ValueError, match="one int4"):
    wo.pack_fragments(wo.quantize_weights(w, bits=8))
  with pytest.raises(ValueError, match="multiples of 64"):
    fragments.pack(np.zeros((100, 128), np.int8))
  with pytest.raises(ValueError, match="fragments=True"):
    _ = dataclasses.replace(packed, values=packed.values[..., :64]).shape


def test_fragments_problem_names_the_rule_it_breaks():
  problem = kernel_lib.WeightOnlyProblem(m=16, n=512, k=512, bits=4, group_size=128, fragments=True)
  config = wo.default_config(problem, 132)
  config.validate(problem)
  with pytest.raises(ValueError, match="fragments needs int4"):
    config.validate(dataclasses.replace(problem, bits=8))
  with pytest.raises(ValueError, match="dequant='registers'"):
    dataclasses.replace(config, dequant="smem").validate(problem)
  with pytest.raises(ValueError, match="N a multiple of 64"):
    config.validate(dataclasses.replace(problem, n=520))


def _case(m, n, k, zeros=False, seed=0, dtype=jnp.bfloat16):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((m, k)), dtype)
  w = jnp.asarray(rng.standard_normal((k, n)), jnp.float32)
  qw = wo.quantize_weights(w, bits=4, group_size=128, symmetric=not zeros, dtype=dtype)
  ref = np.asarray(x, np.float64) @ np.asarray(wo.dequantize_weights(qw), np.float64)
  return x, wo.pack_fragments(qw), ref


def _rel(y, ref):
  y = np.asarray(jnp.asarray(y, jnp.float32), np.float64)
  return np.linalg.norm(y - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("m", [16, 64])
def test_fragments_kernel_lowers_for_cuda(m):
  x, qw, _ = _case(m, 512, 1024)
  exported = jax.export.export(
      jax.jit(lambda x, qw: wo.quantized_matmul(x, qw, implementation="pallas")),
      platforms=["cuda"],
  )(x, qw)
  assert "mosaic_gpu" in exported.mlir_module()


@needs_transposes
def test_the_interpreter_runs_packed_weights_in_k_blocks():
  x, qw, ref = _case(5, 128, 256, zeros=True)
  assert _rel(wo.quantized_matmul(x, qw, implementation="interpret"), ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,n,k,zeros,dtype",
    [
        (1, 512, 1024, False, jnp.bfloat16),
        (13, 768, 512, True, jnp.bfloat16),
        (16, 1088, 4096, False, jnp.float16),  # N = 1088: a partial tile of 256 rows
        (64, 4096, 4096, True, jnp.bfloat16),  # the "tile" output, scales on the weights
        (300, 1024, 2048, False, jnp.bfloat16),  # prefill
    ],
)
def test_fragments_kernel_matches_float64(m, n, k, zeros, dtype):
  x, qw, ref = _case(m, n, k, zeros=zeros, dtype=dtype)
  y = wo.quantized_matmul(x, qw, implementation="pallas")
  assert y.shape == (m, n)
  assert _rel(y, ref) < 1e-2


@pytest.mark.parametrize("hopper", [True, False])
def test_quantize_weights_packs_by_default_where_the_kernel_reads_it(monkeypatch, hopper):
  monkeypatch.setattr(wo._compat, "on_hopper", lambda: hopper)
  w = jnp.ones((256, 192), jnp.float32)
  assert wo.quantize_weights(w, bits=4).fragments == hopper  # elsewhere XLA would gather
  assert not wo.quantize_weights(w, bits=8).fragments
  assert not wo.quantize_weights(w[:, :100], bits=4).fragments  # N not a multiple of 64
  assert not wo.quantize_weights(w, bits=4, k_block=128).fragments  # a layout asked for
  assert not wo.quantize_weights(jnp.ones((2, 256, 192)), bits=4).fragments  # experts
  assert wo.quantize_weights(w, bits=4, fragments=True).fragments
