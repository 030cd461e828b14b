"""Trains the MLP of `train_mlp.py` twice: with `pallas_gemm.flax.Fp8Linear` (fp8 e4m3
forward GEMMs, delayed scaling; bf16 backward, or e5m2 gradients with `--backward e5m2`),
or with `--recipe blockwise` `pallas_gemm.flax.BlockwiseFp8Linear` (DeepSeek-V3's
blockwise fp8 in every GEMM of the forward and backward), and with the bf16
`pallas_gemm.flax.Linear`,
from the same initial parameters on the same batches, and checks that fp8 training reaches
the bf16 model's final loss within a tolerance.

  python examples/train_fp8.py                      # CPU: XLA; GPU: the Pallas kernels
  python examples/train_fp8.py --steps 100 --tolerance 0.3
  python examples/train_fp8.py --backward e5m2        # fp8 backward GEMMs too
  python examples/train_fp8.py --recipe blockwise     # 1x128 / 128x128 block scales
"""

import argparse
import statistics
import sys

import jax
import jax.numpy as jnp
from flax import nnx

import pallas_gemm.flax as pflax
from pallas_gemm.epilogue import ACTIVATIONS
from train_mlp import (
    ACTIVATION,
    add_training_arguments,
    describe_run,
    teacher,
    train_side_by_side,
)


class MLP(nnx.Module):
  """Dense layers with the activation fused (bf16 `Linear`) or after the fp8 GEMM (`Fp8Linear`)."""

  def __init__(self, sizes, *, fp8, implementation, rngs, backward="bf16", recipe="delayed"):
    shapes = list(zip(sizes[:-1], sizes[1:]))
    activations = [ACTIVATION] * (len(shapes) - 1) + [None]
    self.activations = [None] * len(shapes)  # applied after a layer that cannot fuse them
    if fp8 and recipe == "blockwise":
      layers = [
          pflax.BlockwiseFp8Linear(
              i, o, dtype=jnp.bfloat16, implementation=implementation, rngs=rngs
          )
          for i, o in shapes
      ]
      self.activations = activations
    elif fp8:
      layers = [
          pflax.Fp8Linear(
              i, o, activation=act, backward=backward, implementation=implementation, rngs=rngs
          )
          for (i, o), act in zip(shapes, activations)
      ]
    else:
      layers = [
          pflax.Linear(
              i, o, activation=act, dtype=jnp.bfloat16, implementation=implementation, rngs=rngs
          )
          for (i, o), act in zip(shapes, activations)
      ]
    self.layers = nnx.List(layers)

  def __call__(self, x):
    for layer, activation in zip(self.layers, self.activations):
      x = layer(x)
      if activation is not None:
        x = ACTIVATIONS[activation](x.astype(jnp.float32)).astype(x.dtype)
    return x


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_training_arguments(parser, implementations=("pallas", "xla"))
  parser.add_argument(
      "--tolerance",
      type=float,
      default=0.1,
      help="allowed relative excess of the fp8 final loss over the bf16 one",
  )
  parser.add_argument(
      "--backward",
      choices=pflax.BACKWARDS,
      default="bf16",
      help="Fp8Linear's backward GEMMs: bf16, or e5m2 gradients x e4m3",
  )
  parser.add_argument(
      "--recipe",
      choices=("delayed", "blockwise"),
      default="delayed",
      help="per-tensor delayed scaling (Fp8Linear) or DeepSeek-V3 blockwise (BlockwiseFp8Linear)",
  )
  args = parser.parse_args(argv)
  sizes, implementation = describe_run(args)
  print(
      f"MLP {sizes}, {ACTIVATION} between layers, f32 params, adam lr={args.lr}, "
      f"batch {args.batch}, {args.steps} steps"
  )

  target = teacher(sizes, jax.random.key(1))
  fp8_name = f"Fp8Linear (e4m3 fwd, {args.backward} bwd)"
  if args.recipe == "blockwise":
    fp8_name = "BlockwiseFp8Linear (e4m3, 1x128 / 128x128 blocks)"
  models = {
      fp8_name: MLP(
          sizes,
          fp8=True,
          implementation=implementation,
          rngs=nnx.Rngs(0),
          backward=args.backward,
          recipe=args.recipe,
      ),
      "Linear (bf16)": MLP(sizes, fp8=False, implementation=implementation, rngs=nnx.Rngs(0)),
  }
  same_init = jax.tree.all(
      jax.tree.map(
          lambda x, y: bool(jnp.array_equal(x, y)),
          *(nnx.to_pure_dict(nnx.state(m, nnx.Param)) for m in models.values()),
      )
  )
  print(f"same initial parameters: {same_init}")
  losses = train_side_by_side(
      models,
      target,
      width=sizes[0],
      steps=args.steps,
      batch=args.batch,
      lr=args.lr,
      log_every=args.log_every,
  )
  first = models[fp8_name].layers[0]
  if args.recipe == "delayed":
    print(
        f"first layer's fp8 scales after training: input {float(first.input_scale[...]):.1f}, "
        f"kernel {float(first.kernel_scale[...]):.1f}"
    )
  # Average the last 10 steps: single-batch losses are noisy.
  final = {name: statistics.fmean(loss[-10:]) for name, loss in losses.items()}
  fp8_loss, bf16_loss = final[fp8_name], final["Linear (bf16)"]
  ok = same_init and fp8_loss <= bf16_loss * (1 + args.tolerance)
  print(
      f"mean loss of the last 10 steps: fp8 {fp8_loss:.5f}, bf16 {bf16_loss:.5f}; "
      f"check fp8 <= bf16 * (1 + {args.tolerance}): {'PASS' if ok else 'FAIL'}"
  )
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
