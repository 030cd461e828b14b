"""Short-K GEMMs (at most two K steps a tile): the default (each warpgroup tile stored at
once, `heuristics.short_k_stores`) against the 64x64 store chunks it replaced, and XLA
(NOTES exp. 102).

    python -m benchmarks.short_k                    # on a Hopper GPU: the table
    python -m benchmarks.short_k                    # elsewhere: the plan only

Contenders (`benchmarks.default_ab`): xla; the default; `chunked`, the same config with
the 64x64 epilogue chunks and the ring depth it had before. The cases are the fit sweep's
short-K shapes (the rule was decided on them), then held-out ones of both held-out sets,
then shapes neither sweep has.

>>> default_plan(CASES[0]), chunked_config(CASES[0]).epilogue_tile
('128x256x64 s3 cooperative/m cluster 2x1', (64, 64))
"""

from __future__ import annotations

import dataclasses

from benchmarks import default_ab
from benchmarks.default_ab import Case, default_plan
from pallas_gemm import heuristics
from pallas_gemm.config import GemmConfig, fit_stages

CASES = (
    Case(32768, 4096, 64),  # the fit sweep
    Case(8192, 8192, 96),
    Case(16384, 2048, 128),
    Case(2048, 2048, 64, "NT", batch=16),
    Case(32768, 128, 96),  # held out (pallas_gemm/shapes/heldout.json, audit.json)
    Case(2048, 2048, 128, "NT", batch=32),
    Case(16384, 4096, 64),
    Case(1024, 1024, 64, "NT", batch=64),
    Case(4096, 4096, 128, "NT", batch=8),  # in neither sweep
    Case(24576, 3072, 128),
    Case(1024, 1024, 96, batch=48),
    Case(8192, 16384, 64, "TN"),
)


def chunked_config(case: Case) -> GemmConfig:
  """The default's config with the 64x64 store chunks (and the deeper ring) it had before."""
  problem = case.problem()
  config = dataclasses.replace(heuristics.default_config(problem), epilogue_tile=(64, 64))
  return fit_stages(config, problem, heuristics.MAX_STAGES)


def main(argv=None) -> int:
  return default_ab.main(argv, __doc__.split("\n\n")[0], CASES, chunked_config, "chunked")


if __name__ == "__main__":
  raise SystemExit(main())
