"""The warp-specialized pipeline that every kernel of the package is built from.

A kernel here is one persistent CTA (or cluster) per SM with three warpgroups:
a producer that streams operand tiles with TMA into a ring of SMEM stages, and
two consumers that run WGMMA on them and the epilogue. What differs between
kernels (the work decomposition, how a stage is turned into WGMMA operands, the
epilogue) is passed in as functions; this module owns what is the same:

  - `Ring`: the SMEM stages, their `loaded` / `consumed` barriers and the step
    counter that runs on across work items (slot = step % stages, which the
    consumers' K loops take once and then carry: `first_slot`, `next`): `fill`
    (producer), `mma` (consumer K loop, one WGMMA group in flight),
    `mma_register_operand` (the same for a register operand converted from the
    stage, the next convert overlapping this step's WGMMA), `mma_warp` (warp-level
    MMA on register operands), `mma_promoted` (a fresh accumulator per step, scaled
    into a register sum), `skip`
    (a consumer that lets a stage pass), `drain` (the producer's last waits).
  - `persistent_loop`: this CTA's share of a work list, carrying the ring step.
  - `warp_specialized`: the role split with its register budget (`setmaxnreg`).
  - `launch`: the `plgpu.kernel` call with the grid, threads and names above.
  - `StoreSlots`: double-buffered SMEM slots of the TMA epilogue stores.

A ring stage may need work between TMA and WGMMA (masking rows, dequantizing a
narrow operand): `Ring.mma`'s `operands` function runs after the stage is
loaded and before its WGMMA, and may rewrite the stage in SMEM (then
`plgpu.commit_smem()`) before returning the views to multiply.

>>> import jax.numpy as jnp
>>> alloc = ring_scratch(4, [((128, 64), jnp.bfloat16, ()), ((64, 256), jnp.bfloat16, ())])
>>> sorted(alloc), len(alloc["buffers"])
(['buffers', 'consumed', 'loaded'], 2)
>>> StoreSlots(slots=2).in_flight(chunks_per_tile=8), StoreSlots(slots=2).in_flight(3)
(1, 0)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
from jax import lax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp

from pallas_gemm import block_mma
from pallas_gemm import _compat
from pallas_gemm import kernel_trace
from pallas_gemm import smem as smem_lib

MEMORY_REGISTERS = 40
"""Registers per thread left to the producer warpgroup (setmaxnreg)."""


CONSUMERS = 2
"""Consumer warpgroups per CTA; warpgroup `CONSUMERS` is the producer."""


def ring_scratch(
    stages: int, buffers: Sequence[tuple], *, cluster: bool = False, consumers: int = CONSUMERS
) -> dict:
  """`pl.run_scoped` allocations of a `Ring`: one SMEM array per operand, each
  (stages, *tile), and the two barrier arrays.

  Args:
    stages: ring depth.
    buffers: (tile_shape, dtype, transforms) per operand copied into each stage, or
      (tile_shape, dtype, transforms, copy_transforms): the TMA copies then go through
      a second view of the same bytes (`smem.tile_buffer`; rows not in groups of 8).
    consumers: the consumer warpgroups that release each stage.
    cluster: the stages are shared with the other CTAs of a cluster (TMA
      multicast): `consumed` is a cluster barrier, so that a CTA refills a slot
      only once every CTA that reads the multicast copy has released it.
  """
  smem = tuple(
      smem_lib.tile_buffer((stages, *shape), dtype, *spec) for shape, dtype, *spec in buffers
  )
  if cluster:
    consumed = plgpu.ClusterBarrier(
        collective_axes=("cluster",), num_arrivals=consumers, num_barriers=stages
    )
  else:
    consumed = plgpu.Barrier(num_arrivals=consumers, num_barriers=stages)
  return dict(
      buffers=smem,
      loaded=plgpu.Barrier(num_arrivals=len(buffers), num_barriers=stages),
      consumed=consumed,
  )


@dataclasses.dataclass(frozen=True)
class OneOf:
  """A ring buffer's source picked at run time: `(condition, GMEM view)` pairs of which
  exactly one condition holds, e.g. the array that holds a step's K columns when an
  operand comes in pieces (`GemmProblem.a_splits`). Each view is one copy of the same
  box, so the slot's barrier expects the same bytes whichever one runs.

  >>> [c for c, _ in OneOf.choices_of("view")]  # a plain view: one unconditional copy
  [True]
  """

  choices: tuple

  @staticmethod
  def choices_of(source) -> tuple:
    """`source`'s (condition, view) pairs: its choices, or (True, source) for a view."""
    return source.choices if isinstance(source, OneOf) else ((True, source),)


