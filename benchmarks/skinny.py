"""Skinny outputs (N <= 32): the default (a tile as narrow as N, or XLA's GEMM where no tile
wins) against the 64-wide tile it replaced, and XLA (NOTES exp. 101).

    python -m benchmarks.skinny                     # on a Hopper GPU: the table
    python -m benchmarks.skinny                     # elsewhere: the plan only

Contenders, interleaved in rounds (CUPTI medians, cold L2 as the tuner times: problems
under four L2 caches rotate over input sets):
  xla       `jnp.dot` (the layouts as stored)
  default   `pallas_gemm.matmul` with `implementation=None`: `route.choose`, then
            `heuristics.default_config` (the narrow tile, `heuristics.narrow_tile_n`)
  wide      the kernel with the 128x64 tile the default took before: the output
            widened to 64 columns and sliced, B padded where its rows are narrow

>>> [c.label for c in CASES][:2]
['65536x32x512 NN', '65536x32x2048 NN']
>>> wide_config(CASES[0]).tile_n, default_plan(CASES[0])
(64, '128x32x64 s8 cooperative/m cluster 2x1')
>>> default_plan(Case(65536, 16, 2048))
'xla'
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics

from pallas_gemm import heuristics, route
from pallas_gemm.config import GemmConfig, fit_stages
from pallas_gemm.tuner import CuptiTimer, make_problem


@dataclasses.dataclass(frozen=True)
class Case:
  """out (m, n) = op(a) @ op(b), `layout` as in `tuner.make_problem` ("NT": B stored (N, K))."""

  m: int
  n: int
  k: int
  layout: str = "NN"
  batch: int = 1

  @property
  def label(self) -> str:
    lead = f"{self.batch}x" if self.batch > 1 else ""
    return f"{lead}{self.m}x{self.n}x{self.k} {self.layout}"

  def problem(self):
    dims = (self.batch, self.m, self.n, self.k) if self.batch > 1 else (self.m, self.n, self.k)
    return make_problem(dims, "bfloat16", self.layout, None)[0]


CASES = (
    Case(65536, 32, 512),
    Case(65536, 32, 2048),
    Case(16384, 32, 4096),
    Case(8192, 32, 4096, "TT"),
    Case(2048, 32, 8192, "NT"),
    Case(12345, 24, 4096, "NT"),
    Case(65536, 16, 2048, "NT"),
    Case(65536, 16, 2048),
    Case(65536, 8, 2048),
    Case(131072, 16, 1024),
    Case(16384, 16, 8192),
    Case(4096, 16, 4096),
    Case(32768, 24, 2048),
    Case(8192, 16, 4096, "TN"),
    Case(1024, 16, 1024, batch=64),
)


def default_plan(case: Case) -> str:
  """What the default runs: "xla" (routed), else the kernel config it takes."""
  problem = case.problem()
  if route.choose(problem)[0] == "xla":
    return "xla"
  return heuristics.describe(heuristics.config_fields(heuristics.default_config(problem)))


def wide_config(case: Case) -> GemmConfig:
  """The default's config with the 64-wide tile it took before the narrow tiles."""
  problem = case.problem()
  config = dataclasses.replace(
      heuristics.default_config(problem), tile_n=64, epilogue_tile=(64, 64)
  )
  if config.epilogue_tile[1] > config.wg_tile[1]:
    config = dataclasses.replace(config, epilogue_tile=None)
  return fit_stages(config, problem, heuristics.MAX_STAGES)


def run(cases=CASES, rounds: int = 3, iterations: int = 10, log=print) -> list[dict]:
  """Times every contender of every case, interleaved in `rounds`; one row per case (us per
  contender, each kernel output's relative difference from XLA's), logged as it goes."""
  rows = []
  for case in cases:
    problem, plan = case.problem(), default_plan(case)
    routed = plan == "xla"
    kernel = CuptiTimer(problem, iterations=iterations)
    timers = {
        "xla": (CuptiTimer(problem, iterations=iterations, implementation="xla"), None),
        "wide": (kernel, wide_config(case)),
    }
    if not routed:
      timers["default"] = (kernel, heuristics.default_config(problem))
    configs = [config for _, config in timers.values() if config is not None]
    kernel.prepare(configs)
    diff = {name: kernel.verify(config) for name, (_, config) in timers.items() if config}
    samples = {name: [] for name in timers}
    for _ in range(rounds):
      for name, (timer, config) in timers.items():
        samples[name].append(timer(config))
    us = {name: 1e3 * statistics.median(s) for name, s in samples.items()}
    if routed:
      us["default"] = us["xla"]
    rows.append(dict(case=case.label, plan=plan, us=us, diff_from_xla=diff))
    log(
        f"{case.label:22s} xla {us['xla']:7.1f}  default {us['default']:7.1f} "
        f"({us['xla'] / us['default']:.3f})  wide {us['wide']:7.1f} "
        f"({us['xla'] / us['wide']:.3f})  {rows[-1]['plan']}  max diff "
        f"{max(diff.values()):.1e}"
    )
  ratios = lambda name: [r["us"]["xla"] / r["us"][name] for r in rows]
  geomean = lambda xs: math.exp(statistics.mean(map(math.log, xs)))
  log(
      f"geomean XLA/this over {len(rows)} shapes: default {geomean(ratios('default')):.3f}, "
      f"wide {geomean(ratios('wide')):.3f}"
  )
  return rows


def main(argv=None) -> int:
  """The table on a Hopper GPU; the plan (what the default runs) elsewhere."""
  from benchmarks.matmul import environment

  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--iterations", type=int, default=10)
  args = parser.parse_args(argv)
  env = environment()
  print(env, flush=True)
  if env["platform"] != "gpu":
    for case in CASES:
      print(
          f"{case.label:22s} default {default_plan(case)}, before {wide_config(case).tile_n} wide"
      )
    print("no GPU: the plan only")
    return 0
  run(rounds=args.rounds, iterations=args.iterations)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
