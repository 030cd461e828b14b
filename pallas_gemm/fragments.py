"""int4 weights pre-packed in WGMMA's register order: the convert without a relayout.

Mosaic's int4 -> bf16 path loads a tile in `WGMMA_UPCAST_4X`, moves it into WGMMA's
register layout with shuffles, then converts each register pair with prmt + lop3 +
sub: ~17 instructions per 8 weights, which bound decode (NOTES exp. 91). Packed
offline in the order a thread's WGMMA A fragment holds its weights, a thread loads
its own words with 16-byte vector loads and converts each 32-bit word (8 weights)
into 4 bf16 pairs with 3 shifts, 4 lop3 and 4 subs, with no shuffle.

Word w of a thread holds registers 4w..4w+3 of its fragment (in the order of
`element_map`): nibble j of the low half is register 4w+j's first element, of the
high half its second; nibbles are two's complement int4. A warpgroup's words sit as
(words / 4, 128 threads, 4): each 16-byte load of a warp is contiguous.

>>> m = element_map(64, 16)
>>> m.shape, sorted(m.ravel().tolist()) == list(range(64 * 16))
((128, 4, 2), True)
>>> m[0].tolist()  # thread 0: rows 0 and 8, columns 0-1 and 8-9
[[0, 1], [128, 129], [8, 9], [136, 137]]
"""

from __future__ import annotations

import math

import numpy as np


