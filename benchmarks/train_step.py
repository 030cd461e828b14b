"""Training step of a dense layer feeding a nonlinearity: pallas_gemm's custom VJP vs XLA autodiff.

    python -m benchmarks.train_step                  # GPU: 8192x8192x8192, 16384x4096x4096 bf16
    python -m benchmarks.train_step --cpu-smoke      # no GPU: tiny shapes, XLA implementation

One step is `(y, dx, dw, db)` for `y = gelu_tanh(x @ w + b)` and a given cotangent
`dy`: the forward GEMM and the two backward ones (dX = dZ @ W^T, an NT problem;
dW = X^T @ dZ, a TN one), plus what each contender runs around them. Shapes are
MxNxK (x is (M, K), w (K, N)); FLOPs counted are the three GEMMs', 6*M*N*K.

Contenders, interleaved in rounds on the same inputs (bf16; x, dy, b ~ N(0, 1),
w ~ N(0, 1/K) so that the pre-activation is ~ N(0, 1)):
  pallas_gemm   `pallas_gemm.autodiff.matmul(x, w, bias=b, activation="gelu_tanh")`
  xla           jax.vjp of `jax.nn.gelu(jnp.dot(x, w) + b)`
  xla_f32_out   jax.vjp of `jax.nn.gelu(jnp.dot(x, w, preferred_element_type=f32).astype(bf16) + b)`
                (its backward GEMMs take the f32 cotangent of the dot: f32 GEMMs)
Targets: pallas_gemm >= 1.03x xla and >= 2x xla_f32_out.

Timing: CUPTI (`jax.experimental.mosaic.gpu.profiler.measure`, every kernel the
step launches), median over all rounds' iterations, no L2 flush. Before timing,
each contender's outputs are compared with an f32 (HIGHEST) XLA step.
Device, jax version and method are printed first, the table last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from benchmarks.matmul import PEAK_TFLOPS, cupti_times_ms, environment, parse_shapes
from pallas_gemm.autodiff import matmul

SHAPES = "8192x8192x8192,16384x4096x4096"
SMOKE_SHAPES = "256x256x256,512x128x128"
TARGETS = {"xla": 1.03, "xla_f32_out": 2.0}
"""pallas_gemm's speedup each baseline must reach."""


def layers(implementation):
  """name -> y = layer(x, w, b), bf16 in and out."""
  gelu = lambda z: jax.nn.gelu(z, approximate=True)
  return {
      "pallas_gemm": lambda x, w, b: matmul(
          x, w, bias=b, activation="gelu_tanh", implementation=implementation
      ),
      "xla": lambda x, w, b: gelu(jnp.dot(x, w) + b),
      "xla_f32_out": lambda x, w, b: gelu(
          jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype) + b
      ),
  }


def training_step(layer):
  """jit of (x, w, b, dy) -> (y, dx, dw, db)."""

  def step(x, w, b, dy):
    y, vjp = jax.vjp(layer, x, w, b)
    return (y, *vjp(dy))

  return jax.jit(step)


def reference_step():
  """The same step in f32 at HIGHEST precision, outputs cast to bf16's shapes."""

  def layer(x, w, b):
    z = jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST) + b
    return jax.nn.gelu(z, approximate=True)

  up = lambda *xs: [x.astype(jnp.float32) for x in xs]
  return jax.jit(lambda x, w, b, dy: training_step(layer)(*up(x, w, b, dy)))


def make_inputs(m, n, k, seed=0):
  kx, kw, kb, kd = jax.random.split(jax.random.key(seed), 4)
  bf16 = jnp.bfloat16
  return (
      jax.random.normal(kx, (m, k), bf16),
      (jax.random.normal(kw, (k, n), jnp.float32) / k**0.5).astype(bf16),
      jax.random.normal(kb, (n,), bf16),
      jax.random.normal(kd, (m, n), bf16),
  )


def relative_errors(outs, ref):
  """Norm-wise relative error of y, dx, dw, db against the reference."""
  err = lambda x, r: float(
      jnp.linalg.norm((x.astype(jnp.float32) - r).ravel()) / jnp.linalg.norm(r.ravel())
  )
  return {name: err(x, r) for name, x, r in zip(("y", "dx", "dw", "db"), outs, ref)}


def wall_times_ms(fn, args, iterations):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(iterations):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(1e3 * (time.perf_counter() - start))
  return times


def kernel_breakdown(step, args) -> list[tuple[str, float]]:
  """(kernel name, µs) of every kernel one step launches (CUPTI, one iteration)."""
  from jax.experimental.mosaic.gpu import profiler

  _, timings = profiler.measure(step, aggregate=False)(*args)
  return [(name, 1e3 * ms) for name, ms in timings or ()]


