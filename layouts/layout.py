"""CuTe layouts and their algebra, as free functions over immutable values.

A :class:`Layout` is a pair of congruent int tuples, ``shape:stride``: a
function from coordinates (or flat indices, split column-major) to offsets
``sum(c_i * d_i)``. Everything follows CuTe C++ (``cute/layout.hpp``); where
pycute or the CuTe DSL differ, the docstring says so.

>>> L = Layout((4, (2, 3)), (6, (3, 1)))
>>> L
(4,(2,3)):(6,(3,1))
>>> L(1, (1, 2)), L(5), size(L), cosize(L)
(11, 9, 24, 24)
>>> composition(Layout(8), Layout(4, 2))
4:2
>>> logical_divide(Layout(24), 4)
(4,6):(1,4)
"""

from __future__ import annotations

import functools
from functools import reduce

from .basis import ArithmeticTuple, ScaledBasis, is_basis
from .int_tuple import (
    ceil_div,
    flatten,
    is_int,
    is_tuple,
    prefix_product,
    product,
    shape_div,
    suffix_product,
    unflatten,
)
from . import int_tuple

__all__ = [
    "Layout",
    "LayoutLeft",
    "LayoutRight",
    "make_layout",
    "size",
    "cosize",
    "rank",
    "depth",
    "coalesce",
    "filter",
    "composition",
    "complement",
    "right_inverse",
    "left_inverse",
    "logical_divide",
    "zipped_divide",
    "tiled_divide",
    "flat_divide",
    "logical_product",
    "zipped_product",
    "tiled_product",
    "flat_product",
    "blocked_product",
    "raked_product",
    "local_tile",
    "local_partition",
    "max_common_vector",
    "max_common_layout",
    "upcast",
    "downcast",
    "recast",
    "group_modes",
    "append",
    "prepend",
    "select",
    "slice_and_offset",
]


class _Major:
  """Stride generators for ``Layout(shape, LayoutLeft)`` / ``LayoutRight``."""

  def __init__(self, name, make):
    self.name, self.make = name, make

  def __repr__(self):
    return self.name


LayoutLeft = _Major("LayoutLeft", prefix_product)
"""Column-major (the default): the leftmost mode is contiguous."""
LayoutRight = _Major("LayoutRight", suffix_product)
"""Row-major: the rightmost mode is contiguous."""


def _normalize_shape(shape):
  if is_tuple(shape):
    return tuple(_normalize_shape(s) for s in shape)
  if not is_int(shape) or shape < 1:
    raise ValueError(f"Layout: shape entries must be positive ints, got {shape!r}")
  return int(shape)


def _normalize_stride(stride):
  if is_tuple(stride):
    return tuple(_normalize_stride(d) for d in stride)
  if is_int(stride):
    return int(stride)
  if is_basis(stride) and is_int(stride.value):
    return stride
  raise ValueError(f"Layout: strides must be ints or ScaledBasis, got {stride!r}")


def _ordered_strides(shape, order):
  leaves, ranks = flatten(shape), flatten(order)
  if len(ranks) != len(leaves):
    raise ValueError(f"Layout: order {order} must have one entry per mode of {shape}")
  strides, current = [0] * len(leaves), 1
  for i in sorted(range(len(leaves)), key=lambda i: (ranks[i], i)):
    strides[i], current = current, current * leaves[i]
  return unflatten(strides, shape)


