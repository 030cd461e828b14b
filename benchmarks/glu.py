"""The gated linear unit (SwiGLU): `pallas_gemm.gated_linear_unit` against XLA's two GEMMs and
the elementwise product, forward alone and forward + backward.

    python -m benchmarks.glu                 # GPU: Llama-3-8B and 70B-class MLPs, 8k and 16k tokens
    python -m benchmarks.glu --cpu-smoke     # no GPU: tiny shapes, XLA implementation
    python -m benchmarks.glu --block mlp     # the whole MLP: + down projection and residual

Shapes are MxNxK: x (M, K), w_gate and w_up (K, N). Contenders, interleaved in rounds
on the same inputs (bf16; x ~ N(0, 1), weights ~ N(0, 1/K)):
  pallas_gemm   `gated_linear_unit(x, w_gate, w_up, activation="silu")`
  xla           `jax.nn.silu(x @ w_gate) * (x @ w_up)`
  pallas_plain  the project's plain GEMMs: `matmul(x, w_gate, activation="silu") * matmul(x, w_up)`
With `--block mlp` each contender is the whole Llama MLP, `down(unit(x)) + x` with
w_down (N, K): ours is `pallas_gemm.gated_mlp`, pallas_fused_bwd the same with
`fuse_backward=True` (the gate and up cotangents written by the dH GEMM's epilogue),
pallas_plain adds `matmul(h, w_down, residual=x)`.
"fwd" runs the forward alone (inference: nothing saved); "fwd+bwd" is `jax.vjp` and the
backward for a given cotangent (x, w_gate and w_up gradients). FLOPs counted: 4MNK
forward, 12MNK forward + backward. "saved MB": the residuals autodiff keeps for the
backward beyond the inputs (`jax.ad_checkpoint.saved_residuals`).

Timing: CUPTI (every kernel a call launches), median over all rounds' iterations.
Before timing, outputs and gradients are compared with an f32 HIGHEST XLA reference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import jax
import jax.numpy as jnp

from benchmarks.matmul import cupti_times_ms, environment, parse_shapes
from pallas_gemm import _compat
from pallas_gemm.autodiff import matmul
from pallas_gemm.glu import gated_linear_unit, gated_mlp

SHAPES = "8192x14336x4096,16384x14336x4096,8192x28672x8192,16384x28672x8192"
SMOKE_SHAPES = "64x96x32"
TARGETS = {"fwd": 1.12, "fwd+bwd": 1.06}
"""pallas_gemm's speedup over xla that each mode must reach (issue 18)."""


def units(implementation):
  """name -> (x, w_gate, w_up) -> y."""
  return {
      "pallas_gemm": lambda x, wg, wu: gated_linear_unit(
          x, wg, wu, activation="silu", implementation=implementation
      ),
      "xla": lambda x, wg, wu: jax.nn.silu(x @ wg) * (x @ wu),
      "pallas_plain": (
          lambda x, wg, wu: matmul(x, wg, activation="silu", implementation=implementation)
          * matmul(x, wu, implementation=implementation)
      ),
  }


def blocks(implementation):
  """name -> (x, w_gate, w_up, w_down) -> y: the whole MLP with its residual."""
  glu_units = units(implementation)
  return {
      "pallas_gemm": lambda x, wg, wu, wd: gated_mlp(
          x, wg, wu, wd, residual=x, implementation=implementation
      ),
      "pallas_fused_bwd": lambda x, wg, wu, wd: gated_mlp(
          x, wg, wu, wd, residual=x, implementation=implementation, fuse_backward=True
      ),
      "xla": lambda x, wg, wu, wd: glu_units["xla"](x, wg, wu) @ wd + x,
      "pallas_plain": lambda x, wg, wu, wd: matmul(
          glu_units["pallas_plain"](x, wg, wu), wd, residual=x, implementation=implementation
      ),
  }


def step(unit, mode):
  """jit of (*inputs, cotangent) -> y (fwd), or (y, *input gradients) (fwd+bwd)."""
  if mode == "fwd":
    return jax.jit(lambda *args: unit(*args[:-1]))

  def both(*args):
    y, vjp = jax.vjp(unit, *args[:-1])
    return (y, *vjp(args[-1]))

  return jax.jit(both)


def saved_mb(unit, args) -> float:
  """MB of residuals saved for the backward, the inputs left out."""
  total = 0
  for aval, source in _compat.saved_residuals(unit, *args):
    if "argument" not in str(source):
      total += aval.size * aval.dtype.itemsize
  return total / 1e6


def make_inputs(m, n, k, seed=0, block="glu"):
  """(x, w_gate, w_up[, w_down], cotangent)."""
  kx, kg, ku, kdown, kd = jax.random.split(jax.random.key(seed), 5)
  bf16 = jnp.bfloat16
  w = lambda key, rows, cols: (
      jax.random.normal(key, (rows, cols), jnp.float32) / rows**0.5
  ).astype(bf16)
  x = jax.random.normal(kx, (m, k), bf16)
  if block == "mlp":
    return (x, w(kg, k, n), w(ku, k, n), w(kdown, n, k), jax.random.normal(kd, (m, k), bf16))
  return (x, w(kg, k, n), w(ku, k, n), jax.random.normal(kd, (m, n), bf16))


