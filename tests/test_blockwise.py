"""Blockwise-scaled fp8 (`pallas_gemm.blockwise`): the quantizer's blocks, scales and
saturation; the GEMM against float64 of the dequantized operands on XLA and on the
kernel in GPU interpret mode, at shapes that are not multiples of a block or tile,
for every scale granularity; the CUDA lowering; bad input."""

import dataclasses
import zlib

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_gemm
from pallas_gemm import _compat
from pallas_gemm import block_mma
from pallas_gemm import blockwise as bw
from pallas_gemm import compile_once
from pallas_gemm.config import GemmConfig
from tests.interpret_support import hang_guard, needs_transposes  # noqa: F401
from hypothesis_budget import examples

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2


def _normal(shape, scale=1.0, seed=0):
  rng = np.random.default_rng(zlib.crc32(repr((shape, scale, seed)).encode()))
  return jnp.asarray((scale * rng.standard_normal(shape)).astype(np.float32))


def _rel(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30)


# Jitted as a caller runs it (the quantizer is written as one fused XLA pass): one compile
# per example's shapes instead of one per primitive of the eager path.
_quantize = jax.jit(bw.quantize_blockwise, static_argnums=(1, 2))
_dequantize = jax.jit(bw.dequantize_blockwise, static_argnums=(2,))