class Layout:
  """``shape:stride`` as a function from coordinates to offsets.

  ``stride`` defaults to column-major; pass ``LayoutRight`` (or an ``order``
  giving each mode's rank, smallest fastest) for other compact layouts.
  Strides may be :class:`~layouts.basis.ScaledBasis` (coordinate layouts).

  Call it with a flat index, a coordinate, or one argument per mode; ``None``
  in a coordinate keeps that mode (a slice). Indices may be ints, numpy
  integer arrays or traced jax integers.

  >>> Layout((2, 3), LayoutRight)
  (2,3):(3,1)
  >>> Layout((4, 8), (1, 4))(None, 2)
  (4):(1)
  """

  __slots__ = ("shape", "stride", "_modes", "__weakref__")  # _modes: the compiled index function

  def __init__(self, shape, stride=None, *, order=None):
    shape = _normalize_shape(shape)
    if order is not None:
      if stride is not None:
        raise ValueError("Layout: give stride or order, not both")
      stride = _ordered_strides(shape, order)
    elif stride is None or stride is LayoutLeft:
      stride = prefix_product(shape)
    elif stride is LayoutRight:
      stride = suffix_product(shape)
    stride = _normalize_stride(stride)
    if not int_tuple.congruent(shape, stride):
      raise ValueError(f"Layout: stride {stride} is not congruent with shape {shape}")
    leaves = flatten(stride)
    if any(is_basis(d) for d in leaves) and any(is_int(d) and d != 0 for d in leaves):
      raise ValueError(f"Layout: stride {stride} mixes integer and basis strides")
    object.__setattr__(self, "shape", shape)
    object.__setattr__(self, "stride", stride)
    object.__setattr__(self, "_modes", None)

  def __setattr__(self, name, value):
    raise AttributeError("Layout is immutable")

  @staticmethod
  def parse(text: str):
    """Read CuTe notation back: ``Layout.parse("(4,(2,3)):(6,(3,1))")``."""
    from .printing import parse_layout

    return parse_layout(text)

  # -- structure -------------------------------------------------------
  def __eq__(self, other):
    return isinstance(other, Layout) and (self.shape, self.stride) == (other.shape, other.stride)

  def __hash__(self):
    return hash((Layout, self.shape, self.stride))

  def __repr__(self):
    from .printing import format_tuple

    return f"{format_tuple(self.shape)}:{format_tuple(self.stride)}"

  def __len__(self):
    return rank(self)

  def __iter__(self):
    return (self[i] for i in range(len(self)))

  def __getitem__(self, i):
    if isinstance(i, slice):
      return make_layout(*list(self)[i])
    if not is_tuple(self.shape):
      if i in (0, -1):
        return self
      raise IndexError(f"mode {i} of rank-1 layout {self}")
    return Layout(self.shape[i], self.stride[i])

  @property
  def size(self) -> int:
    return product(self.shape)

  @property
  def cosize(self) -> int:
    return cosize(self)

  # -- evaluation ------------------------------------------------------
  def __call__(self, *args):
    if not args:
      raise TypeError("Layout(): give an index or a coordinate")
    crd = args if len(args) > 1 else args[0]
    if _has_none(crd):
      return slice_and_offset(crd, self)[0]
    return _plain(self.offset_of(crd), self._coord_rank())

  def _coord_rank(self) -> int:
    """Length of the coordinates a basis-stride layout returns (0 if none)."""
    modes = [d.mode for d in flatten(self.stride) if is_basis(d)]
    return 1 + max(modes) if modes else 0

  def offset_of(self, crd):
    """Like calling the layout, but a coordinate result stays an
    :class:`~layouts.basis.ArithmeticTuple` (so it can be added to)."""
    if is_tuple(crd):
      return int_tuple.crd2idx(crd, self.shape, self.stride)
    return self._eval_index(crd)

  def _eval_index(self, idx):
    """Evaluate a flat index with the arithmetic one would write by hand:
    ``(i // p) % s * d`` per coalesced mode, compiled once per layout."""
    fn = self._modes
    if fn is None:
      modes = list(zip(flatten(self.shape), flatten(self.stride)))
      fn = _index_function(coalesce(self), absorbing=modes[-1] if modes else None)
      object.__setattr__(self, "_modes", fn)
    return fn(idx)

  def slice_and_offset(self, crd):
    return slice_and_offset(crd, self)


def _index_function(flat: "Layout", absorbing=None):
  """Compile ``i -> flat(i)`` into one Python expression (so numpy can reuse
  its temporaries, as in hand-written code). Only ints are inlined; basis
  strides are bound as constants.

  An index past the layout's size goes on in the last mode of the layout before
  coalescing, `absorbing` = (size, stride), as CuTe's `crd2idx` does: L(i) =
  L(i mod size) + (i // size) * size_last * stride_last (a trailing size-1 mode,
  which coalescing drops, still counts). Traced int32 indices wrap past 2^31 as
  int32 arithmetic does; nothing checks that.
  """
  modes = list(zip(flatten(flat.shape), flatten(flat.stride)))
  if absorbing is not None and modes:
    s_last, d_last = absorbing
    s_c, d_c = modes[-1]
    overflow = s_last * d_last
    if is_int(overflow) and is_int(s_c * d_c) and overflow != s_c * d_c:
      size = 1
      for extent, _ in modes:
        size *= extent
      if size:
        modes.append((1, overflow))  # reached with divisor = size: i // size
  terms, divisor = [], 1
  for k, (s, d) in enumerate(modes):
    coord = "i" if divisor == 1 else f"(i // {divisor})"
    if k < len(modes) - 1:
      coord = f"({coord} % {s})"
    divisor *= s
    if is_int(d) and d == 0:
      continue
    terms.append(
        coord if (is_int(d) and d == 1) else f"{coord} * {d}" if is_int(d) else f"{coord} * _d[{k}]"
    )
  body = " + ".join(terms) if terms else "i * 0"
  strides = tuple(d for _, d in modes)
  return eval(f"lambda i, _d=_d: {body}", {}, {"_d": strides})  # noqa: S307 - ints only


def _memoized(fn):
  """Cache a pure function of hashable layouts and tilers (they are
  immutable), so repeated tiling math costs a dictionary lookup; calls with
  unhashable arguments (e.g. traced values) are computed directly."""
  cached = functools.lru_cache(maxsize=4096)(fn)
  _CACHES.append(cached)

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    try:
      return cached(*args, **kwargs)
    except TypeError as err:
      if "unhashable" not in str(err):
        raise
      return fn(*args, **kwargs)

  return wrapper


