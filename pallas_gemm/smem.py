"""Shared-memory tile layouts: which swizzle a WGMMA operand or epilogue tile uses.

The layout, swizzle and Mosaic tiling of every SMEM tile come from the
`layouts` package (`layouts.gmma_smem_spec`); this module only adds what the
kernel knows and `layouts` does not: the GMEM arrays a tile is TMA-copied from
(TMA tiles the whole array, so its minor extent must be a multiple of the
swizzle span too), and the narrowing to a swizzle both operands share.

>>> import jax.numpy as jnp
>>> widest_swizzle(jnp.bfloat16, 64, 4096)   # a 64-wide K tile of a K=4096 array
128
>>> widest_swizzle(jnp.bfloat16, 64, 4000)   # K=4000 only allows 64-byte spans
64
>>> operand_spec("float8_e4m3fn", (128, 128), "K", 4096).swizzle
128
>>> widest_swizzle(jnp.bfloat16, 8, 4096) is None   # 16 bytes: below every swizzle
True

A TMA-copied array's rows must come in whole groups of 8 (Mosaic tiles the GMEM
array by the SMEM tile's (8, span) tiling). Where each row of a tile is exactly one
swizzle span, the same bytes are also a (1, span) tiling, which any row count allows:
`row_copy_transforms` gives that view for the TMA copies, `tile_buffer` allocates the
two views over one buffer, and `copy_and_register_views` splits them in the kernel.

>>> row_copy_transforms(tile_transforms(jnp.bfloat16, 128, (128, 64)), 64)[0].tiling
(1, 64)
>>> row_copy_transforms(tile_transforms(jnp.bfloat16, 128, (64, 256), "MN"), 256) is None
True

The budget: `footprint` sums a kernel's buffers as Mosaic allocates them, and
`deepest` picks the deepest ring that fits.

>>> footprint(((4, 128, 64), "bfloat16"), ((4, 64, 256), "bfloat16"), ((2, 2, 64, 32), "bfloat16"))
213504
"""

from __future__ import annotations

import functools

import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp

import layouts
from pallas_gemm import _compat

SWIZZLE_BYTES = (128, 64, 32)
"""Swizzle widths that WGMMA and TMA both accept, widest first."""

LIMIT_BYTES = 232448
"""Shared memory a Hopper CTA may use (227 KiB)."""

ALIGN_BYTES = 1024
"""Mosaic GPU aligns every shared-memory allocation to 1 KiB."""

RESERVED_BYTES = 512
"""Headroom for the mbarriers (Mosaic reported 96 bytes for a 4-stage ring)."""


