"""int4 weights packed in WGMMA's register order: the convert without a relayout.

Mosaic's int4 -> bf16 path loads a tile in `WGMMA_UPCAST_4X`, moves it into WGMMA's
register layout with shuffles, then converts each register pair with prmt + lop3 +
sub: ~17 instructions per 8 weights, which bound decode (NOTES exp. 91). Packed
offline in the order a thread's WGMMA A fragment holds its weights, a thread loads
its own words with one 16-byte load per 64 x 64 unit and converts each 32-bit word
(8 weights) into 4 bf16 pairs with 3 shifts, 4 lop3 and 4 subs, with no shuffle.

The layout, `pack(q)` of (N, K) int4 values: (K / 64, N / 64, 4, 128) int32, one
2 KB unit per 64 weight rows x 64 K. In a unit, thread t of a warpgroup owns words
4t .. 4t + 3 (row t // 32, columns 4 (t % 32) ..: a warp's 16-byte loads are
contiguous); its word w holds registers 4w .. 4w + 3 of its (64, 64) fragment (the
order of `element_map`), nibble j of the low half being register 4w + j's first
element and of the high half its second, as two's complement int4. A (64 r, 64 c)
fragment is the registers of its units, row units outermost (`convert`), so any
tile of whole units is read the same way, and a ring step's units along N are
one contiguous run of memory.

>>> m = element_map(64, 16)
>>> m.shape, sorted(m.ravel().tolist()) == list(range(64 * 16))
((128, 4, 2), True)
>>> m[0].tolist()  # thread 0: rows 0 and 8, columns 0-1 and 8-9
[[0, 1], [128, 129], [8, 9], [136, 137]]
"""

from __future__ import annotations

import functools
import math

import jax.experimental.mosaic.gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, llvm, vector
import numpy as np

UNIT = 64
"""Rows and K columns of one packed unit."""
MAGIC = {"bfloat16": (0x43084308, "bf16x2"), "float16": (0x64086408, "f16x2")}
"""Per activation dtype: the exponent bits that make a nibble XOR 8 an integer's
mantissa (bf16 128.0 + 8, f16 1024.0 + 8), and the subtraction's PTX type."""


