"""Three consumer warpgroups (`GemmConfig.consumers=3`, 192x96 tiles as cuBLAS runs
1536^3) against the default and XLA, at the shapes where whole waves fit badly.

    python -m benchmarks.three_consumers           # on a Hopper GPU: the table
    python -m benchmarks.three_consumers           # elsewhere: the configs only

Contenders per shape, interleaved in rounds (odd rounds in reverse; CUPTI medians, cold
L2 as the tuner times): `jnp.dot`, the default config, and each `VARIANTS` config; every
kernel output is checked against XLA's (`CuptiTimer.verify`). From this table (NOTES exp.
131) one config entered the default's grid, for one-wave problems only:
`heuristics.WAVE_TILE` (192x96, cluster 1x2; `benchmarks.wave_tile` holds it out).

>>> [v.wg_tile for v in VARIANTS[:2]]
[(64, 96), (64, 96)]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics

from pallas_gemm import heuristics
from pallas_gemm.config import GemmConfig, GemmProblem, fit_stages

C3 = GemmConfig(tile_m=192, tile_n=96, consumers=3, epilogue_tile=(64, 32))
VARIANTS = (
    C3,
    dataclasses.replace(C3, cluster=(1, 2)),
    dataclasses.replace(C3, cluster=(2, 1)),
    dataclasses.replace(C3, epilogue_tile=None),
    GemmConfig(tile_m=64, tile_n=192, consumers=3, wg_split="n"),
)
"""The three-consumer configs timed (stages: the deepest ring that fits)."""

SHAPES = (
    (1536, 1536, 1536),  # held out (heldout.json): 0.82-0.84x XLA's 192x96 kernel
    (1536, 1536, 4096),
    (1792, 1792, 1792),  # audit.json
    (2560, 2560, 2560),  # fit.json: 0.88x, two waves of 128x256
    (3072, 3072, 1536),
    (2304, 2112, 4096),
    (1024, 13824, 5120),
    (8192, 8192, 8192),  # a large projection, for the step rate
)


def configs(problem: GemmProblem) -> dict[str, GemmConfig]:
  """The contenders of `problem` by name: the default, then each valid variant."""
  named = {"default": heuristics.default_config(problem)}
  for variant in VARIANTS:
    config = fit_stages(variant, problem, 8)
    try:
      config.validate(problem)
    except ValueError:
      continue
    name = heuristics.describe(heuristics.config_fields(config))
    named[f"{name} epilogue {config.epilogue_shape[0]}x{config.epilogue_shape[1]}"] = config
  return named


def run(rounds: int, iterations: int, log=print) -> list[dict]:
  from pallas_gemm.tuner import CuptiTimer

  rows = []
  for m, n, k in SHAPES:
    problem = GemmProblem(m=m, n=n, k=k)
    named = configs(problem)
    kernel = CuptiTimer(problem, iterations=iterations)
    xla = CuptiTimer(problem, iterations=iterations, implementation="xla")
    kernel.prepare(list(named.values()))
    diff = {name: kernel.verify(config) for name, config in named.items()}
    timers = [("xla", lambda: xla(None))]
    timers += [(name, lambda c=config: kernel(c)) for name, config in named.items()]
    samples = {name: [] for name, _ in timers}
    for r in range(rounds):
      for name, timer in timers[:: -1 if r % 2 else 1]:
        samples[name].append(timer())
    us = {name: 1e3 * statistics.median(v) for name, v in samples.items()}
    rows.append(dict(shape=(m, n, k), us=us, diff_from_xla=diff))
    log(f"{m}x{n}x{k}: xla {us['xla']:.1f} us")
    for name, config in named.items():
      if name == "default":
        name_shown = "default " + heuristics.describe(heuristics.config_fields(config))
      else:
        name_shown = name
      log(
          f"    {us[name]:9.1f} us  XLA/this {us['xla'] / us[name]:.3f}  {name_shown}"
          f"  diff {diff[name]:.1e}"
      )
  best = [max(r["us"]["xla"] / t for name, t in r["us"].items() if "x3" in name) for r in rows]
  geomean = math.exp(statistics.mean(map(math.log, best)))
  log(f"geomean XLA/this, the best three-consumer config of each shape: {geomean:.3f}")
  return rows


def main(argv=None) -> int:
  from benchmarks.matmul import environment

  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--iterations", type=int, default=10)
  args = parser.parse_args(argv)
  env = environment()
  print(env, flush=True)
  if env["platform"] != "gpu":
    for m, n, k in SHAPES:
      print(f"{m}x{n}x{k}: {', '.join(configs(GemmProblem(m=m, n=n, k=k)))}")
    print("no GPU: the configs only")
    return 0
  run(args.rounds, args.iterations)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
