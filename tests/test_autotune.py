"""Autotuning on the CPU: candidate pruning, winner selection with fake timers, the cache, the CLI."""

import collections
import dataclasses
import doctest
import importlib
import io
import json
import os
import warnings

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_gemm.shapes import Shape
from pallas_gemm import tune
from pallas_gemm import tuning_cache as tc
from pallas_gemm.config import GemmConfig, GemmProblem
from pallas_gemm.heuristics import default_config

at = importlib.import_module("pallas_gemm.tuner")
BIG = GemmProblem(m=4096, n=4096, k=4096)
SPACE = at.SearchSpace()


@pytest.fixture
def cache(tmp_path):
  return tc.TuningCache(str(tmp_path / "tuning.json"))


def test_docstring_examples():
  assert doctest.testmod(at).failed == 0


# -- the problem --------------------------------------------------------------
def test_make_problem_from_shapes_and_operands():
  p, act = at.make_problem((2, 64, 128, 256), "float16", "tt", "c+relu", out_dtype="float32")
  assert p == GemmProblem(
      m=64,
      n=128,
      k=256,
      batch=2,
      dtype="float16",
      out_dtype="float32",
      transpose_a=True,
      transpose_b=True,
      has_c=True,
  )
  assert act == "relu"
  a = jax.ShapeDtypeStruct((3, 256, 64), jnp.bfloat16)  # (batch, K, M): A transposed
  b = jnp.zeros((128, 256), jnp.bfloat16)  # (N, K): B transposed
  assert at.make_problem((a, b), layout="TT")[0] == GemmProblem(
      m=64, n=128, k=256, batch=3, transpose_a=True, transpose_b=True
  )


@pytest.mark.parametrize(
    "args, match",
    [
        (((64, 64),), "shape must be"),
        (((64, 64, 64), "bfloat16", "NX"), "layout"),
        (((64, 64, 64), "bfloat16", "NN", "bias+tanh"), "epilogue"),
        (((jnp.zeros((8, 16)), jnp.zeros((32, 8))),), "disagree on K"),
        (((0, 128, 128),), "must be >= 1 to tune"),
        (((-1, 128, 128),), "must be >= 1 to tune"),
        (((2, 64, 0, 64),), "must be >= 1 to tune"),
    ],
)
def test_make_problem_rejects_bad_arguments(args, match):
  with pytest.raises(ValueError, match=match):
    at.make_problem(*args)


# -- the candidates -----------------------------------------------------------
def _shape_key(config):
  return dataclasses.replace(config, stages=1)


