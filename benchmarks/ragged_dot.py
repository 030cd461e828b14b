"""Grouped-GEMM benchmark: pallas_gemm.ragged_dot vs jax's ragged_dot_mgpu vs XLA's lax.ragged_dot.

One device call does everything:

    python -m benchmarks.ragged_dot                      # H100 target case, both rhs layouts
    python -m benchmarks.ragged_dot --shapes 16384x16384x2048 --groups 16 --layouts N

1. A correctness pass on the device (odd shapes, empty groups, rows past
   sum(group_sizes), one group with every row, many groups inside one tile,
   both rhs layouts) against `lax.ragged_dot` in f32: the things GPU interpret
   mode cannot check (TMA row-ladder stores from swizzled SMEM, edge clipping).
2. Timing: contenders interleaved in rounds on the same inputs (iid N(0,1)
   bf16, group sizes from sorted uniform cut points, as jax's own benchmark
   draws them), CUPTI (`jax.experimental.mosaic.gpu.profiler.measure`), median
   over all rounds' iterations, no L2 flush. Families `name[i]` (config
   variants) run once each in round 0; only the fastest goes on.
   Then the backward (dlhs + drhs through ragged_dot's custom_vjp: both our
   kernels) against XLA's ragged_dot gradient, unless --no-grad.
3. Device, jax version and method printed first; the table last.

Shapes are MxNxK. Without a GPU it runs one small case in interpret mode
(arithmetic only, no timings).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from benchmarks.matmul import PEAK_TFLOPS, cupti_times_ms, environment, parse_shapes
from pallas_gemm.grouped import ragged_dot
from pallas_gemm.ragged_gemm import RaggedConfig

PALLAS_CONFIGS = (
    RaggedConfig(),
    RaggedConfig(group=4),
    RaggedConfig(group=16),
    RaggedConfig(raster="along_m", group=8),
    RaggedConfig(stages=3, epilogue_tile=(64, 64)),
    RaggedConfig(tile_n=128, stages=6),
)
"""pallas_best[i]: the default and a few variants around it."""

JAX_MGPU_CONFIGS = (
    dict(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, grid_block_n=8),
    dict(block_m=128, block_n=128, block_k=64, max_concurrent_steps=5, grid_block_n=4),
    dict(block_m=192, block_n=128, block_k=64, max_concurrent_steps=4, grid_block_n=8),
    dict(block_m=128, block_n=128, block_k=64, max_concurrent_steps=6, grid_block_n=16),
)
"""jax_mgpu[i]: jax's ragged_dot_mgpu (single warpgroup, non-persistent-ring), four configs."""

CHECK_CASES = (
    # (M, N, K, group sizes, transpose_rhs)
    (1024, 512, 256, (256, 0, 384, 128, 256), False),  # whole tiles only: no ladder
    (1000, 1016, 1000, (300, 0, 0, 511, 189), False),
    (1000, 1016, 1000, (300, 0, 0, 511, 189), True),
    (4096, 4096, 512, (5, 1, 1, 3, 2000, 0, 1000, 7), False),  # 1079 rows past the sum
    (4096, 4096, 512, (5, 1, 1, 3, 2000, 0, 1000, 7), True),
    (333, 136, 72, (333,), False),  # one group, nothing aligned
    (2048, 512, 256, (0, 2048, 0), True),
    (200, 256, 128, (1,) * 64 + (100,), False),  # many groups per tile
    (1000, 256, 128, (700, 700, 5), True),  # sum > M: cut at M
    # rows not a multiple of 8: lhs and output through the row-wise TMA view, unpadded
    (1001, 1024, 512, (300, 0, 500, 201), False),
    (12345, 1024, 512, (4000, 8000, 345), True),
)


GRAD_CHECK_CASES = (
    (1000, 1016, 1000, (300, 0, 0, 511, 150), False),  # 39 tail rows, an empty group
    (4096, 2048, 512, (5, 1, 1, 3, 2000, 0, 1000, 7), True),
    (1001, 1024, 512, (300, 0, 500, 150), False),  # odd rows (dlhs: the row views too)
)


