"""Collectives inside the GEMM kernel: rings over the devices of one mesh axis.

`hopper_gemm(all_gather=(axis, size))` multiplies every device's row chunk of A while
the chunks travel around the ring (`GatherRing`); `hopper_gemm(reduce_scatter=(axis,
size))` multiplies the chunk of A whose partial sums the ring is adding up at that
step and sends the running sum on (`ScatterRing`). Both run `size` device steps of one
chunk's tiles each, address their peers with `plgpu.remote_ref` and count arrivals
with one GMEM semaphore per (step, piece): the kernel is then lowered where it is
called, naming the mesh's devices (`compile_once.kernel_entry(mesh_dependent=)`).

A ring's plan holds `ring_axis` and `ring_size`; `split(plan, tile_index)` gives the
device step of a work item and its tile within that step:

>>> import types
>>> plan = types.SimpleNamespace(step_tiles=6)
>>> split(plan, 14)
(2, 2)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jax import lax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp

from pallas_gemm import tile_epilogue
from pallas_gemm.config import tiles

KINDS = ("all_gather", "reduce_scatter")


def split(plan, tile_index):
  """(device step, tile index within the step) of a work item."""
  per_step = plan.step_tiles
  if isinstance(tile_index, int):
    return divmod(tile_index, per_step)
  return lax.div(tile_index, per_step), lax.rem(tile_index, per_step)


def _neighbour(plan, offset):
  """The device `offset` places along the ring axis from this one."""
  here = lax.axis_index(plan.ring_axis)
  return lax.rem(here + plan.ring_size + offset, plan.ring_size)


@dataclasses.dataclass(frozen=True)
class GatherRing:
  """The all-gather of A's row chunks inside the kernel (`hopper_gemm(all_gather=)`).

  Device d's work is `size` device steps of `step_tiles` tiles; at step s it multiplies
  chunk (d + s) % size: its own A at s = 0, else the one device d + 1 forwarded into
  `gathered[s - 1]`. While consumer warpgroup 0 multiplies a tile of the first column,
  it stores each A stage it consumes into device d - 1's `gathered[s]` (remote TMA
  stores), and after the tile signals that device's semaphore `s` once. The producer
  loads a received chunk only once its semaphore has counted every row tile of it.
  """

  plan: Any
  gathered: Any
  semaphores: Any

  @classmethod
  def of(cls, plan, gathered):
    sems = pl.get_global(plgpu.SemaphoreType.REGULAR((plan.ring_size,)))
    return cls(plan, gathered, sems)

  def out_row0(self, device_step):
    """The first output row of this step's chunk: device (d + step) % size's rows."""
    return _neighbour(self.plan, device_step) * self.plan.problem.m

  def wait_for_chunk(self, device_step):
    """Producer: a received chunk is complete once every row tile of it signalled."""

    @pl.when(device_step > 0)
    def _():
      pl.semaphore_wait(self.semaphores.at[device_step - 1], self.plan.m_tiles, decrement=False)

  def fill(self, ring, step, device_step, views, rows_a, cols_a):
    """Producer: `ring.fill` with A from this step's chunk."""
    own = device_step == 0
    pl.when(own)(lambda: ring.fill(step, views))
    received = [self.gathered.at[jnp.maximum(device_step - 1, 0), rows_a, cols_a], *views[1:]]
    pl.when(jnp.logical_not(own))(lambda: ring.fill(step, received))

  def _forwards(self, device_step, ni):
    """Whether this tile's A stages go on to device d - 1 (first column, not the last step)."""
    return (ni == 0) & (device_step < self.plan.ring_size - 1)

  def forwarding(self, operands, wg, device_step, mi, ni):
    """`operands` that first store the stage's A tile into device d - 1's chunk (warpgroup
    0 of first-column tiles), waiting until the store has read it: the ring releases
    the stage after the next step's WGMMAs are issued."""
    cfg = self.plan.config
    remote = plgpu.remote_ref(self.gathered, _neighbour(self.plan, -1))
    forwards = self._forwards(device_step, ni) & (wg == 0)

    def hooked(k, a_tile, *rest):
      @pl.when(forwards)
      def _():
        target = remote.at[
            device_step, pl.ds(mi * cfg.tile_m, cfg.tile_m), pl.ds(k * cfg.tile_k, cfg.tile_k)
        ]
        plgpu.copy_smem_to_gmem(a_tile, target)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

      return operands(k, a_tile, *rest)

    return hooked

  def signal_forwarded(self, wg, device_step, ni):
    """After a forwarding tile's K loop: its stores have landed; count it at device d - 1."""

    @pl.when(self._forwards(device_step, ni) & (wg == 0))
    def _():
      plgpu.wait_smem_to_gmem(0)
      pl.semaphore_signal(self.semaphores.at[device_step], 1, device_id=_neighbour(self.plan, -1))


