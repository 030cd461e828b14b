"""int4 weights packed in WGMMA's register order (`pallas_gemm.fragments`): the packing
on the CPU, the kernel's lowering for CUDA, and its arithmetic on a GPU."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

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


@settings(max_examples=10, deadline=None)
@given(
    rows=st.sampled_from([64, 128]),
    warpgroups=st.sampled_from([1, 2]),
    n_tiles=st.integers(1, 2),
    k_tiles=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_pack_unpack_round_trip(rows, warpgroups, n_tiles, k_tiles, seed):
  q = np.random.default_rng(seed).integers(-8, 8, (n_tiles * warpgroups * rows, k_tiles * 128))
  packed = fragments.pack(q, rows, 128, warpgroups)
  assert packed.dtype == np.int32 and packed.nbytes * 2 == q.size
  assert packed.shape[:2] == (n_tiles, k_tiles)
  np.testing.assert_array_equal(fragments.unpack(packed, rows, 128, warpgroups), q)


def test_pack_rejects_tiles_it_cannot_split_into_whole_loads():
  with pytest.raises(ValueError, match="16-byte loads"):
    fragments.pack(np.zeros((64, 32), np.int64), 64, 32, 1)
  with pytest.raises(ValueError, match="must tile"):
    fragments.pack(np.zeros((100, 128), np.int64), 64, 128, 1)


def _case(m, n, k, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  q = rng.integers(-8, 8, (n, k))
  scales = jnp.asarray(rng.uniform(0.5, 1.5, (k // 128, n)), jnp.bfloat16)
  problem = kernel_lib.WeightOnlyProblem(m=m, n=n, k=k, bits=4, group_size=128)
  config = wo.default_config(problem, 132)
  packed = jnp.asarray(fragments.pack(q, config.rows_per_wg, config.tile_k, config.consumers))
  return x, q, scales, dataclasses.replace(problem, fragments=True), config, packed


def _call(x, packed, scales, problem, config):
  return kernel_lib.weight_only_gemm(x, packed, scales, None, problem=problem, config=config)


def test_fragments_problem_names_the_rule_it_breaks():
  *_, problem, config, _ = _case(16, 512, 512)
  with pytest.raises(ValueError, match="fragments needs int4"):
    config.validate(dataclasses.replace(problem, bits=8))
  with pytest.raises(ValueError, match="dequant='registers'"):
    dataclasses.replace(config, dequant="smem").validate(problem)
  with pytest.raises(ValueError, match="N a multiple of tile_n"):
    config.validate(dataclasses.replace(problem, n=520))


def test_fragments_kernel_lowers_for_cuda():
  x, _, scales, problem, config, packed = _case(16, 512, 1024)
  exported = jax.export.export(jax.jit(lambda *a: _call(*a, problem, config)), platforms=["cuda"])(
      x, packed, scales
  )
  assert "mosaic_gpu" in exported.mlir_module()


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 512, 1024), (16, 768, 384), (13, 1024, 4096)])
def test_fragments_kernel_matches_float64(m, n, k):
  rows = -(-m // 8) * 8
  x, q, scales, problem, config, packed = _case(m, n, k)
  x_in = jnp.pad(x, ((0, rows - m), (0, 0)))
  out = _call(x_in, packed, scales, dataclasses.replace(problem, m=rows), config)
  y = np.asarray(out.sum(0)[:, :m].T, np.float64)
  deq = q * np.repeat(np.asarray(scales, np.float64), 128, 0).T
  ref = np.asarray(x, np.float64) @ deq.T
  assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-3
