"""Trains a small MLP whose dense layers are `pallas_gemm.flax.Linear`, next to the same
MLP on Flax's `nnx.Linear` + `jax.nn.gelu` (XLA), and compares final loss and step time.

The task is synthetic regression: fit a random "teacher" MLP from Gaussian inputs. Both
models start from the same parameters (the layers share `nnx.Linear`'s parameter tree),
see the same batches, and take their steps interleaved.

  python examples/train_mlp.py                        # CPU: XLA; GPU: the Pallas kernel
  python examples/train_mlp.py --implementation interpret --steps 3   # the kernel, on CPU
"""

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import pallas_gemm.flax as pflax

ACTIVATION = "gelu_tanh"


class MLP(nnx.Module):
  """Dense layers with gelu between them; bf16 compute, f32 parameters."""

  def __init__(self, sizes, *, fused, implementation, rngs):
    shapes = list(zip(sizes[:-1], sizes[1:]))
    activations = [ACTIVATION] * (len(shapes) - 1) + [None]
    if fused:
      layers = [
          pflax.Linear(
              i, o, activation=act, dtype=jnp.bfloat16, implementation=implementation, rngs=rngs
          )
          for (i, o), act in zip(shapes, activations)
      ]
    else:
      layers = [nnx.Linear(i, o, dtype=jnp.bfloat16, rngs=rngs) for i, o in shapes]
    self.layers = nnx.List(layers)
    self.fused = fused

  def __call__(self, x):
    for i, layer in enumerate(self.layers):
      x = layer(x)
      if not self.fused and i < len(self.layers) - 1:
        x = jax.nn.gelu(x, approximate=True)
    return x


def teacher(sizes, key):
  """A random tanh MLP to imitate, as a function of f32 inputs."""
  keys = jax.random.split(key, len(sizes) - 1)
  weights = [
      jax.random.normal(k, (i, o)) / jnp.sqrt(i) for k, i, o in zip(keys, sizes[:-1], sizes[1:])
  ]

  def f(x):
    for w in weights[:-1]:
      x = jnp.tanh(x @ w)
    return x @ weights[-1]

  return f


@nnx.jit
def train_step(model, optimizer, x, y):
  def loss_fn(model):
    return jnp.mean((model(x).astype(jnp.float32) - y) ** 2)

  loss, grads = nnx.value_and_grad(loss_fn)(model)
  optimizer.update(model, grads)
  return loss


def add_training_arguments(parser, implementations):
  """The flags both examples share: steps, batch, sizes, lr, implementation, log-every."""
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--sizes", default="128,512,512,64", help="layer widths, input first")
  parser.add_argument("--lr", type=float, default=3e-3)
  parser.add_argument(
      "--implementation",
      default="auto",
      choices=["auto", *implementations],
      help="auto: the Pallas kernels on a GPU, XLA elsewhere",
  )
  parser.add_argument("--log-every", type=int, default=50)


def describe_run(args):
  """Prints the device and implementation; returns (layer sizes, implementation or None)."""
  sizes = [int(s) for s in args.sizes.split(",")]
  implementation = None if args.implementation == "auto" else args.implementation
  device = jax.devices()[0]
  resolved = implementation or ("pallas" if device.platform == "gpu" else "xla")
  print(
      f"device: {device.device_kind} ({device.platform}), jax {jax.__version__}; "
      f"pallas_gemm implementation: {resolved}"
  )
  return sizes, implementation


def train_side_by_side(models, target, *, width, steps, batch, lr, log_every):
  """Trains `models` (name -> nnx model of input `width`) with Adam on the same batches,
  their steps interleaved so that load changes hit all alike; prints the losses every
  `log_every` steps and a summary table; returns name -> list of per-step losses."""
  optimizers = {
      name: nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param) for name, model in models.items()
  }
  losses = {name: [] for name in models}
  seconds = {name: [] for name in models}
  for step in range(steps):
    x = jax.random.normal(jax.random.fold_in(jax.random.key(2), step), (batch, width))
    y = target(x)
    for name, model in models.items():
      start = time.perf_counter()
      losses[name].append(float(train_step(model, optimizers[name], x, y)))
      seconds[name].append(time.perf_counter() - start)
    if step % log_every == 0 or step == steps - 1:
      print(
          f"step {step:4d}  "
          + "  ".join(f"{name}: {loss[-1]:.5f}" for name, loss in losses.items())
      )

  pad = max(len(name) for name in models)
  print(f"\n{'model':{pad}s} {'first loss':>10s} {'final loss':>10s} {'step ms (median)':>17s}")
  for name in models:
    timed = seconds[name][1:] or seconds[name]  # the first step compiles
    print(
        f"{name:{pad}s} {losses[name][0]:10.5f} {losses[name][-1]:10.5f} "
        f"{1e3 * statistics.median(timed):17.2f}"
    )
  return losses


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_training_arguments(parser, implementations=("pallas", "interpret", "xla"))
  args = parser.parse_args(argv)
  sizes, implementation = describe_run(args)
  print(
      f"MLP {sizes}, {ACTIVATION} between layers, bf16 compute, f32 params, "
      f"adam lr={args.lr}, batch {args.batch}, {args.steps} steps"
  )

  target = teacher(sizes, jax.random.key(1))
  models = {
      "pallas_gemm.flax.Linear": MLP(
          sizes, fused=True, implementation=implementation, rngs=nnx.Rngs(0)
      ),
      "flax nnx.Linear (XLA)": MLP(sizes, fused=False, implementation=None, rngs=nnx.Rngs(0)),
  }
  try:
    losses = train_side_by_side(
        models,
        target,
        width=sizes[0],
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        log_every=args.log_every,
    )
  except NotImplementedError as e:  # e.g. interpret mode on jax 0.10
    print(f"cannot train here: {e}")
    return 2
  went_down = all(loss[-1] < loss[0] for loss in losses.values())
  print(f"loss went down for both: {went_down}")
  return 0 if went_down else 1


if __name__ == "__main__":
  sys.exit(main())
