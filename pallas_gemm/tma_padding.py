"""Extents TMA can copy: zero padding of operands whose rows or rows' bytes TMA cannot tile.

>>> import jax.numpy as jnp
>>> tma_rows(5), tma_rows(13), tma_operand_cols(4096, jnp.bfloat16), tma_operand_cols(4001, jnp.bfloat16)
(5, 16, 4096, 4032)
>>> pad_last2(jnp.ones((2, 3)), 4, 3).shape
(4, 3)
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_gemm import smem


def round_up(x, multiple):
  return -(-x // multiple) * multiple


def pad_last2(x, rows, cols):
  """Zero-pads the last two dims of `x` up to (rows, cols); no-op if already there."""
  pad_r, pad_c = rows - x.shape[-2], cols - x.shape[-1]
  if pad_r <= 0 and pad_c <= 0:
    return x
  widths = [(0, 0)] * (x.ndim - 2) + [(0, max(pad_r, 0)), (0, max(pad_c, 0))]
  return jnp.pad(x, widths)


def tma_rows(rows):
  """Second-minor extent TMA accepts through an (8, span)-tiled tile
  (`smem.rows_tileable`): the rows rounded up to a multiple of 8, unless fewer than 8."""
  return rows if smem.rows_tileable(rows) else round_up(rows, 8)


def tma_operand_cols(cols, dtype):
  """Minor extent for a WGMMA operand: 16-byte rows and a 128-byte swizzle."""
  span = smem.swizzle_span(dtype, 128)
  if smem.is_tma_compatible_extent(dtype, cols, 128):
    return cols
  return round_up(cols, span)
