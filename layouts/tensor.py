"""A tensor: a layout over an engine (flat storage), or over nothing.

``Tensor(layout, engine, offset)`` evaluates ``engine[offset + layout(c)]``; with
no engine it returns the offset itself, or a coordinate when the layout has
basis strides (a TMA coordinate tensor). Slicing with ``None`` keeps modes and
moves the offset, which may be a traced jax integer.

>>> import numpy as np
>>> t = make_tensor(np.arange(12) * 10, Layout((3, 4), (4, 1)))
>>> int(t(1, 2))
60
>>> t(None, 2).layout, t(None, 2).offset
((3):(4), 2)
>>> make_identity_tensor((4, 8))(3, 5)
(3, 5)
"""

from __future__ import annotations

from .basis import ArithmeticTuple
from .layout import Layout, _has_none, _plain, slice_and_offset
from .coordinates import make_identity_layout

__all__ = ["Tensor", "make_tensor", "make_identity_tensor", "as_tensor"]


class Tensor:
  """``engine[offset + layout(c)]``, or ``offset + layout(c)`` with no engine."""

  __slots__ = ("layout", "engine", "_offset", "__weakref__")

  def __init__(self, layout, engine=None, offset=0):
    if isinstance(offset, tuple) and not isinstance(offset, ArithmeticTuple):
      offset = ArithmeticTuple(offset)  # a coordinate origin, e.g. another tensor's .offset
    object.__setattr__(self, "layout", layout)
    object.__setattr__(self, "engine", engine)
    object.__setattr__(self, "_offset", offset)

  @property
  def offset(self):
    """The origin: an int (or traced int), or a coordinate tuple."""
    return _plain(self._offset)

  def __setattr__(self, name, value):
    raise AttributeError("Tensor is immutable")

  @property
  def shape(self):
    return self.layout.shape

  def __call__(self, *args):
    crd = args if len(args) > 1 else args[0]
    if _has_none(crd):
      return self.sliced(crd)
    idx = self._offset + self.layout.offset_of(crd)
    if self.engine is not None:
      return self.engine[idx]
    return _plain(idx, self.layout._coord_rank() if isinstance(self.layout, Layout) else 0)

  def sliced(self, crd, layout=None) -> "Tensor":
    """Keep the ``None`` modes of ``crd`` over ``layout`` (default: own)."""
    sub, off = slice_and_offset(crd, self.layout if layout is None else layout)
    return Tensor(sub, self.engine, self._offset + off)

  def __repr__(self):
    return f"Tensor({self.layout}, offset={self.offset}{'' if self.engine is None else ', engine'})"


def make_tensor(engine, layout) -> Tensor:
  """A tensor over flat storage: numpy or jax arrays are flattened first."""
  if hasattr(engine, "reshape"):
    engine = engine.reshape(-1)
  return Tensor(layout, engine)


def make_identity_tensor(shape) -> Tensor:
  """The coordinate tensor of ``shape``: each position holds its coordinate."""
  rank = len(shape) if isinstance(shape, tuple) else 1
  return Tensor(make_identity_layout(shape), None, ArithmeticTuple((0,) * rank))


def as_tensor(x) -> Tensor:
  """`x` if it is a `Tensor`, else `Tensor(x)` (a layout, or what `Tensor` accepts)."""
  return x if isinstance(x, Tensor) else Tensor(x)