def random_group_sizes(key, groups: int, m: int):
  """jax's benchmark distribution: sorted uniform cut points in [0, m)."""
  cuts = jnp.sort(jax.random.randint(key, (groups - 1,), 0, m, jnp.int32))
  return jnp.diff(jnp.concatenate([jnp.zeros(1, jnp.int32), cuts, jnp.full(1, m, jnp.int32)]))


def make_inputs(m, n, k, groups, transpose_rhs, seed=0, dtype=jnp.bfloat16):
  kx, ky, kz = jax.random.split(jax.random.key(seed), 3)
  lhs = jax.random.normal(kx, (m, k), jnp.float32).astype(dtype)
  rhs = jax.random.normal(
      ky, (groups, n, k) if transpose_rhs else (groups, k, n), jnp.float32
  ).astype(dtype)
  return lhs, rhs, random_group_sizes(kz, groups, m)


def xla_fn(transpose_rhs):
  def f(lhs, rhs, sizes):
    if transpose_rhs:
      rhs = jnp.swapaxes(rhs, 1, 2)
    return lax.ragged_dot(lhs, rhs, sizes)

  return jax.jit(f)


def pallas_fn(transpose_rhs, config=None, implementation="pallas"):
  return jax.jit(
      lambda lhs, rhs, sizes: ragged_dot(
          lhs, rhs, sizes, transpose_rhs=transpose_rhs, config=config, implementation=implementation
      )
  )


def jax_mgpu_fns(m, n, k, transpose_rhs):
  from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

  fns = {}
  for i, cfg in enumerate(JAX_MGPU_CONFIGS):
    if k % cfg["block_k"] or n % (cfg["block_n"] * cfg["grid_block_n"]):
      continue
    fns[f"jax_mgpu[{i}]"] = jax.jit(
        lambda lhs, rhs, sizes, cfg=cfg: ragged_dot_mgpu.ragged_dot(
            lhs, rhs, group_sizes=sizes, transpose_rhs=transpose_rhs, **cfg
        )
    )
  return fns


def grad_fn(fn):
  """(dlhs, drhs) of `fn` for a given cotangent `dout` (the fourth argument):
  the backward alone, via jax.vjp (its forward is not timed apart)."""

  def f(lhs, rhs, sizes, dout):
    out, vjp = jax.vjp(lambda a, b: fn(a, b, sizes), lhs, rhs)
    return vjp(dout.astype(out.dtype))

  return jax.jit(f)


def make_cotangent(m, n, seed=7, dtype=jnp.bfloat16):
  return jax.random.normal(jax.random.key(seed), (m, n), jnp.float32).astype(dtype)


def _flat(x):
  if isinstance(x, (tuple, list)):
    return jnp.concatenate([jnp.ravel(jnp.asarray(v, jnp.float32)) for v in x])
  return jnp.asarray(x, jnp.float32)


def rel_error(out, ref) -> float:
  out, ref = _flat(out), _flat(ref)
  return float(jnp.linalg.norm(out - ref) / jnp.maximum(jnp.linalg.norm(ref), 1e-30))


