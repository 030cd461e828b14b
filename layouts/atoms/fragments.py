"""The PTX register-fragment rule shared by ``mma.sync`` (SM80+) and ``wgmma`` (SM90).

Every warp-level register fragment of those instructions is laid out the same
way. Lane ``4*g + t`` of a warp (``g`` its *group*, ``t`` its index in the
group) holds, in register order:

1. ``pack`` adjacent columns, starting at column ``pack*t``, of row ``g``
   (``pack`` elements share one 32-bit register: 2 for 16-bit types, 4 for
   8-bit types, 1 for 32-bit types; accumulators always come in pairs);
2. the same at row ``g + 8`` (when the tile has 16 rows per warp);
3. the same again ``4*pack`` columns further right, until the row is covered.

In a warpgroup (``wgmma``) warp ``w`` does this for rows ``16*w .. 16*w + 15``.
The result is a thread-value layout ``(thread, value) -> row + rows*col``,
column-major like every CuTe TV layout.

>>> mma_fragment(16, 8, pack=2)            # SM80 16x8 accumulator
((4,8),(2,2)):((32,1),(16,8))
>>> mma_fragment(64, 128, pack=2, warps=4)  # SM90 64x128 accumulator
((4,8,4),(2,2,16)):((128,1,16),(64,8,512))
>>> mma_fragment(8, 16, pack=2)            # SM80 B operand of m16n8k16 (n + 8*k)
((4,8),(2,2)):((16,1),(8,64))
"""

from __future__ import annotations

from ..layout import Layout

__all__ = ["mma_fragment"]


def mma_fragment(rows: int, cols: int, pack: int, warps: int = 1) -> Layout:
  """``(thread, value) -> row + rows*col`` of a ``rows x cols`` register
  fragment spread over ``warps`` warps by the PTX rule above.

  ``rows`` is 8 or 16 per warp (``16*warps`` for a warpgroup); ``cols`` a
  multiple of ``4*pack``. Value modes of size 1 are left out, as CuTe does.
  """
  rows_per_warp = rows // warps
  if rows % warps or rows_per_warp not in (8, 16) or (warps > 1 and rows_per_warp != 16):
    raise ValueError(
        f"mma_fragment: {rows} rows do not split into warps of 8 or 16 rows ({warps} warps)"
    )
  if cols % (4 * pack):
    raise ValueError(f"mma_fragment: {cols} columns are not a multiple of 4*pack = {4 * pack}")
  thread_shape, thread_stride = (4, 8), (pack * rows, 1)
  if warps > 1:
    thread_shape, thread_stride = thread_shape + (warps,), thread_stride + (16,)
  value_modes = [(pack, rows), (rows_per_warp // 8, 8), (cols // (4 * pack), 4 * pack * rows)]
  value_modes = [(s, d) for s, d in value_modes if s > 1] or [(1, 0)]
  value_shape = tuple(s for s, _ in value_modes)
  value_stride = tuple(d for _, d in value_modes)
  if len(value_modes) == 1:
    value_shape, value_stride = value_shape[0], value_stride[0]
  return Layout((thread_shape, value_shape), (thread_stride, value_stride))
