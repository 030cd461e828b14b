"""Times a grid of kernel configs on a set of shapes: the data the default's time model is fitted to.

    python -m benchmarks.calibrate --sweep fit --out out/calibrate   # on a Hopper GPU

For each shape of the sweep it times `jnp.dot` (XLA) and every config of
`pallas_gemm.heuristics.candidates` (CUPTI, median, L2 cold as the harness
times), in rounds with the configs interleaved, and writes
`calibrate_<sweep>.json`: per shape, the problem, XLA's time and each config's
time (or its error). `pallas_gemm.heuristics` is fitted to such files
(`python -m benchmarks.calibrate --fit FILE...` prints the fit and its error),
and the held-out sweep is the check that the fit generalizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import statistics
import sys
import time

VERIFY_BOUND = 1e-2
"""Largest relative difference of a config's output from XLA's that calibration times
(bf16 outputs of the same products differ by rounding, ~1e-5-1e-3)."""

SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calibration")
"""The calibration files the shipped time model is fitted to (`--fit` without files)."""


def calibrate(
    sweep: str,
    *,
    rounds: int,
    iterations: int,
    budget_s: float,
    out_dir: str | None,
    max_shapes: int | None = None,
    shard: tuple[int, int] = (0, 1),
) -> dict:
  from benchmarks import matmul as harness
  from pallas_gemm import shapes as shapes_lib
  from pallas_gemm import heuristics
  from pallas_gemm.tuner import CuptiTimer

  env = harness.environment()
  print(json.dumps(env), flush=True)
  results = dict(env=env, sweep=sweep, shapes=[])
  start = time.perf_counter()
  index, count = shard
  for shape in shard_shapes(shapes_lib.load_sweep(sweep)[:max_shapes], shard):
    if time.perf_counter() - start > budget_s:
      print(f"budget of {budget_s:.0f} s spent: stopping before {shape.label}", flush=True)
      break
    problem, activation = shape.problem()
    configs = heuristics.candidates(problem)
    timer = CuptiTimer(problem, activation, iterations=iterations)
    xla = CuptiTimer(problem, activation, iterations=iterations, implementation="xla")
    timer.prepare(configs)
    times = {c: [] for c in configs}
    errors, xla_times, rel_err = {}, [], {}
    for config in configs:  # each config's output against XLA's before it is timed
      try:
        rel_err[config] = timer.verify(config)
        if not rel_err[config] <= VERIFY_BOUND:
          errors[config] = f"output differs from XLA's: relative error {rel_err[config]:.2e}"
      except Exception as e:  # noqa: BLE001 -- recorded per config
        errors[config] = f"{type(e).__name__}: {str(e)[:200]}"
    for _ in range(rounds):
      xla_times.append(xla(None))
      for config in configs:
        if config in errors:
          continue
        try:
          times[config].append(timer(config))
        except Exception as e:  # noqa: BLE001 -- recorded per config
          errors[config] = f"{type(e).__name__}: {str(e)[:200]}"
    rows = []
    for config in configs:
      row = dict(config=heuristics.config_fields(config))
      if config in rel_err:
        row["rel_err"] = rel_err[config]
      if config in errors:
        row["error"] = errors[config]
      else:
        row["ms"] = statistics.median(times[config])
      rows.append(row)
    entry = dict(
        label=shape.label,
        name=shape.name,
        problem=dataclasses.asdict(problem),
        activation=activation,
        xla_ms=statistics.median(xla_times),
        configs=rows,
    )
    results["shapes"].append(entry)
    best = min((r for r in rows if "ms" in r), key=lambda r: r["ms"], default=None)
    print(
        f"{shape.label:40s} xla {entry['xla_ms'] * 1e3:9.1f} us  best "
        f"{best['ms'] * 1e3 if best else float('nan'):9.1f} us  "
        f"{heuristics.describe(best['config']) if best else '-'}  "
        f"({len(configs)} configs, {len(errors)} failed)",
        flush=True,
    )
  if out_dir:
    os.makedirs(out_dir, exist_ok=True)
    name = f"calibrate_{sweep}" + (f"_{index}of{count}" if count > 1 else "")
    with open(os.path.join(out_dir, f"{name}.json"), "w", encoding="utf-8") as f:
      json.dump(results, f, indent=1)
  return results


def shard_shapes(shapes: list, shard: tuple[int, int]) -> list:
  """Shard (index, count) of a sweep's shapes: every count-th from the index-th, so that
  count GPUs calibrate a sweep side by side (`--shard I/N`; merge their files in order).

  >>> shard_shapes(list("abcde"), (1, 2))
  ['b', 'd']
  """
  index, count = shard
  if not 0 <= index < count:
    raise ValueError(f"--shard {index}/{count}: the index must be in [0, {count})")
  return shapes[index::count]


def parse_overrides(text: str) -> dict[str, float]:
  """`name=value,...` of `heuristics.Params` fields.

  >>> parse_overrides("cluster_fixed_s=1e-7,launch_s=2.5e-6")
  {'cluster_fixed_s': 1e-07, 'launch_s': 2.5e-06}
  """
  from pallas_gemm import heuristics

  fields = heuristics.Params.__dataclass_fields__
  overrides = {}
  for item in filter(None, text.split(",")):
    name, _, value = item.partition("=")
    if name not in fields or not value:
      raise ValueError(f"--compare: {item!r} is not NAME=VALUE of {sorted(fields)}")
    overrides[name] = float(value)
  return overrides


def compare_models(sweeps, overrides, *, rounds=3, iterations=10, num_sms=None, hbm_scale=None,
                   timed=True, log=print) -> list[dict]:  # fmt: skip
  """The shipped time model against a variant (`Params` with `overrides`) on `sweeps`:
  the shapes whose default config would change, each pick timed (CUPTI, interleaved
  with XLA's) when `timed`. A model change ships only on what this says about the
  held-out sweep (NOTES exp. 77)."""
  from pallas_gemm import _compat
  from pallas_gemm import heuristics
  from pallas_gemm import shapes as shapes_lib

  num_sms = num_sms or _compat.device_sm_count() or heuristics.DEFAULT_NUM_SMS
  hbm_scale = hbm_scale or _compat.hbm_scale()
  variant = heuristics.Params(**overrides)
  rows = []
  for sweep in sweeps:
    for shape in shapes_lib.load_sweep(sweep):
      problem, activation = shape.problem()
      shipped = heuristics.pick(problem, num_sms, hbm_scale, heuristics.Params())
      other = heuristics.pick(problem, num_sms, hbm_scale, variant)
      if shipped == other:
        continue
      row = dict(
          sweep=sweep,
          label=shape.label,
          shipped=heuristics.describe(heuristics.config_fields(shipped)),
          variant=heuristics.describe(heuristics.config_fields(other)),
      )
      if timed:
        from pallas_gemm.tuner import CuptiTimer

        timer = CuptiTimer(problem, activation, iterations=iterations)
        xla = CuptiTimer(problem, activation, iterations=iterations, implementation="xla")
        times = {"shipped": [], "variant": [], "xla": []}
        for _ in range(rounds):
          times["shipped"].append(timer(shipped))
          times["variant"].append(timer(other))
          times["xla"].append(xla(None))
        row.update({f"{k}_us": 1e3 * statistics.median(v) for k, v in times.items()})
      rows.append(row)
      log(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
  if timed and rows:
    ratios = [r["shipped_us"] / r["variant_us"] for r in rows]
    log(
        f"{len(rows)} shapes change; shipped / variant time: geomean "
        f"{statistics.geometric_mean(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}"
    )
  elif not rows:
    log("no shape of these sweeps changes its default config")
  return rows


def check_defaults(sweeps, bound: float = 8e-3) -> int:
  """The default config of every shape of `sweeps` against the XLA path (relative error,
  fresh random operands): the time model picks tiles no tuning table ever held."""
  from pallas_gemm import shapes as shapes_lib
  from pallas_gemm import heuristics
  from pallas_gemm.tuner import CuptiTimer

  failures = 0
  for sweep in sweeps:
    for shape in shapes_lib.load_sweep(sweep):
      problem, activation = shape.problem()
      config = heuristics.default_config(problem)
      err = CuptiTimer(problem, activation, iterations=1).verify(config)
      ok = err <= bound
      failures += not ok
      print(
          f"{'PASS' if ok else 'FAIL'} {shape.label:40s} rel_err {err:.2e}  "
          f"{heuristics.describe(heuristics.config_fields(config))}",
          flush=True,
      )
  print(f"defaults checked: {failures} failed")
  return failures


def _parse_shard(parser, text: str) -> tuple[int, int]:
  index, _, count = text.partition("/")
  if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
    parser.error(f"--shard {text!r}: must be I/N with 0 <= I < N")
  return int(index), int(count)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--sweep", default="fit")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--iterations", type=int, default=10)
  parser.add_argument("--budget-s", type=float, default=400.0)
  parser.add_argument("--max-shapes", type=int, default=None)
  parser.add_argument(
      "--shard", default="0/1", help="I/N: every N-th shape from the I-th (one GPU each)"
  )
  parser.add_argument("--out", default=os.environ.get("OUT"))
  parser.add_argument(
      "--check",
      default=None,
      help="comma list of sweeps: check each shape's default config against XLA",
  )
  parser.add_argument(
      "--fit",
      nargs="*",
      default=None,
      help="calibration JSON files (none: the shipped ones): fit the time model to them and "
      "print the fit",
  )
  parser.add_argument(
      "--compare",
      default=None,
      help="NAME=VALUE,... of the time model's Params: time the shipped model's pick against "
      "this variant's on the shapes of --sweep (comma list) where they differ",
  )
  parser.add_argument("--dry-run", action="store_true", help="--compare: list, do not time")
  args = parser.parse_args(argv)
  shard = _parse_shard(parser, args.shard)
  if args.compare is not None:
    try:
      overrides = parse_overrides(args.compare)
    except ValueError as e:
      parser.error(str(e))
    timed = not args.dry_run
    if timed:
      import jax

      if jax.default_backend() != "gpu":
        print("--compare times kernels: it needs a Hopper GPU (or --dry-run)", file=sys.stderr)
        return 2
    compare_models(
        args.sweep.split(","), overrides, rounds=args.rounds, iterations=args.iterations,
        timed=timed,
    )  # fmt: skip
    return 0
  if args.fit is not None:
    from pallas_gemm import heuristics

    paths = args.fit or sorted(glob.glob(os.path.join(SHIPPED_DIR, "*_fit.json")))
    print(heuristics.fit_report([json.load(open(p, encoding="utf-8")) for p in paths]))
    return 0
  import jax

  if jax.default_backend() != "gpu":
    print("calibration times kernels: it needs a Hopper GPU", file=sys.stderr)
    return 2
  if args.check:
    return 1 if check_defaults(args.check.split(",")) else 0
  calibrate(
      args.sweep,
      rounds=args.rounds,
      iterations=args.iterations,
      budget_s=args.budget_s,
      out_dir=args.out,
      max_shapes=args.max_shapes,
      shard=shard,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