@dataclasses.dataclass(frozen=True)
class Ring:
  """A ring of SMEM stages between one TMA producer and `CONSUMERS` WGMMA consumers.

  Steps are counted across work items; step s uses slot s % stages. The
  producer waits for `consumed[slot]` before it refills a slot it used before;
  every consumer waits for `loaded[slot]` and arrives on `consumed[slot]` once
  its WGMMA has read the stage. Every phase of every barrier is waited on by
  every thread that waits on it (Pallas tracks barrier phases per thread).
  `buffers` are the views WGMMA reads, `copies` those TMA writes (the same refs
  unless a buffer has two views, `smem.tile_buffer`).
  """

  buffers: tuple
  loaded: Any
  consumed: Any
  stages: int
  copies: tuple

  @classmethod
  def of(cls, scratch: dict) -> "Ring":
    """The ring over the refs that `ring_scratch`'s allocations became."""
    views = [smem_lib.copy_and_register_views(ref) for ref in scratch["buffers"]]
    buffers = tuple(register for _, register in views)
    return cls(
        buffers,
        scratch["loaded"],
        scratch["consumed"],
        buffers[0].shape[0],
        tuple(copy for copy, _ in views),
    )

  def slot(self, step):
    return lax.rem(step, self.stages)

  def first_slot(self, step0):
    """`slot(step0)` as an int32 to carry through a K loop: consumers step their slot with
    `next` rather than taking `step % stages` at every step, which Mosaic's 64-bit indices
    make a 64-bit division (4.4% of a blockwise fp8 GEMM, NOTES exp. 119)."""
    return jnp.asarray(self.slot(step0), jnp.int32)

  def next(self, slot):
    """The slot after `slot`.

    >>> ring = Ring(buffers=(), loaded=None, consumed=None, stages=3, copies=())
    >>> [int(ring.next(s)) for s in range(3)], [int(ring.previous(s)) for s in range(3)]
    ([1, 2, 0], [2, 0, 1])
    """
    return jnp.where(slot == self.stages - 1, 0, slot + 1)

  def previous(self, slot):
    """The slot before `slot`."""
    return jnp.where(slot == 0, self.stages - 1, slot - 1)

  def wait_loaded(self, slot) -> None:
    """Consumer: waits until `slot`'s TMA copies have landed (the "ring_wait" region
    of a `kernel_trace`: a consumer that spends its time here is starved by memory)."""
    with jax.named_scope("ring_wait"):
      plgpu.barrier_wait(self.loaded.at[slot])

  def stage(self, slot) -> tuple:
    """The views of every buffer at `slot`."""
    return tuple(buffer.at[slot] for buffer in self.buffers)

  def fill(self, step, sources: Sequence, collective: Sequence = ()) -> None:
    """Producer: TMA-copies `sources[i]` (GMEM views, or a `OneOf` of them) into buffer
    i of `step`'s slot, once the slot's previous contents are released. `collective[i]`:
    the cluster axes that share buffer i's copy (multicast), or None."""
    slot = self.slot(step)

    @pl.when(step >= self.stages)
    def _():
      with jax.named_scope("slot_wait"):
        plgpu.barrier_wait(self.consumed.at[slot])

    collective = tuple(collective) or (None,) * len(sources)
    with jax.named_scope("tma_issue"):
      for source, buffer, axes in zip(sources, self.copies, collective, strict=True):
        for condition, view in OneOf.choices_of(source):
          copy = lambda view=view, buffer=buffer, axes=axes: plgpu.copy_gmem_to_smem(
              view, buffer.at[slot], self.loaded.at[slot], collective_axes=axes
          )
          _when(condition, copy)

  def drain(self, steps) -> None:
    """Producer, after its last `fill`: waits until the last stages are released, so
    that no peer CTA arrives on (or multicasts into) this CTA's SMEM after it exits."""

    @pl.loop(jnp.maximum(steps - self.stages, 0), steps)
    def _(step):
      plgpu.barrier_wait(self.consumed.at[self.slot(step)])

  def mma(self, acc, step0, k_begin, k_end, operands: Callable, *, overlap: bool = True) -> None:
    """Consumer: `acc += a @ b` over K steps [k_begin, k_end) (ring steps from step0).

    `operands(k, *stage_views)` returns the (a, b) WGMMA views of a loaded
    stage; with a tuple of accumulators, one (a, b) pair per accumulator (a
    gated GEMM's gate and up halves). One stage's WGMMA groups stay in flight; a
    stage is released once the next one's WGMMAs are issued and its own have
    completed, the last after the loop. Bounds may be Python ints or traced
    scalars (an empty range consumes nothing).

    `overlap=False` waits for each step's WGMMAs before the next step, for a register
    operand `a`: the next step's convert must not write registers an in-flight WGMMA
    reads (`mma_register_operand` overlaps them safely).
    """
    if not overlap:
      self._mma_serial(acc, step0, k_begin, k_end, operands)
      return
    accs = acc if isinstance(acc, tuple) else (acc,)

    def step(k, slot):
      self.wait_loaded(slot)
      pairs = operands(k, *self.stage(slot))
      for acc_ref, pair in zip(accs, pairs if isinstance(acc, tuple) else (pairs,), strict=True):
        plgpu.wgmma(acc_ref, *pair)
      with jax.named_scope("wgmma_wait"):
        plgpu.wgmma_wait(len(accs))  # the previous stage's WGMMAs are done: release it

      @pl.when(k > k_begin)
      def _():
        plgpu.barrier_arrive(self.consumed.at[self.previous(slot)])

      return self.next(slot)

    slot = lax.fori_loop(k_begin, k_end, step, self.first_slot(step0))

    def release_last():
      plgpu.wgmma_wait(0)
      plgpu.barrier_arrive(self.consumed.at[self.previous(slot)])

    _when(k_end > k_begin, release_last)

  def _mma_serial(self, acc, step0, k_begin, k_end, operands: Callable) -> None:
    def step(k, slot):
      self.wait_loaded(slot)
      plgpu.wgmma(acc, *operands(k, *self.stage(slot)))
      with jax.named_scope("wgmma_wait"):
        plgpu.wgmma_wait(0)
      plgpu.barrier_arrive(self.consumed.at[slot])
      return self.next(slot)

    lax.fori_loop(k_begin, k_end, step, self.first_slot(step0))

  def mma_register_operand(
      self, acc, step0, k_begin, k_end, convert: Callable, smem_operand: Callable
  ) -> None:
    """Consumer: `acc += a @ b` over K steps [k_begin, k_end) (Python ints, or traced
    scalars of a range that is not empty: a stream-K unit), where
    `a = convert(k, *stage_views)` is a register operand made from the stage (a
    mixed-type GEMM's dequantized weights) and `b = smem_operand(k, *stage_views)`.

    Each step's WGMMA is issued behind the previous one's, and the next step converts
    while both run; waiting for all but the newest WGMMA then retires the previous step
    and releases its stage. The steps alternate between two register operands (the
    loop is unrolled by two, so that each is its own register in the program): a
    convert only ever writes registers whose last WGMMA has retired. Written the
    obvious way, with one operand carried through the loop, the convert writes the
    registers an in-flight WGMMA reads, and ptxas serializes every WGMMA of the kernel
    (its warning C7513; NOTES exp. 88).
    """

    def ready(k, slot):
      self.wait_loaded(slot)
      return convert(k, *self.stage(slot))

    def issue(k, slot, a):
      """Step k's WGMMA behind the previous step's; then that one retires."""
      plgpu.wgmma(acc, a, smem_operand(k, *self.stage(slot)))
      with jax.named_scope("wgmma_wait"):
        plgpu.wgmma_wait(1)

      def release_previous():
        plgpu.barrier_arrive(self.consumed.at[self.previous(slot)])

      _when(k > k_begin, release_previous)

    def pair(i, carry):
      a_even, slot = carry
      k = k_begin + 2 * i
      issue(k, slot, a_even)
      odd = self.next(slot)
      issue(k + 1, odd, ready(k + 1, odd))
      even = self.next(odd)
      return ready(k + 2, even), even

    count = k_end - k_begin
    pairs = _halve(count - 1)  # each followed by at least one step to convert
    slot = self.first_slot(step0)
    a, slot = lax.fori_loop(0, pairs, pair, (ready(k_begin, slot), slot))
    k = k_begin + 2 * pairs
    issue(k, slot, a)
    odd = self.next(slot)
    _when(count - 2 * pairs == 2, lambda: issue(k + 1, odd, ready(k + 1, odd)))
    plgpu.wgmma_wait(0)
    plgpu.barrier_arrive(self.consumed.at[self.slot(step0 + count - 1)])

  def mma_warp(self, acc, step0, k_begin, k_end, operands: Callable):
    """Consumer: `acc + sum of a @ b` over K steps [k_begin, k_end) with warp-level MMA
    (`plgpu.mma`: synchronous m16n8k16 per warp, no WGMMA pipeline), `operands(k,
    *stage_views)` returning register arrays (a, b). Each stage is released as soon as
    its operands are in registers. Returns the f32 sum (`acc` is its start value)."""

    def step(k, carry):
      total, slot = carry
      self.wait_loaded(slot)
      a, b = operands(k, *self.stage(slot))
      plgpu.barrier_arrive(self.consumed.at[slot])
      return plgpu.mma(total, a, b), self.next(slot)

    return lax.fori_loop(k_begin, k_end, step, (acc, self.first_slot(step0)))[0]

  def mma_promoted(
      self,
      shape,
      step0,
      k_begin,
      k_end,
      operands: Callable,
      scale: Callable,
      depth: int = 2,
      block_operands: Callable | None = None,
      transforms: tuple = (),
  ):
    """Consumer: sum over K steps [k_begin, k_end) of `scale(k, *views) * (a @ b)`, each
    step's product in a fresh f32 WGMMA accumulator promoted into a register sum (the
    per-K-block dequantization of blockwise-scaled fp8: DeepGEMM's and CUTLASS's
    promotion, which also keeps fp8 WGMMA's reduced-precision accumulation to one block).

    `operands` as in `mma`; `scale(k, *stage_views)` returns the multiplier of step k's
    (`shape`) product, read before the stage is released. `depth` 2 issues the WGMMAs
    of two steps before scaling the first, so that the second runs on the tensor cores
    while the first is scaled; 1 is serial. With `block_operands(k, *stage_views)`
    (K-major A and B views, their SMEM `transforms`) the steps go through `block_mma`,
    whose first WGMMA of a step overwrites fresh registers: no accumulator is zeroed
    (hardware only; 10-16% faster on the H200, NOTES exp. 110). Bounds are Python ints
    or traced scalars. Returns the f32 sum.
    """

    def issue(k, acc):
      slot = self.slot(step0 + k - k_begin)
      self.wait_loaded(slot)
      views = self.stage(slot)
      a, b = operands(k, *views)
      with jax.named_scope("wgmma_issue"):
        plgpu.wgmma(acc, a, b)
      return slot, views

    def promote(k, acc, slot, views, total, in_flight):
      with jax.named_scope("wgmma_wait"):
        part = plgpu.wgmma_accumulator_load(acc, wait_n=in_flight)  # this step's WGMMA done
      with jax.named_scope("promote"):
        factor = scale(k, *views)
        plgpu.barrier_arrive(self.consumed.at[slot])
        return total + part * factor

    def zeroed_steps(k, total, count):
      """`count` (1 or 2) steps from k, their accumulators zeroed by the scope."""

      def scoped(*accs):
        issued = [issue(k + i, acc) for i, acc in enumerate(accs)]
        out = total
        for i, (acc, (slot, views)) in enumerate(zip(accs, issued)):
          out = promote(k + i, acc, slot, views, out, in_flight=count - 1 - i)
        return out

      return pl.run_scoped(scoped, *[plgpu.ACC(shape, jnp.float32)] * count)

    def fresh_steps(k, carry, count):
      """`count` (1 or 2) steps from k through `block_mma`: all issued, then each
      waited for, its stage released at once (its scales were read before the
      issue) and its product scaled into the sum while the next one runs. The slot
      rides in the loop's carry (`first_slot`)."""
      total, slot = carry
      slots, pairs, factors = [], [], []
      for i in range(count):
        self.wait_loaded(slot)
        views = self.stage(slot)
        pairs.append(block_operands(k + i, *views))
        factors.append(scale(k + i, *views))
        slots.append(slot)
        slot = self.next(slot)
      with jax.named_scope("wgmma_issue"):
        products = block_mma.issue(pairs, transforms)
      for i, (product, slot_i, factor) in enumerate(zip(products, slots, factors)):
        with jax.named_scope("wgmma_wait"):
          product = block_mma.wait(product, count - 1 - i)
        plgpu.barrier_arrive(self.consumed.at[slot_i])
        with jax.named_scope("promote"):
          total = total + product * factor
      return total, slot

    if block_operands is None:
      steps = lambda k, carry, count: (zeroed_steps(k, carry[0], count), carry[1])
    else:
      steps = fresh_steps
    carry = (jnp.zeros(shape, jnp.float32), self.first_slot(step0))
    count = k_end - k_begin
    pairs = _halve(count) if depth == 2 else 0
    if not isinstance(pairs, int) or pairs:
      carry = lax.fori_loop(0, pairs, lambda i, c: steps(k_begin + depth * i, c, depth), carry)
    rest_begin = k_begin + depth * pairs
    if not isinstance(rest_begin, int) or not isinstance(k_end, int) or rest_begin < k_end:
      carry = lax.fori_loop(rest_begin, k_end, lambda k, c: steps(k, c, 1), carry)
    return carry[0]

  def skip(self, step0, count) -> None:
    """Consumer: lets `count` stages from step0 pass unread (wait, release), as a
    ping-pong consumer does for the other consumer's tiles."""

    @pl.loop(0, count)
    def _(k):
      slot = self.slot(step0 + k)
      self.wait_loaded(slot)
      plgpu.barrier_arrive(self.consumed.at[slot])


