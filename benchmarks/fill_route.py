"""Long-K GEMMs whose tiles fill the SMs badly, routed to XLA (`route.choose`,
`MAX_OVER_IDEAL`), against the kernel's default config there, and XLA (NOTES exp. 140).

    python -m benchmarks.fill_route                 # on a Hopper GPU: the table
    python -m benchmarks.fill_route                 # elsewhere: the plan only

Contenders (`benchmarks.default_ab`): xla; the default (routed: XLA's time); `kernel`,
the kernel with `heuristics.default_config`. The first three cases are the held-out
models' weight gradients that set the rule; the other twelve were drawn (random.seed(5))
after it from the 62 it routes in a grid of M 512-16384, N 768-14336, K 512-16384,
NN/NT/TN, M*N*K <= 2^38.

>>> default_plan(CASES[0])
'xla'
"""

from __future__ import annotations

from benchmarks import default_ab
from benchmarks.default_ab import Case, default_plan
from pallas_gemm import heuristics
from pallas_gemm.config import GemmConfig

CASES = (
    Case(768, 3072, 16384, "TN"),  # heldout_models.json: set the rule
    Case(3072, 768, 16384, "TN"),
    Case(768, 768, 16384, "TN"),
    Case(512, 768, 8192, "NT"),  # drawn after it
    Case(512, 2048, 8192, "NT"),
    Case(768, 768, 8192),
    Case(768, 1024, 8192, "NT"),
    Case(768, 1536, 8192, "TN"),
    Case(1024, 768, 8192),
    Case(1024, 768, 8192, "TN"),
    Case(1024, 1024, 8192, "TN"),
    Case(1536, 768, 8192, "NT"),
    Case(1536, 768, 16384, "NT"),
    Case(1536, 1024, 8192, "NT"),
    Case(1536, 1536, 16384, "TN"),
)


def kernel_config(case: Case) -> GemmConfig:
  """What the kernel runs there: the time model's pick."""
  return heuristics.default_config(case.problem())


def main(argv=None) -> int:
  return default_ab.main(argv, __doc__.split("\n\n")[0], CASES, kernel_config, "kernel")


if __name__ == "__main__":
  raise SystemExit(main())
