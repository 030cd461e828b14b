"""Basis strides: layouts whose values are coordinates, not offsets.

``E(i)`` is the unit vector along mode ``i`` of a coordinate space and
``ScaledBasis(v, i)`` is ``v * E(i)``. A layout whose strides are such bases
maps a coordinate to an :class:`ArithmeticTuple` (a tuple that adds
elementwise) instead of an integer offset. This is how CuTe describes TMA
coordinates (``../shared/reference/cute_tma_tensors.txt``): the identity layout
``(4,8):(1@0,1@1)`` sends ``(i, j)`` to the coordinate ``(i, j)``, and strides
``(1@1,1@0)`` transpose it.

>>> 3 * E(1)
3@1
>>> E(0) * 2 + E(1) * 5
(2,5)
"""

from __future__ import annotations

from .int_tuple import is_int

__all__ = ["ScaledBasis", "E", "ArithmeticTuple", "is_basis"]


def _add(a, b):
  return b if _is_static_zero(a) else a if _is_static_zero(b) else a + b


def _is_static_zero(x) -> bool:
  return is_int(x) and x == 0


class ArithmeticTuple(tuple):
  """A tuple of values that adds elementwise, zero-padding the shorter one.

  Adding a plain int or array is only meaningful for a zero (it comes from a
  stride-0 mode), and is the identity. Numpy defers to this class
  (``__array_ufunc__ = None``), so arrays of coordinates stay arrays inside.

  >>> ArithmeticTuple((1, 2)) + ArithmeticTuple((10,))
  (11,2)
  """

  __slots__ = ()
  __array_ufunc__ = None

  def __add__(self, other):
    if isinstance(other, ScaledBasis):
      other = other.to_tuple()
    if not isinstance(other, tuple):
      if is_int(other) and other != 0:
        raise TypeError(f"cannot add the integer {other} to the coordinate {self}")
      return self
    n = max(len(self), len(other))
    a = tuple(self) + (0,) * (n - len(self))
    b = tuple(other) + (0,) * (n - len(other))
    return ArithmeticTuple(_add(x, y) for x, y in zip(a, b))

  __radd__ = __add__

  def __mul__(self, k):
    return ArithmeticTuple(x * k for x in self)

  __rmul__ = __mul__

  def __repr__(self):
    return "(" + ",".join(str(x) for x in self) + ")"


class ScaledBasis:
  """``value * E(mode)``: a stride that contributes to coordinate ``mode``.

  >>> ScaledBasis(4, 1) * 3 == ScaledBasis(12, 1)
  True
  """

  __slots__ = ("value", "mode")
  __array_ufunc__ = None

  def __init__(self, value, mode: int):
    if not is_int(mode) or mode < 0:
      raise ValueError(f"ScaledBasis: mode must be a non-negative int, got {mode!r}")
    object.__setattr__(self, "value", value)
    object.__setattr__(self, "mode", int(mode))

  def __setattr__(self, name, value):
    raise AttributeError("ScaledBasis is immutable")

  def to_tuple(self) -> ArithmeticTuple:
    return ArithmeticTuple((0,) * self.mode + (self.value,))

  def __mul__(self, k):
    if isinstance(k, (ScaledBasis, tuple)):
      return NotImplemented
    return ScaledBasis(self.value * k, self.mode)

  __rmul__ = __mul__

  def __floordiv__(self, k):
    return ScaledBasis(self.value // k, self.mode)

  def __add__(self, other):
    return self.to_tuple() + other

  __radd__ = __add__

  def __neg__(self):
    return ScaledBasis(-self.value, self.mode)

  def __eq__(self, other):
    return (
        isinstance(other, ScaledBasis)
        and is_int(self.value)
        and (self.value, self.mode) == (other.value, other.mode)
    )

  def __hash__(self):
    return hash(("ScaledBasis", self.value, self.mode))

  def __repr__(self):
    return f"{self.value}@{self.mode}"


def E(mode: int) -> ScaledBasis:
  """The unit basis stride of coordinate ``mode``: ``E(1)`` prints ``1@1``."""
  return ScaledBasis(1, mode)


def is_basis(x) -> bool:
  """Whether `x` is a `ScaledBasis` (a stride along a named mode, as CuTe's E<i>).

  >>> is_basis(E(0)), is_basis(3)
  (True, False)
  """
  return isinstance(x, ScaledBasis)