def _halve(count):
  """count // 2 of a non-negative Python int or traced scalar."""
  return count // 2 if isinstance(count, int) else lax.div(count, 2)


def _when(condition, body: Callable) -> None:
  """body() where `condition` (a Python bool, or a traced one) holds."""
  if isinstance(condition, bool):
    if condition:
      body()
  else:
    pl.when(condition)(body)


def persistent_loop(
    num_items: int, visit: Callable, *, steps_of: int | None = None, workers: int | None = None
):
  """Runs this CTA's share of work items 0..num_items-1 (round-robin over the
  `workers` CTAs of grid axis "sm", as `plgpu.nd_loop` deals them) and returns
  the ring steps they used.

  `visit(item, local_index, step0)` handles one item whose ring steps start at
  step0 and returns its step count. With `steps_of` (a Python int: every item
  uses that many; then `workers` is required), steps are computed, not carried.
  """
  if steps_of is not None:

    @plgpu.nd_loop((num_items,), collective_axes="sm")
    def _(info):
      visit(info.index[0], info.local_index, info.local_index * steps_of)

    sm = lax.axis_index("sm")
    return lax.div(num_items - sm + workers - 1, workers) * steps_of

  @plgpu.nd_loop((num_items,), collective_axes="sm", init_carry=jnp.int32(0))
  def steps(info, carry):  # nd_loop passes the carry by this name
    return carry + visit(info.index[0], info.local_index, carry)

  return steps


