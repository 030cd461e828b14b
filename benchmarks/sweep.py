"""A named sweep side by side: pallas_gemm against `jnp.dot`, per shape, under the roofline.

    python -m benchmarks.matmul --sweep llm --out out/llm      # on the H100
    python -m benchmarks.matmul --sweep llm                    # no GPU: the plan only

The shapes come from `pallas_gemm/shapes/NAME.json`; `--m-values` keeps the
shapes whose M is listed (the llm sweep defaults to `DEFAULT_M_VALUES`) and
`--max-shapes` the first few. Timing is the harness's (`benchmarks.matmul.run_cases`:
CUPTI, contenders interleaved in rounds). The summary holds per shape the
bound that applies (memory or compute, by the roofline), both times, the
speedup (jnp.dot time / pallas_gemm time), TFLOP/s, GB/s of the minimum
traffic and the % of the roofline; then the geomean speedup, the worst shape
and, for decode shapes (M <= 64), the % of the memory roofline. It is written
as JSON with the rows, and drawn as a PNG (`benchmarks.plot`).

>>> geomean([1.0, 4.0])
2.0
>>> [c.label for c in sweep_cases("llm", (1, 16, 64, 256), max_shapes=2)]
['1x4096x4096 bfloat16 NN', '16x4096x4096 bfloat16 NN']
"""

from __future__ import annotations

import math
import statistics
import time

from pallas_gemm import shapes as shapes_lib
from benchmarks.roofline import H100_SXM, Roofline, min_bytes

DEFAULT_M_VALUES = {"llm": (1, 16, 64, 256)}
"""M values a sweep runs unless `--m-values` says otherwise: all 9 of the llm
sweep (63 shapes) would take ~8 minutes of compiling and timing on the H100;
these 4 (28 shapes) take about 3."""

DECODE_MAX_M = 64
"""Shapes up to this M count as decode (target: >= 85% of the memory roofline)."""

EPILOGUES = {None: None, "none": None, "bias+gelu_tanh": "bias_gelu"}
"""Sweep epilogue spellings the harness can time, and its own name for them."""


def geomean(values) -> float:
  values = list(values)
  return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def parse_m_values(text: str | None, sweep: str) -> tuple[int, ...] | None:
  """`--m-values`: "1,16,64" -> (1, 16, 64); "all" -> None; None -> the sweep's default.

  >>> parse_m_values(None, "llm"), parse_m_values("all", "llm"), parse_m_values("2,8", "odd")
  ((1, 16, 64, 256), None, (2, 8))
  """
  if text is None:
    return DEFAULT_M_VALUES.get(sweep)
  if text == "all":
    return None
  try:
    return tuple(int(v) for v in text.split(",") if v)
  except ValueError:
    raise ValueError(
        f"--m-values must be 'all' or comma-separated integers, got {text!r}"
    ) from None


def shape_case(shape: shapes_lib.Shape):
  """The harness `Case` of a sweep shape."""
  from benchmarks.matmul import Case

  if shape.epilogue not in EPILOGUES:
    raise ValueError(
        f"{shape.label}: epilogue {shape.epilogue!r} is not timed by the harness "
        f"(known: {[e for e in EPILOGUES if e]})"
    )
  return Case(
      shape.m, shape.n, shape.k, shape.dtype, shape.layout, EPILOGUES[shape.epilogue], shape.batch
  )


def sweep_cases(name: str, m_values=None, max_shapes: int | None = None):
  """The harness cases of sweep `name`, keeping M in `m_values` (None: all),
  then the first `max_shapes` (None: all)."""
  shapes = [s for s in shapes_lib.load_sweep(name) if m_values is None or s.m in m_values]
  if max_shapes is not None:
    shapes = shapes[:max_shapes]
  if not shapes:
    raise ValueError(f"sweep {name!r} has no shape with M in {m_values}")
  return [shape_case(s) for s in shapes]


def case_problem(case):
  """(GemmProblem, activation) of a harness case, as `matmul` sees it."""
  from pallas_gemm.tuner import make_problem

  dims = (case.batch, case.m, case.n, case.k) if case.batch > 1 else (case.m, case.n, case.k)
  epilogue = "bias+gelu_tanh" if case.epilogue == "bias_gelu" else None
  out_dtype = "bfloat16" if case.dtype.startswith("float8") else case.dtype
  return make_problem(dims, case.dtype, case.layout, epilogue, out_dtype=out_dtype)


def case_config(case):
  """The config `matmul` runs for `case` here: the tuning cache's, else the default."""
  from pallas_gemm import tuning_cache
  from pallas_gemm.heuristics import default_config

  problem, activation = case_problem(case)
  return tuning_cache.lookup_config(problem, activation) or default_config(problem)


