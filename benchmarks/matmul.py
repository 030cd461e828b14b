"""GEMM benchmark harness: pallas_gemm vs XLA (`jnp.dot`, cuBLAS) vs jax's hopper_matmul_mgpu.

Contenders run interleaved in rounds on the same inputs (iid standard normal),
timed with CUPTI (`jax.experimental.mosaic.gpu.profiler.measure`); the reported
time is the median over all rounds' iterations. With `--l2 cold` (the default)
a problem smaller than 4x the L2 cache is timed over several input sets in turn
(`input_sets`), so that its operands come from HBM, as one layer's weights do in
a model; `--l2 warm` times one input set again and again (operands may stay in L2).

    python -m benchmarks.matmul --shapes 4096x8192x4096,8192x8192x8192 --layouts NN,NT
    python -m benchmarks.matmul --sweep llm --out out/llm     # a named sweep (benchmarks.sweep)

On a machine without a GPU it runs the kernel in interpret mode at a tiny shape
to exercise the code; those timings are meaningless and marked so.

>>> Case(m=4096, n=8192, k=4096).flops
274877906944
>>> parse_shapes("64x128x32")
[(64, 128, 32)]
>>> input_sets(Case(16, 4096, 4096))   # 33.8 MB: 7 sets exceed four 50 MiB L2s
7
>>> input_sets(Case(8192, 8192, 8192)), input_sets(Case(16, 4096, 4096), l2="warm")
(1, 1)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys

import jax
import jax.numpy as jnp

from pallas_gemm.tuner import L2_MODES, rotating
from pallas_gemm.tuner import input_sets as _input_sets

PEAK_TFLOPS = {
    "bfloat16": 989.4,
    "float16": 989.4,
    "float8_e4m3fn": 1978.9,
    "float8_e5m2": 1978.9,
    "float32": 494.7,
}
"""H100 SXM dense tensor-core peak (TFLOP/s); float32 runs as tf32."""

K_MAJOR_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float32")

EPILOGUES = (None, "bias_gelu")


@dataclasses.dataclass(frozen=True)
class Case:
  """One benchmark problem."""

  m: int
  n: int
  k: int
  dtype: str = "bfloat16"
  layout: str = "NN"  # first letter: A (N = (M,K), T = (K,M)); second: B (N = (K,N), T = (N,K))
  epilogue: str | None = None
  batch: int = 1

  @property
  def flops(self) -> int:
    return 2 * self.batch * self.m * self.n * self.k

  @property
  def transpose_a(self) -> bool:
    return self.layout[0] == "T"

  @property
  def transpose_b(self) -> bool:
    return self.layout[1] == "T"

  @property
  def label(self) -> str:
    batch = f"{self.batch}x" if self.batch > 1 else ""
    epi = f" +{self.epilogue}" if self.epilogue else ""
    return f"{batch}{self.m}x{self.n}x{self.k} {self.dtype} {self.layout}{epi}"


def case_bytes(case: Case) -> int:
  """Operand and output bytes of one call (A, B, the output in A's dtype, the bias)."""
  item = jnp.dtype(case.dtype).itemsize
  out_item = jnp.dtype(jnp.bfloat16).itemsize if case.dtype.startswith("float8") else item
  per_batch = (case.m * case.k + case.k * case.n) * item + case.m * case.n * out_item
  return case.batch * per_batch + (case.n * 4 if case.epilogue else 0)


def input_sets(case: Case, l2: str = "cold") -> int:
  """Input sets one timed call runs in turn (`pallas_gemm.tuner.input_sets`)."""
  return _input_sets(case_bytes(case), l2)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
  return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]


def make_inputs(case: Case, seed: int):
  """Random operands stored as the layout says, and a bias when the epilogue needs one."""
  ka, kb, kc = jax.random.split(jax.random.key(seed), 3)
  lead = (case.batch,) if case.batch > 1 else ()
  a_shape = (case.k, case.m) if case.transpose_a else (case.m, case.k)
  b_shape = (case.n, case.k) if case.transpose_b else (case.k, case.n)
  a = jax.random.normal(ka, lead + a_shape, jnp.float32).astype(case.dtype)
  b = jax.random.normal(kb, lead + b_shape, jnp.float32).astype(case.dtype)
  bias = jax.random.normal(kc, (case.n,), jnp.float32) if case.epilogue else None
  return a, b, bias


def _op(x, transpose):
  return jnp.swapaxes(x, -1, -2) if transpose else x


