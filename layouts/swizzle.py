"""Swizzles and composed layouts.

``Swizzle(B, M, S)`` permutes offsets by XOR-ing the ``B`` bits starting at bit
``M + S`` into the ``B`` bits starting at bit ``M`` (CuTe's ``Swizzle<B,M,S>``:
``yyy`` bits ``[M+S, M+S+B)`` onto ``zzz`` bits ``[M, M+B)``). It is a bijection
on every aligned block of ``2**(M+S+B)`` offsets, and acts on whatever unit the
offsets are in: PTX's 128-byte swizzle is ``Swizzle(3, 4, 3)`` on *byte*
addresses, which is ``Swizzle(3, 3, 3)`` on 16-bit elements
(``upcast(Swizzle(3, 4, 3), 2)``).

A :class:`ComposedLayout` ``outer o offset o inner`` evaluates
``outer(offset + inner(c))``; ``composition(Swizzle(3,4,3), layout)`` builds
one.

>>> sw = Swizzle(3, 4, 3)
>>> sw(0x80), sw(0x90)
(144, 128)
>>> from layouts import Layout, composition
>>> composition(Swizzle(3, 4, 3), Layout((8, 64), (64, 1)))
Sw<3,4,3> o _0 o (8,64):(64,1)
"""

from __future__ import annotations

from .int_tuple import is_int
from .layout import Layout, composition, cosize, slice_and_offset, upcast, downcast, _as_layout, _has_none

__all__ = ["Swizzle", "ComposedLayout"]


def _log2_exact(n: int, what: str) -> int:
  if not is_int(n) or n < 1 or n & (n - 1):
    raise ValueError(f"{what}: {n} is not a power of two")
  return n.bit_length() - 1


class Swizzle:
  """The XOR swizzle ``Sw<B,M,S>`` as a function on offsets (ints, numpy
  arrays or traced jax integers).

  >>> Swizzle(2, 0, 2)(12)
  15
  """

  __slots__ = ("bits", "base", "shift", "__weakref__")  # weakref: jax.jit(swizzle)

  def __init__(self, bits: int, base: int, shift: int):
    for name, v in (("B", bits), ("M", base), ("S", shift)):
      if not is_int(v):
        raise ValueError(f"Swizzle: {name} must be an int, got {v!r}")
    if bits < 0 or base < 0:
      raise ValueError(f"Swizzle: B and M must be non-negative, got B={bits}, M={base}")
    if abs(shift) < bits:
      raise ValueError(
          f"Swizzle: |S| must be at least B (got B={bits}, S={shift}); "
          "otherwise the XOR-ed bit ranges overlap"
      )
    object.__setattr__(self, "bits", int(bits))
    object.__setattr__(self, "base", int(base))
    object.__setattr__(self, "shift", int(shift))

  def __setattr__(self, name, value):
    raise AttributeError("Swizzle is immutable")

  @property
  def yyy_mask(self) -> int:
    """The source bits ``[M + max(S,0), ... + B)``."""
    return ((1 << self.bits) - 1) << (self.base + max(0, self.shift))

  @property
  def zzz_mask(self) -> int:
    """The destination bits ``[M - min(S,0), ... + B)``."""
    return ((1 << self.bits) - 1) << (self.base - min(0, self.shift))

  def __call__(self, offset):
    if self.bits == 0:
      return offset
    if self.shift >= 0:
      return offset ^ ((offset & self.yyy_mask) >> self.shift)
    return offset ^ ((offset & self.yyy_mask) << -self.shift)

  def compose(self, rhs):
    if rhs is None:
      return self
    rhs = _as_layout(rhs)
    if not isinstance(rhs, Layout):
      raise ValueError(f"composition: cannot compose {self} with {rhs!r}")
    return ComposedLayout(self, 0, rhs)

  def upcast(self, n: int) -> "Swizzle":
    """The same permutation on units ``n`` times wider (M shrinks by log2 n)."""
    k = _log2_exact(n, "upcast")
    if k > self.base:
      raise ValueError(
          f"upcast: {self} keeps only 2**{self.base} contiguous units, "
          f"cannot view it in units of {n}"
      )
    return Swizzle(self.bits, self.base - k, self.shift)

  def downcast(self, n: int) -> "Swizzle":
    """The same permutation on units ``n`` times narrower (M grows by log2 n)."""
    return Swizzle(self.bits, self.base + _log2_exact(n, "downcast"), self.shift)

  def __eq__(self, other):
    return isinstance(other, Swizzle) and (self.bits, self.base, self.shift) == (
        other.bits,
        other.base,
        other.shift,
    )

  def __hash__(self):
    return hash((Swizzle, self.bits, self.base, self.shift))

  def __repr__(self):
    return f"Sw<{self.bits},{self.base},{self.shift}>"


