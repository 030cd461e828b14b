"""`pallas-gemm-bench`: time `pallas_gemm.matmul` against XLA's GEMM on your shapes.

    pallas-gemm-bench --shapes 4096x4096x4096,16x4096x14336 --layout NT --dtype float16

For each MxNxK it prints the default route's time (the kernel, or XLA's GEMM where
`pallas_gemm.route` sends the problem), `jnp.matmul`'s, their ratio and the
relative difference of the outputs. Times are CUPTI medians (as the tuner's
`CuptiTimer`: operands cycled over 4 L2s when smaller, so they come from HBM).
The full harness, with sweeps, epilogues and plots, is `python -m benchmarks` in
the source tree. Needs a Hopper GPU: without one it says so and exits with status 2.
"""

from __future__ import annotations

import functools
import sys

from absl import app
from absl import flags

from pallas_gemm import _compat
from pallas_gemm import cli

FLAGS = flags.FlagValues()
"""This tool's own flags (`pallas-gemm-tune`'s share names with them)."""
_SHAPES = flags.DEFINE_list(
    "shapes", ["4096x4096x4096", "16x4096x14336"], "MxNxK,...", flag_values=FLAGS
)
_LAYOUT = flags.DEFINE_enum(
    "layout", "NN", ["NN", "NT", "TN", "TT"], "T: operand stored transposed", flag_values=FLAGS
)
_DTYPE = flags.DEFINE_enum(
    "dtype", "bfloat16", ["bfloat16", "float16"], "operand and output dtype", flag_values=FLAGS
)
_ITERATIONS = flags.DEFINE_integer(
    "iterations", 20, "timed calls per contender (median kept)", flag_values=FLAGS
)

NO_GPU_STATUS = 2


def parse_shape(text: str) -> tuple[int, int, int]:
  """'MxNxK' -> (M, N, K), positive ints.

  >>> parse_shape("16x4096x14336")
  (16, 4096, 14336)
  """
  parts = text.lower().split("x")
  if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise app.UsageError(f"--shapes: {text!r} is not MxNxK with positive integers")
  m, n, k = (int(p) for p in parts)
  return m, n, k


def main(argv) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  shapes = [parse_shape(s) for s in _SHAPES.value]
  if not _compat.on_hopper():
    print("pallas-gemm-bench needs a Hopper GPU (sm_90); none found", file=sys.stderr)
    return NO_GPU_STATUS
  from pallas_gemm.config import GemmProblem
  from pallas_gemm.tuner import CuptiTimer

  print(
      f"{'MxNxK':>20} {'pallas_gemm ms':>15} {'jnp.matmul ms':>14} {'xla/ours':>9} {'rel.diff':>9}"
  )
  for m, n, k in shapes:
    problem = GemmProblem(
        m=m,
        n=n,
        k=k,
        dtype=_DTYPE.value,
        transpose_a=_LAYOUT.value[0] == "T",
        transpose_b=_LAYOUT.value[1] == "T",
    )
    ours = CuptiTimer(problem, iterations=_ITERATIONS.value, implementation="auto")
    xla = CuptiTimer(problem, iterations=_ITERATIONS.value, implementation="xla")
    ours_ms, xla_ms = ours(None), xla(None)
    print(
        f"{f'{m}x{n}x{k}':>20} {ours_ms:15.4f} {xla_ms:14.4f} {xla_ms / ours_ms:9.3f}"
        f" {ours.verify(None):9.1e}"
    )
  return 0


def run() -> None:
  """The `pallas-gemm-bench` console script."""
  app.run(main, flags_parser=functools.partial(cli.parse_flags, flag_values=FLAGS))


if __name__ == "__main__":
  run()
