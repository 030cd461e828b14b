"""The library on several GPUs: sharded GEMMs checked against float64, then timed against XLA.

    python -m benchmarks.multi_gpu                # every local GPU (2 or more)
    python -m benchmarks.multi_gpu --cpu-smoke    # 4 fake CPU devices, XLA path, tiny shapes

Checks (forward value and every gradient of `mean(y**2)`, y = gelu_tanh(x @ w + bias),
bf16 operands, on a 1-D mesh "d" over all devices with Explicit axes; the kernel runs
per shard, `pallas_gemm.sharding`), each against the same loss in float64 on the host CPU:
  data       x rows sharded, w replicated (data parallel)
  column     w columns sharded (tensor parallel, column-parallel layer)
  row        x columns and w rows sharded: a sharded K, partial sums added by psum
               (row-parallel layer)
  2d         on a ("data", "model") mesh (4 devices or more): x rows by "data" and K by
               "model", w rows by "model"
  ragged     `ragged_dot` with rhs columns sharded (expert weights split by N)
  mlp        `flax.Linear` up (column-parallel) and down (row-parallel) projections, nnx
Timing (CUPTI, all devices' kernels; medians of rounds interleaved): the column- and
row-parallel GEMMs of a 16384 x 8192 x 2048-class layer, ours against XLA's sharded
`jnp.dot` of the same sharded arrays (what `jax.jit` partitions itself), forward only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import jax.numpy as jnp
import numpy as np

from pallas_gemm import matmul, ragged_dot

LAYOUTS = {  # x spec, w spec on the 1-D mesh "d"
    "data": (P("d", None), P(None, None)),
    "column": (P(None, None), P(None, "d")),
    "row": (P(None, "d"), P("d", None)),
}
TOLERANCE = 2e-2
"""bf16 operands and outputs against float64: relative error of values and gradients."""


def _normal(shape, seed, scale=1.0):
  return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.bfloat16)


def _rel(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def _loss(implementation):
  def loss(x, w, bias):
    y = matmul(x, w, bias=bias, activation="gelu_tanh", implementation=implementation)
    return jnp.mean(y.astype(jnp.float32) ** 2)

  return loss


def _reference(x, w, bias):
  """value and (dx, dw, dbias) of the same loss in float64 on the host."""

  def loss(x, w, bias):
    return jnp.mean(jax.nn.gelu(x @ w + bias, approximate=True) ** 2)

  cpu = jax.devices("cpu")[0]
  with jax.enable_x64(True):
    args = [jax.device_put(np.asarray(v, np.float64), cpu) for v in (x, w, bias)]
    value, grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(*args)
    return float(value), [np.asarray(g) for g in grads]


def check_layer(mesh, x_spec, w_spec, m, n, k, implementation) -> float:
  """Largest relative error of the sharded loss and its gradients against float64."""
  x, w, bias = _normal((m, k), 0), _normal((k, n), 1, k**-0.5), _normal((n,), 2)
  ref_value, ref_grads = _reference(x, w, bias)
  put = lambda v, spec: jax.device_put(v, NamedSharding(mesh, spec))
  bias_spec = P(w_spec[1])
  args = (put(x, x_spec), put(w, w_spec), put(bias, bias_spec))
  value, grads = jax.jit(jax.value_and_grad(_loss(implementation), (0, 1, 2)))(*args)
  for g, arg in zip(grads, args):
    if not g.sharding.is_equivalent_to(arg.sharding, g.ndim):
      raise AssertionError(f"gradient sharding {g.sharding.spec} != {arg.sharding.spec}")
  return max([_rel(value, ref_value)] + [_rel(g, r) for g, r in zip(grads, ref_grads)])


def check_ragged(mesh, m, n, k, groups, implementation) -> float:
  """`ragged_dot` with the experts' columns sharded, forward, against float64."""
  lhs, rhs = _normal((m, k), 3), _normal((groups, k, n), 4, k**-0.5)
  sizes = np.random.default_rng(5).multinomial(m, [1 / groups] * groups).astype(np.int32)
  f = lambda a, b, s: ragged_dot(
      a, b, s, out_sharding=P(None, "d"), implementation=implementation
  )  # explicit axes: jax infers no ragged_dot sharding, the caller names it
  with jax.set_mesh(mesh):
    out = jax.jit(f)(lhs, jax.device_put(rhs, P(None, None, "d")), jnp.asarray(sizes))
  a, b = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
  ref, start = np.zeros((m, n)), 0
  for g, size in enumerate(sizes):
    ref[start : start + size] = a[start : start + size] @ b[g]
    start += size
  return _rel(out, ref)


