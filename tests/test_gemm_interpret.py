"""Tier 2: the kernel's numerics in GPU interpret mode on the CPU (small shapes, 2 SMs).

Compared with a float64 numpy reference by ||out - ref|| / ||ref||; inputs are
fresh N(0,1) draws; unwritten memory reads as NaN in the interpreter (its
default), so a tile the kernel forgets to store fails the NaN check.

Gaps of the interpreter, skipped explicitly (never passed silently):
- jax 0.10.2 cannot run WGMMA on a transposed SMEM view (transposed A or B),
  and has no cluster barriers (TMA multicast);
- partially out-of-bounds TMA stores are dropped, so `implementation="interpret"`
  pads outputs (and operands) to whole tiles; true edge tiles run on the GPU
  (tests/test_gemm_gpu.py). K tails with TMA zero fill are tested directly on
  `hopper_gemm` with the interpreter's zero-fill mode.

Each case takes 4-8 s on CI's CPU. CI's legs on other jax versions run one case of each
group (the rest are marked `slow`); its leg on the GPU machine's jax runs them all.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_gemm import GemmConfig, GemmProblem, matmul, _compat
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm.heuristics import default_config, short_k_stores
from pallas_gemm.hopper_gemm import hopper_gemm
from pallas_gemm.gemm import gemm as kernel_matmul  # the kernel entry (not differentiable)

from interpret_support import hang_guard, needs_transposes  # noqa: F401 (hang_guard: autouse)

pytestmark = pytest.mark.interpret

BOUNDS = {"bfloat16": 8e-3, "float16": 1.5e-3, "float32": 1e-5}

slow = pytest.mark.slow  # a further case of a group: CI runs it on the GPU machine's jax only

needs_clusters = pytest.mark.skipif(
    not _compat.INTERPRET_SUPPORTS_CLUSTERS,
    reason="jax 0.10.2's GPU interpreter has no cluster barriers (TMA multicast)",
)


def _random(rng, shape, dtype):
  return jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype)


def _reference(a, b, ta, tb, *, bias=None, c=None, alpha=1.0, beta=0.0, activation=None):
  a64 = np.asarray(a.astype(jnp.float32), np.float64)
  b64 = np.asarray(b.astype(jnp.float32), np.float64)
  y = alpha * np.matmul(
      np.swapaxes(a64, -1, -2) if ta else a64, np.swapaxes(b64, -1, -2) if tb else b64
  )
  if c is not None:
    y = y + beta * np.asarray(c.astype(jnp.float32), np.float64)
  if bias is not None:
    y = y + np.asarray(bias, np.float64)
  if activation == "relu":
    y = np.maximum(y, 0)
  elif activation == "gelu_tanh":
    y = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))
  elif activation == "gelu_exact":
    y = 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
  elif activation == "silu":
    y = y / (1 + np.exp(-y))
  elif activation == "sigmoid":
    y = 1 / (1 + np.exp(-y))
  return y


def _check(out, ref, out_dtype):
  out = np.asarray(jnp.asarray(out).astype(jnp.float32), np.float64)
  assert out.shape == ref.shape
  assert not np.isnan(out).any(), f"{np.isnan(out).sum()} output elements never written"
  err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
  assert err <= BOUNDS[out_dtype], f"relative error {err:.2e} > {BOUNDS[out_dtype]}"


def _run(m, n, k, *, layout="NN", dtype="bfloat16", batch=(), seed=0, config=None, **kw):
  rng = np.random.default_rng(seed)
  ta, tb = layout[0] == "T", layout[1] == "T"
  a = _random(rng, (*batch, *((k, m) if ta else (m, k))), dtype)
  b = _random(rng, (*batch, *((n, k) if tb else (k, n))), dtype)
  bias = _random(rng, (n,), jnp.float32) if kw.pop("bias", False) else None
  out_dtype = kw.get("out_dtype", dtype)
  c = _random(rng, kw.pop("c_shape"), out_dtype) if "c_shape" in kw else None
  out = matmul(
      a,
      b,
      transpose_a=ta,
      transpose_b=tb,
      bias=bias,
      c=c,
      config=config,
      implementation="interpret",
      **kw,
  )
  ref_kw = {key: kw[key] for key in ("alpha", "beta", "activation") if key in kw}
  _check(out, _reference(a, b, ta, tb, bias=bias, c=c, **ref_kw), out_dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=slow)])
def test_nn(dtype):
  _run(256, 256, 128, dtype=dtype)


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param("NT", marks=needs_transposes),
        pytest.param("TN", marks=needs_transposes),
        pytest.param("TT", marks=needs_transposes),
    ],
)
def test_transposed_layouts(layout):
  _run(256, 256, 128, layout=layout, config=GemmConfig(wg_split="n") if layout[0] == "T" else None)


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(GemmConfig(wg_split="n"), marks=slow),
        GemmConfig(schedule="pingpong", tile_m=128, tile_n=128, stages=6),
        pytest.param(GemmConfig(stages=3, epilogue_tile=None), marks=slow),
        pytest.param(GemmConfig(tile_n=128, raster="along_m", group=1, stages=2), marks=slow),
        pytest.param(GemmConfig(cluster=(2, 1)), marks=needs_clusters),
        pytest.param(GemmConfig(cluster=(1, 2), tile_n=128), marks=needs_clusters),
        pytest.param(
            GemmConfig(schedule="pingpong", tile_m=128, tile_n=128, stages=4, cluster=(2, 1)),
            marks=needs_clusters,
        ),
    ],
    ids=[
        "coop-n",
        "pingpong",
        "whole-epilogue",
        "along_m-2stages",
        "cluster21",
        "cluster12",
        "pingpong-cluster21",
    ],
)
def test_schedules(config):
  # 3x3 tiles of 128 rows over 2 SMs: uneven tile counts per SM and per warpgroup; two K
  # steps per tile (the stage rings wrap across tiles).
  _run(384, 3 * config.tile_n, 128, config=config)


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(
            GemmConfig(tile_m=64, tile_n=64, wg_split="n", stages=4, epilogue_tile=(64, 32)),
            marks=slow,
        ),
        GemmConfig(tile_m=128, tile_n=32, stages=4, epilogue_tile=(64, 32)),
        pytest.param(
            GemmConfig(tile_m=64, tile_n=32, schedule="pingpong", stages=4, epilogue_tile=(64, 32)),
            marks=slow,
        ),
    ],
    ids=["coop-n-64x64", "coop-m-128x32", "pingpong-64x32"],
)
def test_narrow_n_major_b_tiles_narrow_the_swizzle(config):
  # Each warpgroup's slice of the N-major B tile is 32 columns: a 64-byte swizzle, not 128.
  _run(136, 104, 72, config=config)


@pytest.mark.parametrize(
    "layout, n, bias, tile_n",
    [
        pytest.param("NT", 16, False, 16, marks=needs_transposes),
        pytest.param("NT", 16, True, 32, marks=needs_transposes),  # the bias's 128 bytes
        ("NN", 32, True, 32),
    ],
)
def test_skinny_outputs_take_the_narrow_tile(layout, n, bias, tile_n):
  # The default over N <= 32 is a 16- or 32-wide tile (`heuristics.narrow_tile_n`).
  problem = GemmProblem(m=200, n=n, k=192, transpose_b=layout == "NT", has_bias=bias)
  config = default_config(problem)
  assert config.tile_n == tile_n
  config = dataclasses.replace(config, cluster=(1, 1))  # the interpreter's clusters vary
  _run(200, n, 192, layout=layout, bias=bias, activation="relu", config=config)


@pytest.mark.parametrize(
    "epilogue",
    [
        pytest.param(dict(bias=True, activation="relu"), marks=slow),
        pytest.param(dict(bias=True, activation="gelu_tanh"), marks=slow),
        pytest.param(dict(activation="gelu_exact"), marks=slow),
        pytest.param(dict(activation="silu"), marks=slow),
        pytest.param(dict(bias=True, activation="sigmoid"), marks=slow),
        dict(c_shape=(256, 256), alpha=0.5, beta=-2.0, bias=True),
        pytest.param(dict(out_dtype="float32", c_shape=(256, 256), beta=1.0), marks=slow),
    ],
    ids=[
        "bias-relu",
        "bias-gelu_tanh",
        "gelu_exact",
        "silu",
        "bias-sigmoid",
        "alpha-beta-c-bias",
        "f32-out-c",
    ],
)
def test_epilogues(epilogue):
  _run(256, 256, 128, **epilogue)


def test_odd_shape_all_operands_padded():
  _run(200, 136, 72)


def test_batched():
  _run(130, 200, 64, batch=(3,), seed=1)


def test_short_k_default_stores_whole_warpgroup_tiles():
  # K <= 128: the default stores a warpgroup tile at once (`heuristics.short_k_stores`).
  problem = GemmProblem(m=200, n=300, k=96, batch=2)
  config = short_k_stores(problem, GemmConfig(stages=4))
  assert (config.epilogue_tile, config.stages) == (None, 3)
  _run(200, 300, 96, batch=(2,), seed=4, config=config)


@slow
def test_batch_folded_into_m_with_shared_b():
  rng = np.random.default_rng(2)
  a = _random(rng, (2, 3, 50, 64), "bfloat16")
  b = _random(rng, (64, 136), "bfloat16")
  out = matmul(a, b, implementation="interpret")
  _check(out, _reference(a, b, False, False), "bfloat16")


@needs_transposes
def test_batched_transposed_a_with_shared_b():
  rng = np.random.default_rng(3)
  a = _random(rng, (3, 64, 100), "bfloat16")
  b = _random(rng, (64, 136), "bfloat16")
  out = matmul(a, b, transpose_a=True, implementation="interpret", config=GemmConfig(wg_split="n"))
  _check(out, _reference(a, b, True, False), "bfloat16")


def test_k_tail_zero_fill():
  """K = 96 with 64-wide K tiles: the second stage reads past K (TMA zero fill)."""
  rng = np.random.default_rng(4)
  a = _random(rng, (256, 96), "bfloat16")
  b = _random(rng, (96, 256), "bfloat16")
  problem = GemmProblem(m=256, n=256, k=96)
  out = hopper_gemm(
      a,
      b,
      problem=problem,
      config=GemmConfig(num_sms=2),
      interpret=_compat.interpret_params(zero_fill=True),
  )
  _check(out, _reference(a, b, False, False), "bfloat16")


@slow
def test_matches_xla_path():
  """`implementation="xla"` computes the same function (same epilogue code)."""
  rng = np.random.default_rng(5)
  a, b = _random(rng, (128, 64), "bfloat16"), _random(rng, (64, 256), "bfloat16")
  bias = _random(rng, (256,), jnp.float32)
  kw = dict(bias=bias, activation="gelu_tanh", alpha=1.5)
  got = matmul(a, b, implementation="interpret", **kw).astype(jnp.float32)
  want = matmul(a, b, implementation="xla", **kw).astype(jnp.float32)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-2, atol=1e-2)


def test_rejected_config_fails_before_interpreting():
  with pytest.raises(ValueError, match=r"^GemmConfig\.stages="):
    _run(128, 256, 64, config=GemmConfig(stages=7))


def test_default_interpret_grid_is_small():
  cfg = dataclasses.replace(GemmConfig(), num_sms=None)
  _run(128, 256, 64, config=cfg)


@pytest.mark.skipif(
    _compat.INTERPRET_SUPPORTS_CLUSTERS,
    reason="only interpreters without cluster barriers reject clusters",
)
def test_cluster_rejected_by_old_interpreter():
  with pytest.raises(ValueError, match=r"^GemmConfig\.cluster="):
    _run(256, 256, 64, config=GemmConfig(cluster=(2, 1)))


# -- fp8 / tf32 operands and the epilogue extras ------------------------------
FP8_BOUNDS = {"float8_e4m3fn": 5e-2, "float8_e5m2": 1e-1}
"""Relative error of rounding to fp8 alone: ~2^-4 (3-bit mantissa), ~2^-3 (2-bit)."""


@needs_transposes  # WGMMA reads B through a transposed SMEM view (K-major B)
@pytest.mark.parametrize(
    "case",
    [
        dict(a_dtype="float8_e4m3fn", b_dtype="float8_e4m3fn", layout="NN", out_dtype="bfloat16"),
        dict(a_dtype="float32", b_dtype="float32", layout="TN", out_dtype="float32"),
        dict(
            a_dtype="float8_e4m3fn",
            b_dtype="float8_e5m2",
            layout="NT",
            out_dtype="float8_e4m3fn",
            out_scale=0.25,
        ),
    ],
    ids=["e4m3-NN-bf16", "tf32-TN-f32", "e4m3xe5m2-NT-e4m3out"],
)
def test_k_major_dtypes(case):
  """NN/TN go through an XLA transpose to K-major; the result is the same function."""
  case = dict(case)
  if case["a_dtype"] != case["b_dtype"] and not _compat.SUPPORTS_MIXED_FP8:
    pytest.skip("mixed e4m3 x e5m2 needs jax >= 0.11")
  rng = np.random.default_rng(7)
  m, n, k = 200, 264, 256  # not multiples of the tile
  ta, tb = case["layout"][0] == "T", case["layout"][1] == "T"
  a = _random(rng, (k, m) if ta else (m, k), case["a_dtype"])
  b = _random(rng, (n, k) if tb else (k, n), case["b_dtype"])
  out_scale = case.get("out_scale")
  out = matmul(
      a,
      b,
      transpose_a=ta,
      transpose_b=tb,
      out_dtype=case["out_dtype"],
      out_scale=out_scale,
      implementation="interpret",
  )
  assert out.dtype == case["out_dtype"]
  ref = _reference(a, b, ta, tb)
  if out_scale is not None:
    fp8_max = float(jnp.finfo(case["out_dtype"]).max)
    ref = np.clip(ref * out_scale, -fp8_max, fp8_max)
  bound = FP8_BOUNDS.get(case["out_dtype"], 1e-3 if case["a_dtype"] == "float32" else 8e-3)
  out = np.asarray(out.astype(jnp.float32), np.float64)
  assert not np.isnan(out).any()
  err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
  assert err <= bound, f"relative error {err:.2e} > {bound}"


def _extras_operands(rng, m=200, n=264, k=128):
  """a, b (bf16), bias (N,) and row_bias (M,) f32, residual (M, N) bf16: the epilogue extras."""
  a, b = _random(rng, (m, k), "bfloat16"), _random(rng, (k, n), "bfloat16")
  bias, row_bias = _random(rng, (n,), jnp.float32), _random(rng, (m,), jnp.float32)
  return a, b, bias, row_bias, _random(rng, (m, n), "bfloat16")


def test_epilogue_extras_combined():
  """act(alpha*ab + beta*c + bias + row_bias) + residual, clamped: all fused, vs float64."""
  rng = np.random.default_rng(8)
  a, b, bias, row_bias, residual = _extras_operands(rng)
  c = _random(rng, (200, 264), "float32")
  out = matmul(
      a,
      b,
      bias=bias,
      row_bias=row_bias,
      residual=residual,
      c=c,
      alpha=0.5,
      beta=-1.5,
      activation="gelu_tanh",
      clamp=(-1.0, 2.5),
      out_dtype="float32",
      implementation="interpret",
  )
  y = _reference(a, b, False, False, bias=bias, c=c, alpha=0.5, beta=-1.5, activation=None)
  y = y + np.asarray(row_bias, np.float64)[:, None]
  y = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))
  y = np.clip(y + np.asarray(residual.astype(jnp.float32), np.float64), -1.0, 2.5)
  _check(out, y, "float32")


@needs_transposes  # the race detector models async TMA stores from jax 0.11
def test_odd_epilogue_chunk_count_has_no_race():
  """tile_n=192 gives each warpgroup 3 epilogue chunks over 2 slots: the next
  tile's first chunk reuses the slot of the last store, which must be drained."""
  from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call

  rng = np.random.default_rng(9)
  a, b = _random(rng, (128, 64), "bfloat16"), _random(rng, (64, 576), "bfloat16")
  problem = GemmProblem(m=128, n=576, k=64)
  config = GemmConfig(tile_n=192, num_sms=1, stages=2, cluster=(1, 1))
  out = hopper_gemm(
      a,
      b,
      problem=problem,
      config=config,
      interpret=_compat.interpret_params(zero_fill=False, detect_races=True),
  )
  _check(out, _reference(a, b, False, False), "bfloat16")
  assert not interpret_pallas_call.get_races().races_found


