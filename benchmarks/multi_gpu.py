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
  tp_flax    the same with `flax.ColumnParallelLinear` / `RowParallelLinear`
  dot_gen    `nnx.Linear(dot_general=pallas_gemm.dot_general)`, column-parallel, against
             the same layer on one device
  fp8_dp     `fp8_linear`, data parallel, against the same layer on one device
  ag_matmul  `all_gather_matmul` (x rows sharded, w columns sharded)
  matmul_rs  `matmul_reduce_scatter` (x columns sharded, w rows sharded)
Timing (CUPTI, all devices' kernels; medians of rounds interleaved): the column- and
row-parallel GEMMs of a 16384 x 8192 x 2048-class layer, ours against XLA's sharded
`jnp.dot` of the same sharded arrays (what `jax.jit` partitions itself), forward only.
Then wall-clock per call (a loop of calls, one wait at the end; medians of interleaved
rounds), since overlapped kernels on two streams cannot be summed: the tensor-parallel
MLP block (d_model 8192, MLP 28672, 16k tokens; up column-parallel with tanh-GELU, down
row-parallel) forward and backward, and its two GEMMs forward, each as
  xla        XLA's sharded `jnp.dot`s (all-gather + GEMM, GEMM + reduce-scatter)
  separate   our kernels per shard after `all_gather` / before `psum_scatter`
  bulk       `all_gather_matmul` / `matmul_reduce_scatter`, schedule "bulk"
  fused      the same, schedule "fused" (the gather inside the kernel; scatter as bulk)
  ring       the same, schedule "ring" (`ring[N]`: N SMs left to NCCL)
with the all-gather and the reduce-scatter timed alone, and the share of them hidden:
(separate - contender) / collective.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys

import jax
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import jax.numpy as jnp
import numpy as np

from pallas_gemm import matmul, ragged_dot
from pallas_gemm.collective_matmul import all_gather_matmul, matmul_reduce_scatter

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


def check_collective(mesh, m, n, k, implementation, schedule="bulk") -> dict[str, float]:
  """`all_gather_matmul` and `matmul_reduce_scatter` (bias + tanh-GELU) with `schedule`:
  loss and all gradients against float64, the gradients sharded like their arrays."""
  x, w, bias = _normal((m, k), 9), _normal((k, n), 10, k**-0.5), _normal((n,), 11)
  ref_value, ref_grads = _reference(x, w, bias)
  errors = {}
  for name, fn, specs in (
      ("ag_matmul", all_gather_matmul, (P("d", None), P(None, "d"), P("d"))),
      ("matmul_rs", matmul_reduce_scatter, (P(None, "d"), P("d", None), P())),
  ):
    args = [jax.device_put(v, NamedSharding(mesh, spec)) for v, spec in zip((x, w, bias), specs)]

    def loss(x, w, bias, fn=fn):
      y = fn(
          x, w, bias, axis_name="d", activation="gelu_tanh", implementation=implementation,
          schedule=schedule,
      )  # fmt: skip
      return jnp.mean(y.astype(jnp.float32) ** 2)

    value, grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(*args)
    for g, arg in zip(grads, args):
      if not g.sharding.is_equivalent_to(arg.sharding, g.ndim):
        raise AssertionError(f"{name}: gradient sharding {g.sharding.spec} != {arg.sharding.spec}")
    errors[name] = max([_rel(value, ref_value)] + [_rel(g, r) for g, r in zip(grads, ref_grads)])
  return errors


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


def check_nnx_mlp(mesh, m, d, h, implementation, tensor_parallel=False) -> float:
  """A column-parallel up and row-parallel down `flax.Linear` pair under `nnx.jit`
  (`tensor_parallel`: `flax.ColumnParallelLinear` and `RowParallelLinear`, the tokens
  sharded between them too), its loss and parameter gradients against the unsharded
  model's (XLA, f32)."""
  from flax import nnx

  from pallas_gemm import flax as pflax

  class MLP(nnx.Module):

    def __init__(self, impl, sharded):
      meta = lambda *names: {"out_sharding": names} if sharded else {}
      rngs = nnx.Rngs(0)
      kw = dict(dtype=jnp.bfloat16, implementation=impl, rngs=rngs)
      if sharded and tensor_parallel:
        self.up = pflax.ColumnParallelLinear(d, h, axis_name="d", activation="gelu_tanh", **kw)
        self.down = pflax.RowParallelLinear(h, d, axis_name="d", **kw)
        return
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


def check_fp8_data_parallel(mesh, m, n, k, implementation) -> float:
  """`fp8_linear` (unit scales) with x's rows sharded: loss and gradients against the same
  layer on one device."""
  from pallas_gemm import fp8_linear

  x, w, bias = (
      _normal((m, k), 19),
      _normal((k, n), 20, k**-0.5),
      _normal((n,), 21).astype(jnp.float32),
  )
  one = jnp.float32(1)

  def loss(x, w, bias):
    y = fp8_linear(x, w, bias, one, one, implementation=implementation)
    return jnp.mean(y.astype(jnp.float32) ** 2)

  grad = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))
  ref_value, ref_grads = grad(x, w, bias)
  with jax.set_mesh(mesh):
    value, grads = grad(
        jax.device_put(x, P("d", None)), jax.device_put(w, P()), jax.device_put(bias, P())
    )
  return max([_rel(value, ref_value)] + [_rel(g, r) for g, r in zip(grads, ref_grads)])


