"""Row counts that are not a multiple of 8: the kernels' row-wise TMA views against the
padded path they replaced, and XLA (NOTES exps. 98, 100).

    python -m benchmarks.odd_rows                   # on a Hopper GPU: the table
    python -m benchmarks.odd_rows                   # elsewhere: the plan only

Contenders, interleaved in rounds (CUPTI medians; every operand rotates over input sets
whose total exceeds four L2 caches, so weights come from HBM as a model's do):
  xla     `jnp.dot` / `lax.ragged_dot`
  pallas  the default (`pallas_gemm.matmul` / `ragged_dot`): odd rows copied through the
          (1, span) view of the SMEM tile, unpadded
  padded  the path before: rows zero-padded to a multiple of 8, the kernel, the output cut

>>> [c.label for c in CASES][:2]
['12345x1024x768', '12345x4096x4096']
>>> padded_rows(12345), padded_rows(12344)
(12352, 12344)
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import jax
from jax import lax
import jax.numpy as jnp

from benchmarks.matmul import cupti_times_ms, environment
from pallas_gemm.tma_padding import tma_rows
from pallas_gemm.tuner import input_sets


@dataclasses.dataclass(frozen=True)
class Case:
  """out (m, n) = a (m, k) @ b (k, n), or with `groups` a grouped GEMM over (groups, k, n)."""

  m: int
  n: int
  k: int
  groups: int = 0

  @property
  def label(self) -> str:
    return f"{self.m}x{self.n}x{self.k}" + (f" G={self.groups}" if self.groups else "")

  def input_sets(self) -> int:
    """Sets of (a, b) one timed call runs in turn, as the harness and the tuner count them
    (`pallas_gemm.tuner.input_sets`: operands and output, cold L2)."""
    return input_sets(
        2 * (self.m * self.k + max(self.groups, 1) * self.k * self.n + self.m * self.n)
    )


CASES = (
    Case(12345, 1024, 768),
    Case(12345, 4096, 4096),
    Case(3001, 4096, 4096),
    Case(16383, 2048, 2048),
    Case(1001, 14336, 4096),
    Case(24690, 14336, 4096, groups=8),  # 12345 tokens routed top-2 to 8 experts
    Case(24690, 4096, 14336, groups=8),
    Case(4099, 1408, 2048, groups=64),
)


def padded_rows(m: int) -> int:
  """The row extent the padded path gave the kernel."""
  return tma_rows(m)


def contenders(case: Case) -> dict:
  """{name: jitted fn(a, b, group_sizes)}."""
  from pallas_gemm import matmul, ragged_dot

  m, mp = case.m, padded_rows(case.m)
  pad = lambda a: jnp.pad(a, ((0, mp - m), (0, 0)))
  if case.groups:
    return dict(
        xla=jax.jit(lambda a, b, s: lax.ragged_dot(a, b, s)),
        pallas=jax.jit(lambda a, b, s: ragged_dot(a, b, s)),
        padded=jax.jit(lambda a, b, s: ragged_dot(pad(a), b, s)[:m]),
    )
  return dict(
      xla=jax.jit(lambda a, b, s: jnp.dot(a, b)),
      pallas=jax.jit(lambda a, b, s: matmul(a, b)),
      padded=jax.jit(lambda a, b, s: matmul(pad(a), b)[:m]),
  )


def inputs(case: Case, seed: int = 0):
  """[(a, b)] input sets, iid N(0, 1) in bf16, and the group sizes (sorted uniform cuts)."""
  key = jax.random.key(seed)
  b_shape = (case.groups, case.k, case.n) if case.groups else (case.k, case.n)
  sets = []
  for i in range(case.input_sets()):
    ka, kb = jax.random.split(jax.random.fold_in(key, i))
    sets.append(
        (
            jax.random.normal(ka, (case.m, case.k), jnp.float32).astype(jnp.bfloat16),
            jax.random.normal(kb, b_shape, jnp.float32).astype(jnp.bfloat16),
        )
    )
  sizes = None
  if case.groups:
    cuts = jnp.sort(jax.random.randint(jax.random.fold_in(key, 99), (case.groups - 1,), 0, case.m))
    sizes = jnp.diff(jnp.concatenate([jnp.zeros(1, jnp.int32), cuts, jnp.full(1, case.m)]))
    sizes = sizes.astype(jnp.int32)
  return sets, sizes


def agreement(fns: dict, a, b, sizes) -> dict:
  """Relative difference of each contender's output from XLA's (bf16 outputs: ~2e-3)."""
  ref = fns["xla"](a, b, sizes).astype(jnp.float32)
  scale = jnp.linalg.norm(ref)
  return {
      name: float(jnp.linalg.norm(f(a, b, sizes).astype(jnp.float32) - ref) / scale)
      for name, f in fns.items()
  }


def run(cases=CASES, rounds: int = 3, iterations: int = 3, log=print) -> list[dict]:
  """Times every contender of every case, interleaved in `rounds`; one row per case (us per
  contender, each output's difference from XLA's), logged as it goes."""
  rows = []
  for case in cases:
    fns = contenders(case)
    sets, sizes = inputs(case)
    diff = agreement(fns, *sets[0], sizes)
    times = {name: [] for name in fns}
    for _ in range(rounds):
      for name, f in fns.items():
        for a, b in sets:
          times[name] += cupti_times_ms(f, (a, b, sizes), iterations)
    us = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    row = dict(case=case.label, us=us, diff_from_xla=diff)
    rows.append(row)
    log(
        f"{case.label:24s} "
        + "  ".join(f"{name} {us[name]:8.1f} us" for name in fns)
        + f"  xla/pallas {us['xla'] / us['pallas']:.3f}  padded/pallas "
        f"{us['padded'] / us['pallas']:.3f}  max diff {max(diff.values()):.1e}"
    )
  return rows


def main(argv=None) -> int:
  """The table on a Hopper GPU; the plan (padded rows, input sets) elsewhere."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--iterations", type=int, default=3)
  args = parser.parse_args(argv)
  env = environment()
  print(env, flush=True)
  if env["platform"] != "gpu":
    for case in CASES:
      print(
          f"{case.label:24s} rows padded to {padded_rows(case.m)}, {case.input_sets()} input sets"
      )
    print("no GPU: the plan only")
    return 0
  run(rounds=args.rounds, iterations=args.iterations)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
