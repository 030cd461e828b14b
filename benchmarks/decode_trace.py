"""Where the weight-only kernel's cycles go, per warpgroup: decode under the in-kernel profiler.

    python -m benchmarks.decode_trace                       # GPU: one table per case
    python -m benchmarks.decode_trace --tokens 16 --contenders int4_ours,int4_tile
    python -m benchmarks.decode_trace --cold                # the weight from HBM, as served

Each contender of `benchmarks.quantized` that runs the kernel is called once
inside `pallas_gemm.kernel_trace.tracing`, and the trace of that call is summed
by region: the consumers' "ring_wait" (starved: the weights have not landed),
"convert" (int4 -> bf16 in registers), "wgmma_wait" (the tensor cores), "store";
the producer's "slot_wait" (the ring is full: the consumers are the limit) and
"tma_issue". Cycles are SM clock cycles; the profiler adds ~10-20 per region, and
its buffer may cost the ring a stage. It needs a GPU: the profiler writes its trace
from a host callback, which jax cannot export for another platform. Each table's
header gives the warpgroups' shortest and longest spans: the longest is the
kernel's critical path. Stream-K's regions: "contribute" (a cut tile's partial
store and release), "fixup_wait" and "fixup_load" (its finisher).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import quantized as bench
from pallas_gemm import kernel_trace
from pallas_gemm import weight_only as wo

CONTENDERS = ("int4_ours", "int4_tile", "int4_scalew", "int8_ours")


def _case(m: int, k: int, n: int, name: str, seed: int = 0):
  """x (m, k) and the quantized (k, n) weight of contender `name` (int8 for int8_*, in
  K blocks for int8_kblock)."""
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((k, n)), jnp.bfloat16)
  qw = wo.quantize_weights(w, bits=8 if name.startswith("int8") else 4, group_size=128)
  return x, wo.block_weights(qw) if name == "int8_kblock" else qw


def trace_one(fn, x, qw, directory: str, cold: bool = False) -> tuple[dict, dict]:
  """The summed trace of one call of `fn(x, qw)`, and the trace itself; after one
  warm-up call, whose trace is deleted (the profiler names a kernel's trace file once
  and never overwrites it). `cold`: the traced call reads a copy of the weight that
  calls on two other copies have since pushed out of L2 (as in a model's decode step;
  a warm call may find much of the weight in L2)."""
  copies = [jax.tree.map(lambda a: jnp.array(a, copy=True), qw) for _ in range(3)] if cold else []
  with kernel_trace.tracing(directory):
    call = jax.jit(fn)
    for weight in [qw] + copies[:-1]:
      jax.block_until_ready(call(x, weight))
      jax.effects_barrier()
      for path in kernel_trace.traces(directory):
        os.remove(path)
    jax.block_until_ready(call(x, copies[-1] if cold else qw))
    jax.effects_barrier()
  written = kernel_trace.traces(directory)
  if not written:
    raise RuntimeError(f"no trace was written into {directory} (did the kernel run?)")
  trace = kernel_trace.load(written[-1])
  return kernel_trace.summarize(trace), trace


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--tokens", default="1,16,64")
  parser.add_argument("--weights", default="4096x14336", help="KxN list")
  parser.add_argument("--contenders", default=",".join(CONTENDERS))
  parser.add_argument("--out", default=None, help="folder for the traces (default: a temp dir)")
  parser.add_argument(
      "--cold", action="store_true", help="trace a call whose weight is not in L2 (HBM-bound)"
  )
  args = parser.parse_args(argv)
  tokens = [int(t) for t in args.tokens.split(",")]
  weights = [tuple(int(d) for d in kn.split("x")) for kn in args.weights.split(",")]
  names = args.contenders.split(",")
  contenders = bench.weight_only_contenders(None)
  unknown = [name for name in names if contenders.get(name) is None]
  if unknown:
    raise SystemExit(f"--contenders: {unknown} are not kernel contenders of benchmarks.quantized")
  out = args.out or tempfile.mkdtemp(prefix="decode_trace_")
  if jax.default_backend() != "gpu":
    raise SystemExit("benchmarks.decode_trace needs a GPU (the profiler runs in the kernel)")
  from benchmarks.matmul import environment

  print(environment())
  for k, n in weights:
    for m in tokens:
      for name in names:
        x, qw = _case(m, k, n, name)
        directory = os.path.join(out, f"{name}_{m}x{n}x{k}")
        try:
          summary, trace = trace_one(contenders[name], x, qw, directory, cold=args.cold)
        except Exception as e:  # one contender's failure must not hide the others'
          print(f"\n{name} {m}x{n}x{k}: failed: {type(e).__name__}: {str(e)[:300]}")
          continue
        shortest, longest = kernel_trace.span_range(trace)
        print(
            f"\n{name} {m}x{n}x{k}: CTAs started within "
            f"{kernel_trace.start_spread_us(trace):.2f} us, warpgroup spans "
            f"{shortest:.0f}-{longest:.0f} cycles ({directory})\n"
            f"{kernel_trace.table(summary)}",
            flush=True,
        )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
