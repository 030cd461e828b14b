"""int4 and int8 weights packed in WGMMA's register order: the convert without a relayout.

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

int8 (`pack(q, bits=8)`): (K / 64, N / 64, 8, 128) int32, 4 KB units. Thread t owns
rows 4h + t // 32 (h = 0, 1), columns 4 (t % 32) .. of its unit: two 16-byte loads;
its word v = 4h + w holds registers 2v and 2v + 1, byte 2i + e being register 2v + i's
element e, as two's complement int8. For bf16 a byte b becomes (128 + (b & 127)) -
(128 or 256 by its sign bit), both exact bf16 built by prmt: 8 instructions per word
of 4 weights; for f16, 1024 + (b ^ 128) - 1152: 5.

>>> m = element_map(64, 16)
>>> m.shape, sorted(m.ravel().tolist()) == list(range(64 * 16))
((128, 4, 2), True)
>>> m[0].tolist()  # thread 0: rows 0 and 8, columns 0-1 and 8-9
[[0, 1], [128, 129], [8, 9], [136, 137]]
"""

from __future__ import annotations

import functools
import math

import jax
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
WORDS = {4: 4, 8: 8}
"""32-bit words a thread holds of one unit, by bits per weight: its 32 weights."""
MAGIC = {"bfloat16": (0x43084308, "bf16x2"), "float16": (0x64086408, "f16x2")}
"""Per activation dtype: the exponent bits that make a nibble XOR 8 an integer's
mantissa (bf16 128.0 + 8, f16 1024.0 + 8), and the subtraction's PTX type."""


def bits_of(packed) -> int:
  """The bits per weight of `pack`'s output, from its word rows (4: int4, 8: int8)."""
  return {words: bits for bits, words in WORDS.items()}[packed.shape[-2]]


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
def _unit_order(bits: int = 4) -> np.ndarray:
  """(4096,): the unit element of each weight in word order: (thread, word, j, half)
  for int4 (register 4 word + j), (thread, word, i, element) for int8 (register
  2 word + i)."""
  emap = element_map(UNIT, UNIT)  # (128, 16 registers, 2)
  per_word = 32 // bits // 2  # registers per word
  return emap.reshape(128, WORDS[bits], per_word, 2).reshape(-1)


def pack(q, bits: int = 4):
  """(N, K) int values (any int dtype, in int`bits`'s range) -> (K / 64, N / 64,
  WORDS[bits], 128) int32; a stack (E, N, K) (experts) packs each: (E, K / 64, ...).

  >>> q = np.random.default_rng(0).integers(-8, 8, (128, 192))
  >>> p = pack(q); p.shape, p.dtype
  ((3, 2, 4, 128), dtype('int32'))
  >>> bool((np.asarray(unpack(p)) == q).all())
  True
  >>> q8 = np.random.default_rng(1).integers(-128, 128, (64, 128))
  >>> p8 = pack(q8, bits=8); p8.shape, bool((np.asarray(unpack(p8)) == q8).all())
  ((2, 1, 8, 128), True)
  """
  if bits not in WORDS:
    raise ValueError(f"fragments.pack: bits must be one of {tuple(WORDS)}, got {bits!r}")
  if q.ndim == 3:
    return jax.vmap(functools.partial(pack, bits=bits))(jnp.asarray(q))
  if q.ndim != 2:
    raise ValueError(f"fragments.pack: q must be (N, K) or (E, N, K), got shape {q.shape}")
  n, k = q.shape
  if n % UNIT or k % UNIT:
    raise ValueError(f"fragments.pack: N and K must be multiples of {UNIT}, got {q.shape}")
  kb, nb = k // UNIT, n // UNIT
  units = jnp.asarray(q).astype(jnp.int32).reshape(nb, UNIT, kb, UNIT)
  units = units.transpose(2, 0, 1, 3).reshape(kb, nb, UNIT * UNIT)
  mask = (1 << bits) - 1
  values = (units[..., _unit_order(bits)] & mask).astype(jnp.uint32)
  if bits == 4:
    nib = values.reshape(kb, nb, 512, 4, 2)  # (word, j, half)
    shifts = jnp.asarray([0, 4, 8, 12], jnp.uint32)
    words = (nib[..., 0] << shifts).sum(-1) | ((nib[..., 1] << shifts).sum(-1) << 16)
    return words.astype(jnp.uint32).view(jnp.int32).reshape(kb, nb, 4, 128)
  shifts = jnp.asarray([0, 8, 16, 24], jnp.uint32)
  words = (values.reshape(kb, nb, 128, 8, 4) << shifts).sum(-1).astype(jnp.uint32)
  # thread t's words 4h .. 4h + 3 go to row 4h + t // 32, columns 4 (t % 32) ..
  words = words.reshape(kb, nb, 128, 2, 4).transpose(0, 1, 3, 2, 4)
  return words.view(jnp.int32).reshape(kb, nb, 8, 128)