@pytest.mark.parametrize(
    "problem",
    [
        BIG,
        GemmProblem(m=4096, n=4096, k=4096, transpose_a=True, transpose_b=True),
        GemmProblem(m=16, n=4096, k=4096),
        GemmProblem(m=200, n=136, k=72, out_dtype="float32", has_bias=True),
        GemmProblem(m=128, n=128, k=65536),
        GemmProblem(m=8, n=8, k=8),
        GemmProblem(m=1, n=1, k=1, dtype="float16", out_dtype="float32", has_c=True),
    ],
)
def test_candidates_are_valid_pruned_and_not_too_many(problem):
  configs = at.candidate_configs(problem)
  assert 1 <= len(configs) <= 400  # ~0.3 s each with parallel compiles
  assert len(set(configs)) == len(configs)
  heuristic = default_config(problem)
  assert heuristic in configs  # tuning never loses to the default
  for config in set(configs) - {heuristic}:  # the search space's rules
    config.validate(problem)  # pruned by the kernel's own checks
    assert config.tile_m < max(64, problem.m) + 64 and config.tile_n < max(64, problem.n) + 64
    assert config.tile_k < max(64, problem.k) + 64
    cm, cn = config.cluster
    assert cm == 1 or problem.m > config.tile_m
    assert cn == 1 or problem.n > config.tile_n
    if config.schedule == "pingpong":
      assert config.stages % 2 == 0 and config.stages >= 4
  by_shape = collections.defaultdict(list)
  for config in configs:
    by_shape[_shape_key(config)].append(config.stages)
  for shape, stages in by_shape.items():  # the deepest rings that fit, nothing shallower
    if shape == _shape_key(heuristic) and len(stages) > SPACE.deepest_stages:
      stages.remove(heuristic.stages)  # the heuristic's own ring, added to the search
    assert len(stages) <= SPACE.deepest_stages
    steps = -(-(-(-problem.k // shape.tile_k)) // shape.split_k)
    floor = 4 if shape.schedule == "pingpong" else 2
    deeper = [
        s
        for s in SPACE.stages
        if s > max(stages)
        and s <= max(steps, floor)
        and (shape.schedule != "pingpong" or s % 2 == 0)
    ]
    assert not deeper or not at._is_valid(dataclasses.replace(shape, stages=deeper[0]), problem)


def test_a_large_problem_explores_every_schedule_cluster_and_tile_shape():
  configs = at.candidate_configs(BIG)
  assert 50 <= len(configs) <= 300
  assert {c.schedule for c in configs} == {"cooperative", "pingpong"}
  assert {c.cluster for c in configs} == {(1, 1), (2, 1), (1, 2)}
  assert {c.tile_m for c in configs} == {64, 128, 256}
  assert {c.tile_n for c in configs} == {32, 64, 128, 192, 256}
  assert {c.wg_split for c in configs if c.schedule == "cooperative"} == {"m", "n"}
  transposed_a = at.candidate_configs(dataclasses.replace(BIG, transpose_a=True))
  assert all(c.wg_split == "n" for c in transposed_a if c.schedule == "cooperative")


def test_raster_variants_cover_orders_and_groups_once():
  variants = at.raster_variants(GemmConfig())
  assert len(variants) == len(SPACE.raster) * len(SPACE.group) - 1
  assert GemmConfig() not in variants and len(set(variants)) == len(variants)
  assert {dataclasses.replace(v, raster="along_n", group=8) for v in variants} == {GemmConfig()}


def test_an_unsupported_problem_says_why():
  with pytest.raises(ValueError, match="dtype float32 not supported"):
    at.autotune((64, 64, 64), "float32", timer=lambda c: 1.0)


# -- tuning with fake timers --------------------------------------------------
def fake_ms(config):
  """Bigger tiles and deeper rings are faster; along_m with group 16 is 10% faster still."""
  ms = 1e4 / (config.tile_m * config.tile_n) - 0.01 * config.stages
  return ms * (0.9 if (config.raster, config.group) == ("along_m", 16) else 1.0)


def test_tune_picks_the_fastest_including_raster_and_caches_it(cache):
  seen = []
  best = at.tune_problem(BIG, "relu", timer=lambda c: seen.append(c) or fake_ms(c), cache=cache)
  assert min(seen, key=fake_ms) == best
  assert (best.tile_m * best.tile_n, best.raster, best.group) == (128 * 256, "along_m", 16)
  confirmations = SPACE.confirm_top * SPACE.confirm_rounds  # the fastest few, timed again
  assert len(set(seen)) == len(at.candidate_configs(BIG)) + 3 * 5
  assert len(seen) == len(set(seen)) + confirmations
  record = cache.record(tc.TuningKey.current(BIG, "relu"))
  assert (record.config, record.time_ms) == (best, fake_ms(best))


def test_a_config_timed_fast_once_by_luck_loses_the_interleaved_confirmation(cache):
  """Phase 1 sees one config at a lucky 0.5x of its real time (a clock boost, say);
  timed again in interleaved rounds it is slower than the real fastest, which wins."""
  lucky = sorted(at.candidate_configs(BIG), key=fake_ms)[1]
  calls = collections.Counter()

  def drifting(config):
    calls[config] += 1
    return fake_ms(config) * (0.5 if config == lucky and calls[config] == 1 else 1.0)

  best = at.tune_problem(
      BIG, timer=drifting, cache=cache, space=dataclasses.replace(SPACE, refine_top=1)
  )
  assert calls[lucky] == 1 + SPACE.confirm_rounds  # it was among the confirmed
  assert best != lucky and fake_ms(best) < fake_ms(lucky)
  assert cache.record(tc.TuningKey.current(BIG)).time_ms == fake_ms(best)
  no_confirmation = dataclasses.replace(SPACE, refine_top=1, confirm_top=0)
  calls.clear()
  assert at.tune_problem(BIG, timer=drifting, cache=cache, space=no_confirmation) == lucky


def test_configs_that_fail_when_timed_again_are_dropped(cache):
  calls = collections.Counter()

  def once_only(config):
    calls[config] += 1
    if calls[config] > 1:
      raise RuntimeError("flaky")
    return fake_ms(config)

  best = at.tune_problem(BIG, timer=once_only, cache=cache)
  confirmed = [c for c, n in calls.items() if n > 1]
  assert len(confirmed) == SPACE.confirm_top and best not in confirmed
  assert fake_ms(best) == min(fake_ms(c) for c in calls if c not in confirmed)  # next fastest


def test_progress_counts_every_trial_up_to_the_total(cache):
  calls = []
  at.tune_problem(BIG, timer=fake_ms, cache=cache, progress=lambda *a: calls.append(a))
  done = [c[0] for c in calls]
  assert done == list(range(1, len(calls) + 1))
  assert calls[-1][0] == calls[-1][1]


def test_failing_configs_are_skipped_with_one_warning(cache):
  def flaky(config):
    if config.cluster != (1, 1):
      raise RuntimeError("does not compile")
    return fake_ms(config)

  with pytest.warns(UserWarning, match="configs failed .*does not compile"):
    best = at.tune_problem(BIG, timer=flaky, cache=cache)
  assert best.cluster == (1, 1)


@pytest.mark.parametrize("bad", [RuntimeError("boom"), float("nan"), -1.0])
def test_when_every_config_fails_nothing_is_cached(cache, bad):
  def timer(config):
    if isinstance(bad, Exception):
      raise bad
    return bad

  with warnings.catch_warnings(), pytest.raises(RuntimeError, match="every candidate"):
    warnings.simplefilter("ignore")
    at.tune_problem(GemmProblem(m=64, n=64, k=64), timer=timer, cache=cache)
  assert cache.records() == {}


def test_CuptiTimer_runs_matmul_on_the_problem_and_takes_the_median():
  problem = GemmProblem(
      m=8, n=16, k=32, batch=2, transpose_b=True, has_bias=True, has_c=True, out_dtype="float32"
  )
  outputs = []

  def fake_measure(fn, iterations):
    def run(*args):
      outputs.append(fn(*args))
      return outputs[-1], [3.0, 1.0, 2.0, 9.0, 0.5][:iterations]

    return run

  timer = at.CuptiTimer(
      problem, "relu", iterations=5, implementation="xla", measure=fake_measure, l2="warm"
  )
  assert timer(GemmConfig()) == 2.0
  assert outputs[0].shape == (2, 8, 16) and outputs[0].dtype == jnp.float32
  assert float(outputs[0].min()) >= 0.0  # relu ran


def test_cold_cupti_timer_times_each_call_over_input_sets_and_divides_by_their_count():
  problem = GemmProblem(m=16, n=4096, k=4096)  # 32.25 MiB: 7 sets make 4 L2s
  seen = []

  def fake_measure(fn, iterations):
    def run(*args):
      seen.append(args)
      return fn(*args), [7.0] * iterations

    return run

  timer = at.CuptiTimer(problem, iterations=2, implementation="xla", measure=fake_measure)
  assert timer.sets == 7
  assert timer(GemmConfig()) == 1.0
  (sets,) = seen[0]
  assert len(sets) == 7 and sets[0] is timer.operands
  assert not np.array_equal(np.asarray(sets[0][1][:4, :4]), np.asarray(sets[1][1][:4, :4]))


def test_cupti_timer_prepares_configs_in_parallel_and_reports_compile_errors_when_timed():
  problem = GemmProblem(m=8, n=16, k=32)
  measured = []

  def fake_measure(fn, iterations):
    measured.append(fn)
    return lambda *args: (fn(*args), [1.0] * iterations)

  timer = at.CuptiTimer(
      problem, iterations=3, implementation="xla", measure=fake_measure, workers=2, l2="warm"
  )
  good, bad = GemmConfig(), GemmConfig(stages=3)
  timer._jitted = (
      lambda config: (_ for _ in ()).throw(ValueError("no"))
      if config == bad
      else jax.jit(lambda a, b, bias, c: a @ b)
  )
  timer.prepare([good, bad, good])
  assert timer(good) == 1.0
  assert isinstance(measured[0], jax.stages.Compiled)  # compiled ahead, not at timing
  with pytest.raises(ValueError, match="no"):
    timer(bad)


class _VerifyingTimer:
  """Times by tile size (bigger is faster); `wrong` configs compute garbage."""

  def __init__(self, wrong):
    self.wrong = wrong

  def __call__(self, config):
    return 1e4 / (config.tile_m * config.tile_n) + 1e-3 * config.stages

  def verify(self, config):
    return 1.0 if self.wrong(config) else 1e-3


def test_tuning_skips_a_fast_config_that_computes_wrong_numbers(cache):
  problem = GemmProblem(m=4096, n=4096, k=4096)
  fastest = at.tune_problem(problem, timer=_VerifyingTimer(lambda c: False), cache=cache)
  broken = lambda c: (c.tile_m, c.tile_n) == (fastest.tile_m, fastest.tile_n)
  with pytest.warns(UserWarning, match="off by 1.00e\\+00"):
    second = at.tune_problem(problem, timer=_VerifyingTimer(broken), cache=cache)
  assert not broken(second)
  assert cache.lookup(tc.TuningKey.current(problem)) == second
  with pytest.raises(RuntimeError, match="no candidate config computed"), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    at.tune_problem(problem, timer=_VerifyingTimer(lambda c: True), cache=cache)


def test_cupti_timer_verifies_against_the_xla_path():
  problem = GemmProblem(m=40, n=24, k=72, has_bias=True)
  timer = at.CuptiTimer(
      problem, "gelu_tanh", implementation="xla", measure=lambda fn, iterations: None
  )
  assert timer.verify(GemmConfig()) < 1e-6  # the XLA path against itself


# -- what matmul calls --------------------------------------------------------
def test_in_trace_sees_tracers_and_closed_over_constants():
  x = jnp.ones(3)
  assert not at.in_trace(x)
  seen = []
  jax.jit(lambda y: seen.append((at.in_trace(y), at.in_trace(x))) or y)(x)
  assert seen == [(True, True)]


def test_tuning_is_requested_by_argument_or_environment(monkeypatch):
  monkeypatch.delenv(at.AUTOTUNE_ENV, raising=False)
  assert not at.tuning_requested()
  assert at.tuning_requested(True)
  monkeypatch.setenv(at.AUTOTUNE_ENV, "1")
  assert at.tuning_requested() and not at.tuning_requested(False)
  monkeypatch.setenv(at.AUTOTUNE_ENV, "0")
  assert not at.tuning_requested()


@pytest.fixture
def env_cache(tmp_path, monkeypatch):
  monkeypatch.setenv(tc.CACHE_ENV, str(tmp_path / "env.json"))
  monkeypatch.delenv(at.AUTOTUNE_ENV, raising=False)
  tuned = []
  monkeypatch.setattr(at, "tune_problem", lambda p, a=None: tuned.append(p) or GemmConfig())
  return tc.default_cache(), tuned


def test_resolve_config_prefers_the_cache_and_never_tunes_unasked(env_cache):
  cache, tuned = env_cache
  assert at.resolve_config(BIG) is None
  cache.store(tc.TuningKey.current(BIG), GemmConfig(stages=3), 1.0)
  assert at.resolve_config(BIG, tune=True) == GemmConfig(stages=3)
  assert tuned == []


def test_resolve_config_tunes_when_asked_outside_a_trace_only(env_cache, monkeypatch):
  _, tuned = env_cache
  monkeypatch.setenv(at.AUTOTUNE_ENV, "1")
  assert at.resolve_config(BIG, operands=(jnp.ones(2),)) == GemmConfig()
  assert tuned == [BIG]
  with pytest.warns(UserWarning, match="not tuning .* inside a jax trace"):
    jax.jit(lambda x: at.resolve_config(BIG, operands=(x,)) or x)(jnp.ones(2))
  assert tuned == [BIG]


# -- the CLI ------------------------------------------------------------------
SHAPES = [
    Shape(4096, 4096, 4096, name="square"),
    Shape(1, 1024, 8192, layout="NT", epilogue="bias"),
]


def test_dry_run_lists_candidates_without_a_gpu(cache):
  out = io.StringIO()
  assert tune.tune_shapes(SHAPES, dry_run=True, cache=cache, out=out) == 0
  text = out.getvalue()
  assert "[1/2] 4096x4096x4096 bfloat16 NN (square): " in text
  assert "[2/2] 1x1024x8192 bfloat16 NT bias: " in text
  assert "    128x256x64 s4 cooperative/m cluster 1x1 along_n/8\n" in text
  assert not os.path.exists(cache.path)


def test_tuning_without_a_gpu_fails_clearly(cache):
  err = io.StringIO()
  assert tune.tune_shapes(SHAPES, dry_run=False, cache=cache, err=err) == tune.NO_GPU_STATUS
  assert "cannot tune: no GPU" in err.getvalue() and "--dry-run" in err.getvalue()


def test_tuning_writes_every_shape_to_the_cache(cache, monkeypatch, tmp_path):
  monkeypatch.setattr(tune, "missing_gpu", lambda: None)
  out, log = io.StringIO(), tmp_path / "trials.jsonl"
  status = tune.tune_shapes(
      SHAPES,
      dry_run=False,
      cache=cache,
      out=out,
      timer_factory=lambda problem, act, iterations: fake_ms,
      log=str(log),
  )
  assert status == 0
  assert len(cache.records()) == 2
  trials = [json.loads(line) for line in log.read_text().splitlines()]
  assert {t["shape"] for t in trials} == {s.label for s in SHAPES}
  assert all(
      t["ms"]
      == fake_ms(
          GemmConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in t["config"].items()})
      )
      for t in trials
  )
  assert out.getvalue().count("  best ") == 2 and "TFLOP/s" in out.getvalue()
  assert "] 1" in out.getvalue()  # the progress bar


def test_a_shape_whose_configs_all_fail_is_reported_and_the_rest_tuned(cache, monkeypatch):
  monkeypatch.setattr(tune, "missing_gpu", lambda: None)

  def timer_factory(problem, activation, iterations):
    if problem.m == 1:
      return lambda config: 1 / 0
    return fake_ms

  out = io.StringIO()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    status = tune.tune_shapes(
        SHAPES, dry_run=False, cache=cache, out=out, timer_factory=timer_factory
    )
  assert status == 1 and len(cache.records()) == 1
  assert "  failed: every candidate config failed" in out.getvalue()
  assert "ZeroDivisionError" in out.getvalue() and "(1 of 2 shapes tuned)" in out.getvalue()


def test_progress_bar_redraws_on_a_terminal():
  class Tty(io.StringIO):

    def isatty(self):
      return True

  stream = Tty()
  bar = tune.ProgressBar(stream, width=10)
  for done in range(1, 5):
    bar(done, 4, GemmConfig(), 1.0 / done)
  bar.close()
  assert stream.getvalue().count("\r") == 4 and stream.getvalue().endswith(
      "[##########] 4/4 best 0.2500 ms\n"
  )


def test_command_line_accepts_dashed_flags_and_shape_files(tmp_path, monkeypatch, capsys):
  shapes = tmp_path / "shapes.txt"
  shapes.write_text("# M N K\n64x64x64\n128 256 512\n")
  monkeypatch.setenv(tc.CACHE_ENV, str(tmp_path / "c.json"))
  try:
    tune.parse_flags(["tune", "--shapes", str(shapes), "--dry-run", "--deepest-stages=1"])
    assert tune.main(["tune"]) == 0
  finally:
    flags.FLAGS.unparse_flags()
  text = capsys.readouterr().out
  assert "[2/2] 128x256x512 bfloat16 NN: " in text
  assert "64x64x64 s4 pingpong" in text and "64x64x64 s6 pingpong" not in text  # 1 K step
  assert "64x64x64 s8 cooperative/n" in text and " s10 " not in text  # <= the 8 K steps


def test_command_line_needs_exactly_one_shape_source():
  try:
    tune.parse_flags(["tune", "--sweep", "llm", "--shapes", "x.txt"])
    with pytest.raises(app.UsageError, match="exactly one"):
      tune.main(["tune"])
  finally:
    flags.FLAGS.unparse_flags()