def compute_registers(consumers: int = CONSUMERS) -> int:
  """Registers per consumer thread after `setmaxnreg`: a CTA of `consumers + 1`
  warpgroups starts with the same count per thread (65536 shared out, a multiple of 8),
  and the consumers can only grow by what the producer gives back on dropping to
  `MEMORY_REGISTERS` (an increase beyond it waits forever).

  >>> compute_registers(2), compute_registers(4)
  (232, 104)
  """
  start = 65536 // (128 * (consumers + 1)) // 8 * 8
  return start + (start - MEMORY_REGISTERS) // consumers // 8 * 8


def warp_specialized(producer: Callable, consumer: Callable, *, consumers: int = CONSUMERS) -> None:
  """Runs `producer` on the last warpgroup and `consumer` on the others, after
  moving registers from the producer (`MEMORY_REGISTERS`) to the consumers."""

  def produce():
    plgpu.set_max_registers(MEMORY_REGISTERS, action="decrease")
    producer()

  def consume():
    plgpu.set_max_registers(compute_registers(consumers), action="increase")
    consumer()

  lax.cond(lax.axis_index("wg") == consumers, produce, consume)


def launch(
    body: Callable,
    *,
    out_type,
    workers: int,
    cluster_size: int = 1,
    compiler_params=None,
    interpret=None,
    consumers: int = CONSUMERS,
):
  """The `plgpu.kernel` of a warp-specialized persistent kernel: `workers` CTAs (or
  clusters) on grid axis "sm", `consumers + 1` warpgroups on axis "wg"."""
  cluster_kwargs = {}
  if cluster_size > 1:
    cluster_kwargs = dict(cluster=(cluster_size,), cluster_names=("cluster",))
  return plgpu.kernel(
      body,
      out_type=out_type,
      grid=(workers,),
      grid_names=("sm",),
      num_threads=consumers + 1,
      thread_name="wg",
      compiler_params=kernel_trace.with_profiler(compiler_params or _compat.compiler_params()),
      interpret=interpret,
      **cluster_kwargs,
  )


@dataclasses.dataclass(frozen=True)
class StoreSlots:
  """Round-robin SMEM slots of the epilogue's TMA stores (per consumer warpgroup).

  Before a slot is rewritten, the store that read it last must have finished
  reading: `wait` keeps at most `in_flight` stores pending. Across tiles the
  slots continue from 0, so only when a tile's store count is a multiple of
  the slots may one store stay in flight past the tile's end.
  """

  slots: int = 2

  def in_flight(self, chunks_per_tile: int) -> int:
    return self.slots - 1 if chunks_per_tile % self.slots == 0 else 0

  def store(
      self, smem_slots, index: int, value, destination, *, in_flight: int, copy_slots=None
  ) -> None:
    """Writes `value` to slot `index % slots` of `smem_slots` and TMA-stores it (through
    the same slot of `copy_slots`, the TMA view of the slots, when given:
    `smem.tile_buffer`)."""
    slot = index % self.slots
    buffer = smem_slots.at[slot]
    plgpu.wait_smem_to_gmem(in_flight, wait_read_only=True)
    buffer[...] = value
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(buffer if copy_slots is None else copy_slots.at[slot], destination)
