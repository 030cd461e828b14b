"""Hierarchical integer tuples: CuTe's ``IntTuple`` as plain Python tuples.

An int tuple is an int or a (possibly nested) tuple of int tuples. Leaves that
are *values* (coordinates, indices) may also be numpy arrays or traced jax
integers: every function here that touches values uses only ``+``, ``*``,
``//`` and ``%``, so it works elementwise on all three with no Python branching
on values.

>>> product((2, (3, 4)))
24
>>> prefix_product((2, (3, 4)))
(1, (2, 6))
>>> idx2crd(7, (2, (3, 4)))
(1, (0, 1))
>>> crd2idx((1, (0, 1)), (2, (3, 4)))
7
"""

from __future__ import annotations

import numbers
from functools import reduce

__all__ = [
    "is_int",
    "is_tuple",
    "flatten",
    "unflatten",
    "product",
    "product_each",
    "inner_product",
    "prefix_product",
    "suffix_product",
    "shape_div",
    "ceil_div",
    "crd2idx",
    "idx2crd",
    "congruent",
    "compatible",
    "rank",
    "depth",
]


def is_int(x) -> bool:
  """True for a static Python/numpy integer (not bool)."""
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_tuple(x) -> bool:
  """Whether `x` is a (nested) IntTuple node rather than a leaf (pycute's `is_tuple`).

  >>> is_tuple((2, 3)), is_tuple(4)
  (True, False)
  """
  return isinstance(x, tuple)


def flatten(t) -> tuple:
  """The leaves of ``t`` left to right: ``flatten((1, (2, 3))) == (1, 2, 3)``."""
  if is_tuple(t):
    return tuple(leaf for sub in t for leaf in flatten(sub))
  return (t,)


def unflatten(flat, profile):
  """Rebuild ``flat`` (a sequence of leaves) into the nesting of ``profile``.

  >>> unflatten((1, 2, 3), (0, (0, 0)))
  (1, (2, 3))
  """
  flat = tuple(flat)
  if len(flat) != len(flatten(profile)):
    raise ValueError(f"unflatten: {len(flat)} leaves do not fit profile {profile}")
  it = iter(flat)

  def build(p):
    return tuple(build(q) for q in p) if is_tuple(p) else next(it)

  return build(profile)


def rank(t) -> int:
  """Number of top-level modes (1 for an int)."""
  return len(t) if is_tuple(t) else 1


def depth(t) -> int:
  """Nesting depth: 0 for an int, 1 for a flat tuple."""
  return 1 + max((depth(x) for x in t), default=0) if is_tuple(t) else 0


def product(t):
  """Product of all leaves (1 for the empty tuple)."""
  if is_tuple(t):
    return reduce(lambda acc, x: acc * product(x), t, 1)
  return t


def product_each(t) -> tuple:
  """Product of each top-level mode: ``product_each((2, (3, 4))) == (2, 12)``."""
  return tuple(product(x) for x in t) if is_tuple(t) else (t,)


def inner_product(a, b):
  """Sum of leafwise products of two congruent tuples."""
  if is_tuple(a):
    if not is_tuple(b) or len(a) != len(b):
      raise ValueError(f"inner_product: {a} and {b} are not congruent")
    terms = [inner_product(x, y) for x, y in zip(a, b)]
    return reduce(lambda x, y: x + y, terms) if terms else 0
  if is_tuple(b):
    raise ValueError(f"inner_product: {a} and {b} are not congruent")
  return a * b


def prefix_product(t, init=1):
  """Exclusive prefix product, keeping the nesting (column-major strides).

  >>> prefix_product((2, 3, 4))
  (1, 2, 6)
  """
  if is_tuple(t):
    out = []
    for x in t:
      out.append(prefix_product(x, init))
      init = init * product(x)
    return tuple(out)
  return init


def suffix_product(t, init=1):
  """Exclusive suffix product, keeping the nesting (row-major strides).

  >>> suffix_product((2, 3, 4))
  (12, 4, 1)
  """
  if is_tuple(t):
    out = []
    for x in reversed(t):
      out.append(suffix_product(x, init))
      init = init * product(x)
    return tuple(reversed(out))
  return init


def _tdiv(a: int, b: int) -> int:
  """C++ integer division (truncates toward zero)."""
  q = abs(a) // abs(b)
  return q if (a >= 0) == (b >= 0) else -q