def run(shapes, *, implementation, rounds, iterations, timer, log=print, breakdown=False):
  rows = []
  for m, n, k in shapes:
    case = f"{m}x{n}x{k} bf16"
    flops = 6 * m * n * k
    args = make_inputs(m, n, k)
    steps = {name: training_step(layer) for name, layer in layers(implementation).items()}
    ref = reference_step()(*args)
    for name, step in steps.items():
      errors = relative_errors(step(*args), ref)
      log(
          f"{case:22s} {name:12s} rel. error vs f32: "
          + " ".join(f"{k}={v:.1e}" for k, v in errors.items())
      )
    samples = {name: [] for name in steps}
    for _ in range(rounds):
      for name, step in steps.items():
        samples[name] += timer(step, args, iterations)
    for name, times in samples.items():
      med = statistics.median(times)
      rows.append(
          dict(
              case=case,
              m=m,
              n=n,
              k=k,
              contender=name,
              median_ms=med,
              min_ms=min(times),
              max_ms=max(times),
              samples=len(times),
              tflops=flops / (med * 1e-3) / 1e12,
          )
      )
      log(
          f"{case:22s} {name:12s} {med:9.3f} ms {rows[-1]['tflops']:7.1f} TFLOP/s "
          f"(min {min(times):.3f}, max {max(times):.3f})"
      )
    for name, step in steps.items() if breakdown else ():
      for kernel, us in kernel_breakdown(step, args):
        log(f"{case:22s} {name:12s} kernel {us:8.1f} us  {kernel[:90]}")
  return rows


def format_table(rows) -> str:
  by_case = {}
  for row in rows:
    by_case.setdefault(row["case"], {})[row["contender"]] = row
  names = list(layers(None))
  lines = [
      "| case | "
      + " | ".join(f"{n} ms (TFLOP/s, % peak)" for n in names)
      + " | "
      + " | ".join(f"pallas_gemm / {t} (target {x}x)" for t, x in TARGETS.items())
      + " |",
      "|---" * (1 + len(names) + len(TARGETS)) + "|",
  ]
  for case, cont in by_case.items():
    cells = [
        f"{cont[n]['median_ms']:.3f} ({cont[n]['tflops']:.0f}, "
        f"{100 * cont[n]['tflops'] / PEAK_TFLOPS['bfloat16']:.0f}%)"
        for n in names
    ]
    ratios = []
    for target, goal in TARGETS.items():
      ratio = cont[target]["median_ms"] / cont["pallas_gemm"]["median_ms"]
      ratios.append(f"{ratio:.3f} {'met' if ratio >= goal else 'MISSED'}")
    lines.append(f"| {case} | " + " | ".join(cells + ratios) + " |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--shapes", default=None, help=f"MxNxK list (default {SHAPES})")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--iterations", type=int, default=10)
  parser.add_argument(
      "--cpu-smoke",
      action="store_true",
      help=f"no GPU needed: {SMOKE_SHAPES}, XLA implementation, wall clock",
  )
  parser.add_argument("--out", default=None, help="folder for train_step.json")
  parser.add_argument(
      "--breakdown",
      action="store_true",
      help="GPU: also print every kernel of each step with its CUPTI time",
  )
  args = parser.parse_args(argv)
  env = environment()
  on_gpu = env["platform"] == "gpu"
  if not on_gpu and not args.cpu_smoke:
    print(
        f"benchmarks.train_step needs a GPU (CUPTI timing of the Pallas kernel); found "
        f"{env['device']} ({env['platform']}). --cpu-smoke runs tiny shapes in XLA mode."
    )
    return 1
  if on_gpu:
    implementation, timer = "pallas", cupti_times_ms
  else:
    implementation, timer = "xla", wall_times_ms
    env["method"] = "wall clock on CPU, XLA implementation: a smoke run, timings meaningless"
  env.update(
      implementation=implementation,
      rounds=args.rounds,
      iterations=args.iterations,
      step="(y, dx, dw, db) of y = gelu_tanh(x @ w + b), bf16, given dy",
  )
  print(json.dumps(env))
  shapes = parse_shapes(args.shapes or (SHAPES if on_gpu else SMOKE_SHAPES))
  rows = run(
      shapes,
      implementation=implementation,
      rounds=args.rounds,
      iterations=args.iterations,
      timer=timer,
      breakdown=args.breakdown and on_gpu,
  )
  print()
  print(format_table(rows))
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "train_step.json"), "w") as f:
      json.dump(dict(environment=env, rows=rows), f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