def reference(mode, block="glu"):
  hi = jax.lax.Precision.HIGHEST
  glu_unit = lambda x, wg, wu: jax.nn.silu(jnp.dot(x, wg, precision=hi)) * jnp.dot(
      x, wu, precision=hi
  )
  unit = glu_unit
  if block == "mlp":
    unit = lambda x, wg, wu, wd: jnp.dot(glu_unit(x, wg, wu), wd, precision=hi) + x
  f = step(unit, mode)
  return jax.jit(lambda *args: f(*(a.astype(jnp.float32) for a in args)))


def rel_err(x, r):
  x = jnp.asarray(x, jnp.float32)
  return float(jnp.linalg.norm((x - r).ravel()) / jnp.linalg.norm(r.ravel()))


def run(shapes, *, implementation, rounds, iterations, timer, log=print, block="glu"):
  rows = []
  contenders = (units if block == "glu" else blocks)(implementation)
  per_mnk = 4 if block == "glu" else 6  # forward FLOPs / MNK
  for m, n, k in shapes:
    args = make_inputs(m, n, k, block=block)
    for mode in ("fwd", "fwd+bwd"):
      case = f"{block} {m}x{n}x{k} {mode}"
      flops = (per_mnk if mode == "fwd" else 3 * per_mnk) * m * n * k
      steps = {
          name: step(unit, mode)
          for name, unit in contenders.items()
          if mode != "fwd" or name != "pallas_fused_bwd"  # the same forward as ours
      }
      ref = reference(mode, block)(*args)
      ref = ref if isinstance(ref, tuple) else (ref,)
      for name, f in steps.items():
        outs = f(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        errors = [rel_err(o, r) for o, r in zip(outs, ref)]
        log(
            f"{case:32s} {name:13s} rel. errors vs f32 (y, dx, dw_gate, dw_up[, dw_down]): "
            + " ".join(f"{e:.1e}" for e in errors)
        )
        if max(errors) > 2e-2:
          raise SystemExit(f"{case} {name}: error {max(errors):.1e} too large")
      samples = {name: [] for name in steps}
      for _ in range(rounds):
        for name, f in steps.items():
          samples[name] += timer(f, args, iterations)
      for name, times in samples.items():
        med = statistics.median(times)
        row = dict(
            case=case,
            mode=mode,
            m=m,
            n=n,
            k=k,
            contender=name,
            median_ms=med,
            tflops=flops / (med * 1e-3) / 1e12,
        )
        if mode == "fwd+bwd":
          row["saved_mb"] = saved_mb(contenders[name], args[:-1])
        rows.append(row)
        log(
            f"{case:32s} {name:13s} {med:9.3f} ms {row['tflops']:7.1f} TFLOP/s"
            + (f"  saved {row['saved_mb']:.0f} MB" if "saved_mb" in row else "")
        )
  return rows


def format_table(rows) -> str:
  by_case = {}
  for row in rows:
    by_case.setdefault(row["case"], {})[row["contender"]] = row
  names = list(dict.fromkeys(row["contender"] for row in rows))
  lines = [
      "| case | "
      + " | ".join(f"{n} ms (TFLOP/s)" for n in names)
      + " | xla / pallas_gemm (target) | saved MB ours / xla |",
      "|---" * (3 + len(names)) + "|",
  ]
  for case, cont in by_case.items():
    cells = [
        f"{cont[n]['median_ms']:.3f} ({cont[n]['tflops']:.0f})" if n in cont else "-" for n in names
    ]
    ratio = cont["xla"]["median_ms"] / cont["pallas_gemm"]["median_ms"]
    goal = TARGETS[cont["xla"]["mode"]]
    saved = "-"
    if "saved_mb" in cont["xla"]:
      saved = f"{cont['pallas_gemm']['saved_mb']:.0f} / {cont['xla']['saved_mb']:.0f}"
    lines.append(
        f"| {case} | "
        + " | ".join(cells)
        + f" | {ratio:.3f} ({goal}, {'met' if ratio >= goal else 'MISSED'}) | {saved} |"
    )
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
  parser.add_argument("--out", default=None, help="folder for glu.json / mlp.json")
  parser.add_argument(
      "--block",
      choices=("glu", "mlp"),
      default="glu",
      help="the gated unit alone (default), or the whole MLP (down projection and residual)",
  )
  args = parser.parse_args(argv)
  gpu = jax.default_backend() == "gpu"
  if args.cpu_smoke or not gpu:
    print("no GPU (or --cpu-smoke): tiny shapes through the XLA implementation, wall clock")
    shapes, implementation = parse_shapes(args.shapes or SMOKE_SHAPES), "xla"
    from benchmarks.train_step import wall_times_ms as timer
  else:
    shapes, implementation, timer = parse_shapes(args.shapes or SHAPES), None, cupti_times_ms
  env = environment()
  print(json.dumps(env))
  rows = run(
      shapes,
      implementation=implementation,
      rounds=args.rounds,
      iterations=args.iterations,
      timer=timer,
      block=args.block,
  )
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.block}.json"), "w") as f:
      json.dump(dict(environment=env, rows=rows), f, indent=1)
  print(format_table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
