"""Shared-memory tile layouts: which swizzle a WGMMA operand or epilogue tile uses.

This module is the one place that decides a swizzle. It will become a thin call
into `layouts.gmma_smem_layout(dtype, tile_shape, major)` once that exists; until
then it picks the widest legal swizzle from the minor-dimension extents.

>>> import jax.numpy as jnp
>>> widest_swizzle(jnp.bfloat16, 64, 4096)   # a 64-wide K tile of a K=4096 array
128
>>> widest_swizzle(jnp.bfloat16, 64, 4000)   # K=4000 only allows 64-byte spans
64
"""

from __future__ import annotations

import jax.experimental.pallas.mosaic_gpu as plgpu
import numpy as np

SWIZZLE_BYTES = (128, 64, 32)
"""Swizzle widths that WGMMA and TMA both accept, widest first."""


def swizzle_span(dtype, swizzle: int) -> int:
  """Elements of `dtype` in one swizzle span (the minor extent of one tile)."""
  return swizzle // np.dtype(dtype).itemsize


def is_tma_compatible_extent(dtype, extent: int, swizzle: int) -> bool:
  """Whether a whole array's minor extent can be TMA-copied with this swizzle.

  Mosaic tiles the whole GMEM array, so its minor dimension must be a multiple
  of the swizzle span. (Mosaic also accepts extents below one span, but on the
  H100 a (5, 40) bf16 A operand gave wrong results that way: not used.)
  """
  return extent % swizzle_span(dtype, swizzle) == 0


def widest_swizzle(dtype, tile_minor: int, *array_minors: int) -> int | None:
  """The widest swizzle (bytes) legal for a tile and the arrays it is copied from.

  `tile_minor` is the SMEM tile's minor extent (it must be a whole number of
  spans); `array_minors` are the minor extents of the GMEM arrays that share
  this swizzle (A and B must match for WGMMA). Returns None if none is legal.
  """
  for swizzle in SWIZZLE_BYTES:
    if tile_minor % swizzle_span(dtype, swizzle):
      continue
    if all(is_tma_compatible_extent(dtype, e, swizzle) for e in array_minors):
      return swizzle
  return None


def tile_transforms(dtype, swizzle: int) -> tuple:
  """Pallas SMEM transforms for a 2-D tile: (8, span) tiling plus the swizzle."""
  return (
      plgpu.TilingTransform((8, swizzle_span(dtype, swizzle))),
      plgpu.SwizzleTransform(swizzle),
  )
