"""Split-K and the shape-coverage defaults: config checks, the default table and
model, autotune candidates, CUDA lowering (no operand copies), numerics in GPU
interpret mode, and the sweep harness's CPU side."""

import dataclasses
import doctest
import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import sweep
from benchmarks.matmul import Case
from pallas_gemm import (
    GemmConfig,
    GemmProblem,
    config as config_lib,
    matmul,
    scaled_matmul,
    split_k,
)
from pallas_gemm.tuner import candidate_configs
from pallas_gemm.config import tiles
from pallas_gemm.heuristics import default_config
from pallas_gemm.hopper_gemm import hopper_gemm

from interpret_support import hang_guard, needs_transposes  # noqa: F401 (hang_guard: autouse)

DECODE = GemmProblem(m=16, n=1024, k=8192)
DECODE_CFG = GemmConfig(tile_m=64, tile_n=128, wg_split="n", split_k=3)


@pytest.mark.parametrize("module", [split_k, config_lib, sweep])
def test_docstring_examples(module):
  assert doctest.testmod(module).failed == 0


# -- the config -----------------------------------------------------------------
@pytest.mark.parametrize(
    "split, match",
    [
        (0, "GemmConfig.split_k=0: must be an int >= 1"),
        (True, "GemmConfig.split_k=True: must be an int >= 1"),
        (2.0, "GemmConfig.split_k=2.0: must be an int >= 1"),
        (17, "GemmConfig.split_k=17: exceeds the 16 tile_k=64 steps of K=1000"),
    ],
)
def test_bad_split_counts_name_the_field(split, match):
  with pytest.raises(ValueError, match=re.escape(match)):
    dataclasses.replace(DECODE_CFG, split_k=split).validate(GemmProblem(m=40, n=136, k=1000))


@pytest.mark.parametrize(
    "k, split, expected",
    [
        (1000, 3, (3, 6)),
        (576, 4, (3, 3)),
        (64, 1, (1, 1)),
        (8192, 128, (128, 1)),
        (8192, 5, (5, 26)),
    ],
)
def test_k_slices_cover_k_and_none_is_empty(k, split, expected):
  cfg = dataclasses.replace(DECODE_CFG, split_k=split)
  splits, k_iters = cfg.k_splits(GemmProblem(m=8, n=8, k=k))
  assert (splits, k_iters) == expected
  steps = math.ceil(k / cfg.tile_k)
  assert (splits - 1) * k_iters < steps <= splits * k_iters


def test_split_kernels_write_f32_partials_without_extras():
  p = GemmProblem(
      m=40,
      n=136,
      k=1000,
      out_dtype="bfloat16",
      has_bias=True,
      has_c=True,
      has_row_bias=True,
      residual_dtype="bfloat16",
  )
  kp = DECODE_CFG.kernel_problem(p)
  assert (kp.out_dtype, kp.has_bias, kp.has_c, kp.has_row_bias, kp.residual_dtype) == (
      "float32",
      False,
      False,
      False,
      None,
  )
  assert GemmConfig().kernel_problem(p) == p
  # SMEM is counted for the f32 partials: the 64x64 f32 epilogue slots of a
  # 128x256 tile leave no room for 4 stages, 64x32 ones do.
  big = GemmProblem(m=256, n=512, k=32768)
  assert GemmConfig(split_k=4, epilogue_tile=(64, 64)).smem_bytes(big) > config_lib.SMEM_LIMIT_BYTES
  GemmConfig(split_k=4, epilogue_tile=(64, 32)).validate(big)


def test_the_kernel_refuses_an_epilogue_on_partial_sums():
  a = jax.ShapeDtypeStruct((40, 1000), jnp.bfloat16)
  b = jax.ShapeDtypeStruct((1000, 136), jnp.bfloat16)
  with pytest.raises(ValueError, match="GemmConfig.split_k=3: a split-K launch writes f32"):
    hopper_gemm(a, b, problem=GemmProblem(m=40, n=136, k=1000), config=DECODE_CFG)


# -- defaults and the model --------------------------------------------------------
def test_default_config_splits_k_for_decode_and_tall_skinny_k():
  cfg = default_config(DECODE)
  assert (cfg.tile_m, cfg.wg_split, cfg.epilogue_tile) == (64, "n", (64, 32))
  assert cfg.split_k > 1 and tiles(1024, cfg.tile_n) * cfg.split_k <= 132
  cfg.validate(DECODE)
  tall = default_config(GemmProblem(m=128, n=128, k=65536))
  assert tall.split_k >= 16
  tall.validate(GemmProblem(m=128, n=128, k=65536))


