"""Named GEMM shape sweeps, for the benchmark harness and the ahead-of-time tuner.

A sweep is a JSON file in this folder (`llm`, `training`, `odd`, `tall_skinny_k`, and
`heldout` and `audit`: shapes no tuning or rule was fitted on, reported apart):

    {"description": "...",
     "defaults": {"dtype": "bfloat16", "layout": "NN"},
     "shapes": [{"name": "7B down", "m": [1, 2, 4], "n": 4096, "k": 11008}, ...]}

Each entry is `defaults` updated by its own fields; `m`, `n`, `k` and `batch`
may be lists, and the entry stands for every combination. Fields: m, n, k,
batch, dtype, out_dtype, layout ("NN", "NT", "TN", "TT"), epilogue (None or
e.g. "bias+gelu_tanh") and name. A text file works too: one `M N K` or
`MxNxK` per line, `#` starting a comment.

>>> shapes = load_sweep("llm")
>>> len(shapes), shapes[0].label, shapes[0].name
(63, '1x4096x4096 bfloat16 NN', '7B q/k/v/o')
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re

SWEEP_DIR = os.path.dirname(os.path.abspath(__file__))
LIST_FIELDS = ("batch", "m", "n", "k")


@dataclasses.dataclass(frozen=True)
class Shape:
  """One GEMM of a sweep: out (batch, M, N) = op(a) (batch, M, K) @ op(b) (batch, K, N)."""

  m: int
  n: int
  k: int
  batch: int = 1
  dtype: str = "bfloat16"
  out_dtype: str | None = None
  layout: str = "NN"
  epilogue: str | None = None
  name: str = ""

  @property
  def label(self) -> str:
    """'[batch x]MxNxK dtype layout[ epilogue]', e.g. '4096x4096x4096 bfloat16 NN'."""
    batch = f"{self.batch}x" if self.batch > 1 else ""
    epilogue = f" {self.epilogue}" if self.epilogue not in (None, "none") else ""
    return f"{batch}{self.m}x{self.n}x{self.k} {self.dtype} {self.layout}{epilogue}"

  def problem(self):
    """(GemmProblem, activation) as `pallas_gemm.matmul` sees this shape."""
    from pallas_gemm.tuner import make_problem

    dims = (self.batch, self.m, self.n, self.k) if self.batch > 1 else (self.m, self.n, self.k)
    return make_problem(dims, self.dtype, self.layout, self.epilogue, out_dtype=self.out_dtype)


def sweep_names() -> list[str]:
  """The sweeps shipped in this folder."""
  return sorted(f[:-5] for f in os.listdir(SWEEP_DIR) if f.endswith(".json"))


def load_sweep(name: str) -> list[Shape]:
  """The shapes of the named sweep (see `sweep_names`)."""
  if name not in sweep_names():
    raise ValueError(f"unknown sweep {name!r}; known: {', '.join(sweep_names())}")
  return load_shapes(os.path.join(SWEEP_DIR, name + ".json"))


def load_shapes(path: str) -> list[Shape]:
  """The shapes of a sweep file (JSON as above, else text lines `M N K`), in file order."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  if path.endswith(".json"):
    data = json.loads(text)
    entries = [{**data.get("defaults", {}), **entry} for entry in data["shapes"]]
  else:
    entries = [_text_entry(line, path) for line in text.splitlines() if line.split("#")[0].strip()]
  shapes = [shape for entry in entries for shape in _expand(entry, path)]
  return list(dict.fromkeys(shapes))


def _text_entry(line: str, path: str) -> dict:
  dims = re.split(r"[\sx,]+", line.split("#")[0].strip())
  if len(dims) != 3 or not all(d.isdigit() for d in dims):
    raise ValueError(f"{path}: expected 'M N K' or 'MxNxK', got {line!r}")
  return dict(zip("mnk", map(int, dims)))


def _expand(entry: dict, path: str) -> list[Shape]:
  """The shapes of one entry: the product of its list-valued m, n, k, batch."""
  lists = {
      f: entry[f] if isinstance(entry.get(f), list) else [entry[f]]
      for f in LIST_FIELDS
      if f in entry
  }
  shapes = []
  for values in itertools.product(*lists.values()):
    try:
      shapes.append(Shape(**{**entry, **dict(zip(lists, values))}))
    except TypeError as e:
      raise ValueError(f"{path}: bad shape entry {entry}: {e}") from None
  return shapes
