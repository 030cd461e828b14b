"""The weight-only quantized GEMM kernel: x (M, K) 16-bit times int4/int8 weights with group scales.

Decode multiplies a few tokens by a large weight, and its time is the time to
read the weight. This kernel reads the weight quantized (int4: a quarter of the
bytes of bf16) and dequantizes it in registers, between the TMA ring and WGMMA:

  - It computes out^T = W^T x^T. The weight is stored (N, K), K-major; each
    consumer warpgroup loads a (64, tile_k) slice of it from shared memory
    straight into registers (`WGMMA_UPCAST_4X` / `_2X` layouts, made for this),
    converts it to the activation dtype (Mosaic's int4 -> bf16 conversion is
    CUTLASS's lop3/prmt sequence), subtracts the group's zero points, and hands
    it to WGMMA as the register A operand. The group scales multiply each step's
    (64 x tile_m) product instead of the (64 x tile_k) weights, promoted into a
    register sum as blockwise fp8 does (`Ring.mma_promoted`): for decode that is
    8x fewer multiplies. The tokens are WGMMA's N (a multiple of 8, from 16),
    read from shared memory as the K-major B operand: decode pays for 16 rows of
    tensor-core work, not 64. A register operand must stay untouched until its
    WGMMA completes, so each step's WGMMA is waited for before the next convert.
  - From 65 tokens (prefill, `scale_on="weights"`) the group scales (and zeros)
    multiply the converted weights instead, one accumulator runs through K, and
    the next step converts while this step's WGMMA runs
    (`Ring.mma_register_operand`); without split-K the kernel applies bias and
    activation and stores its (rows, tokens) sums through a transposed SMEM view
    as the (tokens, rows) block of the (M, N) output (`output="tile"`).
  - One ring step is one K block of `tile_k` weights, within one scale group
    (`tile_k` divides `group_size`), so a step needs one scale row.
  - The persistent CTAs share (split, token tile, `tile_n` weight rows) work items;
    split-K gives decode enough of them to fill the SMs. The kernel writes f32
    partial sums (splits, N, M) and the caller's XLA fusion sums the splits,
    transposes, and applies per-channel scales, bias and activation.

Built from the package's pipeline (`pallas_gemm.pipeline`): the same ring,
persistent loop, role split and launch as the dense kernel; what is its own is
`operands` (the convert stage) and the transposed f32 store.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
from jax import lax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import compile_once
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import fragments
from pallas_gemm import kernel_trace
from pallas_gemm import pipeline
from pallas_gemm import stream_k as stream_k_lib
from pallas_gemm.config import DEFAULT_NUM_SMS, tiles
from pallas_gemm.smem import LIMIT_BYTES as SMEM_BYTES
from pallas_gemm.tma_padding import round_up

BITS = (4, 8)
DEQUANT = ("registers", "smem")
SCALE_ON = ("product", "weights")
MMAS = ("wgmma", "warp")
OUTPUTS = ("partials", "tile")
ACTIVATION_DTYPES = ("bfloat16", "float16")
TILE_M = (16, 32, 64, 128, 160, 192, 224, 256)
"""Token tiles (WGMMA's N): 32-token steps from 128 so that few tokens are padding."""
PARTIAL_COLS = 128
"""Widest f32 partial-sum store (tokens): its (rows, <= 128) SMEM slot, not a whole
256-token tile, leaves room for the ring."""


@dataclasses.dataclass(frozen=True)
class WeightOnlyProblem:
  """out (M, N) = x (M, K) @ dequant(w (N, K) of `bits`, scales per `group_size` of K).

  `per_channel` (group_size == K): the scale is constant along K and is applied
  after the K loop by the caller (or on the weights, with scale_on="weights").
  `zeros`: the groups carry zero points (subtracted from q). `out_dtype`, `bias` ((N,) f32)
  and `activation` (a built-in's name): the epilogue of the "tile" output.
  `experts` > 0: w is a stack (E, N, K) of experts' weights (scales (E, K // G, N)),
  and the token tiles come from a table (`tile_table`): each multiplies one expert.
  `k_block` > 0: w is stored in K blocks, (K / k_block, N, k_block) (`QuantizedWeight`'s
  layout), so that a ring step's box of weight rows is one contiguous run of memory.
  `fragments`: w (int4 or int8) is packed in WGMMA's register order (`fragments.pack`):
  no relayout in the convert.
  """

  m: int
  n: int
  k: int
  bits: int
  group_size: int
  dtype: str = "bfloat16"
  zeros: bool = False
  out_dtype: str = "bfloat16"
  bias: bool = False
  activation: str | None = None
  experts: int = 0
  k_block: int = 0
  fragments: bool = False

  @property
  def per_channel(self) -> bool:
    return self.group_size == self.k


@dataclasses.dataclass(frozen=True)
class WeightOnlyConfig:
  """Tiles of the weight-only kernel.

  tile_m: tokens per work item (WGMMA's N), one of `TILE_M`.
  tile_k: K per ring step (64, 128 or 256), dividing `group_size` unless per channel.
  stages: ring depth.
  split_k: K slices computed by different CTAs (partial sums added by XLA).
  promotion_depth: register path with group scales: 2 converts and issues the next
    step before the previous product is scaled (`Ring.mma_promoted`), 1 is serial.
  consumers: consumer warpgroups per CTA, 2 or 4 (more warps to hide the convert's
    latency, at `pipeline.compute_registers(4)` = 112 registers each).
  rows_per_wg: weight rows per consumer warpgroup (WGMMA's M): 64 or 128 (two
    m64 groups per step: more independent work behind each step's fixed latency).
  dequant: "registers" (the converted weights are WGMMA's register operand) or
    "smem" (they are written back to a double-buffered shared-memory tile that
    WGMMA reads; what the GPU interpreter runs, since it has no register operand).
  scale_on: "product" (decode: group scales multiply each step's (rows x tile_m)
    product, promoted into a register sum; per-channel scales are the caller's) or
    "weights" (prefill: scales and zeros multiply the converted weights, one
    accumulator runs through K, and with register operands the next step converts
    while this one's WGMMA runs, `Ring.mma_register_operand`).
  output: "partials" (f32 (split_k, N, M) that the caller sums, scales and
    finishes) or "tile" (split_k 1: the kernel applies per-channel scales, bias and
    activation and stores the (M, N) output transposed, in the output dtype).
  stream_k: with the "tile" output, every SM runs an equal run of the K steps of all
    the tiles (`pallas_gemm.stream_k`): a tile cut between SMs is summed by the SM that
    ran its first step, from the others' f32 partials in a GMEM workspace (GMEM
    semaphores: not in GPU interpret mode). Decode's few wide tiles then fill every SM
    and no second kernel sums split-K partials. Experimental: the partials' store and
    release cost more than the balance saves (NOTES exp. 92), so no default picks it.
  mma: "wgmma" or "warp" (experimental, for decode: warp-level m16n8k16 MMA on the
    converted weights, `Ring.mma_warp`, which has no per-instruction cost of a
    64-row WGMMA at few tokens; register operands, scales on the weights, "partials").

  >>> WeightOnlyConfig(tile_m=16, tile_k=128, stages=8, split_k=4).validate(
  ...     WeightOnlyProblem(m=1, n=4096, k=14336, bits=4, group_size=128))
  """

  tile_m: int = 16
  tile_k: int = 128
  stages: int = 8
  split_k: int = 1
  dequant: str = "registers"
  rows_per_wg: int = 64
  promotion_depth: int = 2
  consumers: int = pipeline.CONSUMERS
  scale_on: str = "product"
  output: str = "partials"
  mma: str = "wgmma"
  stream_k: bool = False

  @property
  def partial_cols(self) -> int:
    """Tokens per store of the "partials" output (its f32 SMEM slot's width)."""
    return max(c for c in range(8, PARTIAL_COLS + 1, 8) if self.tile_m % c == 0)

  @property
  def tile_n(self) -> int:
    """Weight rows (output columns) per work item."""
    return self.consumers * self.rows_per_wg

  def validate(self, problem: WeightOnlyProblem) -> None:
    """Raises ValueError naming the field and the rule it breaks."""
    if self.tile_m not in TILE_M:
      raise ValueError(f"WeightOnlyConfig.tile_m={self.tile_m}: use one of {TILE_M}")
    if self.tile_k not in (64, 128, 256):
      raise ValueError(f"WeightOnlyConfig.tile_k={self.tile_k}: use 64, 128 or 256")
    if not problem.per_channel and problem.group_size % self.tile_k:
      raise ValueError(
          f"WeightOnlyConfig.tile_k={self.tile_k} must divide group_size={problem.group_size} "
          "(one scale row per ring step)"
      )
    if problem.k_block and problem.k_block % self.tile_k:
      raise ValueError(
          f"WeightOnlyConfig.tile_k={self.tile_k} must divide the weight's k_block="
          f"{problem.k_block} (a ring step reads within one stored K block)"
      )
    if self.dequant not in DEQUANT:
      raise ValueError(f"WeightOnlyConfig.dequant={self.dequant!r}: use one of {DEQUANT}")
    if not isinstance(self.stages, int) or self.stages < 2:
      raise ValueError(f"WeightOnlyConfig.stages={self.stages!r}: an int >= 2")
    if not isinstance(self.split_k, int) or not 1 <= self.split_k <= tiles(problem.k, self.tile_k):
      raise ValueError(
          f"WeightOnlyConfig.split_k={self.split_k!r}: an int from 1 to the K steps "
          f"({tiles(problem.k, self.tile_k)})"
      )
    if self.promotion_depth not in (1, 2):
      raise ValueError(f"WeightOnlyConfig.promotion_depth={self.promotion_depth}: use 1 or 2")
    if self.rows_per_wg not in (64, 128):
      raise ValueError(f"WeightOnlyConfig.rows_per_wg={self.rows_per_wg}: use 64 or 128")
    if self.consumers not in (2, 4):
      raise ValueError(f"WeightOnlyConfig.consumers={self.consumers}: use 2 or 4")
    if self.scale_on not in SCALE_ON:
      raise ValueError(f"WeightOnlyConfig.scale_on={self.scale_on!r}: use one of {SCALE_ON}")
    if self.output not in OUTPUTS:
      raise ValueError(f"WeightOnlyConfig.output={self.output!r}: use one of {OUTPUTS}")
    if self.mma not in MMAS:
      raise ValueError(f"WeightOnlyConfig.mma={self.mma!r}: use one of {MMAS}")
    if self.mma == "warp" and (
        self.dequant != "registers" or self.scale_on != "weights" or self.output != "partials"
    ):
      raise ValueError(
          "WeightOnlyConfig.mma='warp' takes dequant='registers', scale_on='weights' and "
          f"output='partials', got {self.dequant!r}, {self.scale_on!r}, {self.output!r}"
      )
    if self.mma == "warp" and not _compat.HAS_WARP_MMA:
      raise ValueError(
          f"WeightOnlyConfig.mma='warp' needs plgpu.mma, which jax {jax.__version__} lacks"
      )
    per_channel_zeros = problem.zeros and problem.per_channel
    if self.output == "tile" and self.scale_on != "weights" and per_channel_zeros:
      raise ValueError(
          "WeightOnlyConfig.output='tile' with per-channel zero points needs "
          "scale_on='weights' (the product cannot take them off)"
      )
    if self.stream_k and (self.output != "tile" or self.mma != "wgmma"):
      raise ValueError(
          "WeightOnlyConfig.stream_k=True needs output='tile' and mma='wgmma' (the kernel "
          f"sums the cut tiles itself), got output={self.output!r}, mma={self.mma!r}"
      )
    if problem.experts and self.output != "partials":
      raise ValueError(
          f"WeightOnlyConfig.output={self.output!r}: an expert problem stores 'partials'"
      )
    if self.output == "tile" and self.split_k != 1:
      raise ValueError(
          f"WeightOnlyConfig.split_k={self.split_k}: the 'tile' output stores whole sums (use 1)"
      )
    if self.output == "tile" and problem.out_dtype not in ACTIVATION_DTYPES:
      raise ValueError(
          f"WeightOnlyConfig.output='tile' stores {ACTIVATION_DTYPES}, not "
          f"out_dtype={problem.out_dtype!r} (use the 'partials' output)"
      )
    if self.output == "tile" and not _compat.STORES_THROUGH_TRANSPOSED_SMEM:
      raise ValueError(
          f"WeightOnlyConfig.output='tile' needs jax >= 0.11 (a transposed SMEM store); "
          f"jax {jax.__version__} has the 'partials' output"
      )
    if problem.fragments:
      self._validate_fragments(problem)
    registers = self.registers()
    if registers > pipeline.compute_registers(self.consumers):
      raise ValueError(
          f"WeightOnlyConfig: rows_per_wg={self.rows_per_wg}, tile_k={self.tile_k}, "
          f"tile_m={self.tile_m} need ~{registers} registers per consumer thread, more than "
          f"the {pipeline.compute_registers(self.consumers)} of {self.consumers} consumers"
      )
    need = self.smem_bytes(problem)
    if need > SMEM_BYTES:
      raise ValueError(
          f"WeightOnlyConfig.stages={self.stages}: {need} bytes of shared memory > {SMEM_BYTES}"
      )

  def _validate_fragments(self, problem: WeightOnlyProblem) -> None:
    """The rules of weights packed in WGMMA's register order (`fragments.pack`)."""
    rules = {
        "dequant": (self.dequant == "registers", "dequant='registers'"),
        "mma": (self.mma == "wgmma", "mma='wgmma'"),
        "k_block": (not problem.k_block, "k_block=0 (the packing is its own layout)"),
        "n": (problem.n % 64 == 0, "N a multiple of 64 (whole packed units)"),
        "k": (problem.k % 64 == 0, "K a multiple of 64 (whole packed units)"),
    }
    for field, (ok, rule) in rules.items():
      if not ok:
        raise ValueError(f"WeightOnlyProblem.fragments needs {rule} ({field} breaks it)")

  def registers(self) -> int:
    """Per consumer thread: the converted bf16 weights (2 per register; two steps' of
    them in the register pipeline of scale_on="weights"), the f32 accumulator (and
    the promoted sum of scale_on="product"), and ~40 for addresses and the loop."""
    weights = self.rows_per_wg * self.tile_k // 256
    acc = self.rows_per_wg * self.tile_m // 128
    if self.scale_on == "weights":
      return weights * (2 if self.dequant == "registers" else 1) + acc + 40
    return weights + 2 * acc + 40

  def smem_bytes(self, problem: WeightOnlyProblem) -> int:
    x_bytes = jnp.dtype(problem.dtype).itemsize
    stage = self.tile_n * self.tile_k * problem.bits // 8 + self.tile_m * self.tile_k * x_bytes
    if not problem.per_channel or self.scale_on == "weights":
      stage += self.tile_n * x_bytes * (2 if problem.zeros else 1)
    if self.output == "partials":
      out = self.tile_n * self.partial_cols * 4
    else:
      out = self.tile_n * self.tile_m * jnp.dtype(problem.out_dtype).itemsize
    if self.dequant == "smem":
      out += 2 * self.tile_n * self.tile_k * x_bytes
    profiler = kernel_trace.smem_bytes(self.consumers + 1)
    return self.stages * stage + out + profiler + 1024  # barriers and alignment


def _swizzle(row_bytes: int) -> int:
  """The widest swizzle whose span a row of `row_bytes` fills (16: none)."""
  for width in (128, 64, 32):
    if row_bytes % width == 0:
      return width
  return 16


def _transforms(bits: int, cols: int) -> tuple:
  """SMEM tiling and swizzle of a K-major tile whose rows hold `cols` elements of `bits`."""
  swizzle = _swizzle(cols * bits // 8)
  if swizzle == 16:
    return ()
  return (
      plgpu.TilingTransform((8, swizzle * 8 // bits)),
      plgpu.SwizzleTransform(swizzle),
  )


class _Work(NamedTuple):
  """One work item: K split, first x row of its token tile, first output column of
  its partial sums, weight tile, and (experts) the expert and whether it has tokens."""

  split: Any
  row0: Any
  col0: Any
  ni: Any
  expert: Any = None
  active: Any = None


def _kernel(
    x_gmem,
    w_gmem,
    scale_gmem,
    zero_gmem,
    bias_gmem,
    table_gmem,
    out_gmem,
    *partials_gmem,
    p,
    cfg,
    workers,
):
  tm, tk, rows, tile_n = cfg.tile_m, cfg.tile_k, cfg.rows_per_wg, cfg.tile_n
  m_tiles = table_gmem.shape[1] if p.experts else tiles(p.m, tm)
  n_tiles = tiles(p.n, tile_n)
  k_steps = tiles(p.k, tk)
  steps_per_split = tiles(k_steps, cfg.split_k)
  items = cfg.split_k * m_tiles * n_tiles
  dtype = jnp.dtype(p.dtype)
  upcast = plgpu.Layout.WGMMA_UPCAST_4X if p.bits == 4 else plgpu.Layout.WGMMA_UPCAST_2X
  row_layout = plgpu.Layout.WGMMA.reduce(1)
  grouped = not p.per_channel
  tile_output = cfg.output == "tile"
  on_weights = cfg.scale_on == "weights"
  scaled = grouped or on_weights  # scales (and zeros) come through the ring
  scale_weights = scaled and (cfg.dequant == "smem" or on_weights)
  partial_cols = cfg.partial_cols
  # Every item of a dense problem runs the same steps; an expert's empty tile runs none.
  steps_of = {} if p.experts else dict(steps_of=steps_per_split, workers=workers)
  sk = stream_k_lib.Schedule.plan(items, workers, k_steps) if cfg.stream_k else None
  if sk is not None:
    # One f32 (rows, tokens) workspace slot per SM and consumer warpgroup (an SM
    # contributes to at most one tile, `stream_k`), and one semaphore per SM and
    # warpgroup that a tile's contributors signal for its finisher. Pallas zeroes the
    # semaphores before every launch (an XLA memset), and every signal is waited for.
    (partials_gmem,) = partials_gmem
    semaphores = pl.get_global(plgpu.SemaphoreType.REGULAR((workers * cfg.consumers,)))

  def for_each_unit(visit: Callable):
    """visit(step0, work, k_begin, k_end) for each unit of this CTA's work: K steps
    [k_begin, k_end) of its split of one item (static with split-K, traced with
    stream-K), from ring step step0. Returns the ring steps used."""
    if sk is not None:
      return sk.for_each_unit(
          lambda step0, tile, kb, ke: visit(step0, position(tile), kb, ke), lax.axis_index("sm")
      )

    def item(index, _, step0):
      work = position(index)
      body = lambda: visit(step0, work, 0, steps_per_split)
      return for_active(work, body, steps_per_split)

    return pipeline.persistent_loop(items, item, **steps_of)

  def position(item) -> _Work:
    """The work item's (split, token tile, weight tile): weight tiles vary fastest, so
    concurrent CTAs share the token tile and each weight tile is read once per token tile."""
    ni = lax.rem(item, n_tiles)
    rest = lax.div(item, n_tiles)
    split, mi = lax.div(rest, m_tiles), lax.rem(rest, m_tiles)
    if not p.experts:
      return _Work(split, mi * tm, mi * tm, ni)
    expert = table_gmem[0, mi]
    row0 = pl.multiple_of(table_gmem[1, mi], 8)
    return _Work(split, row0, mi * tm, ni, jnp.maximum(expert, 0), expert >= 0)

  def for_active(work: _Work, body: Callable, steps: int):
    """Runs `body` where the item has tokens; the ring steps it used (0 for none)."""
    if work.active is None:
      body()
      return steps
    pl.when(work.active)(body)
    return jnp.where(work.active, steps, 0)

  def expert_of(ref, work: _Work):
    return ref if work.expert is None else ref.at[work.expert]

  def weight_view(w, weights, kk):
    """K step kk of the weight rows `weights`; in K blocks, a step past K reads the last
    block (x is zero there: TMA zero-fills its columns past K)."""
    if p.fragments:  # units of 64 x 64; past K (or N) TMA zero-fills
      units = pl.ds(lax.div(weights.start, fragments.UNIT), tile_n // fragments.UNIT)
      return w.at[pl.ds(kk * (tk // fragments.UNIT), tk // fragments.UNIT), units]
    if not p.k_block:
      return w.at[weights, pl.ds(kk * tk, tk)]
    per_block = p.k_block // tk
    block = jnp.minimum(lax.div(kk, per_block), p.k // p.k_block - 1)
    return w.at[block, weights, pl.ds(lax.rem(kk, per_block) * tk, tk)]

  def scoped(ring_refs, out_smem, w_smem=None):
    ring = pipeline.Ring.of(ring_refs)
    wg = lax.axis_index("wg")
    mine = pl.ds(wg * rows, rows)

    def producer():
      def load(step0, work, k_begin, k_end):
        weights = pl.ds(work.ni * tile_n, tile_n)

        @pl.loop(k_begin, k_end)
        def _(k):
          kk = work.split * steps_per_split + k  # past K: TMA zero-fills (the last split)
          cols = pl.ds(kk * tk, tk)
          views = [
              weight_view(expert_of(w_gmem, work), weights, kk),
              x_gmem.at[pl.ds(work.row0, tm), cols],
          ]
          if scaled:
            group = pl.ds(lax.div(kk * tk, p.group_size), 1)
            views.append(expert_of(scale_gmem, work).at[group, weights])
            if p.zeros:
              views.append(expert_of(zero_gmem, work).at[group, weights])
          ring.fill(step0 + k - k_begin, views)

      ring.drain(for_each_unit(load))

    @jax.named_scope("convert")
    def convert(w_tile, group_tiles, *, wgmma: bool = True):
      """The convert stage: this warpgroup's weight rows as q - zero in registers, times
      the group scale where the weights carry it (else `promote` scales the product).
      `wgmma`: in WGMMA's register layout (else in the one Mosaic infers for `plgpu.mma`)."""
      if wgmma:
        if p.fragments:
          w = fragments.convert(w_tile, rows, tk, p.dtype, p.bits)
        else:
          with jax.named_scope("smem_load"):
            w = _compat.load_registers(w_tile.at[mine], upcast, optimized=True)
            w = plgpu.layout_cast(w, plgpu.Layout.WGMMA)
          with jax.named_scope("to_float"):
            w = w.astype(dtype)
        rows_of = lambda ref: _compat.load_registers(ref.at[0, mine], row_layout)
      else:
        w = w_tile.at[mine][...].astype(dtype)
        rows_of = lambda ref: ref[0, mine]
      if p.zeros and scaled:
        w = w - lax.broadcast_in_dim(rows_of(group_tiles[1]), w.shape, (0,))
      if scale_weights:
        w = w * lax.broadcast_in_dim(rows_of(group_tiles[0]), w.shape, (0,))
      return w

    def operands(k, w_tile, x_tile, *group_tiles):
      """(weights, tokens) of one step: the converted weights in registers or, with
      `dequant="smem"`, written to shared-memory buffer k % 2 (the WGMMA of step k - 2,
      which read it last, has completed: `Ring.mma` keeps one in flight)."""
      w = convert(w_tile, group_tiles)
      if w_smem is None:
        return w, _compat.transpose_2d(x_tile)
      buffer = w_smem.at[wg, lax.rem(k, 2)]
      buffer[...] = w
      plgpu.commit_smem()
      return buffer, _compat.transpose_2d(x_tile)

    def promote(_, w_tile, x_tile, scale_tile, *rest):
      """The multiplier of one step's product: the group scales of this warpgroup's rows."""
      scale = _compat.load_registers(scale_tile.at[0, mine], row_layout)
      return lax.broadcast_in_dim(scale.astype(jnp.float32), (rows, tm), (0,))

    @jax.named_scope("store")
    def store_partials(result, split, col0, ni):
      """The f32 (rows, tokens) sums, `partial_cols` tokens per store through one slot."""
      slot = out_smem.at[wg]
      for c in range(tm // partial_cols):
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last store read the slot
        slot[...] = result[:, c * partial_cols : (c + 1) * partial_cols]
        plgpu.commit_smem()
        tokens = pl.ds(col0 + c * partial_cols, partial_cols)
        plgpu.copy_smem_to_gmem(
            slot, out_gmem.at[split, pl.ds(ni * tile_n + wg * rows, rows), tokens]
        )

    @jax.named_scope("store")
    def store_tile(result, row0, ni):
      """per-channel scales (unless on the weights), bias and activation on this
      warpgroup's (rows, tokens) sums, stored transposed
      as the (tokens, rows) block of the (M, N) output (TMA clips the edges)."""
      columns = pl.ds(ni * tile_n + wg * rows, rows)
      if p.per_channel and not on_weights:  # the per-channel scale of each weight row
        scale = _compat.load_registers(scale_gmem.at[0, columns], row_layout)
        result = result * lax.broadcast_in_dim(scale.astype(jnp.float32), result.shape, (0,))
      if p.bias:
        bias = _compat.load_registers(bias_gmem.at[columns], row_layout)
        result = result + lax.broadcast_in_dim(bias, result.shape, (0,))
      if p.activation is not None:
        result = epilogue_lib.activation_fn(p.activation)(result)
      slot = out_smem.at[wg]
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last store read the slot
      _compat.transpose_2d(slot)[...] = result.astype(out_gmem.dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(slot, out_gmem.at[pl.ds(row0, tm), columns])

    def tokens(k, w_tile, x_tile, *group_tiles):
      return _compat.transpose_2d(x_tile)

    def warp_operands(k, w_tile, x_tile, *group_tiles):
      """(weights, tokens) of one step as register arrays for warp-level MMA."""
      return convert(w_tile, group_tiles, wgmma=False), tokens(k, w_tile, x_tile)[...]

    def accumulate(step0, k_begin, k_end, finish: Callable):
      """finish(f32 (rows, tokens) sums of K steps [k_begin, k_end) from ring step step0)."""
      if cfg.mma == "warp":
        start = jnp.zeros((rows, tm), jnp.float32)
        finish(ring.mma_warp(start, step0, k_begin, k_end, warp_operands))
        return
      if not on_weights and w_smem is None and grouped:  # scales on each step's product
        finish(
            ring.mma_promoted(
                (rows, tm),
                step0,
                k_begin,
                k_end,
                operands,
                promote,
                depth=cfg.promotion_depth,
            )
        )
        return

      @functools.partial(pl.run_scoped, acc=plgpu.ACC((rows, tm), jnp.float32))
      def _(acc):
        if on_weights and w_smem is None:  # the next step converts during this WGMMA
          ring.mma_register_operand(
              acc,
              step0,
              k_begin,
              k_end,
              lambda k, w_tile, x_tile, *group_tiles: convert(w_tile, group_tiles),
              tokens,
          )
        else:
          # A register operand must stay untouched until its WGMMA is done: no overlap.
          ring.mma(acc, step0, k_begin, k_end, operands, overlap=w_smem is not None)
        finish(acc[...])

    def partial_slot(worker):
      """The stream-K workspace slot (and semaphore) of `worker`'s warpgroup."""
      return worker * cfg.consumers + wg

    def tile_of(work: _Work):
      return work.ni + n_tiles * lax.div(work.col0, tm)

    @jax.named_scope("contribute")
    def contribute(result, work: _Work):
      """Stream-K: this warpgroup's f32 sums of a tile's end part into its workspace
      slot, then one signal on the semaphore of the tile's finisher (GPU scope: a
      warpgroup barrier, then one lane's release covers the warpgroup's stores)."""
      partials_gmem.at[partial_slot(lax.axis_index("sm"))][...] = result
      finisher = sk.owner(tile_of(work) * k_steps)
      _compat.semaphore_signal_gpu(semaphores.at[partial_slot(finisher)])

    def finish_cut(result, work: _Work):
      """Stream-K: the tile's first steps' sums plus its contributors' partials (the
      SMs after this one whose ranges cover the rest of the tile), finished and stored.
      One wait for all their signals, then all their loads in flight at once."""
      sm = lax.axis_index("sm")
      contributors = sk.owner(tile_of(work) * k_steps + k_steps - 1) - sm
      with jax.named_scope("fixup_wait"):
        pl.when(contributors > 0)(
            lambda: _compat.semaphore_wait_gpu(semaphores.at[partial_slot(sm)], contributors)
        )
      with jax.named_scope("fixup_load"):
        parts = [
            _compat.load_registers(
                partials_gmem.at[partial_slot(jnp.minimum(sm + 1 + c, workers - 1))],
                plgpu.Layout.WGMMA,
            )
            for c in range(sk.max_contributors)
        ]
        for c, part in enumerate(parts):
          valid = lax.broadcast_in_dim(c < contributors, result.shape, ())
          result = result + jnp.where(valid, part, jnp.zeros_like(part))
      store_tile(result, work.row0, work.ni)

    def consumer():
      def compute(step0, work, k_begin, k_end):
        def finish(result):
          if sk is not None and not isinstance(k_begin, int):  # a tile cut between SMs
            pl.when(k_begin > 0)(lambda: contribute(result, work))
            pl.when(k_begin == 0)(lambda: finish_cut(result, work))
          elif tile_output:
            store_tile(result, work.row0, work.ni)
          else:
            store_partials(result, work.split, work.col0, work.ni)

        accumulate(step0, k_begin, k_end, finish)

      for_each_unit(compute)
      plgpu.wait_smem_to_gmem(0)

    pipeline.warp_specialized(producer, consumer, consumers=cfg.consumers)

  buffers = [
      (
          (tk // 64, tile_n // 64, fragments.WORDS[p.bits], 128) if p.fragments else (tile_n, tk),
          jnp.int32 if p.fragments else jnp.int4 if p.bits == 4 else jnp.int8,
          () if p.fragments else _transforms(p.bits, tk),
      ),
      ((tm, tk), dtype, _transforms(8 * dtype.itemsize, tk)),
  ]
  if scaled:
    buffers += [((1, tile_n), dtype, ())] * (2 if p.zeros else 1)
  if tile_output:
    out_dtype = jnp.dtype(p.out_dtype)
    out_smem = plgpu.SMEM(
        (cfg.consumers, tm, rows), out_dtype, transforms=_transforms(8 * out_dtype.itemsize, rows)
    )
  else:
    out_smem = plgpu.SMEM(
        (cfg.consumers, rows, partial_cols), jnp.float32, transforms=_transforms(32, partial_cols)
    )
  pl.run_scoped(
      scoped,
      ring_refs=pipeline.ring_scratch(cfg.stages, buffers, consumers=cfg.consumers),
      out_smem=out_smem,
      **(
          dict(
              w_smem=plgpu.SMEM(
                  (cfg.consumers, 2, rows, tk),
                  dtype,
                  transforms=_transforms(8 * dtype.itemsize, tk),
              )
          )
          if cfg.dequant == "smem"
          else {}
      ),
      collective_axes="wg",
  )


@compile_once.kernel_entry(static_argnames=("problem", "config", "interpret", "num_sms"))
def weight_only_gemm(
    x,
    w,
    scales,
    zeros,
    bias=None,
    table=None,
    *,
    problem: WeightOnlyProblem,
    config: WeightOnlyConfig,
    interpret=None,
    num_sms=None,
):
  """W^T x^T through the kernel: with the "partials" output, f32 partial sums
  (split_k, N, M_pad), M_pad = M rounded up to tile_m; with "tile", the finished
  output of `problem.out_dtype`, (M, N) rounded up to (8, 64) (slice it).

  x: (M, K) of `problem.dtype`; w: (N, K) int4 or int8 (or (K / k_block, N, k_block)
  with `problem.k_block`, or `fragments.pack`'s (K / 64, N / 64, 4 or 8, 128) int32 units
  with `problem.fragments`); scales and zeros (the zero points, subtracted from q):
  (K // group_size, N) of `problem.dtype`, or None per
  channel with the "partials" output (then the caller scales the result); bias:
  (N rounded up to tile_n,) f32 when `problem.bias`. With `problem.experts`: w, scales
  and zeros carry the leading E, `table` is `tile_table`'s (2, T) int32, and the
  partial sums are (split_k, N, T * tile_m), token tile t in columns [t * tile_m, ...).
  Traced and lowered once per distinct kernel in a program (`compile_once`): pass
  problem, config, interpret and num_sms by keyword.
  """
  config.validate(problem)
  workers = num_sms or DEFAULT_NUM_SMS
  if problem.experts:
    if table is None or table.ndim != 2 or table.shape[0] != 2:
      raise ValueError(f"table must be tile_table's (2, T) array, got {table!r}")
    token_tiles = table.shape[1]
  else:
    token_tiles = tiles(problem.m, config.tile_m)
  items = config.split_k * token_tiles * tiles(problem.n, config.tile_n)
  if not config.stream_k:  # stream-K spreads the K steps over every SM
    workers = min(workers, items)
  elif interpret is not None:
    raise ValueError(
        "WeightOnlyConfig.stream_k=True: GPU interpret mode cannot run the GMEM semaphores "
        "of the stream-K sums; use stream_k=False"
    )
  kernel = compile_once.named_body(
      "pallas_gemm_weight_only", _kernel, p=problem, cfg=config, workers=workers
  )
  if config.output == "tile":  # whole TMA tiles of the transposed store: (8, 64) elements
    out_shape = (round_up(problem.m, 8), round_up(problem.n, 64))
    out_type = jax.ShapeDtypeStruct(out_shape, jnp.dtype(problem.out_dtype))
  else:
    out_shape = (config.split_k, problem.n, token_tiles * config.tile_m)
    out_type = jax.ShapeDtypeStruct(out_shape, jnp.float32)
  if config.stream_k:  # the contributors' f32 partial sums, one slot per SM and warpgroup
    workspace = (workers * config.consumers, config.rows_per_wg, config.tile_m)
    out_type = (out_type, jax.ShapeDtypeStruct(workspace, jnp.float32))
  launch = pipeline.launch(
      kernel,
      out_type=out_type,
      workers=workers,
      interpret=interpret,
      consumers=config.consumers,
  )
  # The kernel never reads an absent operand: x stands in for it (a constant would cost
  # an XLA broadcast kernel, ~1 us, per call).
  stand_in = lambda operand: x if operand is None else operand
  out = launch(x, w, stand_in(scales), stand_in(zeros), stand_in(bias), stand_in(table))
  return out[0] if config.stream_k else out


def tile_table(group_sizes, m: int, tile_m: int, token_tiles: int):
  """(2, token_tiles) int32 for an expert problem: each token tile's expert (-1: unused)
  and first x row, and (M,) int32: each row's output column in the partial sums.

  Expert e's rows [start_e, start_e + size_e) are cut into tile_m-row tiles from
  start_e rounded down to a multiple of 8 (TMA's row tiling; the rows before
  start_e belong to the previous expert and are ignored); tile t's sums are
  columns [t * tile_m, (t + 1) * tile_m). Rows past sum(group_sizes) get column -1.
  `max_token_tiles(m, experts, tile_m)` tiles always suffice.

  >>> table, columns = tile_table(jnp.array([5, 0, 11]), 16, 16, max_token_tiles(16, 3, 16))
  >>> table[:, :3].tolist(), columns.tolist()
  ([[0, 2, -1], [0, 0, 0]], [0, 1, 2, 3, 4, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31])
  """
  sizes = jnp.clip(jnp.asarray(group_sizes, jnp.int32), 0, m)
  ends = jnp.minimum(jnp.cumsum(sizes), m)
  starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
  bases = starts // 8 * 8
  counts = jnp.where(ends > starts, (ends - bases + tile_m - 1) // tile_m, 0)
  first_tile = jnp.cumsum(counts) - counts
  t = jnp.arange(token_tiles, dtype=jnp.int32)
  expert = jnp.searchsorted(jnp.cumsum(counts), t, side="right").astype(jnp.int32)
  used = t < counts.sum()
  expert_c = jnp.minimum(expert, sizes.shape[0] - 1)
  row0 = bases[expert_c] + (t - first_tile[expert_c]) * tile_m
  table = jnp.stack([jnp.where(used, expert_c, -1), jnp.where(used, row0, 0)])
  r = jnp.arange(m, dtype=jnp.int32)
  owner = jnp.minimum(jnp.searchsorted(ends, r, side="right"), sizes.shape[0] - 1)
  offset = r - bases[owner]
  column = (first_tile[owner] + offset // tile_m) * tile_m + offset % tile_m
  return table.astype(jnp.int32), jnp.where(r < ends[-1], column, -1).astype(jnp.int32)


def max_token_tiles(m: int, experts: int, tile_m: int) -> int:
  """An upper bound of `tile_table`'s tiles: each expert adds at most two partial ones
  (its rounded-down start, its end).

  >>> max_token_tiles(16, 3, 16)
  7
  """
  return tiles(m, tile_m) + 2 * min(experts, m)
