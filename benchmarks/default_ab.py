"""The default against the config a change to it replaced, and XLA: the harness behind
`benchmarks.skinny` and `benchmarks.short_k`.

Contenders, interleaved in rounds (CUPTI medians, cold L2 as the tuner times: problems
under four L2 caches rotate over input sets):
  xla       `jnp.dot` (the layouts as stored)
  default   `pallas_gemm.matmul` with `implementation=None`: `route.choose`, then
            `heuristics.default_config`
  before    the kernel with the config the default took before the change (named by the
            caller: "wide", "chunked")

Each kernel contender's output is checked against XLA's (`CuptiTimer.verify`).

>>> Case(1024, 16, 1024, batch=64).label
'64x1024x16x1024 NN'
>>> default_plan(Case(8192, 8192, 8192))
'128x256x64 s4 cooperative/m cluster 2x1'
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from collections.abc import Callable

from pallas_gemm import heuristics, route
from pallas_gemm.config import DEFAULT_NUM_SMS, GemmConfig
from pallas_gemm.tuner import CuptiTimer, make_problem

SLOW = 0.9
"""A shape below this fraction of XLA's speed counts as slow (issue 16: none below 0.9x)."""


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


def default_plan(case: Case) -> str:
  """What the default runs: "xla" (routed), else the kernel config it takes."""
  problem = case.problem()
  if route.choose(problem)[0] == "xla":
    return "xla"
  return heuristics.describe(heuristics.config_fields(heuristics.default_config(problem)))


def model_pick(case: Case, **options) -> GemmConfig:
  """The time model's pick for `case` on this board with some of its parts off (`options`
  of `heuristics.pick`, e.g. `wave_tile=False`), then the tail split the default gives it:
  the default as it was before a change to the model.

  >>> model_pick(Case(1536, 1536, 1536), wave_tile=False).consumers
  2
  """
  from pallas_gemm import _compat  # local: jax is only needed to ask the device

  problem = case.problem()
  num_sms = _compat.device_sm_count() or DEFAULT_NUM_SMS
  config = heuristics.pick(problem, num_sms, _compat.hbm_scale(), heuristics.Params(), **options)
  return heuristics.split_tail(problem, config, num_sms)


def run(
    cases,
    before: Callable[[Case], GemmConfig],
    before_name: str,
    rounds: int = 3,
    iterations: int = 10,
    log=print,
) -> list[dict]:
  """Times xla, the default and `before(case)` on every case, interleaved in `rounds` (odd
  rounds in reverse order); one row per case (us per contender, each kernel output's
  relative difference from XLA's), logged as it goes, then the geometric means of XLA's
  time over each contender's."""
  rows = []
  for case in cases:
    problem, plan = case.problem(), default_plan(case)
    routed = plan == "xla"
    kernel = CuptiTimer(problem, iterations=iterations)
    timers = {
        "xla": (CuptiTimer(problem, iterations=iterations, implementation="xla"), None),
        before_name: (kernel, before(case)),
    }
    if not routed:
      timers["default"] = (kernel, heuristics.default_config(problem))
    kernel.prepare([config for _, config in timers.values() if config is not None])
    diff = {name: kernel.verify(config) for name, (_, config) in timers.items() if config}
    samples = {name: [] for name in timers}
    for r in range(rounds):  # odd rounds in reverse: the power cap's drift hits all alike
      for name, (timer, config) in list(timers.items())[:: -1 if r % 2 else 1]:
        samples[name].append(timer(config))
    us = {name: 1e3 * statistics.median(s) for name, s in samples.items()}
    if routed:
      us["default"] = us["xla"]
    rows.append(dict(case=case.label, plan=plan, us=us, diff_from_xla=diff))
    log(
        f"{case.label:22s} xla {us['xla']:7.1f}  default {us['default']:7.1f} "
        f"({us['xla'] / us['default']:.3f})  {before_name} {us[before_name]:7.1f} "
        f"({us['xla'] / us[before_name]:.3f})  {plan}  max diff {max(diff.values()):.1e}"
    )
  log(summary(rows, before_name))
  return rows


def summary(rows, before_name: str) -> str:
  """The geometric mean of XLA's time over each contender's, and how many shapes each runs
  below `SLOW` x XLA's speed (issue 16's bar).

  >>> rows = [dict(us={"xla": 9.0, "default": 10.0, "wide": 9.0}),
  ...         dict(us={"xla": 4.0, "default": 1.0, "wide": 8.0})]
  >>> summary(rows, "wide")
  'geomean XLA/this over 2 shapes: default 1.897, wide 0.707; below 0.9x: default 0, wide 1'
  """
  ratios = {
      name: [r["us"]["xla"] / r["us"][name] for r in rows] for name in ("default", before_name)
  }
  geomean = lambda xs: math.exp(statistics.mean(map(math.log, xs)))
  means = ", ".join(f"{name} {geomean(xs):.3f}" for name, xs in ratios.items())
  slow = ", ".join(f"{name} {sum(x < SLOW for x in xs)}" for name, xs in ratios.items())
  return f"geomean XLA/this over {len(rows)} shapes: {means}; below {SLOW}x: {slow}"


def main(argv, description: str, cases, before: Callable[[Case], GemmConfig], before_name: str):
  """The table on a Hopper GPU; elsewhere the plan: what the default and `before` run."""
  from benchmarks.matmul import environment

  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--iterations", type=int, default=10)
  parser.add_argument(
      "--only", default="", help="comma-separated labels (e.g. '4096x256000x2048 NN'): these alone"
  )
  args = parser.parse_args(argv)
  if args.only:
    wanted, labels = args.only.split(","), [case.label for case in cases]
    if not set(wanted) <= set(labels):
      parser.error(f"--only: {sorted(set(wanted) - set(labels))} are not cases; cases: {labels}")
    cases = [case for case in cases if case.label in wanted]
  env = environment()
  print(env, flush=True)
  if env["platform"] != "gpu":
    for case in cases:
      config = before(case)
      print(
          f"{case.label:22s} default {default_plan(case)}; {before_name} "
          f"{heuristics.describe(heuristics.config_fields(config))} "
          f"epilogue {config.epilogue_tile}"
      )
    print("no GPU: the plan only")
    return 0
  run(cases, before, before_name, args.rounds, args.iterations)
  return 0


def kernel_config(case: Case) -> GemmConfig:
  """What the kernel runs for `case` where the default routes it: the time model's pick."""
  return heuristics.default_config(case.problem())


def grouped_main(argv, description: str, groups: dict) -> int:
  """`main` over named groups of cases against `kernel_config`: `--group NAME` times one
  group, none every group in order."""
  parser = argparse.ArgumentParser(add_help=False)
  parser.add_argument("--group", choices=sorted(groups), default=None)
  args, rest = parser.parse_known_args(argv)
  names = [args.group] if args.group else list(groups)
  cases = [case for name in names for case in groups[name]]
  return main(rest, description, cases, kernel_config, "kernel")
