"""Stream-K: the partial last wave of output tiles, spread evenly over the K steps.

A persistent grid of G workers (CTAs, or 2-CTA clusters) running T output tiles
of `k_iters` K steps each idles in its last wave unless G divides T: at 8192^3
with 128x256 tiles, 2048 tiles on 132 SMs are 15.5 waves run in 16. Here the
first `sk_tiles` tiles (in raster order) are cut at K-step granularity into G
contiguous ranges of equal length, one per worker, and the other tiles (a
multiple of G) stay whole, data-parallel, after them.

A worker's range may start inside a tile and end inside a later one. The worker
that runs a tile's first K step owns the tile ("finisher"); every other worker
on that tile ("contributor") covers its end part, which is the *first* segment
of that worker's range. So a worker contributes to at most one tile, storing
its f32 partial in its own workspace slot and signalling its own semaphore, and
it does so before anything else: a finisher only ever waits on work that never
waits, and with every worker resident (a persistent grid) nothing deadlocks.

>>> s = Schedule.plan(tiles=10, workers=4, k_iters=8)
>>> s.sk_tiles, [s.range_of(w) for w in range(4)]    # 2 tiles over 4 workers...
(6, [(0, 12), (12, 12), (24, 12), (36, 12)])
>>> s.dp_tiles_per_worker                              # ...then one whole tile each
1
>>> s.owner(8 * 1), s.max_contributors                 # tile 1 starts in worker 0's range
(0, 1)
"""

from __future__ import annotations

import dataclasses

import jax.experimental.pallas as pl
import jax.numpy as jnp
from jax import lax


