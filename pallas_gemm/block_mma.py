"""K blocks of an fp8 WGMMA into fresh registers, and their promotion into a sum.

Blockwise-scaled fp8 multiplies each K block into its own f32 accumulator and
adds that product, scaled, into a register sum (DeepGEMM's and CUTLASS's
promotion). Pallas's `plgpu.wgmma` always accumulates (PTX scale-d = 1), so a
fresh accumulator is first filled with zeros: a register move per accumulator
register and block, competing for issue slots with the promotion's FMAs. Here a
block's first instruction overwrites its registers (scale-d = 0), as DeepGEMM's
`wgmma(..., scale_d = k > 0)` does, with descriptors from `layouts.gmma`.

`issue(blocks, transforms)` issues every block's WGMMAs (one commit group
each) and returns their products; `wait(product, pending)` hands a product back
once its group is done, so that the caller can release the block's ring stage
before it scales the product (DeepGEMM's order), while a second block still runs
on the tensor cores. Operands are a warpgroup's (64, k) A view and (n, k) B view
of a ring stage, K-major fp8 in SMEM tiled (8, swizzle). Inline Mosaic GPU code:
the GPU interpreter cannot run it.

The descriptors' static bits, one per 32-wide K instruction of a (64, 128) view
with the 64-byte swizzle (two swizzle spans along K, 512 bytes apart):

>>> [hex(d) for d in descriptor_bits(jnp.float8_e4m3fn, (64, 128), 64)]
['0x8000004000010000', '0x8000004000010002', '0x8000004000010020', '0x8000004000010022']
"""

from __future__ import annotations

import jax.numpy as jnp
import jax.experimental.pallas.mosaic_gpu as plgpu
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith
from jax._src.lib.mlir.dialects import llvm
from jax._src.lib.mlir.dialects import vector

from layouts import gmma

ROWS = 64  # a warpgroup's WGMMA rows
_K_INSTR = 32  # fp8 WGMMA's K per instruction
_PTX_TYPE = {jnp.dtype(jnp.float8_e4m3fn): "e4m3", jnp.dtype(jnp.float8_e5m2): "e5m2"}


def descriptor_bits(dtype, shape, swizzle: int) -> list[int]:
  """The 64-bit WGMMA descriptors of a K-major fp8 (rows, k) view at SMEM address 0,
  tiled (8, swizzle) with that swizzle: one per 32-wide K instruction."""
  layout = gmma.gmma_smem_layout(dtype, tuple(shape), "K", swizzle)
  return [gmma.encode_gmma_desc(desc) for desc in gmma.make_gmma_descs(layout, dtype)]


def _descriptors(ref, dtype, shape, swizzle: int) -> list:
  """`descriptor_bits` plus the view's address, as i64 values."""
  i64 = ir.IntegerType.get_signless(64)
  address = llvm.ptrtoint(i64, mgpu_utils.memref_ptr(ref))
  field = arith.shrui(arith.andi(address, mgpu_utils.c(0x3FFFF, i64)), mgpu_utils.c(4, i64))
  signed = lambda bits: bits - (1 << 64) if bits >> 63 else bits  # MLIR's i64 is signed
  return [
      arith.addi(field, mgpu_utils.c(signed(bits), i64))
      for bits in descriptor_bits(dtype, shape, swizzle)
  ]


def _issue(a_descs, b_descs, n: int, a_type: str, b_type: str) -> list:
  """One block's WGMMAs, the first overwriting, committed as one group; returns the
  n / 2 f32 registers (PTX order) they write asynchronously."""
  f32 = ir.F32Type.get()
  count = n // 2
  d = "{" + ",".join(f"${i}" for i in range(count)) + "}"
  lines = ["{", ".reg .pred p;", "wgmma.fence.sync.aligned;"]
  steps = len(a_descs)
  for k in range(steps):
    a, b = count + k, count + steps + k  # asm operands: the outputs, then A's, then B's
    scale_d = 0 if k == 0 else 1  # 0: overwrite, 1: accumulate
    lines.append(f"setp.ne.b32 p, {scale_d}, 0;")
    lines.append(
        f"wgmma.mma_async.sync.aligned.m64n{n}k{_K_INSTR}.f32.{a_type}.{b_type} "
        f"{d}, ${a}, ${b}, p, 1, 1;"
    )
  lines += ["wgmma.commit_group.sync.aligned;", "}"]
  result = llvm.inline_asm(
      llvm.StructType.get_literal([f32] * count),
      [*a_descs, *b_descs],
      "\n".join(lines),
      ",".join(["=f"] * count + ["l"] * 2 * steps),
      has_side_effects=True,
  )
  return [llvm.extractvalue(f32, result, [i]) for i in range(count)]


