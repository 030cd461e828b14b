"""A language model's head and cross-entropy: `head_cross_entropy` (the log-sum-exp in the
head GEMM's epilogue) against XLA's head and optax's loss, forward + backward.

    python -m benchmarks.head_loss              # GPU: GPT/Llama-2 (32k), GPT-2 (50257) and
                                                # Llama-3 (128256) vocabularies, 16k and 4k tokens
    python -m benchmarks.head_loss --cpu-smoke  # no GPU: a tiny shape, XLA implementation

Shapes are MxNxK: hidden states x (M, K), head weights w (K, N) (bf16), labels (M,).
Contenders, interleaved in rounds (odd rounds in reverse order), each
`jax.value_and_grad` of the mean loss in x and w:
  pallas_gemm    `head_cross_entropy(x, w, labels).mean()`
  xla            `optax.softmax_cross_entropy_with_integer_labels((x @ w).astype(f32), labels)`
                 `.mean()`, what `benchmarks.model` trains with
  pallas_plain   the same loss on the project's plain GEMM's logits (`matmul(x, w)`)
Before timing, the loss and gradients of each are compared with an f32 HIGHEST XLA
reference. Timing: CUPTI (every kernel a call launches), median of all rounds.
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
from pallas_gemm.autodiff import matmul
from pallas_gemm.cross_entropy import head_cross_entropy

SHAPES = "16384x32000x2048,4096x50257x1024,16384x128256x4096,4096x32000x4096"
SMOKE_SHAPES = "64x200x32"


def _optax_loss(logits, labels):
  import optax

  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)


def losses(implementation):
  """name -> (x, w, labels) -> mean loss."""
  return {
      "pallas_gemm": (
          lambda x, w, labels: head_cross_entropy(
              x, w, labels, implementation=implementation
          ).mean()
      ),
      "xla": lambda x, w, labels: _optax_loss(x @ w, labels).mean(),
      "pallas_plain": (
          lambda x, w, labels: _optax_loss(
              matmul(x, w, implementation=implementation), labels
          ).mean()
      ),
  }


def step(loss):
  """jit of (x, w, labels) -> (loss, dx, dw)."""
  grad = jax.value_and_grad(loss, argnums=(0, 1))
  return jax.jit(lambda x, w, labels: (lambda v, g: (v, *g))(*grad(x, w, labels)))


def reference():
  hi = jax.lax.Precision.HIGHEST
  f32 = lambda x, w, labels: _optax_loss(jnp.dot(x, w, precision=hi), labels).mean()
  return jax.jit(
      lambda x, w, labels: step(f32)(x.astype(jnp.float32), w.astype(jnp.float32), labels)
  )


def make_inputs(m, n, k, seed=0):
  kx, kw, kl = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(kx, (m, k), jnp.bfloat16)
  w = (jax.random.normal(kw, (k, n), jnp.float32) * (2.0 / k**0.5)).astype(jnp.bfloat16)
  return x, w, jax.random.randint(kl, (m,), 0, n)


def rel_err(x, r):
  x, r = jnp.asarray(x, jnp.float32), jnp.asarray(r, jnp.float32)
  return float(jnp.linalg.norm((x - r).ravel()) / jnp.linalg.norm(r.ravel()))


def run(shapes, *, implementation, rounds, iterations, timer, log=print):
  rows = []
  contenders = losses(implementation)
  for m, n, k in shapes:
    args = make_inputs(m, n, k)
    case = f"head+loss {m}x{n}x{k}"
    steps = {name: step(loss) for name, loss in contenders.items()}
    ref = reference()(*args)
    for name, f in steps.items():
      errors = [rel_err(o, r) for o, r in zip(f(*args), ref)]
      log(
          f"{case:30s} {name:13s} rel. errors vs f32 (loss, dx, dw): "
          + " ".join(f"{e:.1e}" for e in errors)
      )
      if max(errors) > 2e-2:
        raise SystemExit(f"{case} {name}: error {max(errors):.1e} too large")
    samples = {name: [] for name in steps}
    for r in range(rounds):
      for name, f in list(steps.items())[:: -1 if r % 2 else 1]:
        samples[name] += timer(f, args, iterations)
    for name, times in samples.items():
      med = statistics.median(times)
      rows.append(dict(case=case, m=m, n=n, k=k, contender=name, median_ms=med))
      log(f"{case:30s} {name:13s} {med:9.3f} ms")
  return rows


def format_table(rows) -> str:
  by_case = {}
  for row in rows:
    by_case.setdefault(row["case"], {})[row["contender"]] = row
  names = list(dict.fromkeys(row["contender"] for row in rows))
  lines = [
      "| case | " + " | ".join(f"{n} ms" for n in names) + " | xla / pallas_gemm |",
      "|---" * (2 + len(names)) + "|",
  ]
  for case, cont in by_case.items():
    cells = [f"{cont[n]['median_ms']:.3f}" for n in names]
    ratio = cont["xla"]["median_ms"] / cont["pallas_gemm"]["median_ms"]
    lines.append(f"| {case} | " + " | ".join(cells) + f" | {ratio:.3f} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--shapes", default=None, help=f"MxNxK list (default {SHAPES})")
  parser.add_argument("--rounds", type=int, default=4)
  parser.add_argument("--iterations", type=int, default=10)
  parser.add_argument("--cpu-smoke", action="store_true", help="no GPU: tiny shape, XLA")
  parser.add_argument("--out", default=None, help="folder for head_loss.json")
  args = parser.parse_args(argv)
  if args.cpu_smoke or jax.default_backend() != "gpu":
    print("no GPU (or --cpu-smoke): a tiny shape through the XLA implementation, wall clock")
    shapes, implementation = parse_shapes(args.shapes or SMOKE_SHAPES), "xla"
    from benchmarks.train_step import wall_times_ms as timer
  else:
    shapes, implementation, timer = parse_shapes(args.shapes or SHAPES), None, cupti_times_ms
  env = environment()
  print(json.dumps(env))
  rows = run(
      shapes, implementation=implementation, rounds=args.rounds, iterations=args.iterations,
      timer=timer,
  )  # fmt: skip
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "head_loss.json"), "w") as f:
      json.dump(dict(environment=env, rows=rows), f, indent=1)
  print(format_table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