def xla_fn(case: Case):
  """`jnp.dot` in the operand dtype (what a user writes); XLA fuses the transposes.

  fp8: `lax.dot_general` of the stored operands contracting K with
  `preferred_element_type=bfloat16` (cuBLASLt's fp8 GEMM when B is (N, K)).
  f32: `jnp.matmul` at default precision (tf32 on Hopper).
  """
  if case.dtype.startswith("float8"):
    ca, cb = (0 if case.transpose_a else 1), (1 if case.transpose_b else 0)
    return jax.jit(
        lambda a, b, bias: jax.lax.dot_general(
            a, b, (((ca,), (cb,)), ((), ())), preferred_element_type=jnp.bfloat16
        )
    )

  def f(a, b, bias):
    if case.epilogue == "bias_gelu":
      acc = jnp.matmul(
          _op(a, case.transpose_a), _op(b, case.transpose_b), preferred_element_type=jnp.float32
      )
      return jax.nn.gelu(acc + bias, approximate=True).astype(case.dtype)
    return jnp.matmul(_op(a, case.transpose_a), _op(b, case.transpose_b))

  return jax.jit(f)


def pallas_fn(case: Case, config=None, implementation="pallas"):
  from pallas_gemm import matmul

  def f(a, b, bias):
    return matmul(
        a,
        b,
        transpose_a=case.transpose_a,
        transpose_b=case.transpose_b,
        bias=bias,
        activation="gelu_tanh" if case.epilogue else None,
        config=config,
        implementation=implementation,
    )

  return jax.jit(f)


JAX_MGPU_CONFIGS = (
    dict(tile_m=128, tile_n=128, grid_minor_dim="N", grid_tile_width=8, wg_dimension="N"),
    dict(tile_m=128, tile_n=128, grid_minor_dim="M", grid_tile_width=8, wg_dimension="N"),
    dict(tile_m=128, tile_n=128, grid_minor_dim="N", grid_tile_width=16, wg_dimension="N"),
    dict(
        tile_m=128,
        tile_n=128,
        grid_minor_dim="N",
        grid_tile_width=8,
        wg_dimension="N",
        cluster_dimension="M",
    ),
)
"""A small set of jax's own kernel configs (its best region in our earlier sweep)."""


def jax_mgpu_fns(case: Case):
  """jax's hopper_matmul_mgpu, one callable per config it accepts (NN, no epilogue only)."""
  if case.layout != "NN" or case.epilogue or case.batch > 1 or case.dtype != "bfloat16":
    return {}
  from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

  fns = {}
  for i, raw in enumerate(JAX_MGPU_CONFIGS):
    kw = dict(raw)
    for key in ("grid_minor_dim", "wg_dimension", "cluster_dimension"):
      if key in kw:
        kw[key] = hm.MatmulDimension[kw[key]]
    cfg = hm.TuningConfig(tile_k=64, max_concurrent_steps=4, **kw)
    cta_m = cfg.tile_m * (2 if cfg.wg_dimension == hm.MatmulDimension.M else 1)
    cta_n = cfg.tile_n * (2 if cfg.wg_dimension == hm.MatmulDimension.N else 1)
    cm = 2 if cfg.cluster_dimension == hm.MatmulDimension.M else 1
    cn = 2 if cfg.cluster_dimension == hm.MatmulDimension.N else 1
    if case.m % (cta_m * cm) or case.n % (cta_n * cn) or case.k % 64:
      continue
    fns[f"jax_mgpu[{i}]"] = jax.jit(lambda a, b, bias, cfg=cfg: hm.matmul(a, b, None, config=cfg))
  return fns


def cupti_times_ms(fn, args, iterations: int) -> list[float]:
  from jax.experimental.mosaic.gpu import profiler

  _, times = profiler.measure(fn, iterations=iterations)(*args)
  if times is None:
    raise RuntimeError("no kernel was launched")
  return list(times)


def kernel_breakdown(fn, args, iterations: int = 20) -> list[tuple[str, float]]:
  """(kernel name, median ms) of each kernel one call of `fn` launches, in launch order."""
  from jax.experimental.mosaic.gpu import profiler

  _, runs = profiler.measure(fn, aggregate=False, iterations=max(iterations, 2))(*args)
  return [
      (name, statistics.median(run[i][1] for run in runs)) for i, (name, _) in enumerate(runs[0])
  ]