def check_nnx_mlp(mesh, m, d, h, implementation) -> float:
  """A column-parallel up and row-parallel down `flax.Linear` pair under `nnx.jit`,
  its loss and parameter gradients against the unsharded model's (XLA, f32)."""
  from flax import nnx

  from pallas_gemm import flax as pflax

  class MLP(nnx.Module):

    def __init__(self, impl, sharded):
      meta = lambda *names: {"out_sharding": names} if sharded else {}
      rngs = nnx.Rngs(0)
      kw = dict(dtype=jnp.bfloat16, implementation=impl, rngs=rngs)
      self.up = pflax.Linear(d, h, activation="gelu_tanh", kernel_metadata=meta(None, "d"),
                             bias_metadata=meta("d"), **kw)  # fmt: skip
      self.down = pflax.Linear(h, d, kernel_metadata=meta("d", None), **kw)

    def __call__(self, x):
      return self.down(self.up(x))

  @nnx.jit
  def step(model, x):
    return nnx.value_and_grad(lambda mod, x: jnp.mean(mod(x).astype(jnp.float32) ** 2))(model, x)

  x = np.random.default_rng(6).standard_normal((m, d)).astype(np.float32)
  ref_value, ref_grads = step(MLP("xla", sharded=False), jnp.asarray(x))
  with jax.set_mesh(mesh):
    model = MLP(implementation, sharded=True)
    value, grads = step(model, jax.device_put(x, P("d", None)))
  return max(
      [_rel(value, ref_value)]
      + [_rel(g, r) for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads))]
  )


def time_layers(mesh, m, n, k, rounds, iterations):
  """Forward column- and row-parallel GEMMs: ours vs XLA's sharded `jnp.dot` (CUPTI)."""
  from benchmarks.matmul import cupti_times_ms

  rows = []
  for name in ("column", "row"):
    x_spec, w_spec = LAYOUTS[name]
    put = lambda v, spec: jax.device_put(v, NamedSharding(mesh, spec))
    args = (put(_normal((m, k), 7), x_spec), put(_normal((k, n), 8, k**-0.5), w_spec))
    fns = {
        "pallas_gemm": jax.jit(lambda x, w: matmul(x, w)),
        "xla": jax.jit(
            lambda x, w: jnp.dot(x, w, out_sharding=NamedSharding(mesh, P(x_spec[0], w_spec[1])))
        ),
    }
    samples = {f: [] for f in fns}
    for _ in range(rounds):
      for f, fn in fns.items():
        samples[f] += cupti_times_ms(fn, args, iterations)
    med = {f: statistics.median(t) for f, t in samples.items()}
    rows.append(dict(layer=name, m=m, n=n, k=k, **{f"{f}_ms": v for f, v in med.items()}))
    print(f"time {name:7s} {m}x{n}x{k}: ours {med['pallas_gemm']:.3f} ms, XLA {med['xla']:.3f} ms,"
          f" XLA/ours {med['xla'] / med['pallas_gemm']:.3f}", flush=True)  # fmt: skip
  return rows


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--cpu-smoke", action="store_true", help="4 fake CPU devices, XLA path")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--iterations", type=int, default=10)
  parser.add_argument("--json", default=None, help="write the results here")
  args = parser.parse_args(argv)
  smoke = args.cpu_smoke or jax.default_backend() != "gpu"
  devices = jax.devices()
  if len(devices) < 2:
    print(f"needs 2 devices or more, this process has {len(devices)}", file=sys.stderr)
    return 2
  impl = "xla" if smoke else None
  m, n, k = (64, 96, 128) if smoke else (4096, 8192, 2048)
  mesh = jax.make_mesh((len(devices),), ("d",), axis_types=(AxisType.Explicit,))
  print(f"{len(devices)} x {devices[0].device_kind}, jax {jax.__version__}, implementation"
        f" {impl or 'default (the kernels)'}", flush=True)  # fmt: skip
  checks = {
      name: lambda x_spec=x_spec, w_spec=w_spec: check_layer(mesh, x_spec, w_spec, m, n, k, impl)
      for name, (x_spec, w_spec) in LAYOUTS.items()
  }
  if len(devices) >= 4 and len(devices) % 2 == 0:
    mesh2 = jax.make_mesh(
        (2, len(devices) // 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2
    )
    checks["2d"] = lambda: check_layer(mesh2, P("data", "model"), P("model", None), m, n, k, impl)
  checks["ragged"] = lambda: check_ragged(mesh, m, n, k, 4, impl)
  checks["mlp"] = lambda: check_nnx_mlp(mesh, m // 4, k // 4, n // 4, impl)
  results = {}
  for name, check in checks.items():
    try:
      results[name] = check()
      verdict = f"max rel. error {results[name]:.2e} " + (
          "ok" if results[name] < TOLERANCE else "FAILED"
      )
    except Exception as e:  # noqa: BLE001 (reported; the other checks still run)
      results[name] = float("inf")
      verdict = f"FAILED: {type(e).__name__}: {str(e)[:400]}"
    print(f"check {name:7s} {verdict}", flush=True)
  timing = [] if smoke else time_layers(mesh, 16384, 8192, 2048, args.rounds, args.iterations)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(devices=len(devices), checks=results, timing=timing), f, indent=1)
  # (inf, a failed check, is written as Infinity)
  return 0 if all(err < TOLERANCE for err in results.values()) else 1


if __name__ == "__main__":
  if "--cpu-smoke" in sys.argv and "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.exit(main())