_CACHES = []


def clear_caches() -> None:
  """Forget memoized results (to time the algebra cold)."""
  for cache in _CACHES:
    cache.cache_clear()


def _plain(value, rank: int = 0):
  """Coordinates leave the algebra as plain tuples (a jax pytree), padded
  with zeros to ``rank`` entries (``(8,2):(1@0,0)`` at 5 gives ``(5,)``,
  and ``(4,8):(1@0,1@1)`` at 3 gives ``(3, 0)``)."""
  if isinstance(value, ScaledBasis):
    value = value.to_tuple()
  if not isinstance(value, ArithmeticTuple):
    return value
  return tuple(value) + (0,) * (rank - len(value))


def _has_none(crd) -> bool:
  return crd is None or (is_tuple(crd) and any(_has_none(c) for c in crd))


def _as_layout(x):
  return Layout(x) if is_int(x) else x


def make_layout(*layouts) -> Layout:
  """Concatenate layouts (or ints, as compact modes) into one, one mode each.

  >>> make_layout(Layout(2, 4), Layout(3, 1))
  (2,3):(4,1)
  """
  layouts = [_as_layout(x) for x in layouts]
  for x in layouts:
    if not isinstance(x, Layout):
      raise ValueError(f"make_layout: {x!r} is not a Layout")
  return Layout(tuple(x.shape for x in layouts), tuple(x.stride for x in layouts))


def size(x) -> int:
  """Number of coordinates of a layout (or product of a shape)."""
  return product(x) if is_int(x) or is_tuple(x) else x.size


def cosize(layout) -> int:
  """One past the largest offset: the memory a layout spans.

  CuTe computes ``L(size-1) + 1``; this is the same for non-negative strides
  and stays meaningful for negative ones (only positive strides count).
  """
  if not isinstance(layout, Layout):
    return layout.cosize
  leaves = list(zip(flatten(layout.shape), flatten(layout.stride)))
  if any(is_basis(d) for _, d in leaves):
    raise ValueError(f"cosize: {layout} has basis strides (it maps to coordinates)")
  return 1 + sum((s - 1) * d for s, d in leaves if d > 0)


def rank(x) -> int:
  """Number of top-level modes of a layout or shape."""
  return int_tuple.rank(x if is_int(x) or is_tuple(x) else x.shape)


def depth(x) -> int:
  """Nesting depth of a layout's shape (0 for an int shape)."""
  return int_tuple.depth(x if is_int(x) or is_tuple(x) else x.shape)


def _from_modes(modes) -> Layout:
  """Layout from a list of flat (shape, stride) modes: 1:0 if empty,
  an int-shaped layout if one."""
  if not modes:
    return Layout(1, 0)
  if len(modes) == 1:
    return Layout(*modes[0])
  return Layout(tuple(s for s, _ in modes), tuple(d for _, d in modes))


# -- coalesce and filter ---------------------------------------------------


@_memoized
def coalesce(layout, profile=None):
  """Merge adjacent modes that act as one (``s0*d0 == d1``), drop size-1 modes.

  The result has the same function on flat indices and the fewest modes.
  With a tuple ``profile``, each mode ``i < len(profile)`` is coalesced on its
  own (by-mode), later modes kept as they are.

  >>> coalesce(Layout((2, 4), (1, 2)))
  8:1
  >>> coalesce(Layout(((2, 4), (3, 1)), ((1, 2), (8, 5))), (1, 1))
  (8,3):(1,8)
  """
  if not isinstance(layout, Layout):
    return layout.map_inner(lambda L: coalesce(L, profile))
  if is_tuple(profile):
    if len(profile) > rank(layout):
      raise ValueError(f"coalesce: profile {profile} has more modes than {layout}")
    modes = [coalesce(layout[i], p) for i, p in enumerate(profile)]
    return make_layout(*modes, *list(layout)[len(profile) :])
  modes = []
  for s, d in zip(flatten(layout.shape), flatten(layout.stride)):
    if s == 1:
      continue
    if modes and modes[-1][0] * modes[-1][1] == d:
      modes[-1] = (modes[-1][0] * s, modes[-1][1])
    else:
      modes.append((s, d))
  return _from_modes(modes)


@_memoized
def filter(layout) -> Layout:  # noqa: A001 - CuTe's name
  """Coalesce after removing stride-0 (broadcast) modes: the distinct
  offsets of ``layout`` as a compact function.

  >>> filter(Layout((2, 3, 4), (1, 0, 2)))
  8:1
  """
  if not isinstance(layout, Layout):
    return layout.map_inner(filter)
  shape = unflatten(
      [
          1 if (is_int(d) and d == 0) else s
          for s, d in zip(flatten(layout.shape), flatten(layout.stride))
      ],
      layout.shape,
  )
  return coalesce(Layout(shape, layout.stride))


