"""How the dense kernel's consumer warpgroups share a CTA's work: its schedules.

  cooperative  both consumers work on every tile, each on one half of it: rows
               (`GemmConfig.wg_split="m"`, each its own A rows) or columns ("n", each its
               own B columns); they run its K loop and epilogue together.
  pingpong     each consumer owns whole tiles, the two alternating: while one runs its
               tile's epilogue the other runs the next tile's K loop, passing over the
               ring stages that are not its own (`Ring.skip`).

A schedule says where a warpgroup's accumulator sits in the tile (`origin`), which part
of a ring stage its WGMMAs read (`a_view`, `b_view`), and runs the consumer loop
(`consume`, given the warpgroup's index `wg`). The work decomposition across CTAs (whole tiles, stream-K, split-K slices)
is the kernel's `for_each_unit`; a schedule takes it as given.

>>> from pallas_gemm.config import GemmConfig
>>> coop = of(GemmConfig(tile_m=128, tile_n=256, wg_split="n"))
>>> coop.origin(mi=2, ni=1, wg=1)   # tile (2, 1); warpgroup 1 holds its right half
(256, 384)
>>> of(GemmConfig(tile_m=64, tile_n=256, schedule="pingpong", stages=4)).origin(mi=2, ni=1, wg=1)
(128, 256)
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from jax import lax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp

from pallas_gemm import pipeline
from pallas_gemm.config import GemmConfig


@dataclasses.dataclass(frozen=True)
class Cooperative:
  """Both consumers on every tile, split along `config.wg_split`."""

  config: GemmConfig

  def _offset(self, wg, axis: str):
    """This warpgroup's offset along `axis` ("m" or "n") within the tile (0 if not split)."""
    wm, wn = self.config.wg_tile
    if self.config.wg_split != axis:
      return 0
    return wg * (wm if axis == "m" else wn)

  def origin(self, mi, ni, wg):
    """(row, col) of this warpgroup's accumulator in the output, for tile (mi, ni)."""
    tm, tn = self.config.tile_m, self.config.tile_n
    if self.config.wg_split == "m":
      return mi * tm + self._offset(wg, "m"), ni * tn
    return mi * tm, ni * tn + self._offset(wg, "n")

  def scale_rows(self, wg):
    """The first row of this warpgroup's rows within the tile (per-row operands)."""
    return self._offset(wg, "m")

  def scale_cols(self, wg):
    """The first column of this warpgroup's columns within the tile."""
    return self._offset(wg, "n")

  def a_view(self, a_tile, wg):
    """This warpgroup's rows of a stage's (untransposed) A tile."""
    if self.config.wg_split != "m":
      return a_tile
    wm = self.config.wg_tile[0]
    return a_tile.at[pl.ds(wg * wm, wm), :]

  def b_view(self, b_tile, wg, transpose_b: bool):
    """This warpgroup's columns of a stage's B tile (stored (N, K) with `transpose_b`)."""
    if self.config.wg_split != "n":
      return b_tile
    wn = self.config.wg_tile[1]
    if transpose_b:
      return b_tile.at[pl.ds(wg * wn, wn), :]
    return b_tile.at[:, pl.ds(wg * wn, wn)]

  def consume(self, compute_unit: Callable, for_each_unit: Callable, ring, plan, wg) -> None:
    """Both consumers run every unit of this CTA's work."""
    del ring, plan, wg
    for_each_unit(compute_unit)
    plgpu.wait_smem_to_gmem(0)


@dataclasses.dataclass(frozen=True)
class Pingpong:
  """Each consumer owns whole tiles, alternating (whole tiles only: no stream-K)."""

  config: GemmConfig

  def origin(self, mi, ni, wg):
    """(row, col) of tile (mi, ni): a warpgroup's accumulator is the whole tile."""
    del wg
    return mi * self.config.tile_m, ni * self.config.tile_n

  def scale_rows(self, wg):
    """0: a warpgroup's rows are the tile's."""
    del wg
    return 0

  def scale_cols(self, wg):
    """0: a warpgroup's columns are the tile's."""
    del wg
    return 0

  def a_view(self, a_tile, wg):
    """The whole A tile."""
    del wg
    return a_tile

  def b_view(self, b_tile, wg, transpose_b: bool):
    """The whole B tile."""
    del wg, transpose_b
    return b_tile

  def consume(self, compute_unit: Callable, for_each_unit: Callable, ring, plan, wg) -> None:
    """Warpgroups take turns; each passes over the other's stages (`Ring.skip`) after
    its own tile's epilogue, which so overlaps the other's main loop. Both consumers
    wait on and release every stage, as the ring requires."""
    del for_each_unit

    def alternate(index, local_index, step0):
      mine = lax.rem(local_index, 2) == wg
      pl.when(mine)(lambda: compute_unit(step0, index, 0, plan.k_iters))
      pl.when(jnp.logical_not(mine))(lambda: ring.skip(step0, plan.k_iters))

    pipeline.persistent_loop(plan.num_tiles, alternate, steps_of=plan.k_iters, workers=plan.workers)
    plgpu.wait_smem_to_gmem(0)


def of(config: GemmConfig) -> Cooperative | Pingpong:
  """The schedule object of `config.schedule`."""
  return {"cooperative": Cooperative, "pingpong": Pingpong}[config.schedule](config)
