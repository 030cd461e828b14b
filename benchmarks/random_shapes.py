"""GEMMs drawn at random, the default against XLA: a held-out check that no sweep shaped.

    python -m benchmarks.random_shapes                      # seed 142, 30 shapes
    python -m benchmarks.random_shapes --seed 7 --count 40  # another draw
    python -m benchmarks.random_shapes                      # elsewhere: the plan only

Extents log-uniform in 256-16384, rounded to multiples of 64 except one in five (any
integer), layout NN/NT/TN alike, 2^24 <= M*N*K <= 2^38, bf16. Contenders
(`benchmarks.default_ab`): xla, the default (`route.choose`, then the time model), and
`kernel`, the time model's config (what runs where nothing is routed).

>>> [case.label for case in draw(142, 2)]
['2880x1920x1088 NT', '320x2752x3136 NT']
"""

from __future__ import annotations

import argparse
import random

from benchmarks import default_ab
from benchmarks.default_ab import Case

MIN_VOLUME, MAX_VOLUME = 2**24, 2**38


def draw(seed: int, count: int) -> list[Case]:
  """`count` cases drawn with `random.Random(seed)` as the module docstring says."""
  rng = random.Random(seed)

  def extent():
    x = 2 ** rng.uniform(8, 14)
    return int(x) if rng.random() < 0.2 else max(64, round(x / 64) * 64)

  cases = []
  while len(cases) < count:
    m, n, k = extent(), extent(), extent()
    if MIN_VOLUME <= m * n * k <= MAX_VOLUME:
      cases.append(Case(m, n, k, rng.choice(["NN", "NT", "TN"])))
  return cases


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(add_help=False)
  parser.add_argument("--seed", type=int, default=142)
  parser.add_argument("--count", type=int, default=30)
  args, rest = parser.parse_known_args(argv)
  return default_ab.main(
      rest,
      __doc__.split("\n\n")[0],
      draw(args.seed, args.count),
      default_ab.kernel_config,
      "kernel",
  )


if __name__ == "__main__":
  raise SystemExit(main())