def check(log=print) -> bool:
  """Device correctness pass; returns True if every case is within bf16 rounding."""
  ok = True
  for m, n, k, sizes, t in CHECK_CASES:
    lhs, rhs, _ = make_inputs(m, n, k, len(sizes), t, seed=m + n + k)
    sizes = jnp.asarray(sizes, jnp.int32)
    ref = lax.ragged_dot(
        lhs.astype(jnp.float32),
        (jnp.swapaxes(rhs, 1, 2) if t else rhs).astype(jnp.float32),
        sizes,
        precision=lax.Precision.HIGHEST,
    )
    out = pallas_fn(t)(lhs, rhs, sizes)
    err = rel_error(out, ref)
    tail = int(jnp.sum(sizes))
    tail_ok = tail >= m or not bool(jnp.any(out[tail:] != 0))
    nan = bool(jnp.any(jnp.isnan(out.astype(jnp.float32))))
    good = err < 8e-3 and tail_ok and not nan
    ok &= good
    log(
        f"check {m}x{n}x{k} G={len(sizes)} rhs={'NK' if t else 'KN'}: rel.err {err:.2e} "
        f"tail-zero={tail_ok} nan={nan} -> {'ok' if good else 'FAIL'}"
    )
  for m, n, k, sizes, t in GRAD_CHECK_CASES:  # both backward kernels through the custom_vjp
    lhs, rhs, _ = make_inputs(m, n, k, len(sizes), t, seed=m + n + k + 1)
    sizes = jnp.asarray(sizes, jnp.int32)
    f32 = lambda lhs, rhs, s: lax.ragged_dot(
        lhs.astype(jnp.float32),
        (jnp.swapaxes(rhs, 1, 2) if t else rhs).astype(jnp.float32),
        s,
        precision=lax.Precision.HIGHEST,
    )
    dout = make_cotangent(m, n)
    want = grad_fn(f32)(lhs, rhs, sizes, dout)
    got = grad_fn(pallas_fn(t))(lhs, rhs, sizes, dout)
    errs = [rel_error(g, w) for g, w in zip(got, want)]
    good = max(errs) < 8e-3 and not any(
        bool(jnp.any(jnp.isnan(g.astype(jnp.float32)))) for g in got
    )
    ok &= good
    log(
        f"check grad {m}x{n}x{k} G={len(sizes)} rhs={'NK' if t else 'KN'}: rel.err dlhs "
        f"{errs[0]:.2e} drhs {errs[1]:.2e} -> {'ok' if good else 'FAIL'}"
    )
  return ok


def run_case(m, n, k, groups, transpose_rhs, *, rounds, iterations, grad=False, log=print):
  """Forward (all contenders) or, with `grad`, the backward (dlhs + drhs: our two
  kernels via ragged_dot's custom_vjp vs XLA's ragged_dot transpose rules)."""
  lhs, rhs, sizes = make_inputs(m, n, k, groups, transpose_rhs)
  label = f"{m}x{n}x{k} G={groups} bf16 rhs={'NK' if transpose_rhs else 'KN'}" + (
      " backward" if grad else ""
  )
  log(f"{label}: group sizes {np.asarray(sizes).tolist()}")
  if grad:
    fns = {"pallas_gemm": grad_fn(pallas_fn(transpose_rhs)), "xla": grad_fn(xla_fn(transpose_rhs))}
  else:
    fns = {
        "pallas_gemm": pallas_fn(transpose_rhs),
        **{f"pallas_best[{i}]": pallas_fn(transpose_rhs, c) for i, c in enumerate(PALLAS_CONFIGS)},
        **jax_mgpu_fns(m, n, k, transpose_rhs),
        "xla": xla_fn(transpose_rhs),
    }
  args = (lhs, rhs, sizes, make_cotangent(m, n)) if grad else (lhs, rhs, sizes)
  ref = fns["xla"](*args)
  errors = {}
  for name, fn in list(fns.items()):
    try:
      err = rel_error(fn(*args), ref)
      log(f"{label} {name:16s} rel.err vs xla {err:.2e}")
      if not err < 1e-2:
        raise RuntimeError(f"wrong result (rel.err {err:.2e})")
    except Exception as e:  # reported, not fatal
      errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
      del fns[name]
  samples = {name: [] for name in fns}
  flops = 2 * m * n * k * (2 if grad else 1)
  for r in range(rounds):
    for name, fn in list(fns.items()):
      samples[name] += cupti_times_ms(fn, args, iterations)
    if r == 0:  # families: keep the fastest member
      for family in ("pallas_best", "jax_mgpu"):
        members = [x for x in fns if x.startswith(family + "[")]
        for x in members:
          log(f"{label} {x:16s} round-0 median {statistics.median(samples[x]) * 1e3:9.1f} us")
        if members:
          best = min(members, key=lambda x: statistics.median(samples[x]))
          for x in members:
            if x != best:
              del fns[x]
              samples.pop(x)
  rows = []
  for name, times in samples.items():
    med = statistics.median(times)
    rows.append(
        dict(
            case=label,
            m=m,
            n=n,
            k=k,
            groups=groups,
            transpose_rhs=transpose_rhs,
            contender=name.split("[")[0],
            variant=name,
            median_ms=med,
            min_ms=min(times),
            max_ms=max(times),
            samples=len(times),
            tflops=flops / (med * 1e-3) / 1e12,
            pct_peak=100 * flops / (med * 1e-3) / 1e12 / PEAK_TFLOPS["bfloat16"],
            group_sizes=np.asarray(sizes).tolist(),
        )
    )
    log(f"{label} {name:16s} {med:8.3f} ms {rows[-1]['tflops']:7.1f} TFLOP/s")
  for name, err in errors.items():
    rows.append(dict(case=label, contender=name.split("[")[0], variant=name, error=err))
    log(f"{label} {name:16s} ERROR {err}")
  return rows