@_memoized
def nullspace(layout) -> Layout:
  """The kernel of ``layout`` (CuTe's ``nullspace``): a layout ``N`` over the indices of
  ``layout``'s domain that it maps to 0, one mode per stride-0 mode of the flattened
  layout, strided as that mode's coordinate in the column-major domain. Then
  ``layout(N(i)) == 0`` for every ``i < size(N)`` and
  ``size(N) * size(filter(layout)) == size(layout)``; ``1:0`` if no mode broadcasts.

  >>> nullspace(Layout((2, 3, 4), (1, 0, 2)))
  3:2
  >>> nullspace(Layout((4, 2), (1, 4)))
  1:0
  """
  if not isinstance(layout, Layout):
    raise ValueError(f"nullspace: {layout!r} is not a plain Layout")
  shapes, strides = flatten(layout.shape), flatten(layout.stride)
  domain_strides = flatten(prefix_product(layout.shape))
  picks = [i for i, d in enumerate(strides) if is_int(d) and d == 0]
  if not picks:
    return Layout(1, 0)
  shape = tuple(shapes[i] for i in picks)
  stride = tuple(domain_strides[i] for i in picks)
  return Layout(shape, stride) if len(picks) > 1 else Layout(shape[0], stride[0])


# -- composition -------------------------------------------------------------


@_memoized
def composition(lhs, rhs):
  """``lhs ∘ rhs``: the layout ``i -> lhs(rhs(i))``, shaped like ``rhs``.

  ``rhs`` may be a layout, an int ``n`` (meaning ``n:1``), or a tuple tiler
  applied by mode (``None`` keeps a mode). ``lhs`` may also be a
  :class:`~layouts.swizzle.Swizzle` or composed layout. Raises ``ValueError``
  when the result is not a layout (CuTe's stride and shape divisibility
  conditions).

  As in CuTe, a multi-mode ``rhs`` is composed mode by mode, so
  ``composition(A, B)(i) == A(B(i))`` holds when the modes of ``B`` land on
  disjoint digits of ``A``'s mixed-radix coordinates (always for rank-1
  ``B`` and for the tilers the algebra builds: ``(T, complement(T))``,
  divides, products); otherwise (e.g. ``A = (2,2):(10,1)``,
  ``B = (2,2):(1,1)``: the result is ``(2,2):(10,10)``, 20 at ``i = 3``,
  but ``A(B(3)) = A(2) = 1``) the sum of ``A``'s per-mode values differs
  from ``A`` of the sum. ``lhs`` is extended past its size along its
  last mode.

  >>> composition(Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1)))
  ((2,2),3):((24,2),8)

  A negative right-hand stride walks ``lhs`` backwards, as in CuTe (which
  carries the stride's sign through the same division): the strides of the
  composition with its absolute value, negated.

  >>> composition(Layout((4, 8), (8, 1)), Layout(4, -1))
  4:-8
  """
  if not isinstance(lhs, Layout):
    if hasattr(lhs, "compose"):
      return lhs.compose(rhs)
    raise ValueError(f"composition: {lhs!r} is not a layout")
  if rhs is None:
    return lhs
  if is_tuple(rhs):
    if len(rhs) > rank(lhs):
      raise ValueError(f"composition: tiler {rhs} has more modes than {lhs}")
    modes = [composition(lhs[i], t) for i, t in enumerate(rhs)]
    return make_layout(*modes, *list(lhs)[len(rhs) :])
  rhs = _as_layout(rhs)
  if not isinstance(rhs, Layout):
    raise ValueError(f"composition: cannot compose {lhs} with {rhs!r}")
  if is_tuple(rhs.shape):
    return make_layout(*(composition(lhs, mode) for mode in rhs))
  return _compose_mode(lhs, rhs.shape, rhs.stride)


def _compose_mode(lhs: Layout, s: int, d) -> Layout:
  if not is_int(d):
    raise ValueError(f"composition: right-hand strides must be ints, got {d}")
  if d == 0:
    return Layout(s, 0)
  if d < 0:  # CuTe carries the sign through: the strides of lhs o s:|d|, negated
    mirrored = _compose_mode(lhs, s, -d)
    return coalesce(
        _from_modes([(m, -e) for m, e in zip(flatten(mirrored.shape), flatten(mirrored.stride))])
    )
  flat = coalesce(lhs)
  modes = list(zip(flatten(flat.shape), flatten(flat.stride)))
  result, rest_shape, rest_stride = [], s, d
  for cs, cd in modes[:-1]:
    if rest_shape == 1:
      break
    if cs % rest_stride != 0 and rest_stride % cs != 0:
      raise ValueError(
          f"composition {lhs} o {s}:{d}: stride divisibility violated "
          f"(mode size {cs} and stride {rest_stride} must divide one another)"
      )
    new_shape = min(shape_div(cs, rest_stride), rest_shape)
    if rest_shape % new_shape != 0:
      raise ValueError(
          f"composition {lhs} o {s}:{d}: shape divisibility violated "
          f"({new_shape} elements of a mode of size {cs} do not divide {rest_shape})"
      )
    if new_shape > 1:
      result.append((new_shape, rest_stride * cd))
    rest_shape //= new_shape
    rest_stride = shape_div(rest_stride, cs)
  if rest_shape > 1 or not result:
    result.append((rest_shape, rest_stride * modes[-1][1]))
  return coalesce(_from_modes(result))