@pytest.mark.parametrize(
    "problem",
    [
        GemmProblem(m=8192, n=8192, k=8192),
        GemmProblem(m=4096, n=8192, k=4096),
        GemmProblem(m=16384, n=4096, k=4096),
    ],
)
def test_default_config_of_large_problems_is_the_tuned_one(problem):
  assert default_config(problem) == GemmConfig(
      tile_m=128, tile_n=256, tile_k=64, stages=4, cluster=(2, 1)
  )


def test_every_default_of_the_sweeps_validates():
  from pallas_gemm import shapes

  for name in shapes.sweep_names():
    for shape in shapes.load_sweep(name):
      problem, _ = shape.problem()
      default_config(problem).validate(problem)


def test_the_model_splits_only_where_tiles_leave_sms_idle():
  kw = dict(tile_m=64, tile_n=128, tile_k=64, stages=8)
  assert split_k.choose(GemmProblem(m=1, n=1024, k=8192), **kw) > 1  # 8 tiles
  assert split_k.choose(GemmProblem(m=1, n=28672, k=8192), **kw) == 1  # 224 tiles
  assert split_k.choose(GemmProblem(m=1, n=1024, k=256), **kw) == 1  # 4 steps of K
  one = split_k.estimate(GemmProblem(m=1, n=28672, k=8192), 1, **kw)
  assert one.bound == "hbm"


def test_autotune_tries_split_k_where_it_can_pay():
  configs = candidate_configs(DECODE)
  splits = {c.split_k for c in configs}
  assert 1 in splits and {2, 4, 8} <= splits and len(configs) <= 300
  for c in configs:
    c.validate(DECODE)
  assert {c.split_k for c in candidate_configs(GemmProblem(m=8192, n=8192, k=8192))} == {1}
  from pallas_gemm.tune import describe

  assert describe(DECODE_CFG).endswith(" split_k 3") and "split_k" not in describe(GemmConfig())


# -- lowering for CUDA ------------------------------------------------------------
@pytest.mark.parametrize("layout", ["NN", "NT", "TN"])
def test_split_k_lowers_without_operand_copies(layout):
  ta, tb = layout[0] == "T", layout[1] == "T"
  m, n, k = 64, 1024, 8192
  a = jax.ShapeDtypeStruct((k, m) if ta else (m, k), jnp.bfloat16)
  b = jax.ShapeDtypeStruct((n, k) if tb else (k, n), jnp.bfloat16)
  bias = jax.ShapeDtypeStruct((n,), jnp.float32)
  cfg = dataclasses.replace(DECODE_CFG, split_k=4, epilogue_tile=(64, 32))
  fn = jax.jit(
      lambda a, b, bias: matmul(
          a,
          b,
          transpose_a=ta,
          transpose_b=tb,
          bias=bias,
          activation="silu",
          config=cfg,
          implementation="pallas",
      )
  )
  exported = jax.export.export(fn, platforms=["cuda"])(a, b, bias)
  text = exported.mlir_module()
  assert exported.out_avals[0].shape == (m, n)
  assert "tensor<4x64x1024xf32>" in text  # the kernel's partial sums
  assert not re.search(r"stablehlo\.(pad|transpose|concatenate|slice|dynamic_slice)\b", text)


# -- numerics in GPU interpret mode ------------------------------------------------
def _bf16(rng, shape):
  return jnp.asarray(rng.standard_normal(shape, dtype=np.float32), jnp.bfloat16)


def _f64(x):
  return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def _gelu_tanh(y):
  return 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))


def _close(out, ref, bound):
  out = _f64(out)
  assert out.shape == ref.shape
  assert not np.isnan(out).any(), f"{np.isnan(out).sum()} elements never written"
  err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
  assert err <= bound, f"relative error {err:.2e} > {bound}"


def test_interpret_split_k_with_bias_and_activation_at_an_odd_shape():
  # K=1000: 16 steps of 64 in 3 slices of 6; the last slice ends past K.
  rng = np.random.default_rng()
  a, b = _bf16(rng, (40, 1000)), _bf16(rng, (1000, 136))
  bias = jnp.asarray(rng.standard_normal(136, dtype=np.float32))
  out = matmul(
      a, b, bias=bias, activation="gelu_tanh", config=DECODE_CFG, implementation="interpret"
  )
  assert out.dtype == jnp.bfloat16
  _close(out, _gelu_tanh(_f64(a) @ _f64(b) + _f64(bias)), 8e-3)