def check_dot_general_column(mesh, m, n, k, implementation) -> float:
  """`nnx.Linear(dot_general=pallas_gemm.dot_general)` with its kernel's columns sharded:
  loss and parameter gradients against the same layer on one device."""
  from flax import nnx

  from pallas_gemm import make_dot_general

  def layer(sharded):
    meta = (lambda *names: {"out_sharding": names}) if sharded else (lambda *names: {})
    return nnx.Linear(k, n, dot_general=make_dot_general(implementation=implementation),
                      kernel_metadata=meta(None, "d"), bias_metadata=meta("d"),
                      dtype=jnp.bfloat16, rngs=nnx.Rngs(3))  # fmt: skip

  @nnx.jit
  def step(model, x):
    return nnx.value_and_grad(lambda mod, x: jnp.mean(mod(x).astype(jnp.float32) ** 2))(model, x)

  x = np.asarray(_normal((m, k), 22), np.float32)
  ref_value, ref_grads = step(layer(False), jnp.asarray(x))
  with jax.set_mesh(mesh):
    value, grads = step(layer(True), jax.device_put(x, P()))
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


def wall_ms(fn, args, iterations) -> float:
  """Wall-clock ms per call of a loop of `iterations` calls with one wait at the end."""
  import time

  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  for _ in range(iterations):
    out = fn(*args)
  jax.block_until_ready(out)
  return 1e3 * (time.perf_counter() - start) / iterations


def tp_mlp_contenders(mesh, comm_sms, schedules=("bulk", "fused", "ring")):
  """{name: (up, down)}: the column-parallel up projection with tanh-GELU and the
  row-parallel down projection, each taking and returning sharded global arrays."""
  d = "d"

  def xla_up(x, w, b):
    return jax.nn.gelu(
        jnp.dot(x, w, out_sharding=NamedSharding(mesh, P(None, d))) + b, approximate=True
    )

  def xla_down(h, w, b):
    return jnp.dot(h, w, out_sharding=NamedSharding(mesh, P(d, None))) + b

  def sep_up(x, w, b):
    f = lambda x, w, b: matmul(
        lax.all_gather(x, d, axis=0, tiled=True), w, bias=b, activation="gelu_tanh"
    )
    specs = dict(in_specs=(P(d, None), P(None, d), P(d)), out_specs=P(None, d))
    # check_vma=False: all_gather's transpose is then a psum_scatter (with it, a psum)
    return jax.shard_map(f, mesh=mesh, check_vma=False, **specs)(x, w, b)

  def sep_down(h, w, b):
    f = lambda h, w, b: lax.psum_scatter(matmul(h, w), d, scatter_dimension=0, tiled=True) + b
    return jax.shard_map(
        f, mesh=mesh, in_specs=(P(None, d), P(d, None), P()), out_specs=P(d, None), check_vma=False
    )(h, w, b)

  contenders = {"xla": (xla_up, xla_down), "separate": (sep_up, sep_down)}
  runs = [(s, 0) for s in ("bulk", "fused") if s in schedules]
  if "ring" in schedules:
    runs += [("ring", sms) for sms in sorted({0, *comm_sms})]
  for schedule, sms in runs:
    name = schedule if sms == 0 else f"{schedule}[{sms}]"
    kw = dict(axis_name=d, schedule=schedule, comm_sms=sms)
    contenders[name] = (
        lambda x, w, b, kw=kw: all_gather_matmul(x, w, b, activation="gelu_tanh", **kw),
        lambda h, w, b, kw=kw: matmul_reduce_scatter(h, w, b, **kw),
    )
  return contenders


