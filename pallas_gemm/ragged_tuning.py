"""Tuning the grouped GEMM (`ragged_dot`) as `tuner` tunes the dense one.

Candidates are `RaggedConfig`s (tile N and K, the epilogue tile, the deepest ring that
fits), phase 2 their work orders (raster and band width), the search `tuner.search`'s,
the timer CUPTI on random operands with equal groups, and the winner goes to the tuning
cache under a "ragged" key (`tuning_cache.TuningKey`), where `ragged_dot` finds it
(`tuning_cache.lookup_ragged_config`).

>>> import os, tempfile
>>> from pallas_gemm.tuning_cache import TuningCache, TuningKey
>>> cache = TuningCache(os.path.join(tempfile.mkdtemp(), "tuning.json"))
>>> problem = RaggedProblem(m=8192, n=4096, k=4096, groups=8)
>>> fake_ms = lambda cfg: 1e4 / cfg.tile_n - 0.01 * cfg.stages   # wide tiles win
>>> best = tune_ragged(problem, timer=fake_ms, cache=cache)
>>> best.tile_n, cache.lookup(TuningKey.current(problem, kernel="ragged")) == best
(256, True)
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from pallas_gemm import raster
from pallas_gemm import smem
from pallas_gemm import tuning_cache
from pallas_gemm.ragged_gemm import RaggedConfig, RaggedProblem
from pallas_gemm.tuner import Progress, SearchSpace, search

TILE_NS = (64, 128, 256)
TILE_KS = (64, 128)
EPILOGUE_TILES = ((64, 32), (64, 64))
GROUPS = (4, 8, 16)
MAX_STAGES = 6


def candidate_configs(problem: RaggedProblem) -> list[RaggedConfig]:
  """Every valid (tile_n, tile_k, epilogue tile) with the deepest ring that fits.

  >>> len(candidate_configs(RaggedProblem(m=4096, n=4096, k=4096, groups=8))) > 1
  True
  """
  found = []
  for tile_n, tile_k, epilogue_tile in itertools.product(TILE_NS, TILE_KS, EPILOGUE_TILES):
    config = smem.deepest(
        lambda stages: RaggedConfig(
            tile_n=tile_n, tile_k=tile_k, stages=stages, epilogue_tile=epilogue_tile
        ),
        range(MAX_STAGES, 1, -1),
        lambda cfg: cfg.smem_bytes(problem) <= smem.LIMIT_BYTES,
    )
    try:
      config.validate(problem)
    except ValueError:
      continue
    found.append(config)
  return list(dict.fromkeys(found))


def order_variants(config: RaggedConfig) -> list[RaggedConfig]:
  """`config` with every raster order and band width (the work order alone)."""
  return [
      dataclasses.replace(config, raster=order, group=group)
      for order, group in itertools.product(raster.ORDERS, GROUPS)
  ]


def _operands(problem: RaggedProblem, seed: int = 0):
  """lhs, rhs and equal group sizes (the remainder to the last group) for `problem`."""
  k1, k2 = jax.random.split(jax.random.key(seed))
  lhs = jax.random.normal(k1, (problem.m, problem.k), jnp.float32).astype(problem.dtype)
  shape = (problem.groups, problem.n, problem.k) if problem.transpose_rhs else (
      problem.groups, problem.k, problem.n
  )  # fmt: skip
  rhs = (jax.random.normal(k2, shape, jnp.float32) / np.sqrt(problem.k)).astype(problem.dtype)
  sizes = np.full(problem.groups, problem.m // problem.groups, np.int32)
  sizes[-1] += problem.m - sizes.sum()
  return lhs, rhs, jnp.asarray(sizes)


class CuptiTimer:
  """A timer of `ragged_dot` with a config: CUPTI kernel time, median of `iterations`
  calls after a warm-up; `verify(config)` is the relative error against the XLA path."""

  def __init__(self, problem: RaggedProblem, *, iterations: int = 10, measure=None):
    if measure is None:
      from jax.experimental.mosaic.gpu import profiler

      measure = profiler.measure
    self.problem, self.iterations, self.measure = problem, iterations, measure
    self.operands = _operands(problem)
    self._reference = None

  def _fn(self, config, implementation="pallas"):
    from pallas_gemm.grouped import ragged_dot  # not at the top: grouped reads the cache

    p = self.problem
    return jax.jit(
        lambda lhs, rhs, sizes: ragged_dot(
            lhs, rhs, sizes, preferred_element_type=p.out_dtype, transpose_rhs=p.transpose_rhs,
            config=config, implementation=implementation,
        )
    )  # fmt: skip

  def __call__(self, config: RaggedConfig) -> float:
    _, times = self.measure(self._fn(config), iterations=self.iterations)(*self.operands)
    if times is None:
      raise RuntimeError("no kernel was launched")
    return statistics.median(times if isinstance(times, list) else [times])

  def verify(self, config: RaggedConfig) -> float:
    out = self._fn(config)(*self.operands).astype(jnp.float32)
    if self._reference is None:
      self._reference = self._fn(None, "xla")(*self.operands).astype(jnp.float32)
    ref = self._reference
    return float(
        jnp.linalg.norm((out - ref).ravel()) / jnp.maximum(jnp.linalg.norm(ref.ravel()), 1e-30)
    )


def tune_ragged(
    problem: RaggedProblem,
    *,
    timer=None,
    space: SearchSpace = SearchSpace(),
    cache: tuning_cache.TuningCache | None = None,
    progress: Progress | None = None,
) -> RaggedConfig:
  """Times the candidates of `problem`, stores the fastest in `cache` (the default cache
  when None), returns it. `timer` defaults to `CuptiTimer(problem)` (needs the GPU)."""
  candidates = candidate_configs(problem)
  if not candidates:
    RaggedConfig().validate(problem)  # raises the reason when the problem is unsupported
    raise ValueError(f"no config of the search space is valid for {problem}")
  timer = timer or CuptiTimer(problem)
  best_ms, best = search(problem, candidates, order_variants, timer, space, progress)
  cache = cache or tuning_cache.default_cache()
  cache.store(tuning_cache.TuningKey.current(problem, kernel="ragged"), best, best_ms)
  return best