def summarize(
    cases, rows, *, roofline: Roofline = H100_SXM, ours="pallas_gemm", other="xla", configs=None
) -> list[dict]:
  """One dict per case that both contenders ran (see the module docstring).

  >>> from benchmarks.matmul import Case
  >>> case = Case(1, 8192, 8192)
  >>> rows = [dict(case=case.label, contender="pallas_gemm", median_ms=0.05),
  ...         dict(case=case.label, contender="xla", median_ms=0.055)]
  >>> s = summarize([case], rows)[0]
  >>> s["bound"], round(s["speedup"], 2), round(s["pct_roofline"]), round(s["gbs"])
  ('memory', 1.1, 80, 2685)
  """
  times = {}
  for row in rows:
    if "error" not in row:
      times.setdefault(row["case"], {})[row["contender"]] = row["median_ms"]
  summary = []
  for i, case in enumerate(cases):
    got = times.get(case.label, {})
    if ours not in got or other not in got:
      continue
    problem, _ = case_problem(case)
    bound_s = roofline.seconds(problem)
    memory = min_bytes(problem) / roofline.bandwidth >= problem.flops / roofline.peak_flops
    s = dict(
        case=case.label,
        m=case.m,
        n=case.n,
        k=case.k,
        bound="memory" if memory else "compute",
        roofline_us=bound_s * 1e6,
        us=got[ours] * 1e3,
        xla_us=got[other] * 1e3,
        speedup=got[other] / got[ours],
        tflops=problem.flops / (got[ours] * 1e-3) / 1e12,
        xla_tflops=problem.flops / (got[other] * 1e-3) / 1e12,
        gbs=min_bytes(problem) / (got[ours] * 1e-3) / 1e9,
        pct_roofline=100 * bound_s / (got[ours] * 1e-3),
        xla_pct_roofline=100 * bound_s / (got[other] * 1e-3),
    )
    if configs is not None:
      s["config"] = configs[i]
    for name, ms in got.items():
      if name not in (ours, other):
        s[f"{name}_us"] = ms * 1e3
    summary.append(s)
  return summary


def format_summary(name: str, summary: list[dict]) -> str:
  """The table and the per-sweep lines printed last (plain text, fixed width)."""
  extra = sorted(
      {k for s in summary for k in s if k.endswith("_us")} - {"roofline_us", "us", "xla_us"}
  )
  head = (
      f"{'shape':34s} {'bound':7s} {'pallas us':>10s} {'xla us':>10s} {'speedup':>7s} "
      f"{'TFLOP/s':>8s} {'GB/s':>7s} {'%roof':>6s} {'xla%roof':>8s}"
      + "".join(f" {k:>16s}" for k in extra)
      + "  config"
  )
  lines = [head]
  for s in summary:
    lines.append(
        f"{s['case']:34s} {s['bound']:7s} {s['us']:10.1f} {s['xla_us']:10.1f} "
        f"{s['speedup']:7.3f} {s['tflops']:8.1f} {s['gbs']:7.0f} {s['pct_roofline']:6.1f} "
        f"{s['xla_pct_roofline']:8.1f}"
        + "".join(f" {s[k]:16.1f}" if k in s else f" {'-':>16s}" for k in extra)
        + f"  {s.get('config', '')}"
    )
  if not summary:
    return head + f"\nsweep {name}: no shape ran on both contenders"
  worst = min(summary, key=lambda s: s["speedup"])
  lines.append(
      f"sweep {name}: {len(summary)} shapes, geomean speedup over jnp.dot "
      f"{geomean(s['speedup'] for s in summary):.3f}, worst {worst['speedup']:.3f} "
      f"({worst['case']}), {sum(s['speedup'] < 0.9 for s in summary)} below 0.9"
  )
  decode = [s["pct_roofline"] for s in summary if s["m"] <= DECODE_MAX_M and s["bound"] == "memory"]
  if decode:
    lines.append(
        f"sweep {name}: decode (M <= {DECODE_MAX_M}) % of the memory roofline: min "
        f"{min(decode):.1f}, median {statistics.median(decode):.1f} ({len(decode)} shapes; "
        f"target >= 85)"
    )
  return "\n".join(lines)


def plan(name: str, cases) -> str:
  """What a device run would do, without a GPU: shape, config, model and roofline times."""
  from pallas_gemm import split_k
  from pallas_gemm.tune import describe

  lines = [
      f"sweep {name}: {len(cases)} shapes (no GPU: the plan only; the configs are what "
      "matmul would run here)",
      f"{'shape':34s} {'roofline us':>11s} {'model us':>9s}  config",
  ]
  for case in cases:
    problem, _ = case_problem(case)
    cfg = case_config(case)
    model = split_k.estimate(
        problem,
        cfg.split_k,
        tile_m=cfg.tile_m,
        tile_n=cfg.tile_n,
        tile_k=cfg.tile_k,
        stages=cfg.stages,
    )
    lines.append(
        f"{case.label:34s} {H100_SXM.seconds(problem) * 1e6:11.1f} "
        f"{model.seconds * 1e6:9.1f}  {describe(cfg)}"
    )
  return "\n".join(lines)


