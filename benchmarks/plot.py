"""Plot harness results: TFLOP/s of each contender per shape, under the roofline.

    python -m benchmarks.plot out/results.json --out out/tflops.png

Rows are the harness's (`benchmarks.matmul`): mappings with `m`, `n`, `k`,
`contender` and `tflops`, optionally `case` (the x label), `batch`, `dtype`
and `out_dtype` (bf16 when absent); rows without `tflops` (errors) are
skipped. matplotlib is optional (`pip install 'pallas-gemm[bench]'`): without
it `plot_rows` warns and draws nothing.

>>> import os, tempfile
>>> rows = [dict(m=4096, n=4096, k=4096, contender="pallas_gemm", tflops=700.0),
...         dict(m=4096, n=4096, k=4096, contender="xla", tflops=780.0)]
>>> path = plot_rows(rows, os.path.join(tempfile.mkdtemp(), "t.png"))
>>> path is None or os.path.getsize(path) > 0
True
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings

from benchmarks.roofline import H100_SXM, Roofline


def _problem(row):
  from pallas_gemm.config import GemmProblem

  dtype = row.get("dtype", "bfloat16")
  return GemmProblem(
      m=row["m"],
      n=row["n"],
      k=row["k"],
      batch=row.get("batch", 1),
      dtype=dtype,
      out_dtype=row.get("out_dtype") or dtype,
  )


def _by_case(rows):
  """{case label: (problem, {contender: tflops})}, in first-seen order."""
  cases = {}
  for row in rows:
    if row.get("tflops") is None:
      continue
    label = row.get("case") or f"{row['m']}x{row['n']}x{row['k']}"
    cases.setdefault(label, (_problem(row), {}))[1][row["contender"]] = float(row["tflops"])
  return cases


def plot_rows(rows, path: str, *, roofline: Roofline = H100_SXM, title: str | None = None):
  """Draws TFLOP/s per shape for every contender and the roofline bound; saves a PNG.

  The y axis is logarithmic when the bounds span more than 10x (e.g. LLM
  decode shapes next to large square ones). Returns `path`, or None (with a
  warning) when matplotlib is not installed.
  """
  try:
    from matplotlib.figure import Figure
  except ImportError:
    warnings.warn(
        "matplotlib is not installed (pip install 'pallas-gemm[bench]'); no plot drawn",
        stacklevel=2,
    )
    return None
  cases = _by_case(rows)
  labels = list(cases)
  x = range(len(labels))
  bounds = [roofline.tflops(problem) for problem, _ in cases.values()]
  contenders = list(dict.fromkeys(name for _, values in cases.values() for name in values))
  fig = Figure(figsize=(max(6.0, 2.0 + 0.3 * len(labels)), 5.0), layout="constrained")
  ax = fig.add_subplot()
  ax.plot(
      x,
      bounds,
      "k--",
      drawstyle="steps-mid",
      label=f"roofline ({roofline.peak_flops / 1e12:g} TFLOP/s, "
      f"{roofline.bandwidth / 1e12:g} TB/s)",
  )
  for name in contenders:
    ax.plot(x, [values.get(name, math.nan) for _, values in cases.values()], marker="o", label=name)
  if bounds and max(bounds) > 10 * min(bounds):
    ax.set_yscale("log")
  ax.set_xticks(list(x), labels, rotation=90, fontsize=7)
  ax.set_ylabel("TFLOP/s")
  ax.set_title(title or "GEMM throughput per shape")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.savefig(path, dpi=120)
  return path


def load_rows(path: str) -> list[dict]:
  """Result rows from a harness JSON file: a list of rows, or {"rows": [...]}."""
  with open(path, encoding="utf-8") as f:
    data = json.load(f)
  return data["rows"] if isinstance(data, dict) else data


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("results", help="harness results.json")
  parser.add_argument("--out", default=None, help="PNG path (default: beside the results)")
  parser.add_argument("--peak-tflops", type=float, default=H100_SXM.peak_flops / 1e12)
  parser.add_argument("--bandwidth-tbs", type=float, default=H100_SXM.bandwidth / 1e12)
  parser.add_argument("--title", default=None)
  args = parser.parse_args(argv)
  out = args.out or args.results.rsplit(".", 1)[0] + ".png"
  roofline = Roofline(args.peak_tflops * 1e12, args.bandwidth_tbs * 1e12)
  path = plot_rows(load_rows(args.results), out, roofline=roofline, title=args.title)
  if path:
    print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
