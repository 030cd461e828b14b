"""The tail split in the default (`heuristics.split_tail`: whole waves, then the partial
last wave's tiles cut into equal K slices, `stream_k.TailSplit`) against the same config
with whole tiles, and XLA (NOTES exp. 125).

    python -m benchmarks.tail_split                 # on a Hopper GPU: the table
    python -m benchmarks.tail_split                 # elsewhere: the plan only

Contenders (`benchmarks.default_ab`): xla; the default; `whole`, the default's config
without stream-K. The cases are the six bf16 projections the rule was decided on (on
the H200), then every held-out shape (`pallas_gemm/shapes/heldout.json`, `audit.json`)
whose default on the H200 has a tail split, two of the training sweep, then eleven
shapes of odd extents or layouts drawn at random (NOTES exp. 147).

>>> default_plan(CASES[0]), whole_config(CASES[0]).stream_k
('128x256x64 s4 cooperative/m cluster 2x1 tail split', False)
"""

from __future__ import annotations

from benchmarks import default_ab
from benchmarks.default_ab import Case, default_plan
from pallas_gemm import heuristics
from pallas_gemm.config import GemmConfig

CASES = (
    Case(8192, 14336, 4096),  # the fit (exp. 125)
    Case(2048, 11008, 4096),
    Case(4096, 11008, 4096),
    Case(1024, 13824, 5120),
    Case(2048, 2112, 7168),
    Case(8192, 2112, 7168),
    Case(8192, 14336, 4096, "NT"),  # held out (heldout.json, audit.json)
    Case(16384, 8192, 3072, "NT"),
    Case(8192, 14336, 3584),
    Case(1024, 14336, 4096, batch=8),
    Case(2048, 27648, 5120),
    Case(2048, 27648, 5120, "NT"),
    Case(6144, 17920, 5120),
    Case(4096, 256000, 2048),
    Case(16384, 16384, 16384),  # the training sweep
    Case(8192, 28672, 8192),
    Case(11584, 4779, 1664, "NT"),  # odd layouts (stop 53, random_shapes seeds 171-178):
    Case(12761, 2048, 1856, "NT"),  # the split won on 10 of 11 (1.02-1.12x)...
    Case(7565, 2304, 2304, "NT"),
    Case(14183, 639, 2688, "NT"),
    Case(861, 6247, 4800, "TN"),
    Case(3456, 7712, 8384),
    Case(4322, 4160, 8128, "TN"),
    Case(3328, 4312, 8315, "NT"),
    Case(3349, 5376, 3136, "TN"),
    Case(1622, 2752, 2048, "TN"),
    Case(3840, 1248, 12352),  # ...and ran 4.4x slower here (NOTES exp. 147): ptxas
    Case(3840, 1248, 12352, "NT"),  # spilled the accumulator of the slice's second copy
    Case(960, 5101, 10352, "NT"),  # of the unit's code (exp. 149)
)


def whole_config(case: Case) -> GemmConfig:
  """The default's config with every tile whole (no stream-K)."""
  return heuristics.default_config(case.problem()).whole_tiles()


def main(argv=None) -> int:
  return default_ab.main(argv, __doc__.split("\n\n")[0], CASES, whole_config, "whole")


if __name__ == "__main__":
  raise SystemExit(main())
