"""Runs each GEMM contender a few times at one shape, for a hardware-counter profiler.

Meant to run under Nsight Compute on the device, which replays every kernel
launch it matches (the timings of `benchmarks.matmul` stay the reference):

    ncu --clock-control none --profile-from-start off \\
        --section SpeedOfLight --section WarpStateStats \\
        python -m benchmarks.profile_once --shape 4096x8192x4096

Every contender is compiled and run once (XLA's GEMM autotuning included),
then the CUDA profiler is started (`cuProfilerStart` on the primary context),
so only the contenders' own launches are profiled.

>>> [c for c, _ in contenders(Case(m=256, n=256, k=64))]
['pallas_gemm', 'xla', 'jax_mgpu']
>>> [c for c, _ in contenders(Case(m=100, n=256, k=64))]  # jax's kernel needs whole tiles
['pallas_gemm', 'xla']
"""

from __future__ import annotations

import argparse
import ctypes
import sys

import jax

from benchmarks.matmul import Case, jax_mgpu_fns, make_inputs, parse_shapes, pallas_fn, xla_fn


def contenders(case: Case):
  """(name, fn) of our kernel, XLA and jax's Hopper kernel (its first config it accepts)."""
  fns = [("pallas_gemm", pallas_fn(case)), ("xla", xla_fn(case))]
  mgpu = list(jax_mgpu_fns(case).values())
  return fns + [("jax_mgpu", mgpu[0])] if mgpu else fns


def start_cuda_profiler() -> None:
  """`cuProfilerStart` on device 0's primary context (the one jax uses)."""
  cuda = ctypes.CDLL("libcuda.so.1")
  dev, ctx = ctypes.c_int(), ctypes.c_void_p()
  for call in (
      lambda: cuda.cuInit(0),
      lambda: cuda.cuDeviceGet(ctypes.byref(dev), 0),
      lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
      lambda: cuda.cuCtxSetCurrent(ctx),
      cuda.cuProfilerStart,
  ):
    status = call()
    if status:
      raise RuntimeError(f"CUDA driver call failed with status {status}")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--shape", default="4096x8192x4096")
  parser.add_argument("--layout", default="NN")
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--launches", type=int, default=2, help="profiled launches per contender")
  args = parser.parse_args(argv)
  ((m, n, k),) = parse_shapes(args.shape)
  case = Case(m=m, n=n, k=k, dtype=args.dtype, layout=args.layout)
  inputs = make_inputs(case, seed=0)
  fns = [(name, jax.jit(fn)) for name, fn in contenders(case)]
  for name, fn in fns:  # compile and warm up everything first
    jax.block_until_ready(fn(*inputs))
  start_cuda_profiler()
  for name, fn in fns:
    for _ in range(args.launches):
      jax.block_until_ready(fn(*inputs))
    print(f"profiled {name} x{args.launches} at {case}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