def footprint(*buffers) -> int:
  """Shared memory of a kernel's buffers, each `(shape, dtype)` (None: absent), as
  Mosaic allocates them (each 1 KiB aligned), plus the barriers' headroom."""
  total = RESERVED_BYTES
  for buffer in buffers:
    if buffer is not None:
      shape, dtype = buffer
      size = jnp.dtype(dtype).itemsize
      for extent in shape:
        size *= extent
      total += -(-size // ALIGN_BYTES) * ALIGN_BYTES
  return total


def deepest(with_stages, stages, fits):
  """The first of `with_stages(s)` for s in `stages` (deepest first) that `fits`; the
  last one if none does (its validation then says why)."""
  candidate = None
  for depth in stages:
    candidate = with_stages(depth)
    if fits(candidate):
      return candidate
  return candidate


def _name(dtype) -> str:
  return jnp.dtype(dtype).name


def swizzle_span(dtype, swizzle: int) -> int:
  """Elements of `dtype` in one swizzle span (the minor extent of one tile)."""
  return swizzle // jnp.dtype(dtype).itemsize


def is_tma_compatible_extent(dtype, extent: int, swizzle: int) -> bool:
  """Whether a whole array's minor extent can be TMA-copied with this swizzle.

  Mosaic tiles the whole GMEM array, so its minor dimension must be a multiple
  of the swizzle span. (Mosaic also accepts extents below one span, but on the
  H100 a (5, 40) bf16 A operand gave wrong results that way: not used.)
  """
  return extent % swizzle_span(dtype, swizzle) == 0


def operand_spec(dtype, tile_shape, major: str, *array_minors: int, swizzle: int | None = None):
  """`layouts.gmma_smem_spec` of a tile, narrowed to a swizzle its GMEM arrays allow.

  `tile_shape` is (mn, k); `major` "K" or "MN" (as in `layouts`); `array_minors`
  are the minor extents of the GMEM arrays copied into this tile. Returns None
  if no swizzle is legal. `swizzle` forces one width (None: widest legal). Memoized: every
  kernel and call site asks again for the same few tiles (1740 asks for the 15 kernels of
  a GPT training step, 0.8 s of its tracing; NOTES exp. 130).
  """
  return _operand_spec(_name(dtype), tuple(tile_shape), major, tuple(array_minors), swizzle)


@functools.lru_cache(maxsize=1024)
def _gmma_smem_spec(dtype: str, tile_shape: tuple, major: str, swizzle=None):
  """`layouts.gmma_smem_spec` on static arguments, memoized (its ValueError too is raised
  again on every ask: lru_cache keeps no exceptions)."""
  return layouts.gmma_smem_spec(dtype, tile_shape, major, swizzle)


@functools.lru_cache(maxsize=1024)
def _operand_spec(dtype: str, tile_shape: tuple, major: str, array_minors: tuple, swizzle):
  try:
    widest = _gmma_smem_spec(dtype, tile_shape, major).swizzle
  except ValueError:  # e.g. a contiguous extent below 32 bytes: no swizzle at all
    return None
  for width in SWIZZLE_BYTES:
    if width > widest or (swizzle is not None and width != swizzle):
      continue
    if not all(is_tma_compatible_extent(dtype, e, width) for e in array_minors):
      continue
    try:
      return _gmma_smem_spec(dtype, tile_shape, major, width)
    except ValueError:
      continue
  return None


def widest_swizzle(dtype, tile_minor: int, *array_minors: int) -> int | None:
  """The widest swizzle (bytes) legal for a tile and the arrays it is copied from.

  `tile_minor` is the SMEM tile's minor (contiguous) extent; `array_minors` are
  the minor extents of the GMEM arrays that share this swizzle (A and B must
  match for WGMMA). Returns None if none is legal. Decided by `layouts`.
  """
  spec = operand_spec(dtype, (8, tile_minor), "K", *array_minors)
  return None if spec is None else spec.swizzle


def rows_tileable(rows: int) -> bool:
  """Whether TMA, as Mosaic tiles a GMEM array, can copy an array with this many rows
  (its second-minor extent) through an (8, span)-tiled tile: a multiple of 8, or < 8.

  >>> rows_tileable(5), rows_tileable(4096), rows_tileable(12345)
  (True, True, False)
  """
  return rows < 8 or rows % 8 == 0


def row_copy_transforms(transforms: tuple, tile_minor: int) -> tuple | None:
  """The TMA-side view of an SMEM tile with `transforms` ((8, span) tiling, swizzle)
  for an array whose row count is not a multiple of 8: the (1, span) tiling of the
  same bytes, when each of the tile's rows is one swizzle span (`tile_minor` ==
  span: row r at r * swizzle bytes either way). None when the layouts differ (a
  row of several spans) or the tile is not swizzled.

  Checked on the H100 (scratch probe, 2026-11-28): TMA loads and stores through the
  (1, 64) view of a 128-byte-swizzled bf16 tile that WGMMA and registers use
  through the (8, 64) view, at 9, 13, 61 and 64 rows: exact to bf16 rounding.
  """
  if len(transforms) != 2:
    return None
  tiling, swizzle = transforms
  if not isinstance(tiling, plgpu.TilingTransform) or tiling.tiling[-1] != tile_minor:
    return None
  return (plgpu.TilingTransform((1, tile_minor)), swizzle)


def row_copy_view(name: str, rows: int, view):
  """`view` (from `row_copy_transforms`) for an array of `rows` rows that TMA cannot
  tile by 8, None where it can; an error naming the array where a view is needed and
  there is none (the wrapper pads such rows).

  >>> row_copy_view("a", 4096, "view") is None, row_copy_view("a", 12345, "view")
  (True, 'view')
  >>> row_copy_view("a", 12345, None)  # doctest: +ELLIPSIS
  Traceback (most recent call last):
  ...
  ValueError: a: 12345 rows, not a multiple of 8, ...: pad its rows to a multiple of 8
  """
  if rows_tileable(rows):
    return None
  if view is None:
    raise ValueError(
        f"{name}: {rows} rows, not a multiple of 8, and its SMEM tile's rows span "
        "several swizzle spans (no row-wise TMA view): pad its rows to a multiple of 8"
    )
  return view


def tile_buffer(shape, dtype, transforms, copy_transforms=None):
  """SMEM of `shape` with `transforms`; with `copy_transforms`, a union of two views of
  the same bytes: (TMA copies' view, WGMMA and registers' view)."""
  if copy_transforms is None:
    return plgpu.SMEM(shape, dtype, transforms=transforms)
  return plgpu.RefUnion(
      plgpu.SMEM(shape, dtype, transforms=copy_transforms),
      plgpu.SMEM(shape, dtype, transforms=transforms),
  )


def copy_and_register_views(ref) -> tuple:
  """(TMA view, WGMMA/register view) of a `tile_buffer`'s ref: the union's two, or
  the ref twice."""
  if _compat.is_ref_union(ref):
    copy_view, register_view = ref
    return copy_view, register_view
  return ref, ref


def tile_transforms(dtype, swizzle: int, tile_shape=None, major: str = "K") -> tuple:
  """Pallas SMEM transforms of a 2-D tile, from `layouts.gmma_smem_spec`.

  `tile_shape` is (mn, k) as `layouts` counts it (default: one swizzle atom).
  """
  if tile_shape is None:
    tile_shape = (8, swizzle_span(dtype, swizzle))
  spec = _gmma_smem_spec(_name(dtype), tuple(tile_shape), major, swizzle)
  return (plgpu.TilingTransform(spec.tiling), plgpu.SwizzleTransform(spec.swizzle))