def ceil_div(a: int, b: int) -> int:
  """ceil(a / b) for ints (b > 0).

  >>> ceil_div(7, 2), ceil_div(8, 2)
  (4, 4)
  """
  return -(-a // b)


def shape_div(a, b):
  """CuTe's ``shape_div``: divide shape ``a`` by ``b`` from the left.

  For ints, one must divide the other: ``a / b`` if ``b | a``, else
  ``signum(a*b)`` (so dividing by a larger multiple gives 1). As in CuTe C++
  the division truncates toward zero for negative values (pycute floors).
  For a tuple ``a``, ``b`` is consumed by the modes of ``a`` in order.

  >>> shape_div((4, 6), 8)
  (1, 3)
  """
  if is_tuple(a):
    if is_tuple(b):
      if len(a) != len(b):
        raise ValueError(f"shape_div: {a} and {b} have different ranks")
      return tuple(shape_div(x, y) for x, y in zip(a, b))
    out = []
    for x in a:
      out.append(shape_div(x, b))
      b = shape_div(b, product(x))
    return tuple(out)
  if is_tuple(b):
    return shape_div(a, product(b))
  if b == 0 or (a % b != 0 and b % a != 0):
    raise ValueError(f"shape_div: neither of {a} and {b} divides the other")
  q = _tdiv(a, b)
  if q != 0 or a == 0:
    return q
  return 1 if (a > 0) == (b > 0) else -1


def congruent(a, b) -> bool:
  """Same nesting profile (leaf values ignored)."""
  if is_tuple(a) and is_tuple(b):
    return len(a) == len(b) and all(congruent(x, y) for x, y in zip(a, b))
  return not is_tuple(a) and not is_tuple(b)


def compatible(a, b) -> bool:
  """Shape ``a`` is compatible with shape ``b``: sizes match and every
  coordinate of ``a`` is a valid coordinate of ``b``.

  >>> compatible(24, (4, 6)), compatible((4, 6), 24)
  (True, False)
  """
  if is_tuple(a):
    return is_tuple(b) and len(a) == len(b) and all(compatible(x, y) for x, y in zip(a, b))
  return a == product(b)


def crd2idx(crd, shape, stride=None):
  """Map a coordinate to an index: ``sum(c_i * d_i)``.

  ``crd`` may be hierarchical, or an int (or array) that is first split
  colexicographically over ``shape`` (the last mode takes the remainder, so
  out-of-range values extend the last mode as in CuTe). ``stride`` defaults
  to the column-major ``prefix_product(shape)``.

  >>> crd2idx(5, (2, 3), (3, 1))  # 5 -> (1, 2)
  5
  """
  if stride is None:
    stride = prefix_product(shape)
  if is_tuple(crd):
    if not is_tuple(shape) or len(crd) != len(shape):
      raise ValueError(f"crd2idx: coordinate {crd} does not match shape {shape}")
    terms = [crd2idx(c, s, d) for c, s, d in zip(crd, shape, stride)]
    return reduce(lambda x, y: x + y, terms) if terms else 0
  if is_tuple(shape):
    if len(shape) == 0:
      return 0
    terms = []
    for s, d in zip(shape[:-1], stride[:-1]):
      n = product(s)
      terms.append(crd2idx(crd % n, s, d))
      crd = crd // n
    terms.append(crd2idx(crd, shape[-1], stride[-1]))
    return reduce(lambda x, y: x + y, terms)
  return crd * stride


def idx2crd(idx, shape, stride=None):
  """Map an index to a coordinate of ``shape``: ``(idx // d) % s`` per leaf.

  With the default column-major ``stride`` this inverts ``crd2idx``; every
  mode wraps (CuTe C++'s convention). A tuple ``idx`` is split mode by mode,
  each entry over its own mode.

  >>> idx2crd(4, (2, 3))
  (0, 2)
  >>> idx2crd((3, 5), (4, (2, 4)))
  (3, (1, 2))
  """
  if stride is None:
    if is_tuple(idx):
      if not is_tuple(shape) or len(idx) != len(shape):
        raise ValueError(f"idx2crd: index {idx} does not match shape {shape}")
      return tuple(idx2crd(i, s) for i, s in zip(idx, shape))
    stride = prefix_product(shape)
  if is_tuple(idx):
    if not is_tuple(shape) or len(idx) != len(shape):
      raise ValueError(f"idx2crd: index {idx} does not match shape {shape}")
    return tuple(idx2crd(i, s, d) for i, s, d in zip(idx, shape, stride))
  if is_tuple(shape):
    return tuple(idx2crd(idx, s, d) for s, d in zip(shape, stride))
  if shape == 1:
    return 0  # a size-1 mode has one coordinate, whatever its stride (even 0)
  return (idx // stride) % shape