def element_map(rows: int, cols: int) -> np.ndarray:
  """(128 threads, registers, 2): the flat index (row * cols + col) of each element a
  warpgroup thread holds of a (rows, cols) 16-bit array in Mosaic's WGMMA layout, in
  the order of its register array (`np.ndindex` of `registers_shape`)."""
  layout = fa.WGMMA_LAYOUT
  tile_strides = layout.tiling.tile_strides((cols, 1))
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

  registers_shape = layout.registers_shape((rows, cols))
  vector_stride = dyn_strides[layout.vector_dim]
  out = np.empty((128, math.prod(registers_shape), layout.vector_length), np.int64)
  for t in range(128):
    warp = delinearize((t // 32) % 4, layout.warp_dims)
    lane = delinearize(t % 32, layout.lane_dims)
    base = sum(i * s for i, s in zip(warp, dyn_strides))
    base += sum(i * s for i, s in zip(lane, dyn_strides))
    for r, tile_idx in enumerate(np.ndindex(registers_shape)):
      lin = base + sum(i * s for i, s in zip(tile_idx, tile_strides))
      out[t, r] = [lin + v * vector_stride for v in range(layout.vector_length)]
  return out


@functools.cache
def _unit_order() -> np.ndarray:
  """(4096,): unit element index of each nibble in word order (thread, word, j, half)."""
  emap = element_map(UNIT, UNIT)  # (128, 16 registers, 2)
  return emap.reshape(128, 4, 4, 2).reshape(-1)


def pack(q):
  """(N, K) int4 values (any int dtype, in [-8, 7]) -> (K / 64, N / 64, 4, 128) int32.

  >>> q = np.random.default_rng(0).integers(-8, 8, (128, 192))
  >>> p = pack(q); p.shape, p.dtype
  ((3, 2, 4, 128), dtype('int32'))
  >>> bool((np.asarray(unpack(p)) == q).all())
  True
  """
  n, k = q.shape
  if n % UNIT or k % UNIT:
    raise ValueError(f"fragments.pack: N and K must be multiples of {UNIT}, got {q.shape}")
  units = jnp.asarray(q).astype(jnp.int32).reshape(n // UNIT, UNIT, k // UNIT, UNIT)
  units = units.transpose(2, 0, 1, 3).reshape(k // UNIT, n // UNIT, UNIT * UNIT)
  nib = (units[..., _unit_order()] & 0xF).astype(jnp.uint32)
  nib = nib.reshape(k // UNIT, n // UNIT, 512, 4, 2)  # (word, j, half)
  shifts = jnp.asarray([0, 4, 8, 12], jnp.uint32)
  words = (nib[..., 0] << shifts).sum(-1) | ((nib[..., 1] << shifts).sum(-1) << 16)
  return words.astype(jnp.uint32).view(jnp.int32).reshape(k // UNIT, n // UNIT, 4, 128)


def unpack(packed):
  """`pack`'s inverse: (K / 64, N / 64, 4, 128) int32 -> (N, K) int8 values."""
  kb, nb = packed.shape[:2]
  words = jnp.asarray(packed).view(jnp.uint32).reshape(kb, nb, 512, 1, 1)
  shifts = jnp.asarray([0, 4, 8, 12], jnp.uint32)[:, None] + jnp.asarray([0, 16], jnp.uint32)
  nib = ((words >> shifts) & 0xF).astype(jnp.int32).reshape(kb, nb, UNIT * UNIT)
  nib = jnp.where(nib >= 8, nib - 16, nib)
  units = nib[..., np.argsort(_unit_order())]
  units = units.reshape(kb, nb, UNIT, UNIT).transpose(1, 2, 0, 3)
  return units.reshape(nb * UNIT, kb * UNIT).astype(jnp.int8)


def convert(stage_ref, rows: int, cols: int, dtype: str = "bfloat16"):
  """In a kernel: this warpgroup's (rows, cols) weights of `dtype`, in WGMMA's
  register layout, from a ring stage of `pack`'s units ((cols / 64, warpgroups * rows
  / 64, 4, 128) int32 in SMEM; warpgroup g's rows are units g * rows / 64 ...)."""
  magic, ptx_type = MAGIC[dtype]

  @plgpu.inline_mgpu(
      arg_types=(plgpu.RefType(),),
      return_type=plgpu.ShapeDtypeStruct((rows, cols), jnp.dtype(dtype), layout=plgpu.Layout.WGMMA),
  )
  def body(ctx, ref):
    del ctx
    i32 = ir.IntegerType.get_signless(32)
    index = ir.IndexType.get()
    element = ir.BF16Type.get() if dtype == "bfloat16" else ir.F16Type.get()
    pair = ir.VectorType.get((2,), element)
    const = lambda v, ty=index: mgpu_utils.c(v, ty)
    tid = mgpu_utils.thread_idx()
    lane = arith.remui(tid, const(128, i32))
    first_unit = arith.muli(arith.divui(tid, const(128, i32)), const(rows // UNIT, i32))
    first_unit = arith.index_cast(index, first_unit)
    row = arith.index_cast(index, arith.divui(lane, const(32, i32)))
    col = arith.index_cast(index, arith.muli(arith.remui(lane, const(32, i32)), const(4, i32)))
    regs = []
    for nu in range(rows // UNIT):
      unit = arith.addi(first_unit, const(nu))
      for ku in range(cols // UNIT):
        quad = vector.load(ir.VectorType.get((4,), i32), ref, [const(ku), unit, row, col])
        for w in range(4):
          word = vector.extract(quad, dynamic_position=[], static_position=[w])
          for j in range(4):
            src = word if j == 0 else arith.shrui(word, const(4 * j, i32))
            out = llvm.inline_asm(
                i32,
                [src],
                f"""
                {{
                .reg .b32 s, m;
                lop3.b32 s, $1, 0x000F000F, {magic:#x}, 0x6a;
                mov.b32 m, {magic:#x};
                sub.{ptx_type} $0, s, m;
                }}
                """,
                "=r,r",
            )
            regs.append(mgpu_utils.bitcast(out, pair))
    registers = np.empty(fa.WGMMA_LAYOUT.registers_shape((rows, cols)), dtype=object)
    registers.flat[:] = regs
    return mgpu.FragmentedArray(_registers=registers, _layout=fa.WGMMA_LAYOUT, _is_signed=None)

  return body(stage_ref)