class ComposedLayout:
  """``outer o offset o inner``: ``c -> outer(offset + inner(c))``.

  Shape, size, modes, slicing, divides and products act on ``inner``; the
  offset accumulates the origin of slices, so the swizzle sees absolute
  offsets (that is what makes a sliced swizzled tile correct).

  >>> from layouts import Layout
  >>> cl = ComposedLayout(Swizzle(1, 0, 1), 0, Layout(4))
  >>> [cl(i) for i in range(4)]
  [0, 1, 3, 2]
  """

  __slots__ = ("outer", "offset", "inner", "__weakref__")

  def __init__(self, outer, offset, inner):
    if not isinstance(inner, Layout):
      raise ValueError(f"ComposedLayout: inner must be a Layout, got {inner!r}")
    object.__setattr__(self, "outer", outer)
    object.__setattr__(self, "offset", offset)
    object.__setattr__(self, "inner", inner)

  def __setattr__(self, name, value):
    raise AttributeError("ComposedLayout is immutable")

  @staticmethod
  def parse(text: str):
    from .printing import parse_layout

    return parse_layout(text)

  @property
  def shape(self):
    return self.inner.shape

  @property
  def size(self) -> int:
    return self.inner.size

  @property
  def cosize(self) -> int:
    return cosize(self.inner)

  def __len__(self):
    return len(self.inner)

  def __iter__(self):
    return (self[i] for i in range(len(self)))

  def __getitem__(self, i):
    return ComposedLayout(self.outer, self.offset, self.inner[i])

  def __call__(self, *args):
    crd = args if len(args) > 1 else args[0]
    if _has_none(crd):
      return self.slice_and_offset(crd)[0]
    return self.offset_of(crd)

  def offset_of(self, crd):
    """The swizzled offset of a coordinate (what a :class:`Tensor` over
    this layout indexes its engine with)."""
    inner = self.inner.offset_of(crd)
    return self.outer(inner if is_int(self.offset) and self.offset == 0 else self.offset + inner)

  def compose(self, rhs):
    return ComposedLayout(self.outer, self.offset, composition(self.inner, rhs))

  def map_inner(self, fn):
    return ComposedLayout(self.outer, self.offset, fn(self.inner))

  def slice_and_offset(self, crd):
    sub, off = slice_and_offset(crd, self.inner)
    return ComposedLayout(self.outer, self.offset + off, sub), 0

  def upcast(self, n: int):
    if is_int(self.offset) and self.offset % n:
      raise ValueError(f"upcast: offset {self.offset} is not a multiple of {n}")
    return ComposedLayout(upcast(self.outer, n), self.offset // n, upcast(self.inner, n))

  def downcast(self, n: int):
    return ComposedLayout(downcast(self.outer, n), self.offset * n, downcast(self.inner, n))

  def __eq__(self, other):
    return isinstance(other, ComposedLayout) and (self.outer, self.offset, self.inner) == (
        other.outer,
        other.offset,
        other.inner,
    )

  def __hash__(self):
    return hash((ComposedLayout, self.outer, self.offset, self.inner))

  def __repr__(self):
    offset = "_0" if is_int(self.offset) and self.offset == 0 else str(self.offset)
    return f"{self.outer} o {offset} o {self.inner}"