def run_cases(cases, contenders_for, *, rounds=3, iterations=10, l2="cold", log=print):
  """Times every contender of every case, interleaved in rounds; returns result rows.

  `contenders_for(case)` -> {name: jitted fn(a, b, bias)}. Contenders whose name
  contains "[" are alternatives of one family (e.g. jax_mgpu[0..3]): after the
  first round only the family's fastest keeps running, reported under the family name.
  `l2`: "cold" times each call over `input_sets` input sets in turn (the time of
  one call is the total / sets), "warm" on one set.
  """
  rows = []
  for case in cases:
    sets = input_sets(case, l2)
    seed = hash(case.label) % 2**31
    arg_sets = tuple(make_inputs(case, seed=seed + i) for i in range(sets))
    args = (arg_sets,) if sets > 1 else arg_sets[0]
    fns = {
        name: rotating(fn, sets) if sets > 1 else fn for name, fn in contenders_for(case).items()
    }
    samples = {name: [] for name in fns}
    errors = {}
    for r in range(rounds):
      for name, fn in list(fns.items()):
        try:
          samples[name] += [t / sets for t in cupti_times_ms(fn, args, iterations)]
        except Exception as e:  # a contender that cannot run this case is reported, not fatal
          errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
          del fns[name]
          samples.pop(name)
      if r == 0:
        _keep_best_of_families(
            fns,
            samples,
            lambda name, ms: log(
                f"{case.label:40s} {name:32s} round-0 median {ms * 1e3:9.1f} us "
                f"{case.flops / (ms * 1e-3) / 1e12:7.1f} TFLOP/s"
            ),
        )
    for name, times in samples.items():
      med = statistics.median(times)
      row = dict(
          case=case.label,
          m=case.m,
          n=case.n,
          k=case.k,
          batch=case.batch,
          dtype=case.dtype,
          layout=case.layout,
          epilogue=case.epilogue,
          contender=name.split("[")[0],
          variant=name,
          median_ms=med,
          min_ms=min(times),
          max_ms=max(times),
          samples=len(times),
          input_sets=sets,
          tflops=case.flops / (med * 1e-3) / 1e12,
      )
      row["pct_peak"] = 100 * row["tflops"] / PEAK_TFLOPS[case.dtype]
      rows.append(row)
      log(f"{case.label:40s} {name:32s} {med * 1e3:9.1f} us {row['tflops']:7.1f} TFLOP/s")
    for name, err in errors.items():
      rows.append(dict(case=case.label, contender=name.split("[")[0], variant=name, error=err))
      log(f"{case.label:40s} {name:24s} ERROR {err}")
  return rows


def _keep_best_of_families(fns, samples, report):
  families = {}
  for name in fns:
    if "[" in name:
      families.setdefault(name.split("[")[0], []).append(name)
  for members in families.values():
    for name in members:
      report(name, statistics.median(samples[name]))
    best = min(members, key=lambda n: statistics.median(samples[n]))
    for name in members:
      if name != best:
        del fns[name]
        samples.pop(name)


def format_table(rows, ours=("pallas_gemm", "pallas_best"), others=("xla", "jax_mgpu")) -> str:
  """Markdown table: one line per case, TFLOP/s (% of peak) per contender, ratios ours/others."""
  by_case = {}
  for row in rows:
    if "error" not in row:
      by_case.setdefault(row["case"], {})[row["contender"]] = row
  present = [c for c in (*ours, *others) if any(c in cont for cont in by_case.values())]
  pairs = [(o, t) for o in ours if o in present for t in others if t in present]
  lines = [
      "| case | "
      + " | ".join(f"{c} TFLOP/s (% peak)" for c in present)
      + " | "
      + " | ".join(f"{o}/{t}" for o, t in pairs)
      + " |",
      "|---" * (1 + len(present) + len(pairs)) + "|",
  ]
  for case, cont in by_case.items():
    cells = [
        f"{cont[c]['tflops']:.0f} ({cont[c]['pct_peak']:.0f}%)" if c in cont else "—"
        for c in present
    ]
    ratios = [
        f"{cont[o]['tflops'] / cont[t]['tflops']:.3f}" if o in cont and t in cont else "—"
        for o, t in pairs
    ]
    lines.append(f"| {case} | " + " | ".join(cells + ratios) + " |")
  return "\n".join(lines)


def file_logger(name: str):
  """log(msg): prints `msg` and appends it to `name` in $OUT (default ./out, created)."""
  out_dir = os.environ.get("OUT", "out")
  os.makedirs(out_dir, exist_ok=True)
  log_file = open(os.path.join(out_dir, name), "a")

  def log(msg):
    print(msg, flush=True)
    log_file.write(msg + "\n")
    log_file.flush()

  return log