def other_split(case, config):
  """`config` with the other split-K choice, to check the model's: split_k=1 if
  it splits, else the model's best count >= 2 (None when K allows none).

  >>> from benchmarks.matmul import Case
  >>> from pallas_gemm.config import GemmConfig
  >>> other_split(Case(16, 1024, 8192), GemmConfig(tile_m=64, tile_n=128, wg_split="n")).split_k
  16
  """
  import dataclasses

  from pallas_gemm import split_k
  from pallas_gemm.config import PARTIAL_EPILOGUE_TILE

  problem, _ = case_problem(case)
  if config.split_k > 1:
    return dataclasses.replace(config, split_k=1)
  best = split_k.best_split(
      problem,
      tile_m=config.tile_m,
      tile_n=config.tile_n,
      tile_k=config.tile_k,
      stages=config.stages,
  )
  if best is None:
    return None
  for stages in range(config.stages, 1, -1):
    candidate = dataclasses.replace(
        config, split_k=best.split_k, stages=stages, epilogue_tile=PARTIAL_EPILOGUE_TILE
    )
    try:
      candidate.validate(problem)
    except ValueError:
      continue
    return candidate
  return None


def table_config(case, path: str):
  """The config a tuning table or cache file at `path` holds for `case` (with the
  shipped table's reach in M: `tuning_cache.packaged_config`), or None."""
  from pallas_gemm import tuning_cache

  problem, activation = case_problem(case)
  return tuning_cache.packaged_config(problem, activation, path=path)


def routed(case) -> str | None:
  """'xla (why)' when the default (`implementation=None` on a GPU) runs XLA's GEMM for
  `case` (`pallas_gemm.route`), else None.

  >>> from pallas_gemm.shapes import Shape
  >>> routed(Shape(m=4096, n=4096, k=8))
  'xla (K=8 < 64: one partial K step (XLA is faster at tiny K))'
  >>> routed(Shape(m=4096, n=4096, k=4096)) is None
  True
  """
  from pallas_gemm import route

  implementation, why = route.choose(case_problem(case)[0])
  return f"xla ({why})" if implementation == "xla" else None


def run(
    name: str,
    cases,
    *,
    out_dir: str | None,
    rounds: int,
    iterations: int,
    budget_s: float,
    compare_split: bool = False,
    compare_table: str | None = None,
    l2: str = "cold",
    log=print,
) -> tuple[list[dict], list[dict]]:
  """Times the cases on the GPU (until `budget_s` has passed; the rest are
  skipped and said so); writes `sweep_NAME.json` and `.png` under `out_dir`.
  Contender `pallas_gemm` is the default a user gets (`implementation="auto"`): where
  it routes to XLA's GEMM, the config column says so and why (`routed`).
  Returns (rows, summary). With `compare_split`, each shape also runs with
  the other split-K choice (`other_split`); with `compare_table`, with the
  config of that tuning file (`table_config`), e.g. a fresh `pallas_gemm.tune`
  cache against the shipped table; either is contender `pallas_alt`. `l2`: the
  harness's L2 policy (`benchmarks.matmul.input_sets`)."""
  import os

  from benchmarks import matmul as harness
  from benchmarks import plot
  from pallas_gemm.tune import describe

  if compare_split and compare_table:
    raise ValueError("compare_split and compare_table both fill contender pallas_alt: pick one")
  configs = [case_config(c) for c in cases]
  if compare_split:
    alts = [other_split(c, cfg) for c, cfg in zip(cases, configs)]
  else:
    alts = [table_config(c, compare_table) if compare_table else None for c in cases]

  def contenders(case):
    fns = {
        "pallas_gemm": harness.pallas_fn(case, implementation="auto"),
        "xla": harness.xla_fn(case),
    }
    alt = alts[cases.index(case)]
    if alt is not None:
      fns["pallas_alt"] = harness.pallas_fn(case, alt)
    return fns

  rows, start, done = [], time.monotonic(), 0
  for case in cases:
    if time.monotonic() - start > budget_s:
      break
    rows += harness.run_cases(
        [case], contenders, rounds=rounds, iterations=iterations, l2=l2, log=log
    )
    done += 1
  if done < len(cases):
    log(
        f"sweep {name}: time budget of {budget_s:.0f} s spent; skipped the last "
        f"{len(cases) - done} of {len(cases)} shapes"
    )
  described = [
      (routed(case) or describe(c)) + (f" (alt: {describe(a)})" if a else "")
      for case, c, a in zip(cases[:done], configs[:done], alts[:done])
  ]
  summary = summarize(cases[:done], rows, configs=described)
  if out_dir:
    harness.write_json(
        out_dir,
        f"sweep_{name}.json",
        environment=harness.environment(l2),
        sweep=name,
        rows=rows,
        summary=summary,
    )
    plot.plot_rows(
        rows,
        os.path.join(out_dir, f"sweep_{name}.png"),
        title=f"sweep {name}: pallas_gemm vs jnp.dot (H100, bf16)",
    )
  return rows, summary