@slow  # the split-K and autodiff tests return `pre` in interpret mode too
def test_return_pre():
  """y and the affine part `pre` from one epilogue (what training saves), vs float64."""
  a, b, bias, row_bias, residual = _extras_operands(np.random.default_rng(10))
  y, pre = kernel_matmul(
      a,
      b,
      bias=bias,
      row_bias=row_bias,
      residual=residual,
      activation="silu",
      clamp=(-1.0, 3.0),
      return_pre=True,
      implementation="interpret",
  )
  want_pre = _reference(a, b, False, False, bias=bias) + np.asarray(row_bias, np.float64)[:, None]
  want_y = np.clip(
      want_pre / (1 + np.exp(-want_pre)) + np.asarray(residual.astype(jnp.float32), np.float64),
      -1.0,
      3.0,
  )
  _check(pre, want_pre, "bfloat16")
  _check(y, want_y, "bfloat16")


@needs_transposes  # the race detector models async TMA stores from jax 0.11
def test_return_pre_has_no_race():
  """Two stores per epilogue chunk through the same two slots: each slot's
  previous TMA store must have read it before it is overwritten."""
  from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call

  rng = np.random.default_rng(11)
  a, b = _random(rng, (128, 64), "bfloat16"), _random(rng, (64, 576), "bfloat16")
  problem = GemmProblem(m=128, n=576, k=64)
  config = GemmConfig(tile_n=192, num_sms=1, stages=2, cluster=(1, 1))
  spec = epilogue_lib.EpilogueSpec(activation="relu")
  y, pre = hopper_gemm(
      a,
      b,
      problem=problem,
      config=config,
      epilogue=spec,
      return_pre=True,
      interpret=_compat.interpret_params(zero_fill=False, detect_races=True),
  )
  ref = _reference(a, b, False, False)
  _check(pre, ref, "bfloat16")
  _check(y, np.maximum(ref, 0), "bfloat16")
  assert not interpret_pallas_call.get_races().races_found