def unpack(packed):
  """`pack`'s inverse: (K / 64, N / 64, 4 or 8, 128) int32 -> (N, K) int8 values (a
  stack (E, K / 64, ...) -> (E, N, K))."""
  if packed.ndim == 5:
    return jax.vmap(unpack)(jnp.asarray(packed))
  bits = bits_of(packed)
  kb, nb = packed.shape[:2]
  words = jnp.asarray(packed).view(jnp.uint32)
  if bits == 4:
    words = words.reshape(kb, nb, 512, 1, 1)
    shifts = jnp.asarray([0, 4, 8, 12], jnp.uint32)[:, None] + jnp.asarray([0, 16], jnp.uint32)
  else:
    words = words.reshape(kb, nb, 2, 128, 4).transpose(0, 1, 3, 2, 4).reshape(kb, nb, 1024, 1)
    shifts = jnp.asarray([0, 8, 16, 24], jnp.uint32)
  half = 1 << (bits - 1)
  values = ((words >> shifts) & ((1 << bits) - 1)).astype(jnp.int32).reshape(kb, nb, UNIT * UNIT)
  values = jnp.where(values >= half, values - 2 * half, values)
  units = values[..., np.argsort(_unit_order(bits))]
  units = units.reshape(kb, nb, UNIT, UNIT).transpose(1, 2, 0, 3)
  return units.reshape(nb * UNIT, kb * UNIT).astype(jnp.int8)


def convert(stage_ref, rows: int, cols: int, dtype: str = "bfloat16", bits: int = 4):
  """In a kernel: this warpgroup's (rows, cols) weights of `dtype`, in WGMMA's
  register layout, from a ring stage of `pack`'s units ((cols / 64, warpgroups * rows
  / 64, WORDS[bits], 128) int32 in SMEM; warpgroup g's rows are units g * rows / 64 ...)."""
  words_of = _int4_pairs if bits == 4 else _int8_pairs

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
        for h in range(WORDS[bits] // 4):  # one 16-byte load per 4 words
          at = [const(ku), unit, arith.addi(row, const(4 * h)), col]
          quad = vector.load(ir.VectorType.get((4,), i32), ref, at)
          for w in range(4):
            word = vector.extract(quad, dynamic_position=[], static_position=[w])
            regs += [mgpu_utils.bitcast(r, pair) for r in words_of(word, dtype)]
    registers = np.empty(fa.WGMMA_LAYOUT.registers_shape((rows, cols)), dtype=object)
    registers.flat[:] = regs
    return mgpu.FragmentedArray(_registers=registers, _layout=fa.WGMMA_LAYOUT, _is_signed=None)

  return body(stage_ref)


def _asm(args, text: str):
  """One i32 result of inline PTX over i32 `args` ($1, $2, ...)."""
  i32 = ir.IntegerType.get_signless(32)
  return llvm.inline_asm(i32, list(args), text, "=r" + ",r" * len(args))


def _int4_pairs(word, dtype: str) -> list:
  """The 4 (16-bit x 2) registers of one int4 word: nibble j of each half, XOR 8 into a
  magic number's mantissa (lop3), minus the magic number."""
  magic, ptx_type = MAGIC[dtype]
  i32 = ir.IntegerType.get_signless(32)
  out = []
  for j in range(4):
    src = word if j == 0 else arith.shrui(word, mgpu_utils.c(4 * j, i32))
    out.append(
        _asm(
            [src],
            f"""
            {{
            .reg .b32 s, m;
            lop3.b32 s, $1, 0x000F000F, {magic:#x}, 0x6a;
            mov.b32 m, {magic:#x};
            sub.{ptx_type} $0, s, m;
            }}
            """,
        )
    )
  return out


def _int8_pairs(word, dtype: str) -> list:
  """The 2 (16-bit x 2) registers of one int8 word (bytes 0-1, then 2-3). bf16: prmt
  places (b & 127) and (b & 128) into the mantissa of 128.0 (0x43 high bytes): 128 +
  (b & 127) minus 128 or 256 is b, exactly. f16: b ^ 128 into 1024.0's mantissa,
  minus 1152."""
  selectors = (0x4140, 0x4342)  # bytes 0, 1 (then 2, 3) into each half's low byte
  if dtype == "bfloat16":
    low = _asm([word], "and.b32 $0, $1, 0x7F7F7F7F;")
    sign = _asm([word], "and.b32 $0, $1, 0x80808080;")
    text = """
        {{
        .reg .b32 k, m, c;
        mov.b32 k, 0x43434343;
        prmt.b32 m, $1, k, {sel:#x};
        prmt.b32 c, $2, k, {sel:#x};
        sub.bf16x2 $0, m, c;
        }}
        """
    return [_asm([low, sign], text.format(sel=sel)) for sel in selectors]
  flipped = _asm([word], "xor.b32 $0, $1, 0x80808080;")
  text = """
      {{
      .reg .b32 k, m, c;
      mov.b32 k, 0x64646464;
      mov.b32 c, 0x64806480;
      prmt.b32 m, $1, k, {sel:#x};
      sub.f16x2 $0, m, c;
      }}
      """
  return [_asm([flipped], text.format(sel=sel)) for sel in selectors]
