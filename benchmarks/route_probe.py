"""Small GEMMs: the kernel (its default config) against `jnp.dot`, in CUPTI kernel time and
in the wall clock of a chain of GEMMs inside one jit (launch gaps included, as in a model).

`pallas_gemm.route` sent GEMMs under 3 us at the roofline to XLA, a rule decided before the
time model (NOTES exps. 51, 53); the shipped calibrations said the model's picks beat
`jnp.dot` in kernel time there (exp. 77). This decides it on both measures: the fit-sweep
squares (384, 640, 1024, 1280) decide, the held-out ones (512, 768) only validate. It moved
the threshold to 0.3 us (exp. 79: 384^3 loses in a chain of launches, 512^3 and up win).

    python -m benchmarks.route_probe            # on a Hopper GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from benchmarks import matmul as harness
from pallas_gemm import matmul

SIZES = (384, 512, 640, 768, 1024, 1280)


def chain_us(size: int, implementation: str | None, length: int, rounds: int) -> float:
  """Wall-clock us per GEMM of `length` chained (size^3) GEMMs in one jit, median of rounds
  (implementation None: `jnp.dot`)."""
  x = jax.random.normal(jax.random.key(0), (size, size), jnp.bfloat16)
  w = (jax.random.normal(jax.random.key(1), (size, size)) / size**0.5).astype(jnp.bfloat16)

  @jax.jit
  def f(x, w):
    for _ in range(length):
      x = jnp.dot(x, w) if implementation is None else matmul(x, w, implementation=implementation)
    return x

  jax.block_until_ready(f(x, w))
  samples = []
  for _ in range(rounds):
    start = time.perf_counter()
    jax.block_until_ready(f(x, w))
    samples.append(time.perf_counter() - start)
  return 1e6 * statistics.median(samples) / length


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
  parser.add_argument("--chain", type=int, default=64, help="GEMMs per jitted chain")
  parser.add_argument("--rounds", type=int, default=5)
  args = parser.parse_args(argv)
  if jax.default_backend() != "gpu":
    print("route_probe times the kernel: it needs a Hopper GPU", file=sys.stderr)
    return 2
  sizes = [int(s) for s in args.sizes.split(",")]
  cases = [harness.Case(s, s, s) for s in sizes]
  contenders = lambda case: {
      "kernel": harness.pallas_fn(case, None, implementation="pallas"),
      "xla": harness.xla_fn(case),
  }
  rows = harness.run_cases(cases, contenders, rounds=args.rounds, iterations=20)
  cupti = {(r["m"], r["variant"]): 1e3 * r["median_ms"] for r in rows if "median_ms" in r}
  print(f"{'shape':>8s} {'CUPTI kernel us':>16s} {'xla':>7s} {'xla/kernel':>10s} "
        f"{'chain kernel us':>16s} {'xla':>7s} {'xla/kernel':>10s}")  # fmt: skip
  for s in sizes:
    wall = {name: chain_us(s, impl, args.chain, args.rounds) for name, impl in
            (("kernel", "pallas"), ("xla", None))}  # fmt: skip
    ck, cx = cupti[(s, "kernel")], cupti[(s, "xla")]
    print(f"{s:>7d}^3 {ck:16.2f} {cx:7.2f} {cx / ck:10.3f} {wall['kernel']:16.2f} "
          f"{wall['xla']:7.2f} {wall['xla'] / wall['kernel']:10.3f}", flush=True)  # fmt: skip
  return 0


if __name__ == "__main__":
  sys.exit(main())