def write_json(out_dir: str, name: str, **payload) -> None:
  """Writes `payload` as indented JSON to out_dir/name (the folder is created)."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, name), "w") as f:
    json.dump(payload, f, indent=1)


def environment(l2: str = "cold") -> dict:
  dev = jax.devices()[0]
  l2_text = (
      "L2 cold: problems under 4x L2 rotate over input sets"
      if l2 == "cold"
      else "L2 warm: one input set, no flush"
  )
  return dict(
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      device=dev.device_kind,
      platform=dev.platform,
      jax=jax.__version__,
      method=f"CUPTI (jax.experimental.mosaic.gpu.profiler.measure), median, {l2_text}, "
      "inputs iid N(0,1)",
  )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--shapes", default="4096x8192x4096,8192x8192x8192,4096x4096x4096")
  parser.add_argument("--layouts", default="NN")
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--epilogue", default=None, choices=[e for e in EPILOGUES if e])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--iterations", type=int, default=10)
  parser.add_argument(
      "--out",
      default=os.environ.get("OUT"),
      help="folder for results.json (sweeps: sweep_NAME.json/.png); default $OUT",
  )
  parser.add_argument(
      "--sweep",
      default=None,
      help="a named sweep of pallas_gemm/shapes (llm, training, odd, tall_skinny_k): "
      "pallas_gemm vs jnp.dot side by side, summary table last",
  )
  parser.add_argument(
      "--m-values",
      default=None,
      help="sweeps: comma list of M values to keep, or 'all' (llm default: 1,16,64,256)",
  )
  parser.add_argument(
      "--max-shapes", type=int, default=None, help="sweeps: only the first N shapes"
  )
  parser.add_argument(
      "--budget-s",
      type=float,
      default=180.0,
      help="sweeps: start no new shape after this many seconds",
  )
  parser.add_argument(
      "--compare-split",
      action="store_true",
      help="sweeps: also time each shape with the other split-K choice (pallas_alt)",
  )
  parser.add_argument(
      "--compare-table",
      default=None,
      metavar="FILE",
      help="sweeps: also time each shape with the config of this tuning table "
      "or cache file, e.g. a fresh pallas_gemm.tune cache (pallas_alt)",
  )
  parser.add_argument(
      "--l2",
      default="cold",
      choices=L2_MODES,
      help="cold: problems under 4x the L2 run over several input sets in turn, "
      "so operands come from HBM; warm: one input set (may stay in L2)",
  )
  parser.add_argument(
      "--breakdown",
      action="store_true",
      help="also print the kernels of pallas_gemm and xla and each one's median time",
  )
  args = parser.parse_args(argv)
  env = environment(args.l2)
  print(json.dumps(env))
  if args.sweep:
    return _run_sweep(args, gpu=env["platform"] == "gpu")
  if env["platform"] != "gpu":
    print("no GPU: running the kernel in interpret mode at 128x256x64; timings are meaningless")
    case = Case(128, 256, 64)
    a, b, bias = make_inputs(case, 0)
    out = pallas_fn(case, implementation="interpret")(a, b, bias)
    ref = xla_fn(case)(a, b, bias)
    err = float(
        jnp.linalg.norm((out - ref).astype(jnp.float32)) / jnp.linalg.norm(ref.astype(jnp.float32))
    )
    print(f"interpret-mode relative error vs XLA: {err:.2e}")
    return 0
  cases = [
      Case(m, n, k, args.dtype, layout, args.epilogue)
      for (m, n, k) in parse_shapes(args.shapes)
      for layout in args.layouts.split(",")
  ]

  def contenders(case):
    return {"pallas_gemm": pallas_fn(case), "xla": xla_fn(case), **jax_mgpu_fns(case)}

  rows = run_cases(cases, contenders, rounds=args.rounds, iterations=args.iterations, l2=args.l2)
  if args.breakdown:  # one input set: the kernels of one call
    for case in cases:
      args_ = make_inputs(case, seed=0)
      for name, fn in (("pallas_gemm", pallas_fn(case)), ("xla", xla_fn(case))):
        kernels = kernel_breakdown(fn, args_, args.iterations)
        print(
            f"{case.label:32s} {name:12s} "
            + "; ".join(f"{kernel[:40]} {ms * 1e3:.2f} us" for kernel, ms in kernels)
        )
  if args.out:
    write_json(args.out, "results.json", environment=env, rows=rows)
  print(format_table(rows))
  return 0


def _run_sweep(args, gpu: bool) -> int:
  from benchmarks import sweep

  cases = sweep.sweep_cases(
      args.sweep, sweep.parse_m_values(args.m_values, args.sweep), args.max_shapes
  )
  if not gpu:
    print(sweep.plan(args.sweep, cases))
    return 0
  _, summary = sweep.run(
      args.sweep,
      cases,
      out_dir=args.out,
      rounds=args.rounds,
      iterations=args.iterations,
      budget_s=args.budget_s,
      compare_split=args.compare_split,
      compare_table=args.compare_table,
      l2=args.l2,
  )
  print(sweep.format_summary(args.sweep, summary))
  return 0


if __name__ == "__main__":
  sys.exit(main())
