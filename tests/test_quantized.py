"""Quantized GEMMs: weight-only int4/int8 (`quantized_matmul`) and W8A8 (`int8_matmul`).

Tiers: the kernels lower for CUDA on the CPU (jax.export); their arithmetic runs in
GPU interpret mode (the weight-only kernel's shared-memory convert variant: the
interpreter has no register WGMMA operand) against float64 of the dequantized
operands, at shapes that are not multiples of the tiles; the register variant and
everything else run on the device (`gpu` marker). Bad input gets named errors.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_gemm
from pallas_gemm import _compat
from pallas_gemm import int8 as int8_lib
from pallas_gemm import weight_only as wo
from pallas_gemm import weight_only_gemm as kernel_lib
from pallas_gemm import weight_only_grouped as grouped

from interpret_support import hang_guard, needs_transposes  # noqa: F401 (hang_guard: autouse)

SLOW = pytest.mark.slow
BOUND = 4e-3
"""Relative error against float64: bf16 output rounding (2^-9) and a bf16 dequantized weight."""


def _rel_err(y, ref):
  y = np.asarray(jnp.asarray(y, jnp.float32), np.float64)
  assert y.shape == ref.shape
  assert np.isfinite(y).all(), "non-finite output"
  return np.linalg.norm(y - ref) / np.linalg.norm(ref)


def _weight_only_case(seed, m, n, k, bits, group_size, symmetric, lead=()):
  rng = np.random.default_rng(seed)
  w = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), jnp.float32)
  x = jnp.asarray(rng.standard_normal((*lead, m, k)), jnp.bfloat16)
  bias = jnp.asarray(rng.standard_normal(n), jnp.float32)
  qw = wo.quantize_weights(w, bits, group_size, symmetric=symmetric)
  ref = np.asarray(x.astype(jnp.float32), np.float64) @ np.asarray(
      wo.dequantize_weights(qw), np.float64
  )
  ref = ref + np.asarray(bias, np.float64)
  return x, qw, bias, ref / (1 + np.exp(-ref))  # silu


def _split_k_default(problem):
  """The decode default where the kernel does not store the output (f32): split-K."""
  return wo.default_config(dataclasses.replace(problem, out_dtype="float32"), 132)


# -- lowering for CUDA (export) ----------------------------------------------------------
@pytest.mark.parametrize(
    "bits,group_size,zeros,dequant",
    [
        (4, 128, False, "registers"),
        (4, 128, True, "smem"),
        (8, 4096, True, "registers"),
        (8, 256, False, "smem"),
    ],
)
@pytest.mark.parametrize("k_block", [0, 128])
def test_weight_only_kernel_lowers_for_cuda(bits, group_size, zeros, dequant, k_block):
  m, n, k = 16, 1024, 4096
  problem = kernel_lib.WeightOnlyProblem(
      m=m, n=n, k=k, bits=bits, group_size=group_size, zeros=zeros, k_block=k_block
  )
  config = wo.default_config(problem, 132, dequant=dequant)
  grouped = not problem.per_channel
  stored = (k // k_block, n, k_block) if k_block else (n, k)
  args = (
      jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
      jax.ShapeDtypeStruct(stored, jnp.int4 if bits == 4 else jnp.int8),
      jax.ShapeDtypeStruct((k // group_size, n), jnp.bfloat16) if grouped else None,
      jax.ShapeDtypeStruct((k // group_size, n), jnp.bfloat16) if grouped and zeros else None,
  )
  f = lambda x, w, s, z: kernel_lib.weight_only_gemm(x, w, s, z, problem=problem, config=config)
  text = jax.export.export(jax.jit(f), platforms=["cuda"])(*args).mlir_module()
  assert "mosaic_gpu" in text


@pytest.mark.parametrize(
    "m,n,k,bits,group_size,zeros,dequant",
    [
        (304, 14336, 4096, 4, 128, False, "registers"),  # 160 tokens, the "tile" output
        (304, 4096, 14336, 4, 128, True, "registers"),  # split-K partials in 80-token stores
        (200, 1024, 2048, 8, 2048, True, "registers"),  # per channel, scales on the weights
        (512, 1024, 2048, 4, 128, False, "smem"),
    ],
)
def test_prefill_kernel_lowers_for_cuda(m, n, k, bits, group_size, zeros, dequant):
  problem = kernel_lib.WeightOnlyProblem(
      m=m, n=n, k=k, bits=bits, group_size=group_size, zeros=zeros, bias=True, activation="silu"
  )
  config = wo.default_config(problem, 132, dequant=dequant)
  assert config.scale_on == "weights"
  assert config.output == "partials" or _compat.STORES_THROUGH_TRANSPOSED_SMEM
  groups = k // group_size
  args = (
      jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
      jax.ShapeDtypeStruct((n, k), jnp.int4 if bits == 4 else jnp.int8),
      jax.ShapeDtypeStruct((groups, n), jnp.bfloat16),
      jax.ShapeDtypeStruct((groups, n), jnp.bfloat16) if zeros else None,
      jax.ShapeDtypeStruct((n,), jnp.float32),
  )
  f = lambda *a: kernel_lib.weight_only_gemm(*a, problem=problem, config=config)
  text = jax.export.export(jax.jit(f), platforms=["cuda"])(*args).mlir_module()
  assert "mosaic_gpu" in text


@pytest.mark.parametrize(
    "m,n,k,group_size,zeros,rows",
    [
        (1, 4096, 14336, 128, False, 128),
        (16, 14336, 4096, 128, True, 64),
        (64, 1024, 4096, 4096, False, 64),
    ],
)
def test_warp_mma_decode_lowers_for_cuda(m, n, k, group_size, zeros, rows):
  if not _compat.HAS_WARP_MMA:
    pytest.skip(f"jax {jax.__version__} has no plgpu.mma")
  problem = kernel_lib.WeightOnlyProblem(m=m, n=n, k=k, bits=4, group_size=group_size, zeros=zeros)
  config = dataclasses.replace(
      _split_k_default(problem), mma="warp", scale_on="weights", rows_per_wg=rows
  )
  config = wo.deepest_ring(config, problem)
  groups = k // group_size
  args = (
      jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
      jax.ShapeDtypeStruct((n, k), jnp.int4),
      jax.ShapeDtypeStruct((groups, n), jnp.bfloat16),
      jax.ShapeDtypeStruct((groups, n), jnp.bfloat16) if zeros else None,
  )
  f = lambda *a: kernel_lib.weight_only_gemm(*a, problem=problem, config=config)
  text = jax.export.export(jax.jit(f), platforms=["cuda"])(*args).mlir_module()
  assert "mosaic_gpu" in text


def test_int8_kernel_lowers_for_cuda():
  args = (
      jax.ShapeDtypeStruct((1000, 1024), jnp.int8),
      jax.ShapeDtypeStruct((1016, 1024), jnp.int8),
      jax.ShapeDtypeStruct((1000,), jnp.float32),
      jax.ShapeDtypeStruct((1016,), jnp.float32),
  )
  f = lambda a, b, sa, sb: int8_lib.int8_matmul(a, b, sa, sb, implementation="pallas")
  assert "mosaic_gpu" in jax.export.export(jax.jit(f), platforms=["cuda"])(*args).mlir_module()


# -- arithmetic in GPU interpret mode ----------------------------------------------------
@needs_transposes
@pytest.mark.parametrize(
    "m,n,k,bits,group_size,symmetric,lead",
    [
        (5, 200, 512, 4, 128, True, ()),  # N not a multiple of 128 weight rows
        pytest.param(  # per channel with zero points, batched x
            3, 136, 256, 8, -1, False, (2,), marks=pytest.mark.slow
        ),
        pytest.param(  # two token tiles' worth of rows, zeros
            17, 128, 512, 4, 256, False, (), marks=pytest.mark.slow
        ),
    ],
)
def test_weight_only_interpret_matches_float64(m, n, k, bits, group_size, symmetric, lead):
  x, qw, bias, ref = _weight_only_case(0, m, n, k, bits, group_size, symmetric, lead)
  y = wo.quantized_matmul(x, qw, bias=bias, activation="silu", implementation="interpret")
  assert y.dtype == jnp.bfloat16
  assert _rel_err(y, ref) < BOUND


@needs_transposes
@pytest.mark.parametrize(
    "fields",
    [
        dict(tile_m=160, split_k=1, output="tile"),  # bias + silu + transposed store in the kernel
        pytest.param(dict(tile_m=128, split_k=2, output="partials"), marks=pytest.mark.slow),
    ],
)
def test_prefill_config_interpret_matches_float64(fields):
  if fields["output"] == "tile" and not _compat.STORES_THROUGH_TRANSPOSED_SMEM:
    pytest.skip(f"jax {jax.__version__}: no transposed SMEM store (the 'tile' output)")
  x, qw, bias, ref = _weight_only_case(11, 70, 136, 256, 4, 128, False)
  problem = kernel_lib.WeightOnlyProblem(m=70, n=136, k=256, bits=4, group_size=128, zeros=True)
  config = dataclasses.replace(wo.default_config(problem, 2), stages=2, **fields)
  assert config.scale_on == "weights"
  y = wo.quantized_matmul(
      x, qw, bias=bias, activation="silu", config=config, implementation="interpret"
  )
  assert y.dtype == jnp.bfloat16
  assert _rel_err(y, ref) < BOUND


@needs_transposes
@pytest.mark.parametrize("bits,group_size", [(8, -1), pytest.param(4, 128, marks=pytest.mark.slow)])
def test_tile_output_with_scales_on_the_product_interpret_matches_float64(bits, group_size):
  if not _compat.STORES_THROUGH_TRANSPOSED_SMEM:
    pytest.skip(f"jax {jax.__version__}: no transposed SMEM store (the 'tile' output)")
  x, qw, bias, ref = _weight_only_case(13, 5, 136, 256, bits, group_size, True)
  config = kernel_lib.WeightOnlyConfig(
      tile_m=16, tile_k=128, stages=2, rows_per_wg=64, output="tile", scale_on="product"
  )
  y = wo.quantized_matmul(
      x, qw, bias=bias, activation="silu", config=config, implementation="interpret"
  )
  assert y.dtype == jnp.bfloat16
  assert _rel_err(y, ref) < BOUND


@pytest.mark.slow
@needs_transposes
def test_four_consumer_warpgroups_interpret_matches_float64():
  x, qw, bias, ref = _weight_only_case(10, 5, 512, 512, 4, 128, False)
  config = kernel_lib.WeightOnlyConfig(tile_m=16, tile_k=128, stages=2, split_k=2, consumers=4)
  assert config.tile_n == 256
  y = wo.quantized_matmul(
      x, qw, bias=bias, activation="silu", config=config, implementation="interpret"
  )
  assert _rel_err(y, ref) < BOUND


@needs_transposes
def test_int8_interpret_matches_float64():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((3, 67, 256)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((256, 136)) * 0.05, jnp.float32)
  xq, xs = int8_lib.quantize_per_token(x)
  wq, ws = int8_lib.quantize_per_channel(w)
  bias = jnp.asarray(rng.standard_normal(136), jnp.float32)
  deq_x = np.asarray(xq, np.float64) * np.asarray(xs, np.float64)[..., None]
  deq_w = np.asarray(wq, np.float64) * np.asarray(ws, np.float64)[:, None]
  ref = np.maximum(deq_x @ deq_w.T + np.asarray(bias, np.float64), 0)
  for implementation in ("interpret", "xla"):
    y = int8_lib.int8_matmul(
        xq, wq, xs, ws, bias=bias, activation="relu", implementation=implementation
    )
    assert y.shape == (3, 67, 136) and y.dtype == jnp.bfloat16
    assert _rel_err(y, ref) < BOUND


# -- the XLA route and the quantizers ----------------------------------------------------
@pytest.mark.parametrize(
    "bits,group_size,symmetric", [(4, 64, True), (4, -1, False), (8, 32, False)]
)
def test_xla_route_matches_float64(bits, group_size, symmetric):
  x, qw, bias, ref = _weight_only_case(2, 9, 40, 128, bits, group_size, symmetric)
  y = wo.quantized_matmul(x, qw, bias=bias, activation="silu", implementation="xla")
  assert _rel_err(y, ref) < BOUND


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_quantization_error_is_at_most_half_a_step(bits, symmetric):
  rng = np.random.default_rng(3)
  w = jnp.asarray(rng.standard_normal((256, 24)), jnp.float32)
  qw = wo.quantize_weights(w, bits, 64, symmetric=symmetric, dtype=jnp.float32)
  lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
  q = np.asarray(qw.values.astype(jnp.int32))
  assert lo <= q.min() and q.max() <= hi
  step = np.repeat(np.asarray(qw.scales), 64, axis=0)
  err = np.abs(np.asarray(wo.dequantize_weights(qw)) - np.asarray(w))
  assert (err <= 0.5 * step * (1 + 1e-5)).all()


@pytest.mark.parametrize("lead", [(), (3,)])
def test_k_blocks_store_the_same_weight(lead):
  rng = np.random.default_rng(11)
  w = jnp.asarray(rng.standard_normal((*lead, 384, 40)), jnp.float32)
  qw = wo.quantize_weights(w, 4, 128, symmetric=False)
  assert qw.k_block == wo.K_BLOCK and qw.values.shape == (*lead, 3, 40, 128)
  plain = wo.block_weights(qw, 0)
  assert plain.values.shape == (*lead, 40, 384) and plain.shape == qw.shape == (*lead, 384, 40)
  np.testing.assert_array_equal(
      np.asarray(qw.nk_values().astype(jnp.int8)), np.asarray(plain.values.astype(jnp.int8))
  )
  np.testing.assert_array_equal(wo.dequantize_weights(qw), wo.dequantize_weights(plain))
  again = wo.block_weights(plain, 64)
  assert again.values.shape == (*lead, 6, 40, 64)
  np.testing.assert_array_equal(wo.dequantize_weights(again), wo.dequantize_weights(qw))
  assert wo.quantize_weights(w[..., :72, :], 4, 8).k_block == 0  # 128 does not divide K
  with pytest.raises(ValueError, match="k_block=96 must be a multiple of 64 dividing K=384"):
    wo.block_weights(qw, 96)
  mislabeled = dataclasses.replace(plain, k_block=128)  # (N, K) values called K blocks
  with pytest.raises(ValueError, match=r"values must be \(\.\.\., K / k_block, N, k_block\)"):
    wo.quantized_matmul(jnp.ones((2, 384), jnp.bfloat16), mislabeled)


@needs_transposes
def test_both_layouts_give_the_same_kernel_result():
  x, qw, bias, ref = _weight_only_case(12, 9, 136, 512, 4, 128, False)
  plain = wo.block_weights(qw, 0)
  run = lambda w: wo.quantized_matmul(
      x, w, bias=bias, activation="silu", implementation="interpret"
  )
  blocked_y, plain_y = run(qw), run(plain)
  assert _rel_err(blocked_y, ref) < BOUND
  np.testing.assert_array_equal(np.asarray(blocked_y), np.asarray(plain_y))


def test_packed_uint8_weights_equal_int4():
  rng = np.random.default_rng(4)
  q = rng.integers(-8, 8, (40, 128))
  nibbles = (q & 0xF).astype(np.uint8)
  packed = jnp.asarray(nibbles[:, 0::2] | (nibbles[:, 1::2] << 4))
  np.testing.assert_array_equal(np.asarray(wo.unpack_int4(packed).astype(jnp.int8)), q)
  x = jnp.asarray(rng.standard_normal((3, 128)), jnp.bfloat16)
  scales = jnp.asarray(rng.uniform(0.5, 1.5, (2, 40)), jnp.bfloat16)
  a = wo.quantized_matmul(x, packed, scales, bits=4, implementation="xla")
  b = wo.quantized_matmul(x, jnp.asarray(q, jnp.int4), scales, implementation="xla")
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_int8_quantizers_are_symmetric_and_round_trip():
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.standard_normal((7, 33)), jnp.float32)
  q, s = int8_lib.quantize_per_token(x)
  assert q.dtype == jnp.int8 and s.shape == (7,)
  assert int(jnp.max(jnp.abs(q.astype(jnp.int32)))) == 127
  np.testing.assert_allclose(q * s[:, None], x, atol=float(s.max()) / 2 + 1e-7)
  wq, ws = int8_lib.quantize_per_channel(x.T)  # (K, N) = (33, 7): q is (N, K)
  assert wq.shape == (7, 33) and ws.shape == (7,)
  zq, zs = int8_lib.quantize_int8(jnp.zeros((2, 4)))
  assert not zq.any() and (zs == 1).all()


def test_decode_default_fits_and_splits_k_only_where_it_shortens_the_critical_path():
  for m, n, k in [(1, 4096, 14336), (16, 14336, 4096), (64, 28672, 8192), (100, 384, 1024)]:
    problem = kernel_lib.WeightOnlyProblem(m=m, n=n, k=k, bits=4, group_size=128)
    for config in (wo.default_config(problem, 132), _split_k_default(problem)):
      config.validate(problem)
      tiles = -(-m // config.tile_m) * -(-n // config.tile_n)
      k_steps = k // config.tile_k
      critical = -(-tiles * config.split_k // 132) * -(-k_steps // config.split_k)
      assert critical <= -(-tiles // 132) * k_steps  # split-K never lengthens it
      assert config.stages >= 4  # a ring deep enough to cover HBM latency
  problem = kernel_lib.WeightOnlyProblem(m=1, n=4096, k=14336, bits=4, group_size=128)
  config = wo.default_config(problem, 132)  # 32 tiles of 128 rows: 128 items
  assert (config.rows_per_wg, config.split_k, config.output) == (64, 4, "partials")


@pytest.mark.parametrize(
    "m,n,k,group_size",
    [(64, 14336, 4096, 128), (1, 128256, 4096, 128), (16, 14336, 4096, 128), (5, 14336, 4096, -1)],
)
def test_decode_default_stores_whole_sums_where_it_does_not_split_k(m, n, k, group_size):
  problem = kernel_lib.WeightOnlyProblem(
      m=m, n=n, k=k, bits=4, group_size=k if group_size == -1 else group_size
  )
  config = wo.default_config(problem, 132)
  config.validate(problem)
  assert config.split_k == 1 and not config.stream_k  # the tiles fill the SMs
  if not _compat.STORES_THROUGH_TRANSPOSED_SMEM:
    assert config.output == "partials"
    return
  assert (config.output, config.scale_on, config.rows_per_wg) == ("tile", "weights", 64)
  f32 = dataclasses.replace(problem, out_dtype="float32")
  assert wo.default_config(f32, 132).output == "partials"


@pytest.mark.parametrize(
    "m,n,k,bits,fields",
    [
        pytest.param(16, 14336, 4096, 4, dict(scale_on="product", rows_per_wg=128), marks=SLOW),
        pytest.param(64, 4096, 14336, 4, dict(scale_on="weights", rows_per_wg=64), marks=SLOW),
        (1, 70000, 256, 8, dict(scale_on="weights", rows_per_wg=128)),  # cut and whole tiles
    ],
)
def test_stream_k_decode_lowers_for_cuda(m, n, k, bits, fields):
  if not _compat.STORES_THROUGH_TRANSPOSED_SMEM:
    pytest.skip(f"jax {jax.__version__}: no 'tile' output")
  problem = kernel_lib.WeightOnlyProblem(m=m, n=n, k=k, bits=bits, group_size=128, bias=True)
  config = kernel_lib.WeightOnlyConfig(
      tile_m=16 if m <= 16 else 64, output="tile", stream_k=True, **fields
  )
  config = wo.deepest_ring(config, problem)
  args = (
      jax.ShapeDtypeStruct((max(m, 8), k), jnp.bfloat16),
      jax.ShapeDtypeStruct((n, k), jnp.int4 if bits == 4 else jnp.int8),
      jax.ShapeDtypeStruct((k // 128, n), jnp.bfloat16),
      None,
      jax.ShapeDtypeStruct((-(-n // config.tile_n) * config.tile_n,), jnp.float32),
  )
  f = lambda *a: kernel_lib.weight_only_gemm(*a, problem=problem, config=config, num_sms=132)
  exported = jax.export.export(jax.jit(f), platforms=["cuda"])(*args)
  assert "mosaic_gpu" in exported.mlir_module()
  assert exported.out_avals[0].shape == (max(m, 8), -(-n // 64) * 64)  # the workspace is dropped


def test_interpret_mode_refuses_stream_k():
  if not _compat.STORES_THROUGH_TRANSPOSED_SMEM:
    pytest.skip(f"jax {jax.__version__}: no 'tile' output")
  problem = kernel_lib.WeightOnlyProblem(m=8, n=256, k=256, bits=8, group_size=256)
  config = kernel_lib.WeightOnlyConfig(output="tile", stream_k=True, scale_on="weights")
  x = jnp.ones((8, 256), jnp.bfloat16)
  w = jnp.ones((256, 256), jnp.int8)
  with pytest.raises(ValueError, match="stream_k=True: GPU interpret mode"):
    kernel_lib.weight_only_gemm(
        x,
        w,
        jnp.ones((1, 256), jnp.bfloat16),
        None,
        problem=problem,
        config=config,
        interpret=_compat.interpret_params(zero_fill=False),
    )


@pytest.mark.parametrize("m", [65, 200, 300, 2048])
@pytest.mark.parametrize("n,k", [(14336, 4096), (4096, 14336)])
def test_prefill_default_scales_weights_and_stores_whole_sums_in_the_kernel(m, n, k):
  problem = kernel_lib.WeightOnlyProblem(m=m, n=n, k=k, bits=4, group_size=128)
  config = wo.default_config(problem, 132)
  config.validate(problem)
  assert config.scale_on == "weights" and config.tile_k == 64
  assert config.output == "partials" or config.split_k == 1
  assert config.tile_m < m + 32 or config.tile_m == 128  # little of the token tile is padding
  assert config.stages >= 4
  if not _compat.STORES_THROUGH_TRANSPOSED_SMEM:
    assert config.output == "partials"
    return
  f32 = dataclasses.replace(problem, out_dtype="float32")
  assert wo.default_config(f32, 132).output == "partials"  # the kernel stores 16-bit tiles


def test_quantized_weight_is_a_pytree():
  qw = wo.quantize_weights(jnp.ones((128, 8)), 4, 64)
  leaves, tree = jax.tree.flatten(qw)
  assert len(leaves) == 2  # values and scales; zeros is None, group_size static
  again = jax.tree.unflatten(tree, leaves)
  assert again.group_size == 64 and again.bits == 4 and again.shape == (128, 8)
  y = jax.jit(lambda x, q: wo.quantized_matmul(x, q, implementation="xla"))(
      jnp.ones((2, 128), jnp.bfloat16), qw
  )
  assert y.shape == (2, 8)


# -- bad input ---------------------------------------------------------------------------
def _bad(**overrides):
  args = dict(
      x=jnp.ones((2, 256), jnp.bfloat16),
      w_q=jnp.zeros((8, 256), jnp.int4),
      scales=jnp.ones((2, 8), jnp.bfloat16),
  )
  kwargs = dict(implementation="xla")
  for key, value in overrides.items():
    (args if key in args else kwargs)[key] = value
  return wo.quantized_matmul(args.pop("x"), args.pop("w_q"), args.pop("scales"), **kwargs)


@pytest.mark.parametrize(
    "overrides,error,match",
    [
        (dict(w_q=jnp.zeros((8, 128), jnp.uint8)), ValueError, "packed int4"),
        (dict(w_q=jnp.zeros((8, 256), jnp.float32)), TypeError, "w_q must be int4"),
        (dict(scales=jnp.ones((3, 8), jnp.bfloat16)), ValueError, "group count dividing K"),
        (dict(scales=jnp.ones((2, 9), jnp.bfloat16)), ValueError, "scales must be"),
        (dict(group_size=64), ValueError, "group_size=64 does not match"),
        (dict(bits=8), ValueError, "bits=8 but w_q is int4"),
        (dict(zeros=jnp.ones((1, 8))), ValueError, "zeros must have the shape"),
        (dict(x=jnp.ones((2, 256), jnp.float32)), TypeError, "x must be one of"),
        (dict(x=jnp.ones((2, 128), jnp.bfloat16)), ValueError, "x must be"),
        (dict(bias=jnp.ones(7)), ValueError, "bias must have shape"),
        (dict(implementation="fast"), ValueError, "implementation must be"),
        (
            dict(
                implementation="interpret",
                w_q=jnp.zeros((8, 192), jnp.int4),
                x=jnp.ones((2, 192), jnp.bfloat16),
            ),
            ValueError,
            "multiple of 256",
        ),
        (
            dict(
                implementation="interpret",
                w_q=jnp.zeros((12, 256), jnp.int4),
                scales=jnp.ones((2, 12), jnp.bfloat16),
            ),
            ValueError,
            "N=12 is not a multiple of 8",
        ),
    ],
)
def test_bad_arguments_get_named_errors(overrides, error, match):
  if "w_q" in overrides and overrides["w_q"].shape[1] == 192:
    overrides["scales"] = jnp.ones((1, 8), jnp.bfloat16)
  with pytest.raises(error, match=match):
    _bad(**overrides)


def test_quantize_weights_rejects_bad_groups_and_bits():
  with pytest.raises(ValueError, match="group_size=100 must be a positive divisor of K=256"):
    wo.quantize_weights(jnp.ones((256, 4)), 4, 100)
  with pytest.raises(ValueError, match="bits must be one of"):
    wo.quantize_weights(jnp.ones((256, 4)), 3, 128)


@pytest.mark.parametrize(
    "fields,match",
    [
        (dict(tile_k=256), "must divide group_size=128"),
        (dict(tile_m=24), "tile_m=24"),
        (dict(dequant="tmem"), "dequant='tmem'"),
        (dict(split_k=0), "split_k=0"),
        (dict(stages=64), "bytes of shared memory"),
        (dict(consumers=4, tile_m=64, rows_per_wg=128), "registers per consumer thread"),
        (dict(consumers=3), "consumers=3"),
        (dict(scale_on="bias"), "scale_on='bias'"),
        (dict(output="tile", scale_on="weights", split_k=2), "stores whole sums"),
        (dict(output="sparse"), "output='sparse'"),
        (dict(mma="mma.sync"), "mma='mma.sync'"),
        (dict(mma="warp"), "mma='warp' takes"),
        (dict(stream_k=True), "stream_k=True needs output='tile'"),
    ],
)
def test_config_errors_name_the_field(fields, match):
  problem = kernel_lib.WeightOnlyProblem(m=1, n=4096, k=4096, bits=4, group_size=128)
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(kernel_lib.WeightOnlyConfig(), **fields).validate(problem)


def test_tile_output_takes_per_channel_zero_points_on_the_weights_only():
  problem = kernel_lib.WeightOnlyProblem(m=1, n=4096, k=4096, bits=8, group_size=4096, zeros=True)
  with pytest.raises(ValueError, match="per-channel zero points needs scale_on='weights'"):
    kernel_lib.WeightOnlyConfig(output="tile", scale_on="product").validate(problem)
  if _compat.STORES_THROUGH_TRANSPOSED_SMEM:  # older jax has no "tile" output at all
    kernel_lib.WeightOnlyConfig(output="tile", scale_on="weights").validate(problem)


def test_int8_matmul_rejects_other_dtypes():
  with pytest.raises(TypeError, match="a must be int8"):
    int8_lib.int8_matmul(jnp.ones((4, 32)), jnp.ones((8, 32), jnp.int8), 1.0, 1.0)


# -- on the device -----------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,n,k,bits,group_size,symmetric,dequant",
    [
        (1, 4096, 4096, 4, 128, True, "registers"),
        (13, 1000, 2048, 4, 128, False, "registers"),
        (64, 4096, 4096, 8, -1, True, "registers"),
        (100, 384, 1024, 8, 256, False, "registers"),
        (200, 4096, 4096, 4, 128, True, "registers"),  # two token tiles of 128
        (13, 1000, 2048, 4, 128, False, "smem"),
        (300, 4104, 1024, 4, 128, False, "registers"),  # prefill: 160 tokens, "tile" output
        (777, 2000, 4096, 8, -1, False, "registers"),  # per channel, zeros, on the weights
        (1000, 1000, 2048, 4, 128, True, "registers"),
        (300, 4096, 14336, 4, 128, True, "registers"),  # split-K partials of 80 tokens
    ],
)
def test_weight_only_on_the_gpu(m, n, k, bits, group_size, symmetric, dequant):
  x, qw, bias, ref = _weight_only_case(6, m, n, k, bits, group_size, symmetric)
  problem = kernel_lib.WeightOnlyProblem(
      m=m,
      n=n,
      k=k,
      bits=bits,
      group_size=k if group_size == -1 else group_size,
      zeros=not symmetric,
  )
  config = wo.default_config(problem, 132, dequant=dequant)
  y = wo.quantized_matmul(
      x, qw, bias=bias, activation="silu", config=config, implementation="pallas"
  )
  assert _rel_err(y, ref) < BOUND


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,n,k,bits,group_size,symmetric,fields",
    [
        (16, 14336, 4096, 4, 128, True, dict(scale_on="product", rows_per_wg=128)),  # packed
        (5, 1000, 2048, 4, 128, False, dict(scale_on="weights", rows_per_wg=64)),
        (40, 4096, 14336, 4, 128, True, dict(scale_on="weights", rows_per_wg=64)),  # ~4 per tile
        (3, 70000, 256, 4, 128, False, dict(scale_on="product", rows_per_wg=128)),  # + whole tiles
        (7, 4000, 4096, 8, -1, False, dict(scale_on="weights", rows_per_wg=128)),
    ],
)
def test_stream_k_decode_on_the_gpu(m, n, k, bits, group_size, symmetric, fields):
  x, qw, bias, ref = _weight_only_case(12, m, n, k, bits, group_size, symmetric)
  problem = wo.problem_of(x, qw, bias=True, activation="silu")
  config = kernel_lib.WeightOnlyConfig(
      tile_m=16 if m <= 16 else 64, output="tile", stream_k=True, **fields
  )
  config = wo.deepest_ring(config, problem)
  y = wo.quantized_matmul(
      x, qw, bias=bias, activation="silu", config=config, implementation="pallas"
  )
  assert _rel_err(y, ref) < BOUND


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,n,k,bits,group_size,symmetric",
    [(1, 4096, 4096, 4, 128, True), (13, 1000, 2048, 4, 128, False), (64, 4096, 4096, 8, -1, True)],
)
def test_warp_mma_decode_on_the_gpu(m, n, k, bits, group_size, symmetric):
  x, qw, bias, ref = _weight_only_case(9, m, n, k, bits, group_size, symmetric)
  qw = wo.block_weights(qw, 0)  # warp MMA reads (N, K) weights, not packed fragments
  problem = kernel_lib.WeightOnlyProblem(
      m=m, n=n, k=k, bits=bits, group_size=qw.group_size, zeros=not symmetric
  )
  config = dataclasses.replace(_split_k_default(problem), mma="warp", scale_on="weights")
  y = wo.quantized_matmul(
      x, qw, bias=bias, activation="silu", config=config, implementation="pallas"
  )
  assert _rel_err(y, ref) < BOUND


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(200, 136, 384), (1000, 1016, 1024)])
def test_int8_on_the_gpu(shape):
  m, n, k = shape
  rng = np.random.default_rng(7)
  xq, xs = int8_lib.quantize_per_token(jnp.asarray(rng.standard_normal((m, k)), jnp.float32))
  wq, ws = int8_lib.quantize_per_channel(jnp.asarray(rng.standard_normal((k, n)), jnp.float32))
  ref = (np.asarray(xq, np.float64) * np.asarray(xs, np.float64)[:, None]) @ (
      np.asarray(wq, np.float64) * np.asarray(ws, np.float64)[:, None]
  ).T
  assert _rel_err(int8_lib.int8_matmul(xq, wq, xs, ws, implementation="pallas"), ref) < BOUND


# -- Flax ------------------------------------------------------------------------------
@pytest.mark.slow
@needs_transposes
def test_quantized_linear_matches_its_dense_layer():
  nnx = pytest.importorskip("flax.nnx")
  from pallas_gemm.flax import QuantizedLinear

  dense = nnx.Linear(256, 136, rngs=nnx.Rngs(0))
  x = jnp.asarray(np.random.default_rng(8).standard_normal((3, 256)), jnp.bfloat16)
  for bits, group_size, symmetric in [(4, 128, True), (8, -1, False)]:
    layer = QuantizedLinear.from_linear(
        dense,
        bits=bits,
        group_size=group_size,
        symmetric=symmetric,
        activation="relu",
        implementation="interpret",
    )
    qw = wo.QuantizedWeight(
        layer.values[...],
        layer.scales[...],
        None if layer.zeros is None else layer.zeros[...],
        layer.group_size,
        layer.k_block,
        layer.fragments,
    )
    w64 = np.asarray(wo.dequantize_weights(qw), np.float64)
    ref = np.maximum(
        np.asarray(x.astype(jnp.float32), np.float64) @ w64
        + np.asarray(dense.bias[...], np.float64),
        0,
    )
    assert _rel_err(layer(x), ref) < BOUND


def test_int8_dot_general_plugs_into_flax():
  nnx = pytest.importorskip("flax.nnx")
  import pallas_gemm

  x = jnp.asarray(np.random.default_rng(9).standard_normal((2, 5, 64)), jnp.float32)
  plain = nnx.Linear(64, 24, rngs=nnx.Rngs(1))
  quantized = nnx.Linear(
      64, 24, dot_general=pallas_gemm.make_int8_dot_general(implementation="xla"), rngs=nnx.Rngs(1)
  )
  y, ref = quantized(x), plain(x)
  assert y.shape == ref.shape == (2, 5, 24)
  err = float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))
  assert 0 < err < 2e-2  # int8 rounding of both operands, not an exact copy


@pytest.mark.slow
@needs_transposes
def test_benchmark_runs_on_the_cpu(capsys, tmp_path):
  from benchmarks import quantized as harness

  assert (
      harness.main(["--cpu-smoke", "--rounds", "1", "--iterations", "1", "--out", str(tmp_path)])
      == 0
  )
  out = capsys.readouterr().out
  assert "| 20x384x256 |" in out and "| 72x136x256 |" in out and "| 40x3x136x256 |" in out
  assert (tmp_path / "quantized.json").exists()


# -- grouped (experts) ---------------------------------------------------------------------
def _grouped_case(seed, m, experts, n, k, bits, group_size, symmetric, sizes):
  rng = np.random.default_rng(seed)
  w = jnp.asarray(rng.standard_normal((experts, k, n)) / np.sqrt(k), jnp.float32)
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  qw = wo.quantize_weights(w, bits, group_size, symmetric=symmetric)
  deq = np.asarray(wo.dequantize_weights(qw), np.float64)
  x64 = np.asarray(x.astype(jnp.float32), np.float64)
  ref, start = np.zeros((m, n)), 0
  for expert, size in enumerate(sizes):
    ref[start : start + size] = x64[start : start + size] @ deq[expert]
    start += size
  return x, qw, jnp.asarray(sizes, jnp.int32), ref


@needs_transposes
@pytest.mark.parametrize(
    "m,experts,n,k,bits,group_size,symmetric,sizes",
    [
        (21, 3, 136, 256, 4, 128, True, [5, 0, 11]),  # an empty expert, rows past the sum
        (21, 3, 128, 256, 4, 128, True, [5, 11, 0]),  # packed; an empty expert
        pytest.param(  # per channel with zeros; a tile starting mid-expert
            40, 3, 128, 512, 8, -1, False, [20, 3, 9], marks=pytest.mark.slow
        ),
    ],
)
def test_grouped_interpret_matches_float64(m, experts, n, k, bits, group_size, symmetric, sizes):
  x, qw, group_sizes, ref = _grouped_case(12, m, experts, n, k, bits, group_size, symmetric, sizes)
  if n % 64 == 0:  # a stack packed in WGMMA's register order (the interpreter: K blocks)
    qw = wo.pack_fragments(qw)
  for implementation in ("interpret", "xla"):
    y = pallas_gemm.quantized_ragged_dot(x, qw, group_sizes, implementation=implementation)
    assert y.shape == (m, n) and y.dtype == jnp.bfloat16
    assert (np.asarray(y[sum(sizes) :]) == 0).all()
    assert _rel_err(y, ref) < BOUND


@pytest.mark.parametrize("mma,packed", [("wgmma", False), ("warp", False), ("wgmma", True)])
def test_grouped_kernel_lowers_for_cuda(mma, packed):
  if mma == "warp" and not _compat.HAS_WARP_MMA:
    pytest.skip(f"jax {jax.__version__} has no plgpu.mma")
  m, experts, n, k = 64, 8, 2048, 1024
  problem = kernel_lib.WeightOnlyProblem(
      m=m, n=n, k=k, bits=4, group_size=128, zeros=True, experts=experts, fragments=packed
  )
  config = dataclasses.replace(grouped.grouped_config(problem, 132), mma=mma)
  tiles = kernel_lib.max_token_tiles(m, experts, config.tile_m)
  weights = (  # an expert stack packed in WGMMA's register order, or (E, N, K) int4
      jax.ShapeDtypeStruct((experts, k // 64, n // 64, 4, 128), jnp.int32)
      if packed
      else jax.ShapeDtypeStruct((experts, n, k), jnp.int4)
  )
  args = (
      jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
      weights,
      jax.ShapeDtypeStruct((experts, k // 128, n), jnp.bfloat16),
      jax.ShapeDtypeStruct((experts, k // 128, n), jnp.bfloat16),
      None,
      jax.ShapeDtypeStruct((2, tiles), jnp.int32),
  )
  f = lambda *a: kernel_lib.weight_only_gemm(*a, problem=problem, config=config)
  exported = jax.export.export(jax.jit(f), platforms=["cuda"])(*args)
  assert exported.out_avals[0].shape == (config.split_k, n, tiles * config.tile_m)
  assert "mosaic_gpu" in exported.mlir_module()


def test_tile_table_covers_every_row_once():
  sizes = jnp.array([20, 0, 3, 9], jnp.int32)
  table, columns = kernel_lib.tile_table(sizes, 40, 16, kernel_lib.max_token_tiles(40, 4, 16))
  expert, row0 = np.asarray(table)
  used = expert >= 0
  assert (row0 % 8 == 0).all() and not used[used.argmin() :].any()  # used tiles first
  cols = np.asarray(columns)
  assert (cols[32:] == -1).all() and len(set(cols[:32])) == 32  # each row its own column
  owner = np.repeat(np.arange(4), np.asarray(sizes))
  for r in range(32):  # the column's tile belongs to the row's expert and holds the row
    t = cols[r] // 16
    assert expert[t] == owner[r] and row0[t] + cols[r] % 16 == r


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda x, qw, gs: (x, qw.values, gs), TypeError, "qw must be a QuantizedWeight"),
        (lambda x, qw, gs: (x, wo.quantize_weights(jnp.ones((256, 8))), gs), ValueError, "stack"),
        (lambda x, qw, gs: (x[:, :128], qw, gs), ValueError, "x must be"),
        (lambda x, qw, gs: (x.astype(jnp.float32), qw, gs), TypeError, "x must be one of"),
        (lambda x, qw, gs: (x, qw, gs[:2]), ValueError, "group_sizes must be"),
    ],
)
def test_grouped_bad_arguments_get_named_errors(call, error, match):
  x = jnp.ones((4, 256), jnp.bfloat16)
  qw = wo.quantize_weights(jnp.ones((3, 256, 8)), 4, 128)
  with pytest.raises(error, match=match):
    pallas_gemm.quantized_ragged_dot(*call(x, qw, jnp.array([1, 1, 2])))


@pytest.mark.parametrize("zeros", [False, True])
def test_decode_runs_no_xla_kernel_besides_the_split_k_sum(monkeypatch, zeros):
  # Absent operands (per-channel scales, zeros, bias, the expert table) are not
  # materialized: a constant stand-in cost an XLA broadcast kernel (~1 us) per call.
  monkeypatch.setattr(_compat, "on_hopper", lambda: True)
  qw = jax.eval_shape(
      lambda: wo.quantize_weights(jnp.ones((4096, 1024)), 4, 128, symmetric=not zeros)
  )
  call = lambda x, qw: wo.quantized_matmul(x, qw)
  text = jax.export.export(jax.jit(call), platforms=["cuda"])(
      jax.ShapeDtypeStruct((16, 4096), jnp.bfloat16), qw
  ).mlir_module()
  xla_ops = [l for l in text.splitlines() if "stablehlo." in l and "custom_call" not in l]
  assert "mosaic_gpu" in text
  assert not [op for op in xla_ops if "broadcast_in_dim" in op or "negate" in op]


@pytest.mark.parametrize(
    "m,k,kernels", [(64, 1024, 1), (grouped.KERNEL_MAX_M + 8, 1024, 0), (64, 1000, 0)]
)
def test_grouped_default_runs_the_kernel_on_hopper_where_it_applies(monkeypatch, m, k, kernels):
  monkeypatch.setattr(_compat, "on_hopper", lambda: True)
  qw = jax.eval_shape(lambda: wo.quantize_weights(jnp.ones((4, k, 256)), 4, -1))
  call = lambda x, qw, sizes: pallas_gemm.quantized_ragged_dot(x, qw, sizes)
  text = jax.export.export(jax.jit(call), platforms=["cuda"])(
      jax.ShapeDtypeStruct((m, k), jnp.bfloat16), qw, jax.ShapeDtypeStruct((4,), jnp.int32)
  ).mlir_module()
  assert text.count("mosaic_gpu") >= kernels and (kernels or "mosaic_gpu" not in text)


@pytest.mark.gpu
@pytest.mark.parametrize("mma", ["wgmma", "warp"])
@pytest.mark.parametrize(
    "m,experts,n,k,bits,group_size,symmetric,sizes",
    [
        (64, 8, 1000, 2048, 4, 128, True, [0, 13, 8, 8, 1, 20, 0, 10]),
        (64, 8, 1024, 2048, 4, 128, False, [0, 13, 8, 8, 1, 20, 0, 10]),  # packed (wgmma)
        (300, 4, 4096, 1024, 8, -1, False, [100, 0, 150, 40]),  # packed (wgmma)
    ],
)
def test_grouped_on_the_gpu(m, experts, n, k, bits, group_size, symmetric, sizes, mma):
  x, qw, group_sizes, ref = _grouped_case(13, m, experts, n, k, bits, group_size, symmetric, sizes)
  if mma == "warp" and qw.fragments:  # warp MMA reads K blocks
    qw = wo.block_weights(qw)
  problem = kernel_lib.WeightOnlyProblem(
      m=m, n=n, k=k, bits=bits, group_size=qw.group_size, zeros=not symmetric, experts=experts
  )
  config = dataclasses.replace(grouped.grouped_config(problem, 132), mma=mma)
  y = pallas_gemm.quantized_ragged_dot(x, qw, group_sizes, config=config, implementation="pallas")
  assert (np.asarray(y[sum(sizes) :]) == 0).all()
  assert _rel_err(y, ref) < BOUND
