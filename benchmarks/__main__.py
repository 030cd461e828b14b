"""The main job: `python -m benchmarks`.

On a GPU it runs the GEMM benchmark harness (`benchmarks.matmul`). Without one
it says so and runs the real kernels in GPU interpret mode on the CPU at small
shapes (their arithmetic, checked against a float64 reference; no timings),
then times the layout algebra.
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import layouts_bench
from pallas_gemm import _compat, matmul

INTERPRET_CASES = (
    # (M, N, K, transpose_a, transpose_b, epilogue kwargs)
    (200, 136, 72, False, False, {}),
    (128, 256, 128, False, False, {"activation": "gelu_tanh", "bias": True}),
    (136, 200, 72, True, False, {}),
    (136, 200, 72, False, True, {}),
)


def interpret_check() -> bool:
  """Run the kernel in interpret mode on small odd shapes; print a table."""
  rng = np.random.default_rng(0)
  print(f"{'M':>5} {'N':>5} {'K':>5} {'layout':>6} {'epilogue':>16} {'rel. error':>11}  result")
  ok = True
  for m, n, k, ta, tb, epi in INTERPRET_CASES:
    layout = ("T" if ta else "N") + ("T" if tb else "N")
    if (ta or tb) and not _compat.INTERPRET_SUPPORTS_TRANSPOSED_OPERANDS:
      print(
          f"{m:>5} {n:>5} {k:>5} {layout:>6} {'-':>16} {'-':>11}  skipped: jax "
          f"{jax.__version__}'s interpreter cannot run transposed WGMMA operands"
      )
      continue
    a64 = rng.standard_normal((k, m) if ta else (m, k))
    b64 = rng.standard_normal((n, k) if tb else (k, n))
    bias64 = rng.standard_normal(n) if epi.get("bias") else None
    a, b = jnp.asarray(a64, jnp.bfloat16), jnp.asarray(b64, jnp.bfloat16)
    bias = None if bias64 is None else jnp.asarray(bias64, jnp.float32)
    out = matmul(
        a,
        b,
        transpose_a=ta,
        transpose_b=tb,
        bias=bias,
        activation=epi.get("activation"),
        out_dtype=jnp.float32,
        implementation="interpret",
    )
    ref = (np.asarray(a, np.float64).T if ta else np.asarray(a, np.float64)) @ (
        np.asarray(b, np.float64).T if tb else np.asarray(b, np.float64)
    )
    if bias64 is not None:
      ref = ref + np.asarray(bias, np.float64)
    if epi.get("activation") == "gelu_tanh":
      ref = 0.5 * ref * (1 + np.tanh(np.sqrt(2 / np.pi) * (ref + 0.044715 * ref**3)))
    err = np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref)
    good = bool(np.isfinite(err) and err < 1e-4)
    ok &= good
    name = "+".join(f"{key}" for key in epi) or "none"
    print(f"{m:>5} {n:>5} {k:>5} {layout:>6} {name:>16} {err:>11.2e}  {'ok' if good else 'FAILED'}")
  return ok


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m benchmarks",
      description=__doc__.split("\n\n")[1].replace("\n", " "),
      epilog="On a GPU, every other argument goes to the harness: see "
      "`python -m benchmarks.matmul --help`. Other benchmarks: benchmarks.model, "
      "benchmarks.glu, benchmarks.blockwise_fp8, benchmarks.scaled_matmul, "
      "benchmarks.ragged_dot, benchmarks.train_step (each with --help).",
  )
  _, rest = parser.parse_known_args(argv)
  print(f"jax {jax.__version__}, devices: {jax.devices()}")
  if _compat.device_sm_count():
    from benchmarks import matmul as harness

    return harness.main(rest)
  if rest:
    parser.error(f"without a GPU there are no harness arguments to pass: {rest}")
  print(
      "No GPU here: running the kernels in GPU interpret mode on the CPU "
      "(the kernel's arithmetic at small shapes, no timings)."
  )
  ok = interpret_check()
  print()
  layouts_bench.main()
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