def block_power(fns, seconds, rounds, gpus, log=print) -> dict[str, dict]:
  """Each block step back to back for `seconds` a round, interleaved, while nvidia-smi samples
  every GPU: ms per step, median power per GPU and SM clock, joules per step (all GPUs)."""
  from benchmarks import power

  sampler = power.Sampler()
  per = {name: dict(sec=[], power=[], clock=[]) for name in fns}
  try:
    for fn, args in fns.values():
      power.run_for(fn, args, 0.5)  # warm
    for _ in range(rounds):
      for name, (fn, args) in fns.items():
        t0, t1, sec, _ = power.run_for(fn, args, seconds, in_flight=4)
        per[name]["sec"].append(sec)
        for clock, watts, _, _ in sampler.window(t0 + 0.25, t1):
          per[name]["clock"].append(clock)
          per[name]["power"].append(watts)
  finally:
    sampler.close()
  rows = {}
  for name, p in per.items():
    sec = statistics.median(p["sec"])
    watts = statistics.median(p["power"]) if p["power"] else float("nan")
    clock = statistics.median(p["clock"]) if p["clock"] else float("nan")
    rows[name] = dict(ms=1e3 * sec, watts_per_gpu=watts, clock_mhz=clock, joules=watts * gpus * sec)
    log(
        f"power {name:28s} {1e3 * sec:8.3f} ms/step {watts:6.0f} W/GPU {clock:6.0f} MHz "
        f"{watts * gpus * sec:7.2f} J/step",
        flush=True,
    )
  return rows