def _as_array(registers: list, n: int) -> mgpu.FragmentedArray:
  """PTX-ordered accumulator registers as a (64, n) array in the WGMMA layout."""
  vec = ir.VectorType.get((1,), ir.F32Type.get())
  regs = [vector.broadcast(vec, r) for r in registers]
  shape = fa.WGMMA_LAYOUT_ACC_32BIT.registers_shape((ROWS, n))
  array = np.asarray(regs, dtype=object).reshape(shape)
  acc = mgpu.FragmentedArray(_registers=array, _layout=fa.WGMMA_LAYOUT_ACC_32BIT, _is_signed=None)
  return acc.to_layout(fa.WGMMA_LAYOUT)


def issue(blocks, transforms) -> tuple:
  """Every block's WGMMAs, each block's first instruction overwriting fresh registers,
  one commit group per block, in order; returns the (64, n) f32 products (WGMMA
  layout), still being written: `wait` for each before reading it.

  blocks: one or two (a_view, b_view) pairs, K-major (rows, k) fp8 views of SMEM
  sharing the (tiling, swizzle) `transforms`; a's rows are the warpgroup's 64."""
  if len(blocks) not in (1, 2):
    raise ValueError(f"issue: one or two blocks, got {len(blocks)}")
  n = blocks[0][1].shape[0]
  swizzle = transforms[1].swizzle
  meta = [(ref.dtype, ref.shape) for pair in blocks for ref in pair]
  refs = [ref for pair in blocks for ref in pair]
  wgmma = plgpu.Layout.WGMMA
  product = plgpu.ShapeDtypeStruct((ROWS, n), jnp.float32, layout=wgmma)

  @plgpu.inline_mgpu(
      arg_types=([plgpu.RefType(tuple(transforms))] * len(refs),),
      return_type=(product,) * len(blocks),
  )
  def body(ctx, views):
    del ctx
    products = []
    for i in range(len(blocks)):
      (a_dtype, a_shape), (b_dtype, b_shape) = meta[2 * i], meta[2 * i + 1]
      a_descs = _descriptors(views[2 * i], a_dtype, a_shape, swizzle)
      b_descs = _descriptors(views[2 * i + 1], b_dtype, b_shape, swizzle)
      a_type, b_type = _PTX_TYPE[jnp.dtype(a_dtype)], _PTX_TYPE[jnp.dtype(b_dtype)]
      products.append(_as_array(_issue(a_descs, b_descs, n, a_type, b_type), n))
    return tuple(products)

  return body(refs)


def wait(product, pending: int):
  """`product` once at most `pending` later commit groups are still running: a
  `wgmma.wait_group` that takes and returns the product's registers, so that
  nothing reads them before it."""
  wgmma = plgpu.Layout.WGMMA

  @plgpu.inline_mgpu(
      arg_types=(wgmma,),
      return_type=plgpu.ShapeDtypeStruct(product.shape, jnp.float32, layout=wgmma),
  )
  def body(ctx, array):
    del ctx
    f32 = ir.F32Type.get()
    registers = array.registers.reshape(-1)
    lanes = ir.VectorType(registers[0].type).shape[0]
    at = lambda j: dict(dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([j]))
    scalars = [vector.extract(r, **at(j)) for r in registers for j in range(lanes)]
    count = len(scalars)
    result = llvm.inline_asm(
        llvm.StructType.get_literal([f32] * count),
        scalars,
        f"wgmma.wait_group.sync.aligned {pending};",
        ",".join(["=f"] * count + [str(i) for i in range(count)]),
        has_side_effects=True,
    )
    out = [llvm.extractvalue(f32, result, [i]) for i in range(count)]
    rebuilt = []
    for r, reg in enumerate(registers):
      vec = reg
      for j in range(lanes):
        vec = vector.insert(out[r * lanes + j], vec, **at(j))
      rebuilt.append(vec)
    return mgpu.FragmentedArray(
        _registers=np.asarray(rebuilt, dtype=object).reshape(array.registers.shape),
        _layout=array.layout,
        _is_signed=None,
    )

  return body(product)