@pytest.mark.parametrize(
    "config,slope",
    [
        # Each chunking once, the residual added (None) or scaled by the activation's
        # slope alternately: the slope applies wherever a chunk is loaded, so the pairs
        # cover both with prefetched and late chunks, cooperative and pingpong.
        pytest.param(
            GemmConfig(tile_m=128, tile_n=64, stages=3), None, id="None-one-chunk", marks=slow
        ),
        pytest.param(
            GemmConfig(tile_m=128, tile_n=64, stages=3, epilogue_tile=(64, 32)),
            "gelu_tanh",
            id="gelu_tanh-two-chunks",
        ),
        pytest.param(
            GemmConfig(tile_m=128, tile_n=128, stages=3, epilogue_tile=(64, 32)),
            None,
            id="None-four-chunks",
            marks=pytest.mark.slow,  # ~6 s; the pingpong case covers four chunks too
        ),
        pytest.param(
            GemmConfig(
                tile_m=64, tile_n=128, schedule="pingpong", stages=4, epilogue_tile=(64, 32)
            ),
            "gelu_tanh",
            id="gelu_tanh-pingpong-four-chunks",
            marks=slow,
        ),
    ],
)
def test_residual_chunks_prefetched_and_loaded_late(config, slope):
  """The first chunks of a tile's residual load with its vectors, the rest in the epilogue;
  several tiles per SM reuse the slots (3x3 tiles and more over the interpreter's SMs)."""
  rng = np.random.default_rng(21)
  m, n, k = 3 * config.tile_m - 8, 3 * config.tile_n - 8, 96
  a, b = _random(rng, (m, k), "bfloat16"), _random(rng, (k, n), "bfloat16")
  residual = _random(rng, (m, n), "bfloat16")
  out = kernel_matmul(
      a, b, residual=residual, residual_slope=slope, config=config, implementation="interpret"
  ).block_until_ready()  # before the float64 reference dispatches
  acc = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  r = np.asarray(residual, np.float64)
  if slope is None:
    ref = acc + r
  else:
    with jax.enable_x64(True):
      gelu = lambda z: jax.nn.gelu(z, approximate=True)
      ref = acc * np.asarray(jax.vmap(jax.vmap(jax.grad(gelu)))(jnp.asarray(r)))
  _check(out, ref, "bfloat16")


@pytest.mark.parametrize(
    "config, epilogue",
    [
        (GemmConfig(tile_m=192, tile_n=96, consumers=3, stages=3, epilogue_tile=(64, 32)), {}),
        pytest.param(
            GemmConfig(tile_m=192, tile_n=96, consumers=3, stages=3, epilogue_tile=None),
            dict(bias=True, activation="gelu_tanh"),
            marks=slow,
        ),
        pytest.param(
            GemmConfig(tile_m=64, tile_n=192, consumers=3, wg_split="n", stages=4),
            dict(c_shape=(400, 500), beta=1.0),
            marks=slow,
        ),
    ],
    ids=["192x96-m", "192x96-m-bias-gelu-whole", "64x192-n-c"],
)
def test_three_consumer_warpgroups(config, epilogue):
  # 3 x 6 tiles of 192 x 96 (the last of each partial) over 2 SMs: each warpgroup holds
  # a third of the tile (64 rows, or 64 columns split along N), three K steps a tile.
  _run(400, 500, 136, config=config, **epilogue)