def time_tp_mlp(
    mesh, tokens, d_model, hidden, rounds, iterations, comm_sms, schedules, breakdown=False,
    power_s=0.0,
):  # fmt: skip
  """Wall ms of the TP MLP block (fwd+bwd) and of its GEMMs (fwd), and the collectives alone."""
  sh = lambda v, spec: jax.device_put(v, NamedSharding(mesh, spec))
  x = sh(_normal((tokens, d_model), 12), P("d", None))
  w_up = sh(_normal((d_model, hidden), 13, d_model**-0.5), P(None, "d"))
  b_up = sh(_normal((hidden,), 14), P("d"))
  w_down = sh(_normal((hidden, d_model), 15, hidden**-0.5), P("d", None))
  b_down = sh(_normal((d_model,), 16), P())
  h = sh(_normal((tokens, hidden), 17), P(None, "d"))
  fns = {}
  for name, (up, down) in tp_mlp_contenders(mesh, comm_sms, schedules).items():

    def loss(x, w_up, b_up, w_down, b_down, up=up, down=down):
      return jnp.mean(down(up(x, w_up, b_up), w_down, b_down).astype(jnp.float32) ** 2)

    fns[f"block fwd+bwd {name}"] = (
        jax.jit(jax.grad(loss, (0, 1, 2, 3, 4))),
        (x, w_up, b_up, w_down, b_down),
    )
    fns[f"up fwd {name}"] = (jax.jit(up), (x, w_up, b_up))
    fns[f"down fwd {name}"] = (jax.jit(down), (h, w_down, b_down))
  gather = jax.shard_map(lambda x: lax.all_gather(x, "d", axis=0, tiled=True), mesh=mesh,
                         in_specs=P("d", None), out_specs=P(None, None), check_vma=False)  # fmt: skip
  scatter = jax.shard_map(lambda y: lax.psum_scatter(y, "d", scatter_dimension=0, tiled=True),
                          mesh=mesh, in_specs=P("d", None), out_specs=P("d", None), check_vma=False)  # fmt: skip
  y_partial = sh(_normal((tokens * len(mesh.devices.flat), d_model), 18), P("d", None))
  gemm_up = jax.shard_map(lambda x, w, b: matmul(x, w, bias=b, activation="gelu_tanh"), mesh=mesh,
                          in_specs=(P(), P(None, "d"), P("d")), out_specs=P(None, "d"))  # fmt: skip
  gemm_down = jax.shard_map(lambda h, w: matmul(h, w), mesh=mesh, in_specs=(P(None, "d"), P("d", None)),
                            out_specs=P("d", None))  # fmt: skip
  fns["up gemm alone"] = (jax.jit(gemm_up), (sh(x, P()), w_up, b_up))
  fns["down gemm alone"] = (jax.jit(gemm_down), (h, w_down))
  fns["all_gather alone"] = (jax.jit(gather), (x,))
  fns["reduce_scatter alone"] = (jax.jit(scatter), (y_partial,))
  if breakdown:
    from benchmarks.matmul import kernel_breakdown

    for name in [n for n in fns if n.startswith("block")]:
      fn, fn_args = fns[name]
      kernels = kernel_breakdown(fn, fn_args, iterations=3)
      print(
          f"kernels of {name} (all devices, launch order), total {sum(t for _, t in kernels):.3f} ms:"
      )
      for kernel, ms in kernels:
        print(f"  {ms:8.3f} ms  {kernel[:110]}")
  if power_s:
    block_power(
        {n: f for n, f in fns.items() if n.startswith("block")},
        power_s,
        rounds,
        len(mesh.devices.flat),
    )
  samples = {name: [] for name in fns}
  for _ in range(rounds):
    for name, (fn, args) in fns.items():
      samples[name].append(wall_ms(fn, args, iterations))
  med = {name: statistics.median(t) for name, t in samples.items()}
  for name, t in med.items():
    print(f"wall {name:34s} {t:8.3f} ms", flush=True)
  for part, coll in (("up", "all_gather"), ("down", "reduce_scatter")):
    for name in med:
      if name.startswith((f"{part} fwd ring", f"{part} fwd bulk", f"{part} fwd fused")):
        hidden_share = (med[f"{part} fwd separate"] - med[name]) / med[f"{coll} alone"]
        print(
            f"hidden {part} {name.split()[-1]:12s} {100 * hidden_share:5.1f}% of {coll}", flush=True
        )
  return med


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--cpu-smoke", action="store_true", help="4 fake CPU devices, XLA path")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--iterations", type=int, default=10)
  parser.add_argument("--json", default=None, help="write the results here")
  parser.add_argument(
      "--comm-sms", default="4,8", help="SMs left to NCCL in ring[N], comma-separated"
  )
  parser.add_argument("--tokens", type=int, default=16384)
  parser.add_argument("--breakdown", action="store_true", help="CUPTI kernels of each block step")
  parser.add_argument(
      "--power", type=float, default=0.0, help="seconds per block and round under nvidia-smi"
  )
  parser.add_argument("--skip-layers", action="store_true", help="only the collective GEMMs")
  parser.add_argument("--checks", default=None, help="run only these checks (comma-separated)")
  parser.add_argument(
      "--schedules", default="bulk,fused,ring", help="collective schedules timed ('' for none)"
  )
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
  if args.skip_layers:
    checks = {}
  if len(devices) >= 4 and len(devices) % 2 == 0:
    mesh2 = jax.make_mesh(
        (2, len(devices) // 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2
    )
    checks["2d"] = lambda: check_layer(mesh2, P("data", "model"), P("model", None), m, n, k, impl)
  if not args.skip_layers:
    checks["ragged"] = lambda: check_ragged(mesh, m, n, k, 4, impl)
    checks["mlp"] = lambda: check_nnx_mlp(mesh, m // 4, k // 4, n // 4, impl)
    checks["tp_flax"] = lambda: check_nnx_mlp(mesh, m // 4, k // 4, n // 4, impl, True)
    checks["dot_gen"] = lambda: check_dot_general_column(mesh, m // 4, n // 4, k // 4, impl)
    checks["fp8_dp"] = lambda: check_fp8_data_parallel(mesh, m // 4, n // 4, k // 4, impl)
  collective = functools.cache(lambda: check_collective(mesh, m // 2, n, k, impl))
  checks["ag_matmul"] = lambda: collective()["ag_matmul"]
  checks["matmul_rs"] = lambda: collective()["matmul_rs"]
  if not smoke:  # the kernel that gathers A itself (a mesh of one axis: this one)
    fused = functools.cache(lambda: check_collective(mesh, m // 2, n, k, impl, "fused"))
    checks["ag_fused"] = lambda: fused()["ag_matmul"]
    checks["rs_fused"] = lambda: fused()["matmul_rs"]
  if args.checks is not None:
    wanted = set(filter(None, args.checks.split(",")))
    if unknown := wanted - set(checks):
      parser.error(f"--checks: unknown {sorted(unknown)}; known: {sorted(checks)}")
    checks = {name: check for name, check in checks.items() if name in wanted}
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
  timing, wall = [], {}
  schedules = [v for v in args.schedules.split(",") if v]
  if not smoke:
    if not args.skip_layers:
      timing = time_layers(mesh, 16384, 8192, 2048, args.rounds, args.iterations)
  if not smoke and schedules:
    wall = time_tp_mlp(
        mesh,
        args.tokens,
        8192,
        28672,
        args.rounds,
        args.iterations,
        [int(v) for v in args.comm_sms.split(",") if v],
        schedules,
        args.breakdown,
        args.power,
    )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
          dict(devices=len(devices), checks=results, timing=timing, wall_ms=wall), f, indent=1
      )
  # (inf, a failed check, is written as Infinity)
  return 0 if all(err < TOLERANCE for err in results.values()) else 1


if __name__ == "__main__":
  if "--cpu-smoke" in sys.argv and "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.exit(main())
