"""Skinny outputs (N <= 32): the default (a tile as narrow as N, or XLA's GEMM where no tile
wins) against the 64-wide tile it replaced, and XLA (NOTES exp. 101).

    python -m benchmarks.skinny                     # on a Hopper GPU: the table
    python -m benchmarks.skinny                     # elsewhere: the plan only

Contenders (`benchmarks.default_ab`): xla; the default (the narrow tile,
`heuristics.narrow_tile_n`, or the route to XLA); `wide`, the kernel with the 128x64 tile
the default took before: the output widened to 64 columns and sliced, B padded where its
rows are narrow.

>>> [c.label for c in CASES][:2]
['65536x32x512 NN', '65536x32x2048 NN']
>>> wide_config(CASES[0]).tile_n, default_plan(CASES[0])
(64, '128x32x64 s8 cooperative/m cluster 2x1')
>>> default_plan(Case(65536, 16, 2048))
'xla'
"""

from __future__ import annotations

import dataclasses

from benchmarks import default_ab
from benchmarks.default_ab import Case, default_plan
from pallas_gemm import heuristics
from pallas_gemm.config import GemmConfig, fit_stages

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


def wide_config(case: Case) -> GemmConfig:
  """The default's config with the 64-wide tile it took before the narrow tiles."""
  problem = case.problem()
  config = dataclasses.replace(
      heuristics.default_config(problem), tile_n=64, epilogue_tile=(64, 64)
  )
  if config.epilogue_tile[1] > config.wg_tile[1]:
    config = dataclasses.replace(config, epilogue_tile=None)
  return fit_stages(config, problem, heuristics.MAX_STAGES)


def main(argv=None) -> int:
  return default_ab.main(argv, __doc__.split("\n\n")[0], CASES, wide_config, "wide")


if __name__ == "__main__":
  raise SystemExit(main())
