"""One-wave GEMMs: the default (`heuristics.WAVE_TILE`, three consumer warpgroups on
192x96 tiles) against the two-consumer config the default took before it, and XLA
(NOTES exp. 131).

    python -m benchmarks.wave_tile                  # on a Hopper GPU: the table
    python -m benchmarks.wave_tile                  # elsewhere: the plan only

Contenders (`benchmarks.default_ab`): xla; the default; `before`, the model's pick among
the candidates without `WAVE_TILE`. The cases: first the 14 that decided its rule (the one
of the held-out sets, 1536^3; the one its step time was measured on, 1536x1536x4096; 12
from a grid of M, N in 1152-2048 and K in 1024-8192 where the pick changed, in no sweep),
five of which, M not a multiple of 192, the rule now leaves to the two-consumer pick;
then 11 drawn at random (seed 7) from the problems of another grid where the rule
changes the pick, timed after the rule was set.

>>> default_plan(CASES[0])
'192x96x64 s5 cooperative/mx3 cluster 1x2'
>>> heuristics.describe(heuristics.config_fields(before_config(CASES[0])))
'128x192x64 s4 cooperative/m cluster 1x1'
"""

from __future__ import annotations

from benchmarks import default_ab
from benchmarks.default_ab import Case, default_plan
from pallas_gemm import heuristics  # noqa: F401 -- its examples describe configs
from pallas_gemm.config import GemmConfig

CASES = (
    Case(1536, 1536, 1536),  # held out (pallas_gemm/shapes/heldout.json)
    Case(1536, 1536, 4096),  # WAVE_TILE's step time (exp. 131)
    Case(1536, 1472, 2048),  # in no sweep
    Case(1600, 1344, 1024),
    Case(1664, 1344, 8192),
    Case(1728, 1280, 4096),
    Case(1984, 1152, 1024),
    Case(2048, 1152, 8192),
    Case(1472, 1472, 4096),
    Case(1536, 1536, 1024, "NT"),
    Case(1728, 1216, 4096, "NT"),
    Case(1344, 1600, 8192, "NT"),
    Case(1152, 2048, 2048, "NT"),
    Case(1920, 1152, 1024, "NT"),
    Case(1344, 1600, 8192),  # drawn after the rule was set
    Case(1152, 1984, 6144),
    Case(1344, 1728, 1536, "NT"),
    Case(1728, 1280, 8192),
    Case(1152, 1856, 8192),
    Case(1152, 1920, 2048),
    Case(1536, 1536, 6144, "NT"),
    Case(1152, 1920, 6144),
    Case(1344, 1664, 4096, "NT"),
    Case(1152, 1920, 768),
    Case(1536, 1536, 1536, "NT"),
)


def before_config(case: Case) -> GemmConfig:
  """What the default ran before `WAVE_TILE` joined its candidates."""
  return default_ab.model_pick(case, wave_tile=False)


def main(argv=None) -> int:
  return default_ab.main(argv, __doc__.split("\n\n")[0], CASES, before_config, "before")


if __name__ == "__main__":
  raise SystemExit(main())
