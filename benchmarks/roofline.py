"""Roofline bounds of a GEMM: the least time compute and memory traffic allow.

time >= max(flops / peak FLOP/s, bytes / bandwidth), with bytes the minimum
traffic: A and B read once, the output written once (plus c read and the
bias read when the problem has them). The default machine is an H100 SXM:
989 TFLOP/s dense bf16/f16 tensor-core peak and 3.35 TB/s of HBM3.

>>> from pallas_gemm.config import GemmProblem
>>> p = GemmProblem(m=4096, n=4096, k=4096)
>>> round(H100_SXM.tflops(p), 1)            # compute bound
989.0
>>> round(H100_SXM.tflops(GemmProblem(m=1, n=8192, k=8192)), 2)   # memory bound
3.35
"""

from __future__ import annotations

import dataclasses

import ml_dtypes  # noqa: F401 -- registers bfloat16 with numpy (a jax dependency)
import numpy as np


def flops(problem) -> int:
  """2 * batch * M * N * K (`GemmProblem.flops`; here beside `min_bytes`)."""
  return problem.flops


def min_bytes(problem) -> int:
  """Bytes a GEMM must move at least: read A, B (and c, bias), write the output."""
  in_bytes = np.dtype(problem.dtype).itemsize
  out_bytes = np.dtype(problem.out_dtype).itemsize
  m, n, k = problem.m, problem.n, problem.k
  total = problem.batch * ((m * k + k * n) * in_bytes + m * n * out_bytes)
  if problem.has_c:
    total += problem.batch * m * n * out_bytes
  if problem.has_bias:
    total += n * 4
  return total


@dataclasses.dataclass(frozen=True)
class Roofline:
  """A machine's peak compute (FLOP/s) and memory bandwidth (bytes/s)."""

  peak_flops: float
  bandwidth: float

  def seconds(self, problem) -> float:
    """The roofline time: max(compute time, memory time)."""
    return max(flops(problem) / self.peak_flops, min_bytes(problem) / self.bandwidth)

  def tflops(self, problem) -> float:
    """The best TFLOP/s the roofline allows: min(peak, intensity * bandwidth)."""
    return flops(problem) / self.seconds(problem) / 1e12


H100_SXM = Roofline(peak_flops=989e12, bandwidth=3.35e12)
"""H100 SXM5: dense bf16/f16 tensor-core peak, HBM3 bandwidth (spec sheet values)."""
