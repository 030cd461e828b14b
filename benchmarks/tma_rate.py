"""HBM streaming through the package's TMA ring, by box and weight layout: what feeds decode.

    python -m benchmarks.tma_rate            # GPU: the table
    python -m benchmarks.tma_rate --export   # no GPU: lower every probe for CUDA

A decode GEMM's time is the time to stream its weight from HBM. The weight-only
kernel reads int4 weights stored (N, K) in boxes of (256 rows, 128 int4): 256 row
segments of 64 bytes at a stride of K / 2 bytes. Each probe streams a weight
through a `pipeline.Ring` on every SM (one TMA producer warpgroup; consumers
that only wait and release, or that also convert their rows to bf16 in WGMMA's
register layout as the kernel does) and reports GB/s by element type, box and
layout:
  rows   (N, K), a box of (rows, cols): row segments of cols * bits / 8 bytes
  tiles  (N / rows, K / cols, rows, cols): each box one contiguous block

>>> Probe("int4", 256, 128, "tiles").name
'int4_256x128_tiles_wait'
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import jax
from jax import lax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import pipeline
from pallas_gemm.weight_only_gemm import _transforms

SMS = 132
DTYPES = {"int4": jnp.int4, "int8": jnp.int8, "bf16": jnp.bfloat16}
BITS = {"int4": 4, "int8": 8, "bf16": 16}
STAGE_BYTES = 160 * 1024
"""SMEM the ring may take: stages = min(8, this // box bytes)."""


@dataclasses.dataclass(frozen=True)
class Probe:
  """Stream an (n, k) weight of `dtype` in (rows, cols) boxes laid out as `layout`;
  `consumer`: "wait" (wait and release) or "convert" (each of 2 consumer warpgroups
  converts its rows/2 rows to bf16 in registers, as the weight-only kernel does)."""

  dtype: str
  rows: int
  cols: int
  layout: str
  consumer: str = "wait"
  n: int = 65536
  k: int = 4096

  @property
  def name(self) -> str:
    return f"{self.dtype}_{self.rows}x{self.cols}_{self.layout}_{self.consumer}"

  @property
  def nbytes(self) -> int:
    return self.n * self.k * BITS[self.dtype] // 8

  @property
  def stages(self) -> int:
    return min(8, STAGE_BYTES // (self.rows * self.cols * BITS[self.dtype] // 8))

  def shape(self) -> tuple:
    if self.layout == "rows":
      return (self.n, self.k)
    return (self.n // self.rows, self.k // self.cols, self.rows, self.cols)

  def weight(self):
    """A weight of the probe's shape (values do not matter to the timing)."""
    bits = BITS[self.dtype]
    if bits == 16:
      return jnp.ones(self.shape(), jnp.bfloat16)
    return jnp.ones(self.shape(), DTYPES[self.dtype])

  def kernel(self):
    rows, cols, consumers = self.rows, self.cols, 2
    n_tiles, k_steps = self.n // rows, self.k // cols
    mine = rows // consumers
    convert = self.consumer == "convert"
    upcast = {4: plgpu.Layout.WGMMA_UPCAST_4X, 8: plgpu.Layout.WGMMA_UPCAST_2X}.get(
        BITS[self.dtype], plgpu.Layout.WGMMA
    )

    out_shape = (consumers, mine, cols) if convert else (1, 8, 64)  # "wait" stores nothing

    def body(w_gmem, out_gmem):
      def scoped(ring_refs, out_smem):
        ring = pipeline.Ring.of(ring_refs)
        wg = lax.axis_index("wg")

        def producer():
          def load(item, _, step0):
            @pl.loop(0, k_steps)
            def _(k):
              if self.layout == "rows":
                view = w_gmem.at[pl.ds(item * rows, rows), pl.ds(k * cols, cols)]
              else:
                view = w_gmem.at[item, k]
              ring.fill(step0 + k, [view])

          ring.drain(pipeline.persistent_loop(n_tiles, load, steps_of=k_steps, workers=SMS))

        def consumer():
          if not convert:
            pipeline.persistent_loop(
                n_tiles,
                lambda item, _, step0: ring.skip(step0, k_steps),
                steps_of=k_steps,
                workers=SMS,
            )
            return

          def step(k, total):
            slot = ring.slot(k)
            plgpu.barrier_wait(ring.loaded.at[slot])
            (w_tile,) = ring.stage(slot)
            w = _compat.load_registers(w_tile.at[pl.ds(wg * mine, mine)], upcast, optimized=True)
            w = plgpu.layout_cast(w, plgpu.Layout.WGMMA).astype(jnp.bfloat16)
            plgpu.barrier_arrive(ring.consumed.at[slot])
            return total + w

          total = jnp.zeros((mine, cols), jnp.bfloat16)
          sm = lax.axis_index("sm")
          steps = lax.div(n_tiles - sm + SMS - 1, SMS) * k_steps
          total = lax.fori_loop(0, steps, step, total)
          out_smem.at[wg][...] = total
          plgpu.commit_smem()

          @pl.when(sm == 0)
          def _():
            plgpu.copy_smem_to_gmem(out_smem.at[wg], out_gmem.at[wg])
            plgpu.wait_smem_to_gmem(0)

        pipeline.warp_specialized(producer, consumer, consumers=consumers)

      pl.run_scoped(
          scoped,
          ring_refs=pipeline.ring_scratch(
              self.stages,
              [((rows, cols), DTYPES[self.dtype], _transforms(BITS[self.dtype], cols))],
              consumers=consumers,
          ),
          out_smem=plgpu.SMEM(out_shape, jnp.bfloat16, transforms=_transforms(16, out_shape[-1])),
          collective_axes="wg",
      )

    call = pipeline.launch(
        body,
        out_type=jax.ShapeDtypeStruct(out_shape, jnp.bfloat16),
        workers=SMS,
        consumers=consumers,
    )
    fn = jax.jit(call)
    fn.__name__ = self.name
    return fn


def cases(consumer_modes=("wait", "convert")):
  boxes = [
      ("int4", 256, 128, "rows"),  # the decode kernel's box: 64-byte row segments
      ("int4", 256, 128, "tiles"),
      ("int4", 256, 256, "rows"),  # 128-byte row segments
      ("int4", 128, 128, "rows"),
      ("int4", 128, 256, "tiles"),
      ("int8", 256, 128, "rows"),
      ("int8", 256, 128, "tiles"),
      ("bf16", 128, 64, "rows"),  # a bf16 GEMV's stream
  ]
  for consumer in consumer_modes:
    for dtype, rows, cols, layout in boxes:
      if consumer == "convert" and (dtype == "bf16" or cols > 128):
        continue  # (the kernel converts 128-column steps; its sum's SMEM would not fit)
      yield Probe(dtype, rows, cols, layout, consumer)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--export", action="store_true", help="lower every probe for CUDA only")
  parser.add_argument("--consumers", default="wait,convert", help="consumer modes to run")
  args = parser.parse_args(argv)
  modes = tuple(args.consumers.split(","))
  if args.export or jax.default_backend() != "gpu":
    for probe in cases(modes):
      w = jax.ShapeDtypeStruct(probe.shape(), DTYPES[probe.dtype])
      jax.export.export(probe.kernel(), platforms=["cuda"])(w)
      print(f"lowered {probe.name}")
    return 0
  from benchmarks.matmul import cupti_times_ms, environment

  print(environment())
  rows = [
      "| dtype | box | layout | consumer | stages | us | GB/s |",
      "|---|---|---|---|---|---|---|",
  ]
  for probe in cases(modes):
    w = probe.weight()
    us = statistics.median(cupti_times_ms(probe.kernel(), (w,), 10)) * 1e3
    rows.append(
        f"| {probe.dtype} | {probe.rows}x{probe.cols} | {probe.layout} | {probe.consumer} | "
        f"{probe.stages} | {us:.1f} | {probe.nbytes / (us * 1e-6) / 1e9:.0f} |"
    )
    print(rows[-1], flush=True)
    del w
  print("\n".join(rows))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