@hypothesis.settings(max_examples=examples(10), deadline=None)  # each example jits new shapes
@hypothesis.given(
    m=st.integers(1, 300),
    k=st.integers(1, 300),
    block=st.sampled_from([(1, 128), (128, 128), (128, 1), (3, 7)]),
    dtype=st.sampled_from([E4M3, E5M2]),
)
def test_quantize_blockwise_round_trips_within_the_dtype_precision(m, k, block, dtype):
  x = _normal((m, k), 3.0, seed=m * 1000 + k)
  q, scales = _quantize(x, block, dtype)
  assert q.shape == (m, k) and q.dtype == jnp.dtype(dtype)
  assert scales.shape == (-(-m // block[0]), -(-k // block[1])) and scales.dtype == jnp.float32
  back = _dequantize(q, scales, block)
  # each element within half an fp8 ulp of its block's amax-relative grid
  eps = float(jnp.finfo(dtype).eps)
  full = np.repeat(np.repeat(np.asarray(scales), block[0], 0), block[1], 1)[:m, :k]
  bound = eps * np.maximum(np.abs(np.asarray(x)), full * float(jnp.finfo(dtype).tiny) * 8)
  assert np.all(np.abs(np.asarray(back) - np.asarray(x)) <= bound + 1e-30)
  # every block's amax maps to the largest finite value (a partial block by its own amax)
  amax = np.abs(np.asarray(q, np.float32)).max()
  assert amax == float(jnp.finfo(dtype).max)


def test_zero_blocks_get_scale_one_and_nan_propagates():
  x = jnp.zeros((4, 256)).at[0, 200].set(jnp.nan)
  q, scales = bw.quantize_blockwise(x)
  assert scales.tolist()[1:] == [[1.0, 1.0]] * 3
  assert np.isnan(scales[0, 1]) and scales[0, 0] == 1.0
  assert not np.isnan(np.asarray(q[1:], np.float32)).any()


def _operands(m, n, k, b_block, dtypes=(E4M3, E4M3), seed=0):
  x = _normal((m, k), seed=seed)
  w = _normal((n, k), k**-0.5, seed=seed + 1)
  xq, xs = bw.quantize_blockwise(x, (1, 128), dtypes[0])
  wq, ws = bw.quantize_blockwise(w, b_block, dtypes[1])
  return xq, wq, xs, ws


def _reference(xq, wq, xs, ws, b_block, bias=None, residual=None, act=None):
  a = np.asarray(bw.dequantize_blockwise(xq, xs), np.float64)
  b = np.asarray(bw.dequantize_blockwise(wq, ws, b_block), np.float64)
  y = a @ b.T + (0.0 if bias is None else np.asarray(bias, np.float64))
  if act is not None:
    y = act(y)
  return y + (0.0 if residual is None else np.asarray(residual, np.float64))


@pytest.mark.parametrize(
    "implementation", ["xla", pytest.param("interpret", marks=needs_transposes)]
)
@pytest.mark.parametrize(
    "b_block,dtypes",
    [((128, 128), (E4M3, E4M3)), ((1, 128), (E4M3, E4M3)), ((128, 128), (E4M3, E5M2))],
    ids=["square", "per_row", "mixed"],
)
def test_matches_float64_of_the_dequantized_operands(implementation, b_block, dtypes):
  # 200 x 136 x 300: partial tiles in M and N, a partial last K block.
  xq, wq, xs, ws = _operands(200, 136, 300, b_block, dtypes)
  y = bw.blockwise_scaled_matmul(
      xq, wq, xs, ws, out_dtype=jnp.float32, implementation=implementation
  )
  assert y.shape == (200, 136) and y.dtype == jnp.float32
  assert _rel(y, _reference(xq, wq, xs, ws, b_block)) < 1e-6


@needs_transposes
@pytest.mark.parametrize(
    "depth,k",
    [
        pytest.param(1, 600, marks=pytest.mark.slow),
        pytest.param(2, 600, marks=pytest.mark.slow),
        (2, 520),
        (2, 100),
    ],
)
def test_promotion_depths_agree_in_interpret_mode(depth, k):
  # depth 2 with 5, 4 and 1 K blocks: pairs and a single step, pairs only, a single step
  xq, wq, xs, ws = _operands(130, 136, k, (128, 128), seed=6)
  config = dataclasses.replace(
      bw.block_config(_problem(130, 136, k)), promotion_depth=depth, num_sms=2
  )
  y = bw.blockwise_scaled_matmul(
      xq, wq, xs, ws, out_dtype=jnp.float32, config=config, implementation="interpret"
  )
  assert _rel(y, _reference(xq, wq, xs, ws, (128, 128))) < 1e-6


def _problem(m, n, k):
  from pallas_gemm.config import GemmProblem

  return GemmProblem(
      m=m, n=n, k=k, dtype="float8_e4m3fn", out_dtype="float32", transpose_b=True, block_scaled=True
  )


@needs_transposes  # fp8 B is read through a transposed view
def test_the_epilogue_in_interpret_mode():
  xq, wq, xs, ws = _operands(130, 256, 384, (128, 128), seed=3)
  bias, residual = _normal((256,), seed=4), _normal((130, 256), seed=5).astype(jnp.bfloat16)
  y = bw.blockwise_scaled_matmul(
      xq, wq, xs, ws, bias=bias, activation="gelu", residual=residual, implementation="interpret"
  )
  ref = _reference(
      xq, wq, xs, ws, (128, 128), bias, residual, lambda v: jax.nn.gelu(v, approximate=True)
  )
  assert y.dtype == jnp.bfloat16 and not np.isnan(np.asarray(y, np.float32)).any()
  assert _rel(y, np.asarray(ref)) < 1e-2


@pytest.mark.parametrize("depth", [1, 2])
def test_lowers_for_cuda_at_deepseek_shapes(depth):
  # 128, 56 and 1 K blocks: depth 2's pairs, then one step or none
  for m, n, k in ((4096, 7168, 16384), (1000, 2112, 7168), (256, 384, 128)):
    f8 = jax.ShapeDtypeStruct
    args = (
        f8((m, k), E4M3),
        f8((n, k), E4M3),
        f8((m, -(-k // 128)), jnp.float32),
        f8((-(-n // 128), -(-k // 128)), jnp.float32),
    )
    config = dataclasses.replace(bw.block_config(_problem(m, n, k)), promotion_depth=depth)
    f = jax.jit(lambda *a: bw.blockwise_scaled_matmul(*a, config=config, implementation="pallas"))
    text = jax.export.export(f, platforms=["cuda"])(*args).mlir_module()
    assert compile_once.module_kernel_count(text) == 1


@pytest.mark.parametrize("tail", [False, True])
def test_stream_k_lowers_for_cuda(tail):
  # 4 x 17 tiles of 57 K blocks on 5 workers: 3 split tiles, then whole ones; the tail
  # split on 32: 2 waves, then 4 tiles in 4 slices of 14-15 blocks each
  m, n, k = 500, 2112, 7168 + 64
  s = jax.ShapeDtypeStruct
  args = (s((m, k), E4M3), s((n, k), E4M3), s((m, 57), jnp.float32), s((17, 57), jnp.float32))
  config = dataclasses.replace(
      bw.block_config(_problem(m, n, k)), stream_k=True, split_tail=tail, num_sms=32 if tail else 5
  )
  f = jax.jit(lambda *a: bw.blockwise_scaled_matmul(*a, config=config, implementation="pallas"))
  text = jax.export.export(f, platforms=["cuda"])(*args).mlir_module()
  assert compile_once.module_kernel_count(text) == 1


@needs_transposes  # fp8 B is read through a transposed view
def test_stream_k_is_refused_in_interpret_mode():
  xq, wq, xs, ws = _operands(130, 136, 256, (128, 128))
  config = dataclasses.replace(bw.block_config(_problem(130, 136, 256)), stream_k=True)
  with pytest.raises(ValueError, match="stream_k=True: GPU interpret mode"):
    bw.blockwise_scaled_matmul(xq, wq, xs, ws, config=config, implementation="interpret")


@pytest.mark.parametrize(
    "k,b_dtype",
    [
        (7168, E4M3),
        (7168 + 64, E4M3),
        pytest.param(
            7168 + 64,
            jnp.float8_e5m2,
            marks=pytest.mark.skipif(
                not _compat.SUPPORTS_MIXED_FP8, reason="mixed fp8 WGMMA needs jax >= 0.11"
            ),
        ),
    ],
)
def test_k_blocks_overwrite_fresh_registers_on_hardware(k, b_dtype):
  # `block_mma`: each K block's first WGMMA has scale-d = 0 (no zeroed accumulator), at
  # the 128-byte swizzle and, where K is an odd number of 64-byte rows, the 64-byte one
  m, n = 1000, 2112
  s = jax.ShapeDtypeStruct
  args = (s((m, k), E4M3), s((n, k), b_dtype), s((m, -(-k // 128)), jnp.float32))
  args += (s((-(-n // 128), -(-k // 128)), jnp.float32),)
  f = jax.jit(lambda *a: bw.blockwise_scaled_matmul(*a, implementation="pallas"))
  text = jax.export.export(f, platforms=["cuda"])(*args).mlir_module()
  b_type = "e4m3" if b_dtype == E4M3 else "e5m2"
  assert "setp.ne.b32 p, 0, 0;" in text
  assert f"wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.{b_type}" in text


def test_block_descriptors_step_through_each_swizzle_span():
  # 32 bytes per instruction inside a swizzle span; SMEM tiled (8, swizzle bytes) keeps
  # a row tile's spans together, so the next span starts 8 * swizzle bytes on
  for swizzle in (32, 64, 128):
    bits = block_mma.descriptor_bits(E4M3, (64, 128), swizzle)
    starts = [(b & 0x3FFF) << 4 for b in bits]
    per_span = swizzle // 32
    assert starts == [(i // per_span) * 8 * swizzle + (i % per_span) * 32 for i in range(4)]
    assert {b >> 14 for b in bits} == {bits[0] >> 14}  # same LBO, SBO and swizzle mode


def test_block_config():
  from pallas_gemm.config import GemmProblem

  problem = GemmProblem(
      m=4096, n=7168, k=16384, dtype="float8_e4m3fn", transpose_b=True, block_scaled=True
  )
  cfg = bw.block_config(problem)
  cfg.validate(problem)
  assert (cfg.tile_k, cfg.tile_n, cfg.split_k, cfg.cluster) == (128, 128, 1, (1, 1))
  assert cfg.promotion_depth == 2
  # 64x32 epilogue stores leave room for a sixth stage (NOTES exp. 116)
  assert (cfg.epilogue_tile, cfg.stages) == ((64, 32), 6)
  # per-row B scales (the weight gradient's, jax.nn.scaled_matmul's): a full factor array
  # per block, so one block in flight (two spill)
  for rows, block_k in ((1, 128), (1, 32)):
    per_row = dataclasses.replace(problem, b_scale_rows=rows, scale_block_k=block_k)
    assert bw.block_config(per_row).promotion_depth == 1
  # stream-K only where whole tiles would run a second, nearly empty wave (NOTES exp. 124):
  # 1024x2112 is 136 tiles, 1.03 waves on 132 SMs, 1.19 on 114
  assert not cfg.stream_k  # 13.6 waves
  just_over = dataclasses.replace(problem, m=1024, n=2112, k=7168)
  assert bw.block_config(just_over, num_sms=132).stream_k
  on_114 = bw.block_config(just_over, num_sms=114)  # 22 tail tiles: 4 slices each
  assert on_114.stream_k and on_114.split_tail
  assert not bw.block_config(dataclasses.replace(just_over, k=2048), num_sms=132).stream_k
  bw.block_config(just_over, num_sms=132).validate(just_over)
  assert not bw.block_config(just_over, num_sms=132).split_tail  # balanced ranges there
  # past that, the last wave in K slices of >= 12 blocks: 448 tiles = 3 waves + 52 in 2
  tail = dataclasses.replace(problem, m=1024)
  assert (bw.block_config(tail, num_sms=132).stream_k, bw.block_config(tail).split_tail) == (
      True,
      True,
  )
  short = dataclasses.replace(tail, k=2048)  # 16 blocks: one slice of 8 would lose
  assert not bw.block_config(short, num_sms=132).split_tail


def test_bad_input_names_the_argument():
  xq, wq, xs, ws = _operands(8, 16, 256, (128, 128))
  with pytest.raises(TypeError, match="a must be one of"):
    bw.blockwise_scaled_matmul(xq.astype(jnp.bfloat16), wq, xs, ws)
  with pytest.raises(ValueError, match="must share K"):
    bw.blockwise_scaled_matmul(xq, wq[:, :128], xs, ws)
  with pytest.raises(ValueError, match=r"a_scales must have shape \(8, 2\)"):
    bw.blockwise_scaled_matmul(xq, wq, xs[:, :1], ws)
  with pytest.raises(ValueError, match=r"b_scales must have shape \(1, 2\)"):
    bw.blockwise_scaled_matmul(xq, wq, xs, ws[:, :1])
  with pytest.raises(ValueError, match=r"bias must have shape \(N,\) = \(16,\)"):
    bw.blockwise_scaled_matmul(xq, wq, xs, ws, bias=jnp.ones(8))
  with pytest.raises(ValueError, match="block must be a pair of positive ints"):
    bw.quantize_blockwise(jnp.ones((4, 4)), block=(0, 128))
  with pytest.raises(TypeError, match="dtype must be one of"):
    bw.quantize_blockwise(jnp.ones((4, 4)), dtype=jnp.int8)
  with pytest.raises(ValueError, match="a blockwise-scaled GEMM runs tile_n=128"):
    bw.blockwise_scaled_matmul(
        xq, wq, xs, ws, implementation="pallas", config=GemmConfig(tile_k=128, tile_n=256)
    )


# -- MXFP8: 32-wide K blocks, power-of-two (E8M0) scales, per row on both operands ---------
def _mx_operands(m, n, k, seed=0, dtypes=(E4M3, E4M3)):
  x = _normal((m, k), seed=seed)
  w = _normal((n, k), k**-0.5, seed=seed + 1)
  xq, xs = bw.quantize_blockwise(x, (1, 32), dtypes[0], power_of_two=True)
  wq, ws = bw.quantize_blockwise(w, (1, 32), dtypes[1], power_of_two=True)
  return xq, wq, xs, ws


def _mx_reference(xq, wq, xs, ws):
  a = np.asarray(bw.dequantize_blockwise(xq, xs, (1, 32)), np.float64)
  return a @ np.asarray(bw.dequantize_blockwise(wq, ws, (1, 32)), np.float64).T


def test_power_of_two_scales_are_exact_in_e8m0_and_never_saturate():
  x = _normal((5, 100), 37.0, seed=20)
  q, s = bw.quantize_blockwise(x, (1, 32), power_of_two=True)
  assert np.array_equal(np.asarray(s.astype(jnp.float8_e8m0fnu).astype(jnp.float32)), np.asarray(s))
  assert float(jnp.max(jnp.abs(q.astype(jnp.float32)))) <= 448.0
  back = bw.dequantize_blockwise(q, s, (1, 32))
  assert _rel(back, x) < 4e-2  # e4m3's 3 mantissa bits


@pytest.mark.parametrize(
    "implementation", ["xla", pytest.param("interpret", marks=needs_transposes)]
)
def test_mxfp8_blocks_match_float64(implementation):
  # 200 x 136 x 300: partial tiles, and a last 32-block of 12 columns
  xq, wq, xs, ws = _mx_operands(200, 136, 300, seed=21)
  y = bw.blockwise_scaled_matmul(
      xq, wq, xs, ws, out_dtype=jnp.float32, block_k=32, implementation=implementation
  )
  assert _rel(y, _mx_reference(xq, wq, xs, ws)) < 1e-6


@pytest.mark.parametrize(
    "implementation", ["xla", pytest.param("interpret", marks=needs_transposes)]
)
def test_nn_scaled_matmul_is_jax_nn_scaled_matmul(implementation):
  # jax.nn.scaled_matmul's arguments: (B, M, K) and (B, N, K) fp8, E8M0 scales per 32
  operands = [_mx_operands(70, 40, 96, seed=22 + i) for i in range(2)]
  lhs, rhs, ls, rs = (jnp.stack([o[j] for o in operands]) for j in range(4))
  ls, rs = ls.astype(jnp.float8_e8m0fnu), rs.astype(jnp.float8_e8m0fnu)
  got = pallas_gemm.nn_scaled_matmul(lhs, rhs, ls, rs, implementation=implementation)
  assert got.shape == (2, 70, 40) and got.dtype == jnp.float32
  ref = np.stack([_mx_reference(*o) for o in operands])
  assert _rel(got, ref) < 1e-6
  if _compat.SCALED_MATMUL_ON_CPU:  # jax's own, where it runs here: the same semantics
    want = jax.nn.scaled_matmul(lhs, rhs, ls, rs, preferred_element_type=jnp.float32)
    assert _rel(want, ref) < 1e-5


def test_nn_scaled_matmul_bad_input_names_the_argument():
  lhs, rhs = jnp.ones((1, 4, 64), E4M3), jnp.ones((1, 8, 64), E4M3)
  scales = lambda rows, blocks: jnp.ones((1, rows, blocks), jnp.float32)
  with pytest.raises(ValueError, match="lhs must be 3-D"):
    pallas_gemm.nn_scaled_matmul(lhs[0], rhs, scales(4, 2), scales(8, 2))
  with pytest.raises(ValueError, match="must share B and K"):
    pallas_gemm.nn_scaled_matmul(lhs, rhs[:, :, :32], scales(4, 2), scales(8, 1))
  with pytest.raises(ValueError, match=r"rhs_scales must have shape \(B, 8, K // block\)"):
    pallas_gemm.nn_scaled_matmul(lhs, rhs, scales(4, 2), scales(8, 3))
  with pytest.raises(ValueError, match="block_k must be 32 or 128"):
    bw.blockwise_scaled_matmul(lhs[0], rhs[0], scales(4, 1)[0], scales(8, 1)[0], block_k=64)
  with pytest.raises(ValueError, match=r"b_scales must have shape \(8, 2\)"):
    bw.blockwise_scaled_matmul(lhs[0], rhs[0], scales(4, 2)[0], scales(1, 2)[0], block_k=32)


def test_mxfp8_lowers_for_cuda():
  m, n, k = 4096, 7168, 7168
  f8 = jax.ShapeDtypeStruct
  args = (
      f8((m, k), E4M3),
      f8((n, k), E4M3),
      f8((m, k // 32), jnp.float32),
      f8((n, k // 32), jnp.float32),
  )
  f = jax.jit(lambda *a: bw.blockwise_scaled_matmul(*a, block_k=32, implementation="pallas"))
  text = jax.export.export(f, platforms=["cuda"])(*args).mlir_module()
  assert compile_once.module_kernel_count(text) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("k", [7168, 7168 + 48])
def test_mxfp8_on_the_gpu_against_float64(k):
  xq, wq, xs, ws = _mx_operands(1000, 2112, k, seed=23)
  y = bw.blockwise_scaled_matmul(xq, wq, xs, ws, out_dtype=jnp.float32, block_k=32)
  assert _rel(y, _mx_reference(xq, wq, xs, ws)) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize(
    "b_block,k,depth", [((128, 128), 7168 + 64, 1), ((128, 128), 7168, 2), ((1, 128), 7168 + 64, 2)]
)
def test_on_the_gpu_against_float64(b_block, k, depth):
  # 57 and 56 K blocks: depth 2 ends on a single step or on a pair
  xq, wq, xs, ws = _operands(1000, 2112, k, b_block)
  problem = dataclasses.replace(_problem(1000, 2112, k), b_scale_rows=b_block[0])
  config = dataclasses.replace(bw.block_config(problem), promotion_depth=depth)
  y = bw.blockwise_scaled_matmul(xq, wq, xs, ws, out_dtype=jnp.float32, config=config)
  # fp8 WGMMA adds its products with a shortened mantissa inside each 128-wide K block
  # (1.3e-4 measured on the H100; the f32 promotion keeps it from growing with K); a
  # wrong scale or block gives errors of order 1.
  assert _rel(y, _reference(xq, wq, xs, ws, b_block)) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize(
    "b_block,k,depth,sms,tail",
    [
        ((128, 128), 7168 + 64, 2, 7, False),
        ((128, 128), 7168, 1, 20, False),
        ((1, 128), 7168 + 64, 2, 13, False),
        ((128, 128), 7168 + 64, 2, 132, True),
        ((1, 128), 7168, 1, 100, True),
    ],
)
def test_stream_k_on_the_gpu_against_float64(b_block, k, depth, sms, tail):
  # 136 tiles on 7, 20 or 13 workers: the last waves split at K-block granularity, each
  # unit's promoted sum an f32 partial that the tile's finisher adds; the tail split on
  # 132 workers: one wave, then 4 tiles in 4 slices of 14-15 K blocks (on 100: 36 in 2)
  xq, wq, xs, ws = _operands(1000, 2112, k, b_block, seed=29)
  problem = dataclasses.replace(_problem(1000, 2112, k), b_scale_rows=b_block[0])
  config = dataclasses.replace(
      bw.block_config(problem),
      promotion_depth=depth,
      stream_k=True,
      split_tail=tail,
      num_sms=sms,
  )
  y = bw.blockwise_scaled_matmul(xq, wq, xs, ws, out_dtype=jnp.float32, config=config)
  assert _rel(y, _reference(xq, wq, xs, ws, b_block)) < 1e-3


@pytest.mark.gpu
def test_the_linear_layer_on_the_gpu_matches_its_xla_path():
  x = _normal((3, 700, 512), seed=14).astype(jnp.bfloat16)
  w, bias = _normal((512, 1000), 512**-0.5, seed=15), _normal((1000,), seed=16)
  g = _normal((3, 700, 1000), seed=17).astype(jnp.bfloat16)
  ours = _linear_grads(None, x, w, bias, g)
  ref = _linear_grads("xla", x, w, bias, g)
  for name, got, want in zip(("y", "dx", "dw", "db"), ours, ref):
    assert _rel(got, want) < 1e-2, name


# -- blockwise_fp8_linear: the DeepSeek-V3 recipe, differentiable --------------------------
def _linear_grads(implementation, x, w, bias, g):
  def f(x, w, bias):
    return bw.blockwise_fp8_linear(x, w, bias, implementation=implementation)

  y, vjp = jax.vjp(f, x, w, bias)
  return (y, *vjp(g))


@pytest.mark.slow
def test_fp8_linear_tracks_the_exact_layer_within_fp8_error():
  x = _normal((3, 70, 256), seed=7).astype(jnp.bfloat16)
  w = _normal((256, 200), 256**-0.5, seed=8)
  bias, g = _normal((200,), seed=9), _normal((3, 70, 200), seed=10).astype(jnp.bfloat16)
  y, dx, dw, db = _linear_grads("xla", x, w, bias, g)
  assert (y.dtype, dx.dtype, dw.dtype, db.dtype) == (
      jnp.bfloat16,
      jnp.bfloat16,
      w.dtype,
      bias.dtype,
  )
  x64, w64, g64 = (np.asarray(v, np.float64) for v in (x, w, g))
  assert 1e-3 < _rel(y, x64 @ w64 + np.asarray(bias)) < 6e-2  # it did quantize, and closely
  assert _rel(dx, g64 @ w64.T) < 6e-2
  assert _rel(dw, np.einsum("bmk,bmn->kn", x64, g64)) < 6e-2
  assert _rel(db, g64.sum((0, 1))) < 1e-2


@pytest.mark.slow  # ~9 s; skipped on jax 0.10 anyway
@needs_transposes
def test_fp8_linear_kernels_match_the_xla_path_in_interpret_mode():
  x = _normal((130, 256), seed=11).astype(jnp.bfloat16)
  w, bias = _normal((256, 136), 256**-0.5, seed=12), None
  g = _normal((130, 136), seed=13).astype(jnp.bfloat16)
  ours = _linear_grads("interpret", x, w, bias, g)
  ref = _linear_grads("xla", x, w, bias, g)
  for name, got, want in zip(("y", "dx", "dw"), ours, ref):
    assert _rel(got, want) < 1e-2, name


def test_fp8_linear_bad_input():
  with pytest.raises(ValueError, match=r"x must be \(..., K\) and w \(K, N\)"):
    bw.blockwise_fp8_linear(jnp.ones((4, 8)), jnp.ones((9, 4)))
  with pytest.raises(TypeError, match="dtype must be one of"):
    bw.blockwise_fp8_linear(jnp.ones((4, 8)), jnp.ones((8, 4)), dtype=jnp.bfloat16)


def test_the_dot_general_runs_dense_contractions_blockwise_and_others_as_lax():
  f = bw.make_blockwise_fp8_dot_general(implementation="xla")
  x, w = _normal((3, 5, 256), seed=20), _normal((256, 136), 256**-0.5, seed=21)
  dense = (((2,), (0,)), ((), ()))
  y = f(x, w, dense)
  np.testing.assert_array_equal(
      np.asarray(y), np.asarray(bw.blockwise_fp8_linear(x, w, implementation="xla"))
  )
  y_nk = f(x, w.T, (((2,), (1,)), ((), ())))  # weights stored (N, K)
  np.testing.assert_array_equal(np.asarray(y_nk), np.asarray(y))
  assert 1e-3 < _rel(y, np.asarray(x, np.float64) @ np.asarray(w, np.float64)) < 6e-2
  # a batched contraction (attention-like) is lax's, exactly
  q, k = _normal((2, 8, 16), seed=22), _normal((2, 8, 16), seed=23)
  batched = (((2,), (2,)), ((0,), (0,)))
  np.testing.assert_array_equal(
      np.asarray(f(q, k, batched)), np.asarray(jax.lax.dot_general(q, k, batched))
  )


@pytest.mark.slow
@needs_transposes
def test_the_benchmark_runs_on_the_cpu(capsys):
  from benchmarks import blockwise_fp8 as harness

  # Shapes below the smoke defaults (the kernels at those run in the tests above), still
  # partial in every dimension: the harness's checks, contenders and table are the subject.
  smoke = ["--cpu-smoke", "--rounds", "1", "--iterations", "1"]
  assert harness.main([*smoke, "--shapes", "72x136x136"]) == 0
  out = capsys.readouterr().out.splitlines()
  assert "pallas_gemm=" in " ".join(out) and out[-1].startswith("| 72x136x136 |")
  assert harness.main([*smoke, "--grouped", "--shapes", "2x72x136x136"]) == 0
  assert capsys.readouterr().out.splitlines()[-1].startswith("| 2x72x136x136 |")
  # each expert's rows a multiple of 128: 300 rows give two 128-row blocks and a 44-row tail
  assert harness.main([*smoke, "--grouped", "--aligned", "--shapes", "2x300x136x136"]) == 0
  assert capsys.readouterr().out.splitlines()[-1].startswith("| 2x300x136x136 aligned |")


def test_aligned_grouped_inputs_give_each_expert_whole_128_row_blocks():
  from benchmarks import blockwise_fp8 as harness

  *_, sizes = harness.grouped_inputs(3, 700, 8, 128, aligned=True)
  assert np.all(np.asarray(sizes) % 128 == 0) and int(sizes.sum()) == 640
  *_, sizes = harness.grouped_inputs(3, 700, 8, 128)
  assert int(sizes.sum()) == 700


# -- grouped (MoE) -------------------------------------------------------------------------
def _grouped(m, n, k, sizes, seed=30):
  x = _normal((m, k), seed=seed)
  w = _normal((len(sizes), n, k), k**-0.5, seed=seed + 1)
  xq, xs = bw.quantize_blockwise(x)
  wq, ws = jax.vmap(lambda v: bw.quantize_blockwise(v, (128, 128)))(w)
  return xq, wq, xs, ws, jnp.asarray(sizes, jnp.int32)


def _grouped_reference(xq, wq, xs, ws, sizes):
  a = np.asarray(bw.dequantize_blockwise(xq, xs), np.float64)
  out, start = np.zeros((a.shape[0], wq.shape[1])), 0
  for g, size in enumerate(np.asarray(sizes)):
    b = np.asarray(bw.dequantize_blockwise(wq[g], ws[g], (128, 128)), np.float64)
    out[start : start + size] = a[start : start + size] @ b.T
    start += size
  return out


@pytest.mark.parametrize(
    "implementation", ["xla", pytest.param("interpret", marks=needs_transposes)]
)
def test_grouped_matches_float64_with_empty_groups_and_a_tail(implementation):
  # 300 rows: groups of 70, 0 and 200 rows (boxes straddle groups), 30 tail rows of zeros.
  args = _grouped(300, 136, 300, [70, 0, 200])
  y = bw.blockwise_ragged_dot(*args, out_dtype=jnp.float32, implementation=implementation)
  assert y.shape == (300, 136) and not np.isnan(np.asarray(y)).any()
  assert _rel(y, _grouped_reference(*args)) < 1e-6
  assert float(jnp.abs(y[270:]).max()) == 0.0


@pytest.mark.gpu
def test_grouped_on_the_gpu_against_float64():
  args = _grouped(3000, 1000, 2048 + 64, [700, 0, 1900, 333])  # 67 tail rows
  y = bw.blockwise_ragged_dot(*args, out_dtype=jnp.float32)
  assert _rel(y, _grouped_reference(*args)) < 1e-3  # fp8 WGMMA's in-block accumulation
  assert float(jnp.abs(y[2933:]).max()) == 0.0


@pytest.mark.gpu
def test_odd_rows_on_the_gpu_against_float64():
  """1001 rows (dense) and 3001 routed rows (grouped): A / lhs and the bf16 output go
  through the row-wise TMA views unpadded (NOTES exps. 98, 100)."""
  xq, wq, xs, ws = _operands(1001, 2112, 7168, (128, 128))
  y = bw.blockwise_scaled_matmul(xq, wq, xs, ws, out_dtype=jnp.bfloat16)
  assert _rel(y, _reference(xq, wq, xs, ws, (128, 128))) < 5e-3  # bf16 output rounding
  args = _grouped(3001, 1000, 2048, [700, 0, 1900, 333])  # 68 tail rows
  y = bw.blockwise_ragged_dot(*args, out_dtype=jnp.bfloat16)
  assert _rel(y, _grouped_reference(*args)) < 5e-3
  assert float(jnp.abs(y[2933:].astype(jnp.float32)).max()) == 0.0


def test_grouped_lowers_for_cuda_at_a_moe_shape():
  f8, f32 = E4M3, jnp.float32
  s = jax.ShapeDtypeStruct
  args = (
      s((8192, 7168), f8),
      s((8, 4096, 7168), f8),
      s((8192, 56), f32),
      s((8, 32, 56), f32),
      s((8,), jnp.int32),
  )
  f = jax.jit(lambda *a: bw.blockwise_ragged_dot(*a, implementation="pallas"))
  text = jax.export.export(f, platforms=["cuda"])(*args).mlir_module()
  assert compile_once.module_kernel_count(text) == 1 and "ragged_blockwise" in text
  assert "setp.ne.b32 p, 0, 0;" in text  # `block_mma`'s fresh registers


def test_grouped_bad_input():
  xq, wq, xs, ws, sizes = _grouped(16, 128, 256, [8, 8])
  with pytest.raises(ValueError, match="rhs must be a 3-D fp8 array"):
    bw.blockwise_ragged_dot(xq, wq[0], xs, ws, sizes)
  with pytest.raises(ValueError, match=r"rhs_scales must have shape \(2, 1, 2\)"):
    bw.blockwise_ragged_dot(xq, wq, xs, ws[:, :, :1], sizes)
  with pytest.raises(ValueError, match=r"group_sizes must have shape \(2,\)"):
    bw.blockwise_ragged_dot(xq, wq, xs, ws, sizes[:1])


# -- blockwise_fp8_ragged_linear: grouped, differentiable ----------------------------------
def _ragged_linear_case(m, k, n, sizes, seed=40):
  x = _normal((m, k), seed=seed).astype(jnp.bfloat16)
  w = _normal((len(sizes), k, n), k**-0.5, seed=seed + 1).astype(jnp.bfloat16)
  g = _normal((m, n), seed=seed + 2).astype(jnp.bfloat16)
  return x, w, jnp.asarray(sizes, jnp.int32), g


def _ragged_linear_grads(implementation, x, w, sizes, g):
  f = lambda x, w: bw.blockwise_fp8_ragged_linear(x, w, sizes, implementation=implementation)
  y, vjp = jax.vjp(f, x, w)
  return (y, *vjp(g))


@pytest.mark.slow
def test_ragged_linear_tracks_the_exact_layer_within_fp8_error():
  x, w, sizes, g = _ragged_linear_case(300, 256, 136, [70, 0, 200])  # 30 tail rows
  y, d_x, d_w = _ragged_linear_grads("xla", x, w, sizes, g)
  assert (y.dtype, d_x.dtype, d_w.dtype) == (jnp.bfloat16,) * 3
  x64, w64, g64 = (np.asarray(v, np.float64) for v in (x, w, g))
  rows = np.repeat(np.arange(3), np.asarray(sizes))  # the group of each row (270 rows)
  y_ref, dx_ref, dw_ref = np.zeros((300, 136)), np.zeros((300, 256)), np.zeros_like(w64)
  for r, e in enumerate(rows):
    y_ref[r] = x64[r] @ w64[e]
    dx_ref[r] = w64[e] @ g64[r]
    dw_ref[e] += np.outer(x64[r], g64[r])
  assert 1e-3 < _rel(y, y_ref) < 6e-2  # it did quantize, and closely
  assert _rel(d_x, dx_ref) < 6e-2 and _rel(d_w, dw_ref) < 1e-2  # wgrad is 16-bit
  assert float(jnp.abs(y[270:]).max()) == 0.0 and float(jnp.abs(d_x[270:]).max()) == 0.0


@pytest.mark.slow
@needs_transposes
def test_ragged_linear_kernels_match_the_xla_path_in_interpret_mode():
  x, w, sizes, g = _ragged_linear_case(200, 256, 136, [90, 110], seed=50)
  ours = _ragged_linear_grads("interpret", x, w, sizes, g)
  ref = _ragged_linear_grads("xla", x, w, sizes, g)
  for name, got, want in zip(("y", "dx", "dw"), ours, ref):
    assert _rel(got, want) < 1e-2, name


def test_ragged_linear_bad_input():
  with pytest.raises(ValueError, match=r"x must be \(M, K\) and w \(G, K, N\)"):
    bw.blockwise_fp8_ragged_linear(jnp.ones((4, 8)), jnp.ones((2, 9, 4)), jnp.ones(2, jnp.int32))
  with pytest.raises(ValueError, match=r"group_sizes must be \(2,\) integers"):
    bw.blockwise_fp8_ragged_linear(jnp.ones((4, 8)), jnp.ones((2, 8, 4)), jnp.ones(3, jnp.int32))


@pytest.mark.gpu
def test_ragged_linear_on_the_gpu_matches_its_xla_path():
  x, w, sizes, g = _ragged_linear_case(3000, 1024, 768, [700, 0, 1900, 333], seed=60)
  ours = _ragged_linear_grads(None, x, w, sizes, g)
  ref = _ragged_linear_grads("xla", x, w, sizes, g)
  for name, got, want in zip(("y", "dx", "dw"), ours, ref):
    assert _rel(got, want) < 1e-2, name