@pytest.mark.slow
def test_interpret_split_k_batched_with_c_row_bias_and_residual():
  # batch 2 x 4 slices (K=700: 11 steps, 3 per slice), f32 output.
  rng = np.random.default_rng()
  a, b = _bf16(rng, (2, 72, 700)), _bf16(rng, (2, 700, 136))
  c, res = _bf16(rng, (72, 136)), _bf16(rng, (2, 72, 136))
  row_bias = jnp.asarray(rng.standard_normal(72, dtype=np.float32))
  cfg = dataclasses.replace(DECODE_CFG, tile_m=128, wg_split="m", split_k=4)
  out = matmul(
      a,
      b,
      c=c,
      alpha=0.5,
      beta=-1.5,
      row_bias=row_bias,
      residual=res,
      activation="relu",
      out_dtype=jnp.float32,
      config=cfg,
      implementation="interpret",
  )
  ref = np.maximum(0.5 * (_f64(a) @ _f64(b)) - 1.5 * _f64(c) + _f64(row_bias)[:, None], 0)
  _close(out, ref + _f64(res), 1e-5)


def test_interpret_split_k_return_pre():
  """With split-K the epilogue runs after the sum, in XLA: y and pre both come from there."""
  from pallas_gemm.gemm import gemm as kernel_matmul  # the kernel entry (return_pre)

  rng = np.random.default_rng()
  a, b = _bf16(rng, (40, 1000)), _bf16(rng, (1000, 136))
  bias = jnp.asarray(rng.standard_normal(136, dtype=np.float32))
  y, pre = kernel_matmul(
      a,
      b,
      bias=bias,
      activation="gelu_tanh",
      return_pre=True,
      config=DECODE_CFG,
      implementation="interpret",
  )
  want_pre = _f64(a) @ _f64(b) + _f64(bias)
  _close(pre, want_pre, 8e-3)
  _close(y, _gelu_tanh(want_pre), 8e-3)


@needs_transposes  # jax 0.10.2's interpreter cannot run fp8 operands
def test_interpret_split_k_scaled_fp8_with_amax():
  """Runtime scales and the amax of a scaled fp8 GEMM also move to the XLA epilogue."""
  rng = np.random.default_rng()
  a = jnp.asarray(rng.standard_normal((40, 512), dtype=np.float32), jnp.float8_e4m3fn)
  b = jnp.asarray(rng.standard_normal((136, 512), dtype=np.float32), jnp.float8_e4m3fn)
  a_scale = jnp.asarray(rng.uniform(0.5, 2.0, 40), jnp.float32)
  b_scale = jnp.float32(0.75)
  bias = jnp.asarray(rng.standard_normal(136, dtype=np.float32))
  cfg = dataclasses.replace(DECODE_CFG, tile_k=128, split_k=2)
  y, amax = scaled_matmul(
      a,
      b,
      a_scale,
      b_scale,
      out_dtype=jnp.bfloat16,
      bias=bias,
      activation="gelu_tanh",
      return_amax=True,
      config=cfg,
      implementation="interpret",
  )
  want = _gelu_tanh(_f64(a_scale)[:, None] * 0.75 * (_f64(a) @ _f64(b).T) + _f64(bias))
  _close(y, want, 8e-3)
  assert abs(float(amax) - np.abs(want).max()) <= 1e-5 * np.abs(want).max()


# -- the sweep harness (CPU side) -------------------------------------------------
def test_sweep_cases_filter_m_and_count():
  assert len(sweep.sweep_cases("llm", sweep.parse_m_values(None, "llm"))) == 28
  assert len(sweep.sweep_cases("llm", None)) == 63
  assert [c.m for c in sweep.sweep_cases("llm", (64,), max_shapes=3)] == [64, 64, 64]
  with pytest.raises(ValueError, match="no shape with M in"):
    sweep.sweep_cases("odd", (7,))
  with pytest.raises(ValueError, match="--m-values"):
    sweep.parse_m_values("1,x", "llm")