def format_table(rows) -> str:
  """Markdown: per case the median ms of each contender and our speed-ups."""
  names = ("pallas_gemm", "pallas_best", "jax_mgpu", "xla")
  by_case = {}
  for row in rows:
    if "error" not in row:
      by_case.setdefault(row["case"], {})[row["contender"]] = row
  lines = [
      "| case | "
      + " | ".join(f"{c} ms (TFLOP/s)" for c in names)
      + " | best/jax_mgpu | best/xla | variant |",
      "|---" * (len(names) + 4) + "|",
  ]
  for case, cont in by_case.items():
    cells = [
        f"{cont[c]['median_ms']:.3f} ({cont[c]['tflops']:.0f})" if c in cont else "—" for c in names
    ]
    ours = min(
        (cont[c] for c in ("pallas_gemm", "pallas_best") if c in cont),
        key=lambda r: r["median_ms"],
        default=None,
    )
    ratio = lambda other: (
        f"{cont[other]['median_ms'] / ours['median_ms']:.2f}x" if ours and other in cont else "—"
    )
    lines.append(
        f"| {case} | " + " | ".join(cells) + f" | {ratio('jax_mgpu')} | {ratio('xla')} | "
        f"{ours['variant'] if ours else '—'} |"
    )
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--shapes", default="16384x16384x2048", help="MxNxK,...")
  parser.add_argument("--groups", type=int, default=16)
  parser.add_argument("--layouts", default="N,T", help="rhs layouts: N = (G,K,N), T = (G,N,K)")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--iterations", type=int, default=10)
  parser.add_argument("--no-check", action="store_true", help="skip the correctness pass")
  parser.add_argument("--no-grad", action="store_true", help="skip the backward timing")
  parser.add_argument("--out", default=os.environ.get("OUT"), help="folder for ragged_dot.json")
  args = parser.parse_args(argv)
  env = environment()
  print(json.dumps(env))
  if env["platform"] != "gpu":
    print("no GPU: one small case in interpret mode (arithmetic only, no timings)")
    lhs, rhs, sizes = make_inputs(300, 256, 128, 4, False)
    err = rel_error(
        pallas_fn(False, implementation="interpret")(lhs, rhs, sizes),
        xla_fn(False)(lhs, rhs, sizes),
    )
    print(f"interpret-mode relative error vs XLA: {err:.2e}")
    return 0 if err < 1e-2 else 1
  ok = True if args.no_check else check()
  rows = []
  for m, n, k in parse_shapes(args.shapes):
    for layout in args.layouts.split(","):
      for grad in (False,) if args.no_grad else (False, True):
        rows += run_case(
            m,
            n,
            k,
            args.groups,
            layout == "T",
            rounds=args.rounds,
            iterations=args.iterations,
            grad=grad,
        )
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ragged_dot.json"), "w") as f:
      json.dump(dict(environment=env, check_ok=ok, rows=rows), f, indent=1)
  print(f"device check: {'all ok' if ok else 'FAILURES (see above)'}")
  print(format_table(rows))
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