def element_map(rows: int, cols: int) -> np.ndarray:
  """(128 threads, registers, 2): the flat index (row * cols + col) of each element a
  warpgroup thread holds of a (rows, cols) 16-bit array in Mosaic's WGMMA layout, in
  the order of its register array (`np.ndindex` of `registers_shape`)."""
  from jax.experimental.mosaic.gpu import fragmented_array as fa

  layout = fa.WGMMA_LAYOUT
  shape = (rows, cols)
  contig = (cols, 1)
  tile_strides = layout.tiling.tile_strides(contig)
  rank = layout.tiled_tiling_rank
  dyn_strides = tile_strides[-rank:]
  tiled_shape = layout.tiled_tiling_shape

  def delinearize(idx, dims):
    sizes = [d.times if isinstance(d, fa.Replicated) else tiled_shape[d] for d in dims]
    strides = [math.prod(sizes[i + 1 :]) for i in range(len(sizes))]
    full = [0] * rank
    for d, size, stride in zip(dims, sizes, strides):
      if not isinstance(d, fa.Replicated):
        full[d] = (idx // stride) % size
    return full

  registers_shape = layout.registers_shape(shape)
  vector = layout.vector_length
  vector_stride = dyn_strides[layout.vector_dim]
  out = np.empty((128, math.prod(registers_shape), vector), np.int64)
  for t in range(128):
    warp = delinearize((t // 32) % 4, layout.warp_dims)
    lane = delinearize(t % 32, layout.lane_dims)
    base = sum(i * s for i, s in zip(warp, dyn_strides)) + sum(
        i * s for i, s in zip(lane, dyn_strides)
    )
    for r, tile_idx in enumerate(np.ndindex(registers_shape)):
      lin = base + sum(i * s for i, s in zip(tile_idx, tile_strides))
      out[t, r] = [lin + v * vector_stride for v in range(vector)]
  return out


def pack(q: np.ndarray, rows: int, cols: int, warpgroups: int) -> np.ndarray:
  """(N, K) int4 values (ints in [-8, 7]) as int32 words in fragment order:
  (N / (warpgroups * rows), K / cols, warpgroups * words / 32, 128), one ring step's
  box (`warpgroups` x `rows` weight rows x `cols` K) per leading pair, contiguous, in
  rows of 512 bytes (TMA streams 16-byte rows at a fraction of the rate).

  >>> q = np.arange(-8, 8).reshape(1, 16).repeat(64, 0).repeat(8, 1)
  >>> pack(q, 64, 128, 1).shape
  (1, 1, 8, 128)
  """
  n, k = q.shape
  tile_n = warpgroups * rows
  if n % tile_n or k % cols:
    raise ValueError(f"q {q.shape} must tile by ({tile_n}, {cols})")
  if rows * cols % (128 * 8 * 4):
    raise ValueError(f"a ({rows}, {cols}) tile gives threads no whole 16-byte loads")
  emap = element_map(rows, cols)  # (128, R, 2)
  words = emap.shape[1] // 4
  tiles = np.asarray(q, np.int64).reshape(n // rows, rows, k // cols, cols).transpose(0, 2, 1, 3)
  tiles = tiles.reshape(n // rows, k // cols, rows * cols)
  vals = tiles[..., emap] & 0xF  # (N / rows, K / cols, 128, R, 2)
  vals = vals.reshape(*vals.shape[:3], words, 4, 2)
  shift = 4 * np.arange(4)
  packed = (vals[..., 0] << shift).sum(-1) | ((vals[..., 1] << shift).sum(-1) << 16)
  packed = packed.astype(np.uint32).view(np.int32)  # (N / rows, K / cols, 128, words)
  packed = packed.reshape(*packed.shape[:3], words // 4, 4).transpose(0, 1, 3, 2, 4)
  packed = packed.reshape(n // tile_n, warpgroups, k // cols, words // 4, 128, 4)
  return np.ascontiguousarray(
      packed.transpose(0, 2, 1, 3, 4, 5).reshape(n // tile_n, k // cols, -1, 128)
  )


def unpack(packed: np.ndarray, rows: int, cols: int, warpgroups: int) -> np.ndarray:
  """`pack`'s inverse: (N, K) int values.

  >>> q = np.random.default_rng(0).integers(-8, 8, (256, 128))
  >>> bool((unpack(pack(q, 128, 128, 2), 128, 128, 2) == q).all())
  True
  """
  n_tiles, k_tiles = packed.shape[:2]
  emap = element_map(rows, cols)
  words = emap.shape[1] // 4
  p = np.asarray(packed).reshape(n_tiles, k_tiles, warpgroups, words // 4, 128, 4)
  p = p.view(np.uint32)
  p = p.transpose(0, 2, 1, 4, 3, 5).reshape(n_tiles * warpgroups, k_tiles, 128, words)
  p = p.astype(np.int64)
  shift = 4 * np.arange(4)
  lo = (p[..., None] >> shift) & 0xF
  hi = (p[..., None] >> (16 + shift)) & 0xF
  vals = np.stack([lo, hi], -1).reshape(n_tiles * warpgroups, k_tiles, 128, words * 4, 2)
  vals = np.where(vals >= 8, vals - 16, vals)
  out = np.empty((n_tiles * warpgroups, k_tiles, rows * cols), np.int64)
  out[..., emap.reshape(-1)] = vals.reshape(*vals.shape[:2], -1)
  out = out.reshape(n_tiles * warpgroups, k_tiles, rows, cols).transpose(0, 2, 1, 3)
  return out.reshape(n_tiles * warpgroups * rows, k_tiles * cols)


def convert(stage_ref, rows: int, cols: int):
  """In a kernel: this warpgroup's (rows, cols) bf16 weights, in WGMMA's register
  layout, from a ring stage of `pack`'s words ((warpgroups * words / 32, 128) int32 in
  SMEM: thread t of warpgroup g reads its i-th 4 words at row 4 * (g * words / 4 + i)
  + t // 32, columns 4 * (t % 32) ...)."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  import jax.numpy as jnp

  words = rows * cols // (128 * 8)

  @plgpu.inline_mgpu(
      arg_types=(plgpu.RefType(),),
      return_type=plgpu.ShapeDtypeStruct((rows, cols), jnp.bfloat16, layout=plgpu.Layout.WGMMA),
  )
  def body(ctx, ref):
    del ctx
    from jax.experimental import mosaic as _  # noqa: F401
    import jax.experimental.mosaic.gpu as mgpu
    from jax.experimental.mosaic.gpu import fragmented_array as fa
    from jax.experimental.mosaic.gpu import utils
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, llvm, vector

    i32 = ir.IntegerType.get_signless(32)
    index = ir.IndexType.get()
    bf16x2 = ir.VectorType.get((2,), ir.BF16Type.get())
    tid = utils.thread_idx()
    lane = arith.index_cast(index, arith.remui(tid, utils.c(128, i32)))
    first = arith.index_cast(
        index, arith.muli(arith.divui(tid, utils.c(128, i32)), utils.c(words // 4, i32))
    )
    regs = []
    row0 = arith.addi(arith.muli(first, utils.c(4, index)), arith.divui(lane, utils.c(32, index)))
    col = arith.muli(arith.remui(lane, utils.c(32, index)), utils.c(4, index))
    for i in range(words // 4):
      row = arith.addi(row0, utils.c(4 * i, index))
      quad = vector.load(ir.VectorType.get((4,), i32), ref, [row, col])
      for w in range(4):
        word = vector.extract(quad, dynamic_position=[], static_position=[w])
        for j in range(4):
          src = word if j == 0 else arith.shrui(word, utils.c(4 * j, i32))
          out = llvm.inline_asm(
              i32,
              [src],
              """
              {
              .reg .b32 s, m;
              lop3.b32 s, $1, 0x000F000F, 0x43084308, 0x6a;
              mov.b32 m, 0x43084308;
              sub.bf16x2 $0, s, m;
              }
              """,
              "=r,r",
          )
          regs.append(utils.bitcast(out, bf16x2))
    registers = np.empty(fa.WGMMA_LAYOUT.registers_shape((rows, cols)), dtype=object)
    registers.flat[:] = regs
    return mgpu.FragmentedArray(_registers=registers, _layout=fa.WGMMA_LAYOUT, _is_signed=None)

  return body(stage_ref)
