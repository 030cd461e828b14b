"""Tuning the grouped GEMM (issue 19: one tuner over kernel configs): candidates, the
search with a stand-in timer, the cache's "ragged" entries, and `ragged_dot` reading them."""

import json

import jax.numpy as jnp
import pytest

from pallas_gemm import grouped, ragged_tuning, tuning_cache
from pallas_gemm.ragged_gemm import RaggedConfig, RaggedProblem, default_ragged_config
from pallas_gemm.tuning_cache import TuningCache, TuningKey

PROBLEM = RaggedProblem(m=8192, n=2048, k=7168, groups=8)


@pytest.mark.parametrize(
    "problem",
    [
        PROBLEM,
        RaggedProblem(m=512, n=384, k=256, groups=3, out_dtype="float32", transpose_rhs=True),
    ],
)
def test_every_candidate_is_valid_and_the_default_is_among_them(problem):
  candidates = ragged_tuning.candidate_configs(problem)
  for config in candidates:
    config.validate(problem)
    assert config.smem_bytes(problem) <= ragged_tuning.smem.LIMIT_BYTES
  default = default_ragged_config(problem)
  assert any(
      (c.tile_n, c.tile_k, c.epilogue_tile)
      == (default.tile_n, default.tile_k, default.epilogue_tile)
      for c in candidates
  )
  assert len(set(ragged_tuning.order_variants(candidates[0]))) == 2 * len(ragged_tuning.GROUPS)


def test_the_fastest_config_is_cached_under_a_ragged_key(tmp_path):
  cache = TuningCache(str(tmp_path / "tuning.json"))
  timed = []

  def score(config):  # narrow K steps and the along_m raster with bands of 16 win
    return 1.0 + config.tile_k / 128 + (config.raster != "along_m") + (config.group != 16) / 2

  best = ragged_tuning.tune_ragged(
      PROBLEM, timer=lambda c: timed.append(c) or score(c), cache=cache
  )
  assert (best.tile_k, best.raster, best.group) == (64, "along_m", 16)
  assert score(best) == min(score(c) for c in timed)
  again = TuningCache(cache.path)  # parsed back from the file, validated
  record = again.record(TuningKey.current(PROBLEM, kernel="ragged"))
  assert record.config == best and record.key.kernel == "ragged"
  ((token, entry),) = json.load(open(cache.path))["entries"].items()
  assert entry["key"]["kernel"] == "ragged" and "|ragged 8x8192x2048x7168 " in token


def test_gemm_and_ragged_entries_live_side_by_side(tmp_path):
  from pallas_gemm.config import GemmConfig, GemmProblem

  cache = TuningCache(str(tmp_path / "tuning.json"))
  gemm_key = TuningKey.current(GemmProblem(m=256, n=256, k=256))
  cache.store(gemm_key, GemmConfig(), 1.0)
  cache.store(TuningKey.current(PROBLEM, kernel="ragged"), RaggedConfig(tile_n=128), 2.0)
  again = TuningCache(cache.path)
  assert again.lookup(gemm_key) == GemmConfig()
  assert again.lookup(TuningKey.current(PROBLEM, kernel="ragged")) == RaggedConfig(tile_n=128)
  entries = json.load(open(cache.path))["entries"]
  assert "kernel" not in entries[gemm_key.token()]["key"]  # GEMM entries keep the older format


def test_ragged_dot_runs_the_tuned_config(tmp_path, monkeypatch):
  monkeypatch.setenv("PALLAS_GEMM_CACHE", str(tmp_path / "tuning.json"))
  lhs, rhs = jnp.ones((96, 64), jnp.bfloat16), jnp.ones((3, 64, 128), jnp.bfloat16)
  sizes = jnp.asarray([40, 40, 16], jnp.int32)
  problem = RaggedProblem(m=96, n=128, k=64, groups=3)
  tuned = RaggedConfig(tile_n=128, stages=3, group=4)
  tuning_cache.default_cache().store(TuningKey.current(problem, kernel="ragged"), tuned, 1.0)
  seen = []

  def fake_kernel(lhs, rhs, group_sizes, *, problem, config, interpret):
    seen.append(config)
    return jnp.zeros((problem.rows, problem.n), problem.out_dtype)

  monkeypatch.setattr(grouped, "ragged_gemm", fake_kernel)
  monkeypatch.setattr(grouped._compat, "on_hopper", lambda: True)
  grouped._run_kernel(lhs, rhs, sizes, False, "bfloat16", None, False)
  assert seen == [tuned]
  grouped._run_kernel(lhs, rhs, sizes, False, "bfloat16", RaggedConfig(), False)
  assert seen[-1] == RaggedConfig()  # an explicit config wins over the cache


def test_the_cli_lists_tunes_and_refuses_without_a_gpu(tmp_path, monkeypatch):
  import io

  from pallas_gemm import tune

  problem = tune.ragged_problem("8x8192x2048x7168")
  assert problem == PROBLEM
  cache = TuningCache(str(tmp_path / "tuning.json"))
  out, err = io.StringIO(), io.StringIO()
  assert tune.tune_ragged_shapes([problem], dry_run=True, cache=cache, out=out) == 0
  assert "    128x256x64 s4 epilogue 64x32 along_n/8\n" in out.getvalue()  # the default, listed
  monkeypatch.setattr(tune, "missing_gpu", lambda: "no GPU (test)")
  assert (
      tune.tune_ragged_shapes([problem], dry_run=False, cache=cache, err=err) == tune.NO_GPU_STATUS
  )
  monkeypatch.setattr(tune, "missing_gpu", lambda: None)
  out = io.StringIO()
  fake = lambda p: (lambda config: 1.0 + (config.tile_n != 128))
  assert (
      tune.tune_ragged_shapes([problem], dry_run=False, cache=cache, out=out, timer_factory=fake)
      == 0
  )
  assert cache.lookup(TuningKey.current(problem, kernel="ragged")).tile_n == 128
  with pytest.raises(tune.app.UsageError, match="is not GxMxNxK"):
    tune.ragged_problem("8x4096x2048")
