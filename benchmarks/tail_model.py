"""The time model with the tail split in it (`heuristics.estimate`: the whole waves, then
one K slice of the last wave's tiles, and `TAIL_FIXED_S` + S * `TAIL_SLICE_S`) against the
pick of the model before it, and XLA (NOTES exp. 139).

    python -m benchmarks.tail_model                 # on a Hopper GPU: the table
    python -m benchmarks.tail_model                 # elsewhere: the plan only

Contenders (`benchmarks.default_ab`): xla; the default; `before`, the pick of the model
that ranked every config as if it ran whole tiles (then given its tail split, as the
default was). The cases: every sweep shape whose pick the change moves on the H100 or
the H200 (`pallas_gemm/shapes/*.json`, 2026-11-29; the tail cost was fitted on them and
on NOTES exp. 125's), then ten drawn at random after the fit from the shapes it moves.

>>> CASES[4].label, default_plan(CASES[4])
('2048x3072x16384 TN', '128x256x64 s4 cooperative/n cluster 2x1 tail split')
"""

from __future__ import annotations

from benchmarks import default_ab
from benchmarks.default_ab import Case, default_plan
from pallas_gemm.config import GemmConfig

CASES = (
    Case(768, 3072, 16384, "TN"),  # heldout_models.json: seen before the change
    Case(3072, 768, 16384, "TN"),
    Case(1024, 3072, 16384, "TN"),
    Case(3072, 3072, 8192, "TN"),
    Case(2048, 3072, 16384, "TN"),  # models.json: the default llama's weight gradient
    Case(2048, 27648, 5120),  # audit.json
    Case(2048, 27648, 5120, "NT"),
    Case(4096, 3584, 18944),  # heldout.json
    Case(4097, 4097, 4097),  # odd.json
    # Drawn after the fit (random.seed(11), 10 of the 134 moved on both boards in a grid of
    # M 512-16384, N 768-14336, K 1024-16384, NN/NT/TN, M*N*K <= 2^38):
    Case(768, 14336, 16384),
    Case(1536, 3072, 2048),
    Case(1536, 3072, 2048, "NT"),
    Case(2048, 5120, 8192, "TN"),
    Case(6144, 768, 2048, "NT"),
    Case(6144, 768, 2048, "TN"),
    Case(6144, 1024, 8192),
    Case(6144, 1024, 8192, "TN"),
    Case(6144, 5120, 8192),
    Case(6144, 5120, 8192, "NT"),
)


def before_config(case: Case) -> GemmConfig:
  """The default as the model without the tail term picked it."""
  return default_ab.model_pick(case, tail_model=False)


def main(argv=None) -> int:
  return default_ab.main(argv, __doc__.split("\n\n")[0], CASES, before_config, "before")


if __name__ == "__main__":
  raise SystemExit(main())
