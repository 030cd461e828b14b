"""int4 and int8 weights packed in WGMMA's register order (`pallas_gemm.fragments`,
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
from hypothesis_budget import examples


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


@settings(max_examples=examples(4), deadline=None)
@given(
    n_units=st.integers(1, 2),
    k_units=st.integers(1, 2),
    bits=st.sampled_from([4, 8]),
    seed=st.integers(0, 2**16),
)
def test_pack_unpack_round_trip(n_units, k_units, bits, seed):
  half = 2 ** (bits - 1)
  q = np.random.default_rng(seed).integers(-half, half, (64 * n_units, 64 * k_units))
  packed = fragments.pack(q, bits=bits)
  words = fragments.WORDS[bits]
  assert packed.dtype == jnp.int32 and packed.shape == (k_units, n_units, words, 128)
  assert fragments.bits_of(packed) == bits
  np.testing.assert_array_equal(np.asarray(fragments.unpack(packed)), q)


def test_a_stack_packs_and_unpacks_expert_by_expert():
  q = np.random.default_rng(3).integers(-128, 128, (3, 128, 64))
  packed = fragments.pack(q, bits=8)
  assert packed.shape == (3, 1, 2, 8, 128)
  for e in range(3):
    np.testing.assert_array_equal(packed[e], fragments.pack(q[e], bits=8))
  np.testing.assert_array_equal(np.asarray(fragments.unpack(packed)), q)
  with pytest.raises(ValueError, match="\\(N, K\\) or \\(E, N, K\\)"):
    fragments.pack(q[None])


def test_a_packed_weight_names_its_bits():
  x, qw, ref = _case(3, 64, 128, bits=8)
  y = wo.quantized_matmul(x, qw, bits=8, implementation="xla")
  assert _rel(y, ref) < 1e-2
  with pytest.raises(ValueError, match="bits=4 but w_q is packed int8"):
    wo.quantized_matmul(x, qw, bits=4)


def test_int8_words_hold_each_threads_registers_in_order():
  """Thread t's word v (row 4 (v // 4) + t // 32, column 4 (t % 32) + v % 4 of a unit)
  holds registers 2v and 2v + 1 of its (64, 64) fragment, byte 2i + e = register
  2v + i's element e: what the kernel's two 16-byte loads and prmt assume."""
  q = (np.arange(64 * 64).reshape(64, 64) % 251 - 125).astype(np.int64)  # distinct-ish
  packed = np.asarray(fragments.pack(q, bits=8)).view(np.uint32)[0, 0]  # (8, 128)
  emap = fragments.element_map(64, 64)  # (thread, register, element)
  flat = q.reshape(-1)
  for t in (0, 31, 32, 77, 127):
    for v in range(8):
      word = int(packed[4 * (v // 4) + t // 32, 4 * (t % 32) + v % 4])
      got = [np.int8(np.uint8((word >> (8 * b)) & 0xFF)) for b in range(4)]
      want = [flat[emap[t, 2 * v + i, e]] for i in (0, 1) for e in (0, 1)]
      assert got == want


def test_pack_fragments_keeps_the_weight_and_names_what_it_cannot_pack():
  w = jnp.asarray(np.random.default_rng(1).standard_normal((256, 192)), jnp.float32)
  qw = wo.quantize_weights(w, bits=4, group_size=128)
  packed = pallas_gemm.pack_fragments(qw)
  assert packed.fragments and packed.shape == qw.shape == (256, 192) and packed.bits == 4
  np.testing.assert_array_equal(wo.dequantize_weights(packed), wo.dequantize_weights(qw))
  assert wo.pack_fragments(packed) is packed
  back = wo.block_weights(packed)
  assert not back.fragments and back.k_block == 128
  stack = wo.quantize_weights(jnp.ones((2, 256, 192)), bits=4, fragments=False)
  packed_stack = wo.pack_fragments(stack)  # an expert stack packs expert by expert
  assert packed_stack.values.shape == (2, 4, 3, 4, 128) and packed_stack.shape == (2, 256, 192)
  np.testing.assert_array_equal(wo.dequantize_weights(packed_stack), wo.dequantize_weights(stack))
  q8 = wo.quantize_weights(w[:64, :64], bits=8, group_size=-1)
  packed8 = wo.pack_fragments(q8)
  assert packed8.values.shape == (1, 1, 8, 128) and packed8.bits == 8
  np.testing.assert_array_equal(wo.dequantize_weights(packed8), wo.dequantize_weights(q8))
  with pytest.raises(ValueError, match="multiples of 64"):
    fragments.pack(np.zeros((100, 128), np.int8))
  with pytest.raises(ValueError, match="fragments=True"):
    _ = dataclasses.replace(packed, values=packed.values[..., :64]).shape


def test_fragments_problem_names_the_rule_it_breaks():
  problem = kernel_lib.WeightOnlyProblem(m=16, n=512, k=512, bits=4, group_size=128, fragments=True)
  config = wo.default_config(problem, 132)
  config.validate(problem)
  with pytest.raises(ValueError, match="dequant='registers'"):
    dataclasses.replace(config, dequant="smem").validate(problem)
  with pytest.raises(ValueError, match="N a multiple of 64"):
    config.validate(dataclasses.replace(problem, n=520))


def _case(m, n, k, zeros=False, seed=0, dtype=jnp.bfloat16, bits=4):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((m, k)), dtype)
  w = jnp.asarray(rng.standard_normal((k, n)), jnp.float32)
  group_size = 128 if bits == 4 else -1
  qw = wo.quantize_weights(w, bits=bits, group_size=group_size, symmetric=not zeros, dtype=dtype)
  ref = np.asarray(x, np.float64) @ np.asarray(wo.dequantize_weights(qw), np.float64)
  return x, wo.pack_fragments(qw), ref


def _rel(y, ref):
  y = np.asarray(jnp.asarray(y, jnp.float32), np.float64)
  return np.linalg.norm(y - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize(
    "m,bits,dtype",
    [(16, 4, jnp.bfloat16), (64, 4, jnp.bfloat16), (1, 8, jnp.bfloat16), (16, 8, jnp.float16)],
)
def test_fragments_kernel_lowers_for_cuda(m, bits, dtype):
  x, qw, _ = _case(m, 512, 1024, bits=bits, dtype=dtype)
  exported = jax.export.export(
      jax.jit(lambda x, qw: wo.quantized_matmul(x, qw, implementation="pallas")),
      platforms=["cuda"],
  )(x, qw)
  assert "mosaic_gpu" in exported.mlir_module()


@needs_transposes
@pytest.mark.parametrize("bits", [4, pytest.param(8, marks=pytest.mark.slow)])
def test_the_interpreter_runs_packed_weights_in_k_blocks(bits):
  x, qw, ref = _case(5, 128, 256, zeros=True, bits=bits)
  assert _rel(wo.quantized_matmul(x, qw, implementation="interpret"), ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,n,k,zeros,dtype,bits",
    [
        (1, 512, 1024, False, jnp.bfloat16, 4),
        (13, 768, 512, True, jnp.bfloat16, 4),
        (16, 1088, 4096, False, jnp.float16, 4),  # N = 1088: a partial tile of 256 rows
        (64, 4096, 4096, True, jnp.bfloat16, 4),  # the "tile" output, scales on the weights
        (300, 1024, 2048, False, jnp.bfloat16, 4),  # prefill
        (1, 512, 1024, False, jnp.bfloat16, 8),  # int8: prmt into 128.0's mantissa
        (13, 4096, 4096, True, jnp.bfloat16, 8),  # the "tile" output, zeros per channel
        (16, 1088, 4096, False, jnp.float16, 8),  # int8 to f16: 1024.0's mantissa
        (200, 1024, 2048, False, jnp.bfloat16, 8),  # prefill
    ],
)
def test_fragments_kernel_matches_float64(m, n, k, zeros, dtype, bits):
  x, qw, ref = _case(m, n, k, zeros=zeros, dtype=dtype, bits=bits)
  y = wo.quantized_matmul(x, qw, implementation="pallas")
  assert y.shape == (m, n)
  assert _rel(y, ref) < 1e-2


@pytest.mark.parametrize("hopper", [True, False])
def test_quantize_weights_packs_by_default_where_the_kernel_reads_it(monkeypatch, hopper):
  monkeypatch.setattr(wo._compat, "on_hopper", lambda: hopper)
  w = jnp.ones((256, 192), jnp.float32)
  assert wo.quantize_weights(w, bits=4).fragments == hopper  # elsewhere XLA would gather
  assert wo.quantize_weights(w, bits=8, group_size=-1).fragments == hopper
  assert not wo.quantize_weights(w[:, :100], bits=4).fragments  # N not a multiple of 64
  assert not wo.quantize_weights(w, bits=4, k_block=128).fragments  # a layout asked for
  assert wo.quantize_weights(jnp.ones((2, 256, 192)), bits=4).fragments == hopper  # experts
  assert wo.quantize_weights(w, bits=4, fragments=True).fragments
