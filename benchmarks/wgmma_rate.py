"""The time of one WGMMA instruction (m64 x N x k16, bf16) by N and by where A lives.

    python -m benchmarks.wgmma_rate            # GPU: the table
    python -m benchmarks.wgmma_rate --export   # no GPU: lower every probe for CUDA

A decode GEMM (few tokens) multiplies each 64 x 16 block of weights by N = 16
tokens: one WGMMA of 16K multiply-adds, 8 cycles of an SM's tensor cores at
their peak (2048 bf16 multiply-adds per cycle). The weight-only kernel's decode
step (32 such instructions per SM for 16 KB of int4 weights) takes ~1.1 us, about
64 cycles per instruction (NOTES exp. 88). This probe measures what the
instruction itself costs: each of 132 CTAs runs `iters` WGMMAs of (64 x 128) x
(128 x N) (8 instructions each) on operands already in SMEM or registers, one
WGMMA group in flight, with 1 or 2 warpgroups per SM. Cycles per instruction
are per SM (both warpgroups' instructions counted) at `CLOCK_GHZ`.

>>> probe(16, register_a=True, warpgroups=2, iters=4).__name__
'wgmma_rate_n16_regs_wg2'
"""

from __future__ import annotations

import argparse
import statistics

import jax
from jax import lax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp

from pallas_gemm import _compat

K = 128
"""K per WGMMA call: 8 instructions of k16."""
CLOCK_GHZ = 1.755
"""The H100 SXM's boost clock; the cycle counts scale with the clock the run held."""
NS = (8, 16, 32, 64, 128, 256)
SMS = 132


def probe(n: int, *, register_a: bool, warpgroups: int, iters: int):
  """A jitted kernel of `iters` WGMMA calls per warpgroup; returns a (64, N) f32 array."""
  swizzled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

  def body(out_gmem, a_smem, b_smem, out_smem):
    wg = lax.axis_index("wg")

    def scoped(acc):
      a = (
          _compat.load_registers(a_smem, plgpu.Layout.WGMMA, optimized=True)
          if register_a
          else a_smem
      )
      b = _compat.transpose_2d(b_smem)

      @pl.loop(0, iters)
      def _(_):
        plgpu.wgmma(acc, a, b)
        plgpu.wgmma_wait(1)

      plgpu.wgmma_wait(0)
      out_smem.at[wg][...] = acc[...]  # a use of the result
      plgpu.commit_smem()

      @pl.when((lax.axis_index("sm") == 0) & (wg == 0))
      def _():
        plgpu.copy_smem_to_gmem(out_smem.at[0], out_gmem)
        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(scoped, plgpu.ACC((64, n), jnp.float32))

  def kernel(out_gmem):
    pl.run_scoped(
        lambda a, b, o: body(out_gmem, a, b, o),
        plgpu.SMEM((64, K), jnp.bfloat16, transforms=swizzled),
        plgpu.SMEM((n, K), jnp.bfloat16, transforms=swizzled),
        plgpu.SMEM((warpgroups, 64, n), jnp.float32),
        collective_axes="wg",
    )

  call = plgpu.kernel(
      kernel,
      out_type=jax.ShapeDtypeStruct((64, n), jnp.float32),
      grid=(SMS,),
      grid_names=("sm",),
      num_threads=warpgroups,
      thread_name="wg",
      compiler_params=_compat.compiler_params(),
  )
  fn = jax.jit(call)
  fn.__name__ = f"wgmma_rate_n{n}_{'regs' if register_a else 'smem'}_wg{warpgroups}"
  return fn


def cases():
  for register_a in (True, False):
    for n in NS:
      for warpgroups in (1, 2):
        yield n, register_a, warpgroups


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--export", action="store_true", help="lower every probe for CUDA only")
  parser.add_argument("--iters", type=int, default=500)
  args = parser.parse_args(argv)
  if args.export or jax.default_backend() != "gpu":
    for n, register_a, warpgroups in cases():
      fn = probe(n, register_a=register_a, warpgroups=warpgroups, iters=args.iters)
      jax.export.export(fn, platforms=["cuda"])()
      print(f"lowered {fn.__name__}")
    return 0
  from benchmarks.matmul import cupti_times_ms, environment

  print(environment())
  rows = [
      "| N | A | warpgroups | us | cycles / instruction / SM | at peak |",
      "|---|---|---|---|---|---|",
  ]
  for n, register_a, warpgroups in cases():
    fn = probe(n, register_a=register_a, warpgroups=warpgroups, iters=args.iters)
    us = statistics.median(cupti_times_ms(fn, (), 10)) * 1e3
    instructions = args.iters * (K // 16) * warpgroups
    cycles = us * 1e-6 * CLOCK_GHZ * 1e9 / instructions
    rows.append(
        f"| {n} | {'registers' if register_a else 'SMEM'} | {warpgroups} | {us:.1f} | "
        f"{cycles:.1f} | {64 * n * 16 / 2048:.1f} |"
    )
    print(rows[-1], flush=True)
  print("\n".join(rows))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