def test_summary_table_geomean_and_worst_shape():
  cases = [Case(1, 8192, 8192), Case(4096, 4096, 4096), Case(64, 1024, 8192)]
  times = {
      cases[0].label: (0.05, 0.05),
      cases[1].label: (0.2, 0.176),
      cases[2].label: (0.01, 0.0125),
  }
  rows = [
      dict(case=label, contender=name, median_ms=ms)
      for label, pair in times.items()
      for name, ms in zip(("pallas_gemm", "xla"), pair)
  ]
  rows.append(dict(case=cases[2].label, contender="pallas_alt", median_ms=0.02))
  summary = sweep.summarize(cases, rows, configs=["a", "b", "c"])
  assert [s["bound"] for s in summary] == ["memory", "compute", "memory"]
  compute = summary[1]
  assert compute["pct_roofline"] == pytest.approx(100 * 2 * 4096**3 / 989e12 / 0.2e-3)
  assert compute["tflops"] == pytest.approx(2 * 4096**3 / 0.2e-3 / 1e12)
  text = sweep.format_summary("t", summary)
  lines = text.splitlines()
  assert len(lines) == 1 + 3 + 2 and "pallas_alt_us" in lines[0]
  assert f"geomean speedup over jnp.dot {sweep.geomean([1.0, 0.88, 1.25]):.3f}" in text
  assert "worst 0.880 (4096x4096x4096 bfloat16 NN), 1 below 0.9" in text
  assert "decode (M <= 64) % of the memory roofline: min" in lines[-1]


@pytest.mark.filterwarnings("ignore:matplotlib is not installed")
def test_sweep_run_writes_json_and_prints_per_shape(tmp_path, monkeypatch):
  from benchmarks import matmul as harness

  monkeypatch.setattr(harness, "cupti_times_ms", lambda fn, args, iterations: [0.02] * iterations)
  cases = [Case(16, 1024, 256)]
  rows, summary = sweep.run(
      "t",
      cases,
      out_dir=str(tmp_path),
      rounds=2,
      iterations=3,
      budget_s=60,
      compare_split=True,
      log=lambda msg: None,
  )
  assert {r["contender"] for r in rows} == {"pallas_gemm", "xla"}  # K too short to split
  assert summary[0]["speedup"] == pytest.approx(1.0)
  data = json.loads((tmp_path / "sweep_t.json").read_text())
  assert data["sweep"] == "t" and len(data["summary"]) == 1
  rows, summary = sweep.run(
      "t", cases, out_dir=None, rounds=1, iterations=1, budget_s=-1, log=lambda msg: None
  )
  assert rows == summary == []  # over budget before the first shape


@pytest.mark.filterwarnings("ignore:matplotlib is not installed")
def test_sweep_compares_a_tuning_table_file(tmp_path, monkeypatch):
  from benchmarks import matmul as harness
  from pallas_gemm import tuning_cache

  monkeypatch.setattr(harness, "cupti_times_ms", lambda fn, args, iterations: [0.02] * iterations)
  tuned_at = Case(16, 1024, 256)
  problem, activation = sweep.case_problem(tuned_at)
  path = str(tmp_path / "tuned.json")
  config = GemmConfig(tile_m=64, tile_n=128, wg_split="n", stages=3)
  tuning_cache.TuningCache(path).store(
      tuning_cache.TuningKey.current(problem, activation), config, 0.02
  )
  assert sweep.table_config(Case(3, 1024, 256), path) == config  # tuned at 16 serves M=3
  assert sweep.table_config(Case(16, 1024, 512), path) is None  # another K
  rows, summary = sweep.run(
      "t",
      [tuned_at],
      out_dir=None,
      rounds=1,
      iterations=2,
      budget_s=60,
      compare_table=path,
      log=lambda msg: None,
  )
  assert {r["contender"] for r in rows} == {"pallas_gemm", "xla", "pallas_alt"}
  assert summary[0]["config"].endswith("(alt: 64x128x64 s3 cooperative/n cluster 1x1 along_n/8)")
  with pytest.raises(ValueError, match="pick one"):
    sweep.run(
        "t",
        [tuned_at],
        out_dir=None,
        rounds=1,
        iterations=1,
        budget_s=60,
        compare_split=True,
        compare_table=path,
    )


def test_sweep_without_a_gpu_prints_the_plan(capsys):
  from benchmarks import matmul as harness

  assert harness.main(["--sweep", "tall_skinny_k", "--max-shapes", "2"]) == 0
  out = capsys.readouterr().out
  assert "sweep tall_skinny_k: 2 shapes" in out and "split_k" in out
