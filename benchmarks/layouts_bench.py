"""Time the layout algebra and vectorized layout evaluation (CPU, no jax).

    python -m benchmarks.layouts_bench

Prints microseconds per call for the algebra used in GEMM tiling, and the
cost of evaluating a 1M-element swizzled layout on a numpy index array next
to the same arithmetic written by hand in numpy.
"""

from __future__ import annotations

import platform
import timeit

import numpy as np

import layouts as L
from layouts.layout import clear_caches


def _best_us(fn, number: int) -> float:
  return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def algebra_cases():
  """(name, thunk) pairs: the algebra a GEMM kernel derives its tiling from."""
  tile = L.Layout((128, 64), (64, 1))  # a row-major A tile (bf16)
  smem = L.composition(L.Swizzle(3, 3, 3), L.Layout((8, 64), (64, 1)))
  mma_c = L.Layout.parse("((4,8,4),(2,2,16)):((128,1,16),(64,8,512))")
  gmem = L.Layout((8192, 8192), (8192, 1))
  return [
      (
          "Layout.parse (SM90 C layout)",
          lambda: L.Layout.parse("((4,8,4),(2,2,16)):((128,1,16),(64,8,512))"),
      ),
      ("coalesce 64x128 C layout", lambda: L.coalesce(mma_c)),
      ("composition tile o (32,8):(8,1)", lambda: L.composition(tile, L.Layout((32, 8), (8, 1)))),
      ("complement (32,8):(8,1) in 8192", lambda: L.complement(L.Layout((32, 8), (8, 1)), 8192)),
      ("right_inverse 64x128 C layout", lambda: L.right_inverse(mma_c)),
      ("left_inverse 64x128 C layout", lambda: L.left_inverse(mma_c)),
      ("zipped_divide 8192^2 by (128,256)", lambda: L.zipped_divide(gmem, (128, 256))),
      ("local_tile 8192^2 (128,64) at (3,5)", lambda: L.local_tile(gmem, (128, 64), (3, 5))),
      ("logical_product smem atom x (16,1)", lambda: L.logical_product(smem, L.Layout((16, 1)))),
      (
          "blocked_product (8,64) x (16,1)",
          lambda: L.blocked_product(L.Layout((8, 64), (64, 1)), L.Layout((16, 1))),
      ),
      ("upcast smem atom to 16 B", lambda: L.upcast(smem, 8)),
      ("evaluate (i, j) on C layout", lambda: mma_c(3, 17)),
  ]


def evaluation_cases(n: int = 1 << 20):
  """Vectorized evaluation of a 1M-element swizzled layout vs hand-written numpy."""
  rows = cols = 1 << 10
  layout = L.composition(L.Swizzle(3, 3, 3), L.Layout((rows, cols), (cols, 1)))
  idx = np.arange(n, dtype=np.int64)

  def by_hand():
    offset = (idx % rows) * cols + idx // rows
    return offset ^ ((offset & 0b111000000) >> 3)

  assert np.array_equal(layout(idx), by_hand())
  plain = L.Layout((rows, cols), (cols, 1))
  return [
      ("Sw<3,3,3> o (1024,1024):(1024,1) on 1M indices", lambda: layout(idx)),
      ("  same arithmetic by hand in numpy", by_hand),
      ("(1024,1024):(1024,1) on 1M indices", lambda: plain(idx)),
      ("  same arithmetic by hand in numpy", lambda: (idx % rows) * cols + idx // rows),
  ]


def _cold(fn):
  """``fn`` with the algebra's memo caches emptied first."""

  def run():
    clear_caches()
    return fn()

  return run


def main() -> list[tuple[str, float, float]]:
  print(
      f"layouts benchmark: Python {platform.python_version()}, numpy {np.__version__}, "
      f"{platform.processor() or platform.machine()}; best of 5 repeats; "
      "cold = memo caches emptied before each call"
  )
  rows = [(name, _best_us(_cold(fn), 500), _best_us(fn, 2000)) for name, fn in algebra_cases()]
  rows += [(name, _best_us(fn, 5), float("nan")) for name, fn in evaluation_cases()]
  width = max(len(name) for name, *_ in rows)
  print(f"{'case':<{width}}  {'cold us':>10}  {'cached us':>10}")
  for name, cold, warm in rows:
    print(f"{name:<{width}}  {cold:>10.1f}  {'' if warm != warm else f'{warm:.1f}':>10}")
  return rows


if __name__ == "__main__":
  main()