@dataclasses.dataclass(frozen=True)
class ScatterRing:
  """The reduce-scatter of the output's row chunks inside the kernel
  (`hopper_gemm(reduce_scatter=)`).

  A holds `size` row chunks (M rows each); the sum over devices of chunk c's product
  belongs to device c. At device step s, device d multiplies chunk (d + s + 1) % size;
  from s = 1 on it adds the running sum device d + 1 sent for that chunk at step s - 1
  (`received[s - 1]`, in the output dtype, once the warpgroup tile's semaphore is set).
  Before the last step it stores the sum into device d - 1's `received[s]` (the
  epilogue's SMEM chunks and TMA stores to peer memory) and sets that device's
  semaphore of the tile; at the last step the chunk is d's own, and the sum goes
  through the epilogue to the (M, N) output.
  """

  plan: Any
  received: Any
  semaphores: Any

  @classmethod
  def of(cls, plan, received):
    count = (plan.ring_size - 1) * cls.pieces(plan)
    return cls(plan, received, pl.get_global(plgpu.SemaphoreType.REGULAR((count,))))

  @staticmethod
  def pieces(plan) -> int:
    """Warpgroup tiles of one chunk: one semaphore each per step."""
    wm, wn = plan.config.wg_tile
    return tiles(plan.problem.m, wm) * tiles(plan.problem.n, wn)

  @staticmethod
  def received_shape(plan) -> tuple[int, int, int]:
    """The running sums received, (size - 1, M, N), in the output dtype."""
    return (plan.ring_size - 1, plan.problem.m, plan.problem.n)

  def a_row0(self, device_step):
    """The first row of A this step multiplies: chunk (d + step + 1) % size's."""
    return _neighbour(self.plan, device_step + 1) * self.plan.problem.m

  def _semaphore(self, device_step, row0, col0):
    wm, wn = self.plan.config.wg_tile
    piece = lax.div(row0, wm) * tiles(self.plan.problem.n, wn) + lax.div(col0, wn)
    return self.semaphores.at[device_step * self.pieces(self.plan) + piece]

  def wait(self, device_step, row0, col0):
    """The running sum of this warpgroup tile from device d + 1 has landed (step > 0)."""

    @pl.when(device_step > 0)
    def _():
      pl.semaphore_wait(self._semaphore(device_step - 1, row0, col0), 1)

  def partials(self, device_step, row0, col0):
    """This warpgroup tile's running sum received, for the epilogue (`Partials`: none at
    step 0)."""
    wm, wn = self.plan.config.wg_tile
    slot = jnp.maximum(device_step - 1, 0)
    tile = self.received.at[slot, pl.ds(row0, wm), pl.ds(col0, wn)]
    return tile_epilogue.Partials((device_step > 0).astype(jnp.int32), lambda c: tile)

  def send(self, result, device_step, row0, col0, store_only):
    """Before the last step: result plus the running sum received, stored into device
    d - 1's `received[step]` by `store_only(out_gmem)`'s epilogue, then signalled."""
    self.wait(device_step, row0, col0)
    previous = _neighbour(self.plan, -1)
    target = plgpu.remote_ref(self.received, previous).at[device_step]
    partials = self.partials(device_step, row0, col0)
    store_only(target).run(result, 0, row0, col0, None, partials)
    plgpu.wait_smem_to_gmem(0)  # landed in device d - 1's memory
    pl.semaphore_signal(self._semaphore(device_step, row0, col0), 1, device_id=previous)


def check(kind, ring, problem, config, epilogue, interpret, *extras):
  """What `hopper_gemm(all_gather= / reduce_scatter=)` takes (its docstring), else a
  ValueError naming the argument and the rules it breaks."""
  if ring is None:
    return
  _, size = ring
  rules = {
      "a schedule 'cooperative'": config.schedule == "cooperative",
      "whole row tiles (M a multiple of tile_m)": problem.m % config.tile_m == 0,
      "whole K tiles": problem.k % config.tile_k == 0,
      "no split-K, stream-K or cluster": (
          config.k_splits(problem)[0] == 1 and not config.stream_k and config.cluster_size == 1
      ),
      "no batch, transposed A, gated or block-scaled problem": (
          problem.batch == 1
          and not problem.transpose_a
          and not epilogue.gated
          and not problem.block_scaled
          and not problem.amax
          and not problem.row_lse
      ),
      "no c, row bias, residual, runtime scales or up weights": all(x is None for x in extras),
      "2 devices or more": isinstance(size, int) and size >= 2,
      "the kernel on hardware (remote stores have no interpreter)": interpret is None,
  }
  broken = [rule for rule, ok in rules.items() if not ok]
  if broken:
    raise ValueError(f"{kind}={ring!r} needs {'; '.join(broken)}")
