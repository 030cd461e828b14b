"""Autotuning: enumerate the valid configs of a problem, time them, cache the winner.

The search has three phases. Phase 1 times every candidate of `candidate_configs`
(tiles, stages, schedule, warpgroup split and cluster, pruned by
`GemmConfig.validate` and by the problem's size); phase 2 times the raster
order and group width of the fastest few (`raster_variants`), which only
change the order tiles are visited in; phase 3 times the fastest few of both
again, interleaved in rounds (A B C, A B C, ...) like the benchmark harness, so
that clock and power drift between the phases' single timings cannot pick the
winner. The winner is stored in the tuning cache (`pallas_gemm.tuning_cache`),
where `matmul` finds it.

The timer is a function `GemmConfig -> milliseconds`; on the GPU it is
`CuptiTimer` (CUPTI, median of several runs), elsewhere any stand-in:

>>> import os, tempfile
>>> from pallas_gemm.tuning_cache import TuningCache
>>> cache = TuningCache(os.path.join(tempfile.mkdtemp(), "tuning.json"))
>>> fake_ms = lambda cfg: 1e4 / (cfg.tile_m * cfg.tile_n) - 0.01 * cfg.stages  # big tiles win
>>> best = autotune((4096, 4096, 4096), "bfloat16", "NN", None, timer=fake_ms, cache=cache)
>>> (best.tile_m, best.tile_n, best.stages)
(128, 256, 4)
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import math
import numbers
import os
import statistics
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import raster
from pallas_gemm import split_k
from pallas_gemm import tuning_cache
from pallas_gemm import watchdog
from pallas_gemm.heuristics import default_config
from pallas_gemm.config import (
    CLUSTERS,
    DEFAULT_NUM_SMS,
    PARTIAL_EPILOGUE_TILE,
    SCHEDULES,
    WG_SPLITS,
    GemmConfig,
    GemmProblem,
    default_tile_k,
    tiles,
)

AUTOTUNE_ENV = "PALLAS_GEMM_AUTOTUNE"
"""Set to 1 to let `matmul` tune shapes the cache does not know (outside jit only)."""

TILE_OVERHANG = 64
"""A tile may extend past the problem by less than this (one WGMMA row block)."""

Timer = Callable[[GemmConfig], float]
"""Runs the kernel with a config and returns its time in milliseconds (may raise)."""

Progress = Callable[[int, int, GemmConfig, "float | None"], None]
"""Called after each trial with (done, total, config, ms or None if it failed)."""


@dataclasses.dataclass(frozen=True)
class SearchSpace:
  """The values tried for each `GemmConfig` field.

  Attributes:
    split_k: K slice counts; counts above 1 are tried only where they keep
      one wave of work units (see `_split_counts`), plus the count the
      `split_k` model picks, with f32 partials stored in
      `config.PARTIAL_EPILOGUE_TILE` chunks, and (to bound the search) only
      for cooperative configs with the dtype's default tile_k.
    deepest_stages: per tile shape and schedule, how many of the deepest rings
      that fit in SMEM are tried (the persistent kernel runs one CTA per SM, so
      SMEM left unused by a shallower ring buys nothing).
    refine_top: how many of phase 1's fastest configs get raster variants.
    confirm_top, confirm_rounds: phase 3 re-times this many of the fastest
      configs in this many interleaved rounds; the lowest median wins.
  """

  tile_m: tuple[int, ...] = (64, 128, 256)
  split_k: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
  tile_n: tuple[int, ...] = (32, 64, 128, 192, 256)
  tile_k: tuple[int, ...] = (32, 64, 128)
  stages: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8, 10, 12, 16)
  schedule: tuple[str, ...] = SCHEDULES
  wg_split: tuple[str, ...] = WG_SPLITS
  cluster: tuple[tuple[int, int], ...] = CLUSTERS
  epilogue_tile: tuple[tuple[int, int] | None, ...] = ((64, 64),)
  raster: tuple[str, ...] = raster.ORDERS
  group: tuple[int, ...] = (4, 8, 16)
  deepest_stages: int = 2
  refine_top: int = 3
  confirm_top: int = 4
  confirm_rounds: int = 3


# -- the problem --------------------------------------------------------------
def make_problem(
    shape_or_args,
    dtype="bfloat16",
    layout: str = "NN",
    epilogue: str | None = None,
    *,
    out_dtype=None,
) -> tuple[GemmProblem, str | None]:
  """The (GemmProblem, activation) that `matmul` would see.

  Args:
    shape_or_args: (M, N, K), (batch, M, N, K), or the operands (a, b) as
      arrays or `jax.ShapeDtypeStruct`s stored as `layout` says (then their
      dtype is used).
    dtype: operand dtype when a shape is given.
    layout: "NN", "NT", "TN" or "TT": A then B, "T" meaning stored transposed
      (A as (K, M), B as (N, K)).
    epilogue: None/"none", or "+"-joined parts: "bias", "c", an activation.
    out_dtype: defaults to `dtype`.

  >>> p, act = make_problem((8, 4096, 11008), layout="NT", epilogue="bias+silu")
  >>> (p.m, p.n, p.k, p.transpose_b, p.has_bias, act)
  (8, 4096, 11008, True, True, 'silu')
  """
  layout = layout.upper()
  if len(layout) != 2 or set(layout) - {"N", "T"}:
    raise ValueError(f"layout must be one of NN, NT, TN, TT, got {layout!r}")
  transpose_a, transpose_b = layout[0] == "T", layout[1] == "T"
  if all(isinstance(d, numbers.Integral) for d in shape_or_args):
    dims = tuple(int(d) for d in shape_or_args)
    if len(dims) not in (3, 4):
      raise ValueError(f"shape must be (M, N, K) or (batch, M, N, K), got {dims}")
    batch, (m, n, k) = (dims[0], dims[1:]) if len(dims) == 4 else (1, dims)
  else:
    a, b = shape_or_args
    m, k = a.shape[-2:][::-1] if transpose_a else a.shape[-2:]
    kb, n = b.shape[-2:][::-1] if transpose_b else b.shape[-2:]
    if k != kb:
      raise ValueError(f"a {a.shape} and b {b.shape} disagree on K under layout {layout}")
    batch, dtype = math.prod(a.shape[:-2] or b.shape[:-2]), a.dtype
  if min(batch, m, n, k) < 1:
    raise ValueError(
        f"shape_or_args: M, N, K (and batch) must be >= 1 to tune, got "
        f"{(batch, m, n, k) if batch != 1 else (m, n, k)} (an empty GEMM has nothing to tune)"
    )
  has_bias, has_c, activation = tuning_cache.parse_epilogue(epilogue)
  problem = GemmProblem(
      m=m,
      n=n,
      k=k,
      batch=batch,
      dtype=jnp.dtype(dtype).name,
      out_dtype=jnp.dtype(out_dtype or dtype).name,
      transpose_a=transpose_a,
      transpose_b=transpose_b,
      has_bias=has_bias,
      has_c=has_c,
  )
  return problem, activation


# -- the candidates -----------------------------------------------------------
def _is_valid(config: GemmConfig, problem: GemmProblem) -> bool:
  try:
    config.validate(problem)
  except ValueError:
    return False
  return True


def _fits_problem(problem: GemmProblem, tile_m: int, tile_n: int, tile_k: int, cluster) -> bool:
  """No tile overhangs the problem by a whole row block; clusters need >= 2 tiles to share."""
  overhang = lambda extent, tile: tile < max(TILE_OVERHANG, extent) + TILE_OVERHANG
  cm, cn = cluster
  return (
      overhang(problem.m, tile_m)
      and overhang(problem.n, tile_n)
      and overhang(problem.k, tile_k)
      and (cm == 1 or tiles(problem.m, tile_m) >= cm)
      and (cn == 1 or tiles(problem.n, tile_n) >= cn)
  )


def _split_counts(
    problem: GemmProblem, tile_m: int, tile_n: int, tile_k: int, space: SearchSpace, num_sms: int
) -> list[int]:
  """The split_k values worth timing for a tile shape: 1, and the counts of
  `space.split_k` and of the model (`split_k.choose`) that fit the output
  tiles into one wave of work units with at least
  `split_k.MIN_STEPS_PER_SLICE` steps per slice.

  >>> space = SearchSpace()
  >>> _split_counts(GemmProblem(m=16, n=1024, k=8192), 64, 128, 64, space, 132)
  [1, 2, 4, 8, 16]
  >>> _split_counts(GemmProblem(m=8192, n=8192, k=8192), 128, 256, 64, space, 132)
  [1]
  """
  mn_tiles = problem.batch * tiles(problem.m, tile_m) * tiles(problem.n, tile_n)
  most = min(num_sms // mn_tiles, tiles(problem.k, tile_k) // split_k.MIN_STEPS_PER_SLICE)
  if most < 2:
    return [1]
  modelled = split_k.choose(
      problem, tile_m=tile_m, tile_n=tile_n, tile_k=tile_k, stages=4, num_sms=num_sms
  )
  return sorted({1, modelled, *(s for s in space.split_k if s <= most)})


def candidate_configs(problem: GemmProblem, space: SearchSpace = SearchSpace()) -> list[GemmConfig]:
  """Every config of `space` that is worth timing for `problem` (phase 1).

  Kept: configs that pass `GemmConfig.validate(problem)` (SMEM budget, WGMMA
  shapes, swizzle divisibility, registers), whose tiles do not overhang the
  problem by a whole 64-row block, whose clusters have tiles to share, and,
  per tile shape and schedule, the `space.deepest_stages` deepest rings that
  fit and are no deeper than the K steps of a slice; pingpong's two rings
  need an even number of stages, at least 2 each.
  Raster order and group stay at their defaults (see `raster_variants`).
  Split-K counts: see `_split_counts`. The heuristic's own choice
  (`default_config`) is always a candidate, so tuning never loses to it.

  >>> len(candidate_configs(GemmProblem(m=8, n=8, k=8))) >= 1
  True
  """
  num_sms = _compat.device_sm_count() or DEFAULT_NUM_SMS
  configs = []
  for tm, tn, tk, schedule, cluster, epilogue_tile in itertools.product(
      space.tile_m, space.tile_n, space.tile_k, space.schedule, space.cluster, space.epilogue_tile
  ):
    if not _fits_problem(problem, tm, tn, tk, cluster):
      continue
    wg_splits = space.wg_split if schedule == "cooperative" else (GemmConfig.wg_split,)
    k_split_counts = [1]
    if schedule == "cooperative" and tk == default_tile_k(problem.dtype):
      k_split_counts = _split_counts(problem, tm, tn, tk, space, num_sms)
    for wg_split, k_splits in itertools.product(wg_splits, k_split_counts):
      fitting = []
      steps = tiles(tiles(problem.k, tk), k_splits)  # a ring deeper than the K steps idles
      for stages in sorted(space.stages, reverse=True):
        if schedule == "pingpong" and (stages % 2 or stages < 4):
          continue
        if stages > max(steps, 4 if schedule == "pingpong" else 2):
          continue
        config = GemmConfig(
            tile_m=tm,
            tile_n=tn,
            tile_k=tk,
            stages=stages,
            schedule=schedule,
            wg_split=wg_split,
            cluster=cluster,
            split_k=k_splits,
            epilogue_tile=PARTIAL_EPILOGUE_TILE if k_splits > 1 else epilogue_tile,
        )
        if config.epilogue_tile and config.epilogue_tile[1] > config.wg_tile[1]:
          config = dataclasses.replace(config, epilogue_tile=None)  # narrow: the whole tile
        if _is_valid(config, problem):
          fitting.append(config)
        if len(fitting) == space.deepest_stages:
          break
      configs += fitting
  heuristic = default_config(problem)
  if _is_valid(heuristic, problem):
    configs.append(heuristic)
  return list(dict.fromkeys(configs))


def raster_variants(config: GemmConfig, space: SearchSpace = SearchSpace()) -> list[GemmConfig]:
  """`config` with every other raster order and group width of `space` (phase 2).

  >>> len(raster_variants(GemmConfig()))  # 2 orders x 3 groups, less the config itself
  5
  """
  return [
      dataclasses.replace(config, raster=order, group=group)
      for order, group in itertools.product(space.raster, space.group)
      if (order, group) != (config.raster, config.group)
  ]


# -- timing -------------------------------------------------------------------
L2_BYTES = 50 * 2**20
"""H100 SXM L2 cache."""

COLD_L2_FACTOR = 4
"""L2 policy "cold": the input sets of one timed call are together at least this many L2s."""

MAX_INPUT_SETS = 64

L2_MODES = ("cold", "warm")


def input_sets(nbytes: int, l2: str = "cold") -> int:
  """How many independent input sets of `nbytes` (operands and output) one timed call
  runs in turn: "cold" enough that together they exceed `COLD_L2_FACTOR` L2 caches, so
  each call reads its operands from HBM as one layer's weights do in a model; "warm" one
  (its operands may stay in L2 from the previous call).

  >>> nbytes = (16 * 4096 + 4096 * 4096 + 16 * 4096) * 2   # 16x4096x4096 bf16: 32.25 MiB
  >>> input_sets(nbytes), input_sets(400 * 2**20), input_sets(nbytes, "warm")
  (7, 1, 1)
  """
  if l2 not in L2_MODES:
    raise ValueError(f"l2 must be one of {L2_MODES}, got {l2!r}")
  if l2 == "warm":
    return 1
  return min(MAX_INPUT_SETS, max(1, -(-COLD_L2_FACTOR * L2_BYTES // max(nbytes, 1))))


def rotating(fn, sets: int):
  """A jitted call of `fn` on each of `sets` input sets in turn: `rotating(fn, n)(arg_sets)`.

  Each call is ordered after the previous one's output by an optimization barrier
  (free at run time), so that XLA cannot merge the calls' kernels horizontally.
  """

  def run(arg_sets):
    outs, prev = [], None
    for args in arg_sets:
      if prev is not None:
        prev, args = jax.lax.optimization_barrier((prev, args))
      prev = fn(*args)
      outs.append(prev)
    return outs

  return jax.jit(run)


def _random_operands(problem: GemmProblem, seed: int):
  """(a, b, bias, c) for `problem`, iid standard normal, stored as its layout says."""
  ka, kb, kbias, kc = jax.random.split(jax.random.key(seed), 4)
  lead = (problem.batch,) if problem.batch > 1 else ()
  a_shape = (problem.k, problem.m) if problem.transpose_a else (problem.m, problem.k)
  b_shape = (problem.n, problem.k) if problem.transpose_b else (problem.k, problem.n)
  normal = lambda key, shape, dtype: jax.random.normal(key, shape, jnp.float32).astype(dtype)
  a = normal(ka, lead + a_shape, problem.dtype)
  b = normal(kb, lead + b_shape, problem.dtype)
  bias = normal(kbias, (problem.n,), jnp.float32) if problem.has_bias else None
  c = normal(kc, lead + (problem.m, problem.n), problem.out_dtype) if problem.has_c else None
  return a, b, bias, c


class CuptiTimer:
  """A `Timer` that runs `matmul` on random operands and returns the median time (ms).

  Times are CUPTI's (`jax.experimental.mosaic.gpu.profiler.measure`), summed
  over the kernels of one call (padding copies included, as a user pays
  them), median over `iterations` calls after one warm-up. With `l2="cold"`
  (the default, as the benchmark harness) a problem smaller than
  `COLD_L2_FACTOR` L2s is timed over `input_sets` operand sets in turn, and
  one call's time is their total over the count. `verify(config)`
  returns the relative error of a config's output against `matmul`'s XLA
  path (the tuner checks its winner with it). `prepare(configs)`
  compiles many configs ahead of timing them, `workers` at a time. One by
  default: on the H200, processes that compiled stream-K and tail-split configs
  on 8 threads then hung in 7 of 11 runs (in a kernel's first run or the next
  compile), never in 5 runs compiled one at a time (NOTES exp. 142); threads
  saved ~30% of the compile time. Each compile, check and timing has a deadline
  (`watchdog.deadline`): a config whose kernel never finishes ends the process
  with its name rather than hanging it. `measure` and `implementation` can be
  replaced, e.g. to exercise this on a CPU.
  """

  def __init__(
      self,
      problem: GemmProblem,
      activation: str | None = None,
      *,
      iterations: int = 20,
      implementation: str = "pallas",
      measure=None,
      seed: int = 0,
      workers: int = 1,
      l2: str = "cold",
  ):
    if measure is None:
      from jax.experimental.mosaic.gpu import profiler

      measure = profiler.measure
    self.problem, self.activation, self.implementation = problem, activation, implementation
    self.iterations, self.measure = iterations, measure
    if workers < 1:
      raise ValueError(f"workers={workers}: prepare needs at least one compile thread")
    self.workers = workers
    self.operands = _random_operands(problem, seed)
    out_bytes = problem.batch * problem.m * problem.n * jnp.dtype(problem.out_dtype).itemsize
    self.sets = input_sets(sum(x.nbytes for x in self.operands if x is not None) + out_bytes, l2)
    self._args = self.operands  # what one timed call is given
    if self.sets > 1:
      self._args = (
          (self.operands, *(_random_operands(problem, seed + i) for i in range(1, self.sets))),
      )
    self._compiled = {}  # config -> compiled executable, or the exception compiling raised
    self._reference = None  # the XLA path's output, computed on the first `verify`

  def _run_with(self, config: GemmConfig | None, implementation: str):
    from pallas_gemm.gemm import gemm  # not at the top: gemm consults this module

    problem = self.problem

    def run(a, b, bias, c):
      return gemm(
          a,
          b,
          transpose_a=problem.transpose_a,
          transpose_b=problem.transpose_b,
          bias=bias,
          activation=self.activation,
          c=c,
          beta=1.0 if problem.has_c else 0.0,
          out_dtype=problem.out_dtype,
          config=config,
          implementation=implementation,
      )

    return run

  def _jitted(self, config: GemmConfig):
    return jax.jit(self._run_with(config, self.implementation))

  def _timed(self, config: GemmConfig):
    """What one timed call runs: `config` on every input set in turn."""
    fn = self._jitted(config)
    return fn if self.sets == 1 else rotating(fn, self.sets)

  def _what(self, step: str, config: GemmConfig | None) -> str:
    """`step` of `config` on this problem, as a hung step is reported (`watchdog`)."""
    return f"{step} implementation={self.implementation!r} config={config!r} on {self.problem}"

  def _compile(self, config: GemmConfig):
    try:
      with watchdog.deadline(self._what("compiling", config)):
        return self._timed(config).lower(*self._args).compile()
    except Exception as e:  # noqa: BLE001 -- reported when the config is timed
      return e

  def prepare(self, configs) -> None:
    """Compiles `configs` (those not compiled yet), `workers` at a time; errors wait for
    `__call__`."""
    todo = [c for c in dict.fromkeys(configs) if c not in self._compiled]
    with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:
      self._compiled.update(zip(todo, pool.map(self._compile, todo)))

  def verify(self, config: GemmConfig) -> float:
    """Relative error of `config`'s output against `matmul`'s XLA path on the same operands."""
    with watchdog.deadline(self._what("checking", config)):
      out = self._jitted(config)(*self.operands)
      if self._reference is None:
        self._reference = jax.jit(self._run_with(None, "xla"))(*self.operands)
      ref = self._reference.astype(jnp.float32)
      diff = jnp.linalg.norm((out.astype(jnp.float32) - ref).ravel())
      scale = jnp.linalg.norm(ref.ravel())
      return float(jnp.nan_to_num(diff / jnp.maximum(scale, 1e-30), nan=jnp.inf))

  def __call__(self, config: GemmConfig) -> float:
    fn = self._compiled.get(config)  # kept: the confirmation phase times a config again
    if fn is None:
      fn = self._compiled[config] = self._timed(config)
    if isinstance(fn, Exception):
      raise fn
    with watchdog.deadline(self._what("timing", config)):
      _, times = self.measure(fn, iterations=self.iterations)(*self._args)
    if times is None:
      raise RuntimeError("no kernel was launched")
    return statistics.median(times if isinstance(times, list) else [times]) / self.sets


def _fastest(configs, timer: Timer, progress: Progress | None, done: int, total: int):
  """[(ms, config)] of the configs that ran, fastest first; and the failures."""
  timed, failures = [], []
  for i, config in enumerate(configs):
    try:
      ms = float(timer(config))
      if not math.isfinite(ms) or ms <= 0:
        raise ValueError(f"timer returned {ms} ms")
    except Exception as e:  # noqa: BLE001 -- a valid config can still fail to compile or run
      failures.append((config, e))
      ms = None
    else:
      timed.append((ms, i, config))
    if progress:
      progress(done + i + 1, total, config, ms)
  return [(ms, config) for ms, _, config in sorted(timed)], failures


VERIFY_BOUNDS = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 5e-3}
"""Largest relative error (vs `matmul`'s XLA path) a tuned winner may show, by output dtype:
a few roundings of the output dtype (fp8 outputs: 0.25)."""


def _confirm(ranked, timer: Timer, rounds: int, progress: Progress | None, done: int, total: int):
  """[(median ms, config)] of `ranked`'s configs re-timed in `rounds` interleaved rounds
  (each config once per round), fastest first; a config that fails drops out.

  >>> times = {"a": iter([2.0, 2.1, 1.9]), "b": iter([1.5, 1.6, 1.4])}
  >>> _confirm([(0.5, "a"), (1.0, "b")], lambda c: next(times[c]), 3, None, 0, 6)
  [(1.5, 'b'), (2.0, 'a')]
  """
  samples = {config: [] for _, config in ranked}
  for _ in range(rounds):
    for config in list(samples):
      trial = _fastest([config], timer, progress, done, total)[0]
      done += 1
      if trial:
        samples[config].append(trial[0][0])
      else:
        del samples[config]
  medians = [
      (statistics.median(times), i, config) for i, (config, times) in enumerate(samples.items())
  ]
  return [(ms, config) for ms, _, config in sorted(medians)]


def _first_correct(ranked, timer: Timer, problem, bound: float):
  """The fastest (ms, config) of `ranked` whose output `timer.verify` accepts (no verify: the
  fastest). A config that computes wrong numbers is skipped with a warning, never cached."""
  verify = getattr(timer, "verify", None)
  if verify is None:
    return ranked[0]
  for ms, config in ranked:
    err = verify(config)
    if err <= bound:
      return ms, config
    warnings.warn(
        f"skipping {config} for {problem}: its output is off by {err:.2e} "
        f"(relative; bound {bound:.0e}) against the XLA path",
        stacklevel=3,
    )
  raise RuntimeError(f"no candidate config computed {problem} correctly")


def search(
    problem,
    candidates,
    variants: Callable,
    timer,
    space: SearchSpace = SearchSpace(),
    progress: Progress | None = None,
):
  """(median ms, config) of the fastest of `candidates` for `problem`, any kernel's configs.

  Phase 1 times every candidate; phase 2 times `variants(config)` (configs that differ
  only in the order of the work, e.g. the raster) of the `space.refine_top` fastest;
  phase 3 times the `space.confirm_top` fastest again in `space.confirm_rounds`
  interleaved rounds and ranks them by their median. A timer with `prepare(configs)`
  is handed each phase's configs first; with `verify(config)`, the winner is the
  fastest whose output is within `VERIFY_BOUNDS` of the XLA path. Candidates that fail
  are skipped with one warning; if all fail, RuntimeError.

  >>> search("p", [1, 2, 3], lambda c: [c], lambda c: {1: 3.0, 2: 1.0, 3: 2.0}[c])
  (1.0, 2)
  """
  per_config = len(variants(candidates[0]))
  refining = min(space.refine_top, len(candidates)) * per_config
  estimate = len(candidates) + refining + space.confirm_top * space.confirm_rounds
  prepare = getattr(timer, "prepare", lambda configs: None)
  prepare(candidates)
  ranked, failures = _fastest(candidates, timer, progress, 0, estimate)
  refine = [v for _, config in ranked[: space.refine_top] for v in variants(config)]
  prepare(refine)
  refined, more_failures = _fastest(refine, timer, progress, len(candidates), estimate)
  failures += more_failures
  if failures:
    config, error = failures[0]
    warnings.warn(
        f"{len(failures)} of {len(candidates) + len(refine)} configs failed for "
        f"{problem} (first: {config}: {type(error).__name__}: {error})",
        stacklevel=3,
    )
  if not ranked:
    raise RuntimeError(f"every candidate config failed for {problem}") from failures[0][1]
  best_of = {}  # config -> its fastest phase 1 or 2 time; a variant may repeat a config
  for ms, config in sorted(ranked + refined, key=lambda pair: pair[0]):
    best_of.setdefault(config, ms)
  fastest = [(ms, config) for config, ms in best_of.items()]
  top, rest = fastest[: space.confirm_top], fastest[space.confirm_top :]
  done = len(candidates) + len(refine)
  confirmed = _confirm(
      top, timer, space.confirm_rounds, progress, done, done + len(top) * space.confirm_rounds
  )
  # If every confirmation run failed, the phase 1 and 2 times still rank the configs.
  bound = VERIFY_BOUNDS.get(getattr(problem, "out_dtype", None), 0.25)
  return _first_correct(confirmed + rest or top, timer, problem, bound)


def tune_problem(
    problem: GemmProblem,
    activation: str | None = None,
    *,
    timer: Timer | None = None,
    space: SearchSpace = SearchSpace(),
    cache: tuning_cache.TuningCache | None = None,
    progress: Progress | None = None,
) -> GemmConfig:
  """Times the candidates of `problem`, stores the fastest in `cache`, returns it.

  `timer` defaults to `CuptiTimer(problem, activation)` (needs the GPU); `cache` to
  the default cache. The search is `search`'s, with `raster_variants` as phase 2.
  """
  candidates = candidate_configs(problem, space)
  if not candidates:
    GemmConfig().validate(problem)  # raises the reason when the problem itself is unsupported
    raise ValueError(f"no config of the search space is valid for {problem}")
  timer = timer or CuptiTimer(problem, activation)
  variants = lambda config: raster_variants(config, space)
  best_ms, best = search(problem, candidates, variants, timer, space, progress)
  cache = cache or tuning_cache.default_cache()
  cache.store(tuning_cache.TuningKey.current(problem, activation), best, best_ms)
  return best


def autotune(
    shape_or_args,
    dtype="bfloat16",
    layout: str = "NN",
    epilogue: str | None = None,
    *,
    out_dtype=None,
    timer: Timer | None = None,
    space: SearchSpace = SearchSpace(),
    cache: tuning_cache.TuningCache | None = None,
    progress: Progress | None = None,
) -> GemmConfig:
  """Tunes one problem (see `make_problem` for the arguments) and caches the winner.

  Returns the fastest `GemmConfig`; `matmul` picks it up from the cache.
  """
  problem, activation = make_problem(shape_or_args, dtype, layout, epilogue, out_dtype=out_dtype)
  return tune_problem(problem, activation, timer=timer, space=space, cache=cache, progress=progress)


# -- what matmul calls --------------------------------------------------------
def in_trace(*operands) -> bool:
  """Whether jax is tracing (jit, grad, vmap, ...): work done now would be staged, not run.

  True if an operand is a `jax.core.Tracer`; also, through jax's private trace
  state where it exists, when the operands are constants closed over by a trace.
  """
  if any(isinstance(x, jax.core.Tracer) for x in operands):
    return True
  from jax._src import core as jax_core

  clean = getattr(jax_core, "trace_state_clean", None)
  return clean is not None and not clean()


def tuning_requested(tune: bool | None = None) -> bool:
  """`tune` if given, else whether $PALLAS_GEMM_AUTOTUNE is 1 (or true/yes/on)."""
  if tune is not None:
    return tune
  return os.environ.get(AUTOTUNE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def resolve_config(
    problem: GemmProblem, activation: str | None = None, *, operands=(), tune: bool | None = None
) -> GemmConfig | None:
  """The config `matmul` should use, or None for the heuristic `default_config`.

  The cached winner if there is one; else, when tuning is requested
  (`tuning_requested(tune)`) and jax is not tracing `operands`, a fresh
  `tune_problem` (minutes: it compiles and times every candidate); else None.
  Inside a trace it never tunes (the timing runs would be staged into the
  traced program); it warns instead.
  """
  config = tuning_cache.lookup_config(problem, activation)
  if config is not None or not tuning_requested(tune):
    return config
  if in_trace(*operands):
    warnings.warn(
        f"{AUTOTUNE_ENV}: not tuning {problem} inside a jax trace; call matmul once "
        "outside jit, or run `python -m pallas_gemm.tune`",
        stacklevel=2,
    )
    return None
  return tune_problem(problem, activation)
