"""Coordinate layouts built from basis strides (CuTe's identity layouts).

>>> make_identity_layout((4, 8))
(4,8):(1@0,1@1)
>>> make_identity_layout((4, 8))(13)
(1, 3)
>>> Layout((4, 8), (E(1), E(0)))(1, 3)
(3, 1)
"""

from __future__ import annotations

from .basis import E, ScaledBasis
from .int_tuple import is_tuple, prefix_product
from .layout import Layout

__all__ = ["make_identity_layout"]


def make_identity_layout(shape) -> Layout:
  """``shape:(1@0, 1@1, ...)``: maps a coordinate of ``shape`` to itself.

  A nested mode gets ``prefix_product`` multiples of its basis, so it yields
  the mode's flat (column-major) coordinate; CuTe would return the nested
  coordinate instead. This flat form is what TMA needs.
  """

  def scaled(pre, i):
    return tuple(scaled(p, i) for p in pre) if is_tuple(pre) else ScaledBasis(pre, i)

  if not is_tuple(shape):
    return Layout(shape, E(0))
  return Layout(shape, tuple(scaled(prefix_product(m), i) for i, m in enumerate(shape)))