# -- complement and inverses ------------------------------------------------


@_memoized
def complement(layout, cotarget=None, *, strict: bool = True) -> Layout:
  """The layout of the offsets in ``[0, cotarget)`` that ``layout`` misses,
  ordered, so that ``make_layout(layout, complement(layout, n))`` covers
  ``n`` (rounded up to a whole repetition).

  ``cotarget`` (an int or a shape) defaults to ``cosize(layout)``. Requires
  positive strides that, sorted, each divide the span of the modes below
  (otherwise the layout overlaps itself, or its modes interleave, and it has
  no complement). ``strict=False`` is CuTe's (and pycute's) form where it is
  defined: a stride that does not divide the span below gives the floor of the
  quotient, a layout that can miss offsets; modes that start inside
  the span of smaller ones still raise.

  >>> complement(Layout(4, 4), 16)
  4:1
  >>> complement(Layout((2, 2), (1, 6)), 24)
  (3,2):(2,12)
  >>> complement(Layout((2, 3), (2, 5)), 30, strict=False)  # 5 is no multiple of 4
  (2,2):(1,15)
  """
  if not isinstance(layout, Layout):
    raise ValueError(f"complement: {layout!r} is not a plain Layout")
  cotarget = cosize(layout) if cotarget is None else product(cotarget)
  flat = filter(layout)
  modes = [(s, d) for s, d in zip(flatten(flat.shape), flatten(flat.stride)) if s > 1 and d != 0]
  for _, d in modes:
    if not is_int(d) or d < 0:
      raise ValueError(f"complement: {layout} needs positive integer strides, has {d}")
  result, current = [], 1
  for s, d in sorted(modes, key=lambda m: (m[1], m[0])):
    if strict and d % current != 0:
      raise ValueError(
          f"complement: {layout} is not complementable: stride {d} is not a "
          f"multiple of {current}, the span of the smaller modes (the layout overlaps "
          f"itself or its modes interleave; strict=False gives CuTe's result)"
      )
    if d < current:  # CuTe: an overlap fails its check; interleaving gives a 0-size mode
      raise ValueError(
          f"complement: {layout}'s mode {s}:{d} starts inside the span {current} of the "
          "smaller modes (they overlap or interleave): no complement, even CuTe's"
      )
    result.append((d // current, current))
    current = s * d
  result.append((ceil_div(cotarget, current), current))
  return coalesce(_from_modes(result))


@_memoized
def right_inverse(layout) -> Layout:
  """A layout ``R`` with ``layout(R(i)) == i`` for ``i < size(R)``, as large
  as possible (size 1 when ``layout`` has no stride-1 mode).

  >>> right_inverse(Layout((4, 2), (2, 1)))
  (2,4):(4,1)
  """
  if not isinstance(layout, Layout):
    raise ValueError(f"right_inverse: {layout!r} is not a plain Layout")
  flat = coalesce(layout)
  shapes, strides = flatten(flat.shape), flatten(flat.stride)
  if any(is_basis(d) for d in strides):
    raise ValueError(f"right_inverse: {layout} has basis strides")
  pre = flatten(prefix_product(flat.shape))
  result, current = [], 1
  while True:
    k = next(
        (k for k, (s, d) in enumerate(zip(shapes, strides)) if s > 1 and abs(d) == current), None
    )
    if k is None:
      break
    result.append((shapes[k], pre[k] if strides[k] > 0 else -pre[k]))
    current = shapes[k] * abs(strides[k])
  return coalesce(_from_modes(result))


@_memoized
def left_inverse(layout, *, strict: bool = True) -> Layout:
  """A layout ``L`` with ``L(layout(i)) == i`` for every ``i < size(layout)``.

  Exists only for injective, complementable layouts; otherwise raises
  ``ValueError``. Follows CuTe C++: ``right_inverse(make_layout(layout,
  complement(layout)))``. ``strict=False`` is CuTe's quasi-inverse of any layout
  (broadcast modes and non-dividing strides accepted, `complement(strict=False)`):
  ``layout(L(layout(i))) == layout(i)`` then holds where CuTe's does.

  >>> left_inverse(Layout((2, 2), (2, 1)))
  (2,2):(2,1)
  >>> left_inverse(Layout((2, 4), (0, 1)), strict=False)  # the broadcast mode is dropped
  4:2
  """
  if not isinstance(layout, Layout):
    raise ValueError(f"left_inverse: {layout!r} is not a plain Layout")
  if strict:
    for s, d in zip(flatten(layout.shape), flatten(layout.stride)):
      if s > 1 and is_int(d) and d == 0:
        raise ValueError(
            f"left_inverse: {layout} is not injective (mode {s}:0 broadcasts; "
            "strict=False gives CuTe's quasi-inverse)"
        )
  try:
    comp = complement(layout, strict=strict)
  except ValueError as err:
    raise ValueError(f"left_inverse: {layout} has no left inverse: {err}") from None
  return right_inverse(make_layout(layout, comp))


# -- divides and products ----------------------------------------------------


def _by_mode(fn, layout, tiler):
  if len(tiler) > rank(layout):
    raise ValueError(f"tiler {tiler} has more modes than {layout}")
  return make_layout(*(fn(layout[i], t) for i, t in enumerate(tiler)), *list(layout)[len(tiler) :])


@_memoized
def logical_divide(layout, tiler):
  """Split ``layout`` into ``(tile, rest)``: ``layout ∘ (tiler, complement)``.

  A tuple tiler divides by mode. If the size is not a multiple of the tile
  the rest mode rounds up (CuTe's semantics, for predicated edge tiles);
  when that is not expressible as a layout, ``ValueError``.

  >>> logical_divide(Layout((4, 6), (6, 1)), (2, 3))
  ((2,2),(3,2)):((6,12),(1,3))
  """
  if not isinstance(layout, Layout):
    return layout.map_inner(lambda L: logical_divide(L, tiler))
  if tiler is None:
    return layout
  if is_tuple(tiler):
    return _by_mode(logical_divide, layout, tiler)
  tiler = _as_layout(tiler)
  return composition(layout, make_layout(tiler, complement(tiler, size(layout))))


@_memoized
def logical_product(layout, tiler):
  """Repeat ``layout`` over ``tiler``: ``(layout, complement(layout) ∘ tiler)``.

  >>> logical_product(Layout((2, 2), (1, 2)), Layout(3))
  ((2,2),3):((1,2),4)
  """
  if not isinstance(layout, Layout):
    return layout.map_inner(lambda L: logical_product(L, tiler))
  if tiler is None:
    return layout
  if is_tuple(tiler):
    return _by_mode(logical_product, layout, tiler)
  tiler = _as_layout(tiler)
  return make_layout(layout, composition(complement(layout, size(layout) * cosize(tiler)), tiler))


def _unzip(mode, tiler):
  """Split one by-mode result into (tile part, rest part)."""
  if tiler is None:
    return mode, Layout(1, 0)
  if is_tuple(tiler):
    parts = [_unzip(mode[i], t) for i, t in enumerate(tiler)]
    extra = list(mode)[len(tiler) :]
    return make_layout(*(p[0] for p in parts)), make_layout(*(p[1] for p in parts), *extra)
  return mode[0], mode[1]


def _zipped(op, layout, tiler):
  if not isinstance(layout, Layout):
    return layout.map_inner(lambda L: _zipped(op, L, tiler))
  result = op(layout, tiler)
  if not is_tuple(tiler):
    return result
  return make_layout(*_unzip(result, tiler))


@_memoized
def zipped_divide(layout, tiler):
  """``((tile modes...), (rest modes...))``.

  ``None`` in a tuple tiler puts the whole mode in the tile part (and
  ``1:0`` in the rest). pycute puts it whole in the rest instead, and CuTe
  C++ splits a rank-2 mode into its two halves; keeping it whole is what
  ``local_tile(x, (128, None), (m,))`` needs.

  >>> zipped_divide(Layout((8, 6)), (4, 3))
  ((4,3),(2,2)):((1,8),(4,24))
  """
  return _zipped(logical_divide, layout, tiler)


def _expand_second(layout):
  if not isinstance(layout, Layout):
    return layout.map_inner(_expand_second)
  return make_layout(layout[0], *layout[1])


def _expand_both(layout):
  if not isinstance(layout, Layout):
    return layout.map_inner(_expand_both)
  return make_layout(*layout[0], *layout[1])


def tiled_divide(layout, tiler):
  """``((tile modes...), rest0, rest1, ...)``."""
  return _expand_second(zipped_divide(layout, tiler))


def flat_divide(layout, tiler):
  """``(tile0, tile1, ..., rest0, rest1, ...)``."""
  return _expand_both(zipped_divide(layout, tiler))


def zipped_product(layout, tiler):
  """``((layout modes...), (repeat modes...))``."""
  return _zipped(logical_product, layout, tiler)


def tiled_product(layout, tiler):
  """``((layout modes...), repeat0, repeat1, ...)``."""
  return _expand_second(zipped_product(layout, tiler))


def flat_product(layout, tiler):
  """``(layout0, ..., repeat0, ...)``."""
  return _expand_both(zipped_product(layout, tiler))


def _rank_matched_product(block, tiler, block_first: bool):
  tiler = _as_layout(tiler)
  r = max(rank(block), rank(tiler))
  result = logical_product(append(block, rank=r), append(tiler, rank=r))
  pairs = [
      (result[0][i], result[1][i]) if block_first else (result[1][i], result[0][i])
      for i in range(r)
  ]
  return coalesce(make_layout(*(make_layout(a, b) for a, b in pairs)), (1,) * r)


@_memoized
def blocked_product(block, tiler) -> Layout:
  """Tile ``block`` over ``tiler`` keeping each block contiguous:
  mode ``i`` is ``(block_i, tiler_i)``.

  >>> blocked_product(Layout((2, 2), (1, 2)), Layout((2, 3)))
  ((2,2),(2,3)):((1,4),(2,8))
  """
  return _rank_matched_product(block, tiler, block_first=True)


@_memoized
def raked_product(block, tiler) -> Layout:
  """Interleave copies of ``block``: mode ``i`` is ``(tiler_i, block_i)``.

  >>> raked_product(Layout((2, 2), (1, 2)), Layout((2, 3)))
  ((2,2),(3,2)):((4,1),(8,2))
  """
  return _rank_matched_product(block, tiler, block_first=False)


# -- tiles and partitions ---------------------------------------------------


def local_tile(x, tiler, coord):
  """The tile of ``x`` (a layout or :class:`~layouts.tensor.Tensor`) at
  tile coordinate ``coord``: ``zipped_divide(x, tiler)[tile, coord]``.

  Returns a :class:`~layouts.tensor.Tensor` whose offset is the tile's
  origin; ``coord`` may be traced.

  >>> t = local_tile(Layout((8, 6), (6, 1)), (4, 3), (1, 1))
  >>> t.layout, t.offset
  ((4,3):(6,1), 27)
  """
  from .tensor import as_tensor

  t = as_tensor(x)
  tiled = zipped_divide(t.layout, tiler)
  n_rest = rank(tiled[1])
  coord = coord if is_tuple(coord) else (coord,)
  if len(coord) > n_rest:
    raise ValueError(f"local_tile: coordinate {coord} has more modes than the {n_rest} tile modes")
  rest = coord + (None,) * (n_rest - len(coord))
  return t.sliced((_whole(tiled[0]), rest if is_tuple(tiled[1].shape) else rest[0]), tiled)


def local_partition(x, thr_layout, thr_idx):
  """The elements of ``x`` that thread ``thr_idx`` owns when ``thr_layout``
  (threads -> tile position) is repeated over ``x``.

  >>> t = local_partition(Layout((8, 8), (8, 1)), Layout((4, 2), (2, 1)), 3)
  >>> t.layout, t.offset
  ((2,4):(32,2), 9)
  """
  from .tensor import as_tensor

  t = as_tensor(x)
  tiler = tuple(int_tuple.product_each(thr_layout.shape))
  thr_coord = int_tuple.idx2crd(thr_idx, thr_layout.shape, thr_layout.stride)
  tiled = zipped_divide(t.layout, tiler)
  flat_coord = tuple(
      int_tuple.crd2idx(c, s)
      for c, s in zip(
          thr_coord if is_tuple(thr_coord) else (thr_coord,),
          thr_layout.shape if is_tuple(thr_layout.shape) else (thr_layout.shape,),
      )
  )
  inner = flat_coord if is_tuple(tiled[0].shape) else flat_coord[0]
  return t.sliced((inner, _whole(tiled[1])), tiled)


def _whole(layout):
  """A coordinate that keeps every top-level mode of ``layout``."""
  return (None,) * rank(layout) if is_tuple(layout.shape) else None


def slice_and_offset(crd, layout):
  """Split a coordinate with ``None`` entries into the layout of the kept
  modes and the offset of the fixed ones (CuTe's ``slice_and_offset``).

  >>> slice_and_offset((None, 2), Layout((4, 8), (1, 4)))
  ((4):(1), 8)
  """
  if not isinstance(layout, Layout):
    return layout.slice_and_offset(crd)
  sub = _slice(crd, layout.shape, layout.stride)
  offset = _offset(crd, layout.shape, layout.stride)
  return Layout(*sub), (0 if offset is None else offset)


def _slice(crd, shape, stride):
  """Kept (shape, stride) of a coordinate with ``None``s, as CuTe's slice:
  a ``None`` keeps its mode whole, a tuple splices in what it keeps."""
  if crd is None:
    return shape, stride
  if not is_tuple(crd):
    return (), ()
  if not is_tuple(shape) or len(crd) != len(shape):
    raise ValueError(f"slice: coordinate {crd} does not match shape {shape}")
  shapes, strides = [], []
  for c, s, d in zip(crd, shape, stride):
    if c is None:
      shapes.append(s)
      strides.append(d)
    elif is_tuple(c):
      sub = _slice(c, s, d)
      shapes.extend(sub[0])
      strides.extend(sub[1])
  return tuple(shapes), tuple(strides)


def _offset(crd, shape, stride):
  if crd is None:
    return None
  if is_tuple(crd):
    terms = [t for t in (_offset(c, s, d) for c, s, d in zip(crd, shape, stride)) if t is not None]
    return reduce(lambda a, b: a + b, terms) if terms else None
  return int_tuple.crd2idx(crd, shape, stride)


# -- vectors, recasts and mode surgery --------------------------------------


def max_common_layout(a, b) -> Layout:
  """The largest layout ``R`` with ``a(R(i)) == b(R(i))`` contiguous in
  both: the part of ``b``'s inverse on which ``a`` is the identity.

  >>> max_common_layout(Layout((4, 8), (8, 1)), Layout((4, 8), (8, 1)))
  (8,4):(4,1)
  """
  inv_b = right_inverse(b)
  common = coalesce(composition(a, inv_b))
  first = common[0] if is_tuple(common.shape) else common
  if not is_tuple(first.shape) and first.stride == 1:
    return composition(inv_b, first)
  return Layout(1, 0)


def max_common_vector(a, b) -> int:
  """How many elements ``a`` and ``b`` both store contiguously and in the
  same order (the widest vector copy between them).

  >>> max_common_vector(Layout((4, 8), (8, 1)), Layout((4, 8), (1, 4)))
  1
  """
  common = coalesce(composition(a, right_inverse(b)))
  first = common[0] if is_tuple(common.shape) else common
  return first.shape if first.stride == 1 else 1


def upcast(layout, n: int):
  """View ``layout`` in units ``n`` times wider (e.g. 8 bytes -> 1 uint64):
  strides divide by ``n``, contiguous modes shrink by ``n / |stride|``.

  >>> upcast(Layout((4, 8), (8, 1)), 4)
  (4,2):(2,1)
  """
  if not isinstance(layout, Layout):
    return layout.upcast(n)

  def leaf(s, d):
    if is_int(d) and d == 0:
      return s, d
    mag = abs(d.value if is_basis(d) else d)
    new_s = shape_div(s, shape_div(n, mag))
    new_d = ScaledBasis(shape_div(d.value, n), d.mode) if is_basis(d) else shape_div(d, n)
    return new_s, new_d

  pairs = [leaf(s, d) for s, d in zip(flatten(layout.shape), flatten(layout.stride))]
  return Layout(
      unflatten([p[0] for p in pairs], layout.shape), unflatten([p[1] for p in pairs], layout.shape)
  )


def downcast(layout, n: int):
  """View ``layout`` in units ``n`` times narrower: unit-stride modes grow
  by ``n``, other strides scale by ``n``.

  >>> downcast(Layout((4, 2), (2, 1)), 4)
  (4,8):(8,1)
  """
  if not isinstance(layout, Layout):
    return layout.downcast(n)
  pairs = [
      (s * n, d) if (is_int(d) and abs(d) == 1) else (s, d * n)
      for s, d in zip(flatten(layout.shape), flatten(layout.stride))
  ]
  return Layout(
      unflatten([p[0] for p in pairs], layout.shape), unflatten([p[1] for p in pairs], layout.shape)
  )


def recast(layout, old_bits: int, new_bits: int):
  """Reinterpret a layout of ``old_bits``-wide elements as ``new_bits``-wide
  ones (``recast(L, 16, 8)`` is a bf16 layout seen as bytes).

  >>> recast(Layout((8, 64), (64, 1)), 16, 8)
  (8,128):(128,1)
  """
  if old_bits <= 0 or new_bits <= 0:
    raise ValueError(f"recast: bit widths must be positive, got {old_bits} and {new_bits}")
  if new_bits > old_bits:
    if new_bits % old_bits:
      raise ValueError(f"recast: {new_bits} is not a multiple of {old_bits}")
    return upcast(layout, new_bits // old_bits)
  if old_bits % new_bits:
    raise ValueError(f"recast: {old_bits} is not a multiple of {new_bits}")
  return downcast(layout, old_bits // new_bits) if new_bits < old_bits else layout


def group_modes(layout, begin: int, end: int) -> Layout:
  """Group modes ``[begin, end)`` into one: ``group_modes((2,3,4), 1, 3)``
  gives shape ``(2,(3,4))``."""
  modes = list(layout)
  if not 0 <= begin <= end <= len(modes):
    raise ValueError(f"group_modes: [{begin}, {end}) is not a range of the {len(modes)} modes")
  return make_layout(*modes[:begin], make_layout(*modes[begin:end]), *modes[end:])


def append(layout, x=None, *, rank=None) -> Layout:
  """Add ``x`` (default ``1:0``) as a last mode, or pad to ``rank`` modes."""
  x = Layout(1, 0) if x is None else _as_layout(x)
  modes = list(layout)
  if rank is None:
    return make_layout(*modes, x)
  if rank < len(modes):
    raise ValueError(f"append: {layout} already has more than {rank} modes")
  if rank == len(modes) == 1:
    return layout
  return make_layout(*modes, *([x] * (rank - len(modes))))


def prepend(layout, x=None) -> Layout:
  """Add ``x`` (default ``1:0``) as a first mode."""
  return make_layout(Layout(1, 0) if x is None else _as_layout(x), *layout)


def select(layout, *modes: int) -> Layout:
  """The listed modes, in that order: ``select(L, 1, 0)`` swaps two modes."""
  return make_layout(*(layout[i] for i in modes))
