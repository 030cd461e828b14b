"""The order in which a persistent kernel visits output tiles.

Consecutive tile indices run through a band of `group` tile rows (or columns),
one column (row) at a time, and every other band runs backwards (a snake), so
the tiles the SMs hold at once share A rows and B columns in L2.

>>> [tuple(int(v) for v in tile_coords(i, 4, 3, group=2, order="along_n")) for i in range(6)]
[(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
>>> [tuple(int(v) for v in tile_coords(i, 4, 3, group=2, order="along_n")) for i in range(6, 9)]
[(2, 2), (3, 2), (2, 1)]
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

ORDERS = ("along_n", "along_m")
"""`along_n`: bands of `group` tile rows sweep along N; `along_m`: bands of columns sweep along M."""


def tile_coords(index, m_tiles: int, n_tiles: int, *, group: int, order: str):
  """Maps a linear tile index in [0, m_tiles * n_tiles) to (m_tile, n_tile).

  Works on Python ints or int32 scalars (traced inside the kernel).
  """
  if order not in ORDERS:
    raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
  band_dim, sweep_dim = (m_tiles, n_tiles) if order == "along_n" else (n_tiles, m_tiles)
  group = max(1, min(group, band_dim))
  index = jnp.asarray(index, jnp.int32)
  per_band = group * sweep_dim
  band, within = lax.div(index, per_band), lax.rem(index, per_band)
  band_height = jnp.minimum(group, band_dim - band * group)
  across = band * group + lax.rem(within, band_height)
  along = lax.div(within, band_height)
  along = jnp.where(lax.rem(band, 2) == 1, sweep_dim - 1 - along, along)
  if order == "along_n":
    return across, along
  return along, across