@dataclasses.dataclass(frozen=True)
class Schedule:
  """Which K steps of which tiles each of `workers` workers runs (all static ints)."""

  tiles: int
  workers: int
  k_iters: int
  sk_tiles: int
  """The first `sk_tiles` tiles are split over all workers; the rest are whole."""

  @classmethod
  def plan(cls, tiles: int, workers: int, k_iters: int) -> "Schedule":
    """The remainder wave plus one full wave (when there is one) go stream-K.

    Splitting one full wave more than the remainder keeps each worker's range
    at least one tile long, so that a tile has at most a couple of contributors.
    """
    waves, rest = divmod(tiles, workers)
    sk = 0 if rest == 0 else rest + workers * min(waves, 1)
    return cls(tiles, workers, k_iters, sk)

  @property
  def enabled(self) -> bool:
    return self.sk_tiles > 0

  @property
  def sk_steps(self) -> int:
    return self.sk_tiles * self.k_iters

  @property
  def dp_tiles_per_worker(self) -> int:
    return (self.tiles - self.sk_tiles) // self.workers

  def range_of(self, worker):
    """(first step, number of steps) of `worker`'s stream-K range; ints or traced."""
    q, r = divmod(self.sk_steps, self.workers)
    if isinstance(worker, int):
      return worker * q + min(worker, r), q + int(worker < r)
    return worker * q + jnp.minimum(worker, r), q + (worker < r).astype(jnp.int32)

  def owner(self, step):
    """The worker whose range holds stream-K step `step`; ints or traced."""
    q, r = divmod(self.sk_steps, self.workers)
    head = r * (q + 1)  # the first r workers run q + 1 steps
    if q == 0:  # one step each for the first r workers, none for the rest
      return step
    if isinstance(step, int):
      return step // (q + 1) if step < head else r + (step - head) // q
    return jnp.where(step < head, lax.div(step, q + 1), r + lax.div(jnp.maximum(step - head, 0), q))

  @property
  def max_contributors(self) -> int:
    """Most workers other than its finisher that one stream-K tile has."""
    if not self.enabled:
      return 0
    return max(
        int(self.owner((t + 1) * self.k_iters - 1)) - int(self.owner(t * self.k_iters))
        for t in range(self.sk_tiles)
    )

  @property
  def slots(self) -> int:
    """Workspace slots for the contributors' partial sums: one per worker (any may
    contribute)."""
    return self.workers

  def slot(self, worker):
    """The workspace slot of contributor `worker` (ints or traced): its own."""
    return worker

  def for_each_unit(self, visit, worker):
    """Inside the kernel: visit(step0, tile_index, kb, ke) for each unit of `worker`'s
    work (its range of the stream-K tiles' K steps, then its whole tiles), in order; a
    unit is K steps [kb, ke) of one tile, step0 its first ring step. Returns the steps."""
    kt = self.k_iters
    start, length = self.range_of(worker)
    first = lax.div(start, kt)
    end = jnp.where(length > 0, lax.div(start + length + kt - 1, kt), first)

    @pl.loop(first, end)
    def _(tile_index):
      kb = jnp.maximum(start - tile_index * kt, 0)
      ke = jnp.minimum(start + length - tile_index * kt, kt)
      visit(tile_index * kt + kb - start, tile_index, kb, ke)

    @pl.loop(0, self.dp_tiles_per_worker)
    def _(i):
      visit(length + i * kt, self.sk_tiles + worker + i * self.workers, 0, kt)

    return length + self.dp_tiles_per_worker * kt

  def segments(self, worker: int) -> list[tuple[int, int, int]]:
    """(tile, first k, end k) of every stream-K segment of `worker`, in order (ints)."""
    start, length = (int(x) for x in self.range_of(worker))
    out = []
    for tile in range(start // self.k_iters, -(-(start + length) // self.k_iters)):
      kb = max(start - tile * self.k_iters, 0)
      ke = min(start + length - tile * self.k_iters, self.k_iters)
      out.append((tile, kb, ke))
    return out


MIN_SLICE_STEPS = 12
"""`TailSplit`'s shortest K slice. Measured on the H200 (NOTES exp. 125): blockwise fp8
slices of 11.6 K blocks gained 1.14x, of 5-8 lost (0.80-0.995x); bf16 slices of 10.7-56
steps of 64 gained 1.003-1.27x."""


@dataclasses.dataclass(frozen=True)
class TailSplit:
  """The whole waves first, then the partial last wave's tiles cut into equal K slices.

  With T tiles on G workers, the T // G whole waves run as usual; each of the R = T % G
  remaining tiles is then cut into S equal slices of K steps, run side by side by R * S
  workers, so the tail takes ~1/S of a tile instead of a whole one. Tile t's slices go
  to workers t * S ... t * S + S - 1; the first (it runs K step 0) finishes the tile,
  the others contribute. Unlike `Schedule`'s balanced ranges, the whole tiles walk K in
  step (sharing operands in L2) and the slices start together at S offsets; a
  contributor never waits, so the order is safe.
  A slice has at least `min_steps` K steps (`MIN_SLICE_STEPS`: shorter slices lost on
  the H200, their fixed costs and the finisher's partial reads no longer amortized), so
  S = min(G // R, k_iters // min_steps); S < 2 leaves `enabled` False and every tile
  runs whole.

  >>> s = TailSplit.plan(tiles=10, workers=4, k_iters=8, min_steps=1)  # 2 waves + 2 tiles
  >>> s.slices, s.dp_tiles_per_worker, [s.slice_of(w) for w in range(4)]
  (2, 2, [(8, 0, 4), (8, 4, 8), (9, 0, 4), (9, 4, 8)])
  >>> s.owner(9 * 8 + 7), s.max_contributors   # tile 9's last step: worker 3
  (3, 1)
  >>> TailSplit.plan(tiles=136, workers=132, k_iters=56).slices   # not 33 slices of 1-2
  4
  >>> s.slots, [s.slot(w) for w in (1, 3)]   # contributors 1 and 3 (tiles 8 and 9)
  (2, [0, 1])
  """

  tiles: int
  workers: int
  k_iters: int
  min_steps: int = MIN_SLICE_STEPS

  @classmethod
  def plan(
      cls, tiles: int, workers: int, k_iters: int, min_steps: int = MIN_SLICE_STEPS
  ) -> "TailSplit":
    return cls(tiles, workers, k_iters, min_steps)

  @property
  def dp_tiles_per_worker(self) -> int:
    return self.tiles // self.workers

  @property
  def tail_tiles(self) -> int:
    return self.tiles % self.workers

  @property
  def slices(self) -> int:
    """K slices per tail tile (0 without a tail)."""
    if not self.tail_tiles:
      return 0
    return min(self.workers // self.tail_tiles, self.k_iters // self.min_steps)

  @property
  def enabled(self) -> bool:
    return self.slices >= 2

  @property
  def max_contributors(self) -> int:
    return self.slices - 1 if self.enabled else 0

  @property
  def slots(self) -> int:
    """Workspace slots for the contributors' partial sums: one per slice after the first
    of each tail tile, R * (S - 1), not one per worker (NOTES exp. 140)."""
    return self.tail_tiles * max(self.slices - 1, 0)

  def slot(self, worker):
    """Contributor `worker`'s workspace slot (ints or traced): tile t's slices c = 1 ..
    S - 1 take t * (S - 1) + c - 1. Clamped into range for a worker that contributes
    nothing (the kernel forms slot indices it never uses)."""
    s = self.slices
    if isinstance(worker, int):
      t, c = divmod(worker, s)
      return min(max(t * (s - 1) + c - 1, 0), self.slots - 1)
    t, c = lax.div(worker, s), lax.rem(worker, s)
    return jnp.clip(t * (s - 1) + c - 1, 0, self.slots - 1)

  def _bound(self, c):
    """First K step of slice c (ints or traced): c * k_iters // slices."""
    return (
        c * self.k_iters // self.slices
        if isinstance(c, int)
        else lax.div(c * self.k_iters, self.slices)
    )

  def slice_of(self, worker: int) -> tuple[int, int, int] | None:
    """(tile, first k, end k) of `worker`'s tail slice, or None (ints)."""
    if worker >= self.tail_tiles * self.slices:
      return None
    t, c = divmod(worker, self.slices)
    return self.dp_tiles_per_worker * self.workers + t, self._bound(c), self._bound(c + 1)

  def owner(self, step):
    """The worker that runs K step `step` (tile * k_iters + k) of a tail tile; traced ok."""
    kt, s = self.k_iters, self.slices
    div = (lambda a, b: a // b) if isinstance(step, int) else lax.div
    tile = div(step, kt)
    k = step - tile * kt
    first = self.dp_tiles_per_worker * self.workers
    return (tile - first) * s + div((k + 1) * s - 1, kt)  # k's slice: ceil((k+1)S/kt) - 1

  def units(self, worker):
    """How many units `worker` runs: its whole tiles, then its tail slice if it has one
    (ints or traced)."""
    has_slice = worker < self.tail_tiles * self.slices
    if isinstance(worker, int):
      return self.dp_tiles_per_worker + int(has_slice)
    return self.dp_tiles_per_worker + has_slice.astype(jnp.int32)

  def unit(self, worker, i):
    """(tile, first k, end k) of `worker`'s unit i < `units(worker)` (ints or traced): a
    whole tile before `dp_tiles_per_worker`, then the tail slice.

    >>> s = TailSplit.plan(tiles=10, workers=4, k_iters=8, min_steps=1)
    >>> [s.unit(1, i) for i in range(s.units(1))]
    [(1, 0, 8), (5, 0, 8), (8, 4, 8)]
    """
    kt, dp = self.k_iters, self.dp_tiles_per_worker
    if isinstance(worker, int) and isinstance(i, int):
      if i < dp:
        return worker + i * self.workers, 0, kt
      return self.slice_of(worker)
    t, c = lax.div(worker, self.slices), lax.rem(worker, self.slices)
    tail = i == dp
    tile = jnp.where(tail, dp * self.workers + t, worker + i * self.workers)
    return tile, jnp.where(tail, self._bound(c), 0), jnp.where(tail, self._bound(c + 1), kt)

  def for_each_unit(self, visit, worker):
    """Inside the kernel: visit(step0, tile_index, kb, ke) for each of `worker`'s
    `units`, all from one call site (traced kb, ke): a second copy of the unit's code
    for the tail slice made ptxas spill the accumulator and serialize every WGMMA of the
    kernel at some tile widths, 4-5x slower (NOTES exp. 149). Returns the step count."""
    kt = self.k_iters

    @pl.loop(0, self.units(worker))
    def _(i):
      visit(i * kt, *self.unit(worker, i))

    dp = self.dp_tiles_per_worker
    _, kb, ke = self.unit(worker, dp)  # the tail slice, counted where the worker has one
    return dp * kt + jnp.where(self.units(worker) > dp, ke - kb, 0)
