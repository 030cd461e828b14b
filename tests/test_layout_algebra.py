"""Unit tests for Layout and every function of CuTe's layout algebra.

Every expected value is either hand-derived from CuTe's documented semantics
(the arithmetic is spelled out beside it) or checked by brute force: the
reference evaluator ``ref_offsets`` below unravels each flat index
column-major with numpy and dots the coordinate with the strides, using none
of the package's code.
"""

import itertools

import numpy as np
import pytest

from layouts import (
    Layout,
    LayoutLeft,
    LayoutRight,
    append,
    blocked_product,
    coalesce,
    complement,
    composition,
    cosize,
    depth,
    downcast,
    filter,
    flat_divide,
    flat_product,
    group_modes,
    left_inverse,
    local_partition,
    local_tile,
    logical_divide,
    logical_product,
    make_layout,
    max_common_layout,
    max_common_vector,
    prepend,
    raked_product,
    rank,
    recast,
    right_inverse,
    select,
    size,
    slice_and_offset,
    tiled_divide,
    tiled_product,
    upcast,
    zipped_divide,
    zipped_product,
)

from layout_reference import leaves, offsets, ref_offsets


def evaluated(layout, n=None):
  """The package's own evaluation at flat indices 0..n-1."""
  n = size(layout) if n is None else n
  return np.array([layout(i) for i in range(n)], dtype=np.int64)


def same_function(a, b):
  assert size(a) == size(b), (a, b)
  np.testing.assert_array_equal(offsets(a), offsets(b))


def is_injective(layout):
  off = offsets(layout)
  return len(set(off.tolist())) == len(off)


# -- construction ----------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, stride",
    [
        (8, 1),
        ((2, 3), (1, 2)),
        ((2, (3, 4)), (1, (2, 6))),
        (((2, 2), 3), ((1, 2), 4)),
    ],
)
def test_default_stride_is_column_major(shape, stride):
  L = Layout(shape)
  assert L.shape == shape and L.stride == stride
  assert Layout(shape, LayoutLeft) == L
  # Brute force: a compact column-major layout is the identity on indices.
  np.testing.assert_array_equal(offsets(L), np.arange(size(L)))


def test_layout_right_is_row_major():
  L = Layout((2, 3, 4), LayoutRight)
  assert L.stride == (12, 4, 1)
  for i, j, k in itertools.product(range(2), range(3), range(4)):
    assert L(i, j, k) == np.ravel_multi_index((i, j, k), (2, 3, 4), order="C")
  assert Layout(((2, 2), 3), LayoutRight).stride == ((6, 3), 1)


def test_order_gives_each_mode_its_rank():
  # order ranks the modes, smallest fastest: mode 1 first (stride 1), then
  # mode 2 (stride 3), then mode 0 (stride 3*4 = 12).
  assert Layout((2, 3, 4), order=(2, 0, 1)).stride == (12, 1, 3)
  assert Layout(((2, 3), 4), order=((1, 2), 0)).stride == ((4, 8), 1)
  assert Layout((2, 3), order=(0, 1)) == Layout((2, 3))
  assert Layout((2, 3), order=(1, 0)) == Layout((2, 3), LayoutRight)


def test_int_shape_layout():
  L = Layout(8, 2)
  assert (L.shape, L.stride) == (8, 2)
  assert [L(i) for i in range(8)] == [2 * i for i in range(8)]
  assert Layout(8).stride == 1


@pytest.mark.parametrize("shape", [0, -2, (4, 0), (2, (3, -1)), 2.5, "4", True])
def test_shapes_must_be_positive_ints(shape):
  with pytest.raises(ValueError, match="positive ints"):
    Layout(shape)


@pytest.mark.parametrize(
    "shape, stride", [((2, 3), (1,)), ((2, 3), 1), (4, (1, 2)), ((2, (3, 4)), (1, 2, 6))]
)
def test_stride_must_be_congruent(shape, stride):
  with pytest.raises(ValueError, match="not congruent"):
    Layout(shape, stride)


def test_bad_strides_and_orders():
  with pytest.raises(ValueError, match="strides must be"):
    Layout(4, 1.5)
  with pytest.raises(ValueError, match="not both"):
    Layout((2, 3), (1, 2), order=(0, 1))
  with pytest.raises(ValueError, match="one entry per mode"):
    Layout((2, 3), order=(0, 1, 2))


def test_layout_is_immutable_hashable_and_compared_by_value():
  L = Layout((2, 3), (3, 1))
  with pytest.raises(AttributeError):
    L.shape = (3, 2)
  assert L == Layout((2, 3), (3, 1)) and hash(L) == hash(Layout((2, 3), (3, 1)))
  assert L != Layout((2, 3)) and L != Layout((3, 2), (1, 3))
  assert L != "(2,3):(3,1)"
  assert len({L, Layout((2, 3), (3, 1)), Layout((2, 3))}) == 2


def test_make_layout_concatenates_modes():
  assert make_layout(Layout(2, 4), Layout(3, 1)) == Layout((2, 3), (4, 1))
  assert make_layout(Layout((2, 2), (1, 2)), 3) == Layout(((2, 2), 3), ((1, 2), 1))
  assert make_layout(Layout(5, 7)) == Layout((5,), (7,))
  with pytest.raises(ValueError, match="not a Layout"):
    make_layout(Layout(2), "x")


# -- size, cosize, rank, depth, modes -------------------------------------------


@pytest.mark.parametrize(
    "shape, stride",
    [
        (8, 1),
        ((4, 3), (1, 4)),
        ((4, (2, 3)), (6, (3, 1))),
        ((2, 3, 4), (0, 1, 5)),
        ((3, 2), (2, 7)),
        (((2, 2), (3, 1)), ((1, 8), (2, 100))),
    ],
)
def test_size_and_cosize_by_brute_force(shape, stride):
  L = Layout(shape, stride)
  off = ref_offsets(shape, stride)
  assert size(L) == L.size == len(off)
  assert cosize(L) == L.cosize == off.max() + 1


def test_rank_and_depth():
  assert (rank(Layout(8)), depth(Layout(8))) == (1, 0)
  assert (rank(Layout((4, 3))), depth(Layout((4, 3)))) == (2, 1)
  assert (rank(Layout((4, (2, 3)))), depth(Layout((4, (2, 3))))) == (2, 2)
  assert (rank(Layout(((2, (2, 2)), 3))), depth(Layout(((2, (2, 2)), 3)))) == (2, 3)
  assert size((2, (3, 4))) == 24 and rank((2, 3, 4)) == 3 and depth(5) == 0


def test_getitem_extracts_modes():
  L = Layout((4, (2, 3)), (6, (3, 1)))
  assert L[0] == Layout(4, 6)
  assert L[1] == Layout((2, 3), (3, 1))
  assert L[-1] == L[1]
  assert L[1][0] == Layout(2, 3)
  assert len(L) == 2 and list(L) == [L[0], L[1]]
  assert L[0:2] == L
  assert L[1:] == Layout(((2, 3),), ((3, 1),))
  one = Layout(5, 3)
  assert one[0] == one and one[-1] == one and list(one) == [one]
  with pytest.raises(IndexError):
    one[1]


# -- evaluation --------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, stride",
    [
        (8, 3),
        ((4, 3), (1, 4)),
        ((4, 3), (3, 1)),
        ((4, (2, 3)), (6, (3, 1))),
        ((2, 3, 4), (0, 7, 1)),
        (((2, 2), (3, 2)), ((1, 12), (4, 2))),
        ((3, 1, 2), (5, 100, 1)),
    ],
)
def test_flat_index_evaluation_matches_brute_force(shape, stride):
  L = Layout(shape, stride)
  np.testing.assert_array_equal(evaluated(L), ref_offsets(shape, stride))


def test_call_forms():
  L = Layout((4, (2, 3)), (6, (3, 1)))
  for i, j, k in itertools.product(range(4), range(2), range(3)):
    want = 6 * i + 3 * j + k
    assert L((i, (j, k))) == want
    assert L(i, (j, k)) == want
    # An int coordinate for a nested mode is split column-major in it.
    assert L(i, j + 2 * k) == want
    # And a flat index over the whole layout.
    assert L(i + 4 * j + 8 * k) == want
  with pytest.raises(TypeError):
    L()
  with pytest.raises(ValueError, match="does not match"):
    L((1, 2, 3))


def test_none_slicing_keeps_modes():
  L = Layout((4, 8), (1, 4))
  col = L(None, 2)
  assert col == Layout((4,), (1,))
  row = L(3, None)
  assert row == Layout((8,), (4,))
  # The offset of the fixed coordinate goes with slice_and_offset.
  sub, off = slice_and_offset((None, 2), L)
  assert (sub, off) == (Layout((4,), (1,)), 8)
  for i in range(4):
    assert sub(i) + off == L(i, 2)


def test_nested_none_slicing_and_offset_by_brute_force():
  L = Layout((4, (2, 3)), (6, (3, 1)))
  sub, off = L.slice_and_offset((None, (1, None)))
  assert sub == Layout((4, 3), (6, 1)) and off == 3
  for i, k in itertools.product(range(4), range(3)):
    assert sub(i, k) + off == L(i, (1, k))
  sub, off = slice_and_offset((2, (None, 1)), L)
  assert sub == Layout((2,), (3,)) and off == 12 + 1
  sub, off = slice_and_offset((None, None), L)
  assert sub == L and off == 0
  sub, off = slice_and_offset((1, 5), L)  # no None: everything fixed
  assert sub == Layout((), ()) and off == L(1, 5)


def test_slice_coordinate_must_match_the_shape():
  L = Layout((4, (2, 3)), (6, (3, 1)))
  with pytest.raises(ValueError, match="does not match"):
    L(None, 1, 2)
  with pytest.raises(ValueError, match="does not match"):
    slice_and_offset((None, (1, None, 0)), L)


# -- coalesce and filter ---------------------------------------------------------


@pytest.mark.parametrize(
    "shape, stride, expected",
    [
        ((2, 4), (1, 2), Layout(8, 1)),  # 2*1 == 2: one mode
        ((2, (1, 6)), (1, (7, 2)), Layout(12, 1)),  # size-1 mode dropped
        ((2, 4), (4, 1), Layout((2, 4), (4, 1))),  # not mergeable
        ((4, 2, 3), (3, 12, 1), Layout((8, 3), (3, 1))),
        ((2, 3), (0, 0), Layout(6, 0)),  # 2*0 == 0
        ((1, 1), (5, 3), Layout(1, 0)),  # all size 1
        (((2, 2), (2, 2)), ((1, 2), (4, 16)), Layout((8, 2), (1, 16))),
    ],
)
def test_coalesce(shape, stride, expected):
  L = Layout(shape, stride)
  C = coalesce(L)
  assert C == expected
  same_function(C, L)


def test_coalesce_by_mode_profile():
  L = Layout(((2, 4), (3, 1)), ((1, 2), (8, 5)))
  C = coalesce(L, (1, 1))
  assert C == Layout((8, 3), (1, 8))
  # Mode by mode: the mode functions are unchanged and the rank is kept,
  # even though the whole layout would coalesce further (8*1 == 8).
  assert coalesce(L) == Layout(24, 1)
  for i in range(2):
    same_function(C[i], L[i])
  # A shorter profile leaves later modes alone.
  L3 = Layout(((2, 2), (2, 2), (3, 1)), ((1, 2), (1, 2), (1, 3)))
  assert coalesce(L3, (1,)) == Layout((4, (2, 2), (3, 1)), (1, (1, 2), (1, 3)))
  with pytest.raises(ValueError, match="profile"):
    coalesce(Layout((2, 2)), (1, 1, 1))


@pytest.mark.parametrize(
    "shape, stride, expected",
    [
        ((2, 3, 4), (1, 0, 2), Layout(8, 1)),
        ((4, 3), (0, 0), Layout(1, 0)),
        ((2, (3, 2)), (3, (0, 1)), Layout((2, 2), (3, 1))),
    ],
)
def test_filter(shape, stride, expected):
  L = Layout(shape, stride)
  F = filter(L)
  assert F == expected
  assert set(offsets(F).tolist()) == set(offsets(L).tolist())
  assert 0 not in [d for s, d in zip(leaves(F.shape), leaves(F.stride)) if s > 1]


# -- composition -------------------------------------------------------------------


def check_composition(A, B, R):
  """R == A o B: shaped like B, R(i) == A(B(i)) (brute force on both)."""
  assert size(R) == size(B)
  a, b = offsets(A), offsets(B)
  assert b.max() < len(a), "test composes only within A's domain"
  np.testing.assert_array_equal(offsets(R), a[b])


@pytest.mark.parametrize(
    "A, B, expected",
    [
        # CuTe's documented example.
        (Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1)), Layout(((2, 2), 3), ((24, 2), 8))),
        # (8):(1) o (4):(2) = (4):(2): offsets 0, 2, 4, 6.
        (Layout(8, 1), Layout(4, 2), Layout(4, 2)),
        # Compact 4x6 row-major A, a 2x3 block of B: A o B is the block in A.
        (Layout((4, 6), (6, 1)), Layout((2, 3), (1, 4)), Layout((2, 3), (6, 1))),
        (Layout(20, 2), Layout((4, 5), (5, 1)), Layout((4, 5), (10, 2))),
        (Layout((10, 2), (16, 4)), Layout((5, 4), (1, 5)), Layout((5, (2, 2)), (16, (80, 4)))),
        # A stride-0 right-hand mode broadcasts.
        (Layout((4, 4), (4, 1)), Layout((2, 4), (0, 1)), Layout((2, 4), (0, 4))),
    ],
)
def test_composition_known_values(A, B, expected):
  R = composition(A, B)
  check_composition(A, B, R)
  assert R == expected


def test_composition_with_int_and_identity():
  A = Layout((4, 6), (6, 1))
  assert composition(A, 8) == composition(A, Layout(8, 1))
  check_composition(A, Layout(8), composition(A, 8))
  # Composing with the compact layout of its own size is the coalesced A.
  same_function(composition(A, Layout(24)), A)
  assert composition(Layout(24), A) == A
  assert composition(A, None) == A


def test_composition_by_mode_tiler():
  A = Layout((12, (4, 8)), (59, (13, 1)))
  R = composition(A, (Layout(3, 4), Layout(8, 2)))
  # Mode 0: 12:59 o 3:4 = 3:236.  Mode 1: (4,8):(13,1) o 8:2 = (2,4):(26,1).
  assert R == Layout((3, (2, 4)), (236, (26, 1)))
  for i, j in itertools.product(range(3), range(8)):
    assert R(i, j) == A(4 * i, 2 * j)
  # None keeps a mode; an int is n:1; missing trailing modes are kept.
  assert composition(A, (None, 4)) == make_layout(A[0], composition(A[1], Layout(4)))
  assert composition(A, (Layout(3, 4),)) == make_layout(composition(A[0], Layout(3, 4)), A[1])
  with pytest.raises(ValueError, match="more modes"):
    composition(Layout((2, 2)), (1, 1, 1))


def test_composition_is_by_mode_when_right_modes_share_digits():
  # B's two leaves both step through A's first digit, so A is not additive
  # on them: CuTe composes leaf by leaf, which is not A(B(i)) at i = 3.
  A, B = Layout((2, 2), (10, 1)), Layout((2, 2), (1, 1))
  R = composition(A, B)
  assert R == Layout((2, 2), (10, 10))
  assert [R(i) for i in range(4)] == [A(0), A(1), A(1), A(1) + A(1)]
  assert R(3) == 20 and A(B(3)) == A(2) == 1


def test_composition_extends_the_last_mode():
  # B reaches past size(A): CuTe extends A's last (coalesced) mode.
  assert composition(Layout(4, 3), Layout(2, 4)) == Layout(2, 12)
  assert composition(Layout((2, 2), (1, 10)), Layout(3, 2)) == Layout(3, 10)


def test_composition_stride_divisibility_violation():
  # A = (3,4):(4,1); B = 2:2 steps by 2 through a mode of size 3.
  with pytest.raises(ValueError, match="stride divisibility"):
    composition(Layout((3, 4), (4, 1)), Layout(2, 2))


def test_composition_shape_divisibility_violation():
  # B = 4:1 takes the 3 elements of A's first mode, 3 does not divide 4.
  with pytest.raises(ValueError, match="shape divisibility"):
    composition(Layout((3, 4), (4, 1)), Layout(4, 1))


@pytest.mark.parametrize(
    "lhs,s,d",
    [
        (Layout(16, 3), 4, -2),
        (Layout((4, 8), (8, 1)), 4, -1),
        (Layout((2, 4, 2), (1, 4, 16)), 8, -2),
    ],
)
def test_composition_with_a_negative_right_hand_stride_carries_the_sign(lhs, s, d):
  """CuTe's rule: the composition with |d|, every stride negated, so offsets run backwards
  from 0; on a rank-1 lhs it is lhs's linear extension at rhs's negative offsets."""
  result, positive = composition(lhs, Layout(s, d)), composition(lhs, Layout(s, -d))
  assert [result(i) for i in range(s)] == [-positive(i) for i in range(s)]
  assert [positive(i) for i in range(s)] == [lhs(-d * i) for i in range(s)]
  if isinstance(lhs.shape, int):
    assert [result(i) for i in range(s)] == [lhs.stride * d * i for i in range(s)]


def test_composition_by_mode_keeps_each_mode_sign():
  lhs = Layout((4, 8), (8, 1))
  result = composition(lhs, Layout((2, 4), (-1, 2)))
  assert result == make_layout(composition(lhs, Layout(2, -1)), composition(lhs, Layout(4, 2)))


def test_composition_rejects_bad_right_hand_strides():
  with pytest.raises(ValueError, match="not a layout"):
    composition("nope", Layout(2))
  with pytest.raises(ValueError, match="cannot compose"):
    composition(Layout(8), 2.5)


def test_composition_is_associative_on_an_example():
  A, B, C = Layout((4, 8), (8, 1)), Layout((8, 4), (4, 1)), Layout((2, 4), (1, 8))
  same_function(composition(composition(A, B), C), composition(A, composition(B, C)))


# -- complement -------------------------------------------------------------------


def check_complement(L, n, C):
  """C has sorted strides, its image meets L's only at 0, and
  (L, C) is injective and covers [0, n)."""
  flat = [(s, d) for s, d in zip(leaves(C.shape), leaves(C.stride)) if s > 1]
  ds = [d for _, d in flat]
  assert ds == sorted(ds)
  assert set(offsets(L).tolist()) & set(offsets(C).tolist()) == {0}
  full = offsets(make_layout(L, C))
  assert len(set(full.tolist())) == len(full)
  assert set(range(n)) <= set(full.tolist())
  # Size: n rounded up to whole repetitions of L's span (the end of its
  # largest-stride mode).
  span = max(
      [s * d for s, d in zip(leaves(L.shape), leaves(L.stride)) if s > 1 and d > 0], default=1
  )
  assert len(set(offsets(L).tolist())) * size(C) == -(-n // span) * span


@pytest.mark.parametrize(
    "L, n, expected",
    [
        (Layout(4, 2), 24, Layout((2, 3), (1, 8))),  # fills odd offsets, then repeats at 8
        (Layout((2, 4), (1, 6)), 24, Layout(3, 2)),  # {0,1,6,7,...} + {0,2,4}
        (Layout(4, 4), 16, Layout(4, 1)),
        (Layout((2, 2), (1, 6)), 24, Layout((3, 2), (2, 12))),
        (Layout(4, 1), 24, Layout(6, 4)),
        (Layout(4, 1), 4, Layout(1, 0)),  # nothing left
        (Layout((4, 2), (2, 1)), 16, Layout(2, 8)),  # image 0..7 in another order
        (Layout(3, 1), 10, Layout(4, 3)),  # ceil(10/3) == 4 repetitions
    ],
)
def test_complement_known_values(L, n, expected):
  C = complement(L, n)
  assert C == expected
  check_complement(L, n, C)


def test_complement_default_cotarget_and_shape_cotarget():
  # Default cotarget is cosize(L): (2,2):(1,6) spans 8 -> fill 0..7.
  L = Layout((2, 2), (1, 6))
  assert complement(L) == Layout(3, 2)
  assert complement(L, (4, 6)) == complement(L, 24)
  # Stride-0 and size-1 modes are ignored.
  assert complement(Layout((4, 3, 1), (2, 0, 9)), 24) == Layout((2, 3), (1, 8))


@pytest.mark.parametrize(
    "L", [Layout((2, 2), (1, 1)), Layout((2, 3), (2, 3)), Layout((2, 4), (2, 1))]
)
def test_complement_of_self_overlapping_layout_raises(L):
  with pytest.raises(ValueError, match="not complementable"):
    complement(L, 64)


@pytest.mark.parametrize(
    "L", [Layout((2, 3), (2, 5)), Layout((3, 2), (1, 4)), Layout((2, 2, 3), (1, 3, 7))]
)
def test_cute_complement_of_strides_that_do_not_divide(L):
  with pytest.raises(ValueError, match="strict=False"):
    complement(L, 64)
  # CuTe's result: L and its complement together are injective (they may miss offsets)
  both = make_layout(L, complement(L, 64, strict=False))
  assert len(set(offsets(both).tolist())) == size(both)
  assert complement(Layout((2, 3), (2, 5)), 30, strict=False) == Layout((2, 2), (1, 15))


@pytest.mark.parametrize(
    "L", [Layout((4, 3), (3, 1)), Layout((2, 2), (1, 6)), Layout((4, 3, 1), (2, 0, 9))]
)
def test_cute_complement_agrees_where_the_strict_one_is_defined(L):
  assert complement(L, 48, strict=False) == complement(L, 48)


def test_cute_complement_still_refuses_interleaved_modes():
  with pytest.raises(ValueError, match="even CuTe's"):
    complement(Layout((2, 3), (2, 3)), 18, strict=False)


def test_complement_needs_positive_integer_strides():
  with pytest.raises(ValueError, match="positive integer strides"):
    complement(Layout(4, -1), 8)
  from layouts import Swizzle

  with pytest.raises(ValueError, match="plain Layout"):
    complement(composition(Swizzle(1, 0, 1), Layout(4)), 8)


# -- inverses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "L, expected",
    [
        (Layout((4, 2), (2, 1)), Layout((2, 4), (4, 1))),
        (Layout((2, 3), (3, 1)), Layout((3, 2), (2, 1))),
        (Layout(8, 1), Layout(8, 1)),
        (Layout(4, 2), Layout(1, 0)),  # no stride-1 mode: only 0 -> 0
        (Layout((2, 4), (0, 1)), Layout(4, 2)),  # broadcast mode skipped
        (Layout((2, 4, 3), (1, 6, 2)), Layout((2, 3, 4), (1, 8, 2))),
    ],
)
def test_right_inverse(L, expected):
  R = right_inverse(L)
  assert R == expected
  # Brute force: L(R(i)) == i for every i < size(R).
  np.testing.assert_array_equal(offsets(L)[offsets(R)], np.arange(size(R)))


def test_right_inverse_of_bijection_is_two_sided():
  L = Layout((3, (2, 4)), (8, (1, 2)))
  R = right_inverse(L)
  assert size(R) == 24
  np.testing.assert_array_equal(offsets(R)[offsets(L)], np.arange(24))


def test_right_inverse_negative_stride():
  # 4:-1 maps i -> -i; its right inverse maps i -> -i too.
  R = right_inverse(Layout(4, -1))
  assert R == Layout(4, -1)
  assert [Layout(4, -1)(R(i)) for i in range(4)] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "L, expected",
    [
        (Layout((2, 2), (2, 1)), Layout((2, 2), (2, 1))),
        (Layout(4, 2), Layout((2, 4), (4, 1))),
        # complement((3,2):(1,6), cosize 9) = 2:3; right_inverse of
        # ((3,2),2):((1,6),3) follows strides 1, 3, 6: (3,2,2):(1,6,3).
        (Layout((3, 2), (1, 6)), Layout((3, 2, 2), (1, 6, 3))),
    ],
)
def test_left_inverse(L, expected):
  Linv = left_inverse(L)
  # Brute force: Linv(L(i)) == i for every i < size(L).
  np.testing.assert_array_equal(evaluated(Linv, cosize(L))[offsets(L)], np.arange(size(L)))
  assert Linv == expected


@pytest.mark.parametrize(
    "L", [Layout((4, 2), (1, 0)), Layout((2, 4), (0, 1)), Layout((2, 3, 2), (2, 0, 1))]
)
def test_cute_quasi_inverse_of_broadcasting_layouts(L):
  Linv = left_inverse(L, strict=False)
  # L(Linv(L(i))) == L(i): each offset goes back to an index with that offset
  image = offsets(L)
  np.testing.assert_array_equal(offsets(L)[evaluated(Linv, cosize(L))[image]], image)


def test_left_inverse_does_not_exist_for_non_injective_layouts():
  with pytest.raises(ValueError, match="not injective.*strict=False"):
    left_inverse(Layout((4, 2), (1, 0)))
  with pytest.raises(ValueError, match="no left inverse"):
    left_inverse(Layout((2, 2), (1, 1)))
  with pytest.raises(ValueError, match="no left inverse"):
    left_inverse(Layout(4, -1))


# -- divides -------------------------------------------------------------------------


def test_logical_divide_1d():
  # (24):(1) / (4):(1) = (4,6):(1,4): tile-internal and tile-external modes.
  D = logical_divide(Layout(24), Layout(4))
  assert D == Layout((4, 6), (1, 4))
  assert logical_divide(Layout(24), 4) == D
  # Divide by a strided tiler: the tile is {0,2,4,6}, the rest fills 1 and 8k.
  L = Layout(24, 3)
  D = logical_divide(L, Layout(4, 2))
  tile, rest = [0, 2, 4, 6], [0, 1, 8, 9, 16, 17]
  for i, j in itertools.product(range(4), range(6)):
    assert D((i, j)) == L(tile[i] + rest[j])


def test_logical_divide_by_mode():
  L = Layout((4, 6), (6, 1))
  D = logical_divide(L, (2, 3))
  assert D.shape == ((2, 2), (3, 2))
  for i0, j0, i1, j1 in itertools.product(range(2), range(2), range(3), range(2)):
    assert D((i0, j0), (i1, j1)) == L(i0 + 2 * j0, i1 + 3 * j1)
  assert logical_divide(L, None) == L
  assert logical_divide(L, (None, 3)) == make_layout(L[0], logical_divide(L[1], 3))


def test_logical_divide_rounds_the_rest_up():
  # 10 elements in tiles of 4: 3 tiles, the last one partly outside.
  D = logical_divide(Layout(10), 4)
  assert D == Layout((4, 3), (1, 4))


@pytest.mark.parametrize(
    "L",
    [
        Layout((8, 6)),
        Layout((8, 6), (6, 1)),
        Layout(((2, 4), 6), ((1, 12), 2)),
    ],
)
def test_zipped_tiled_flat_divide_by_mode(L):
  t0, t1 = 4, 3
  Z, T, F = zipped_divide(L, (t0, t1)), tiled_divide(L, (t0, t1)), flat_divide(L, (t0, t1))
  r0, r1 = size(L[0]) // t0, size(L[1]) // t1
  assert rank(Z) == 2 and rank(Z[0]) == rank(Z[1]) == 2
  assert [size(Z[0][0]), size(Z[0][1]), size(Z[1][0]), size(Z[1][1])] == [t0, t1, r0, r1]
  assert rank(T) == 3 and rank(F) == 4
  for i0, i1, j0, j1 in itertools.product(range(t0), range(t1), range(r0), range(r1)):
    want = L(i0 + t0 * j0, i1 + t1 * j1)
    assert Z((i0, i1), (j0, j1)) == want
    assert T((i0, i1), j0, j1) == want
    assert F(i0, i1, j0, j1) == want


def test_zipped_divide_docstring_example_by_brute_force():
  L = Layout((8, 8), (8, 1))
  Z = zipped_divide(L, (4, 2))
  assert Z == Layout(((4, 2), (2, 4)), ((8, 1), (32, 2)))


def test_zipped_divide_with_layout_tiler_is_logical_divide():
  # A Layout tiler divides the flat index space: the result is already
  # (tile, rest); tiled/flat divide splice the rest's modes in.
  L, T = Layout((8, 6)), Layout(4, 2)
  D = logical_divide(L, T)
  assert zipped_divide(L, T) == D
  assert rank(D[1]) == 2
  assert tiled_divide(L, T) == make_layout(D[0], *D[1])


def test_divide_raises_when_tile_does_not_fit():
  # (3,4):(4,1) / 2: the rest 6:2 steps by 2 through a mode of size 3.
  with pytest.raises(ValueError, match="stride divisibility"):
    logical_divide(Layout((3, 4), (4, 1)), 2)
  with pytest.raises(ValueError, match="more modes"):
    logical_divide(Layout(8), (2, 2))


# -- products --------------------------------------------------------------------------


def test_logical_product_known_values():
  # CuTe's tutorial: (2,2):(4,1) x 6:1. complement((2,2):(4,1), 24) = (2,3):(2,8).
  A = Layout((2, 2), (4, 1))
  P = logical_product(A, Layout(6))
  assert P == Layout(((2, 2), (2, 3)), ((4, 1), (2, 8)))
  # Docstring: (2,2):(1,2) x 3 == ((2,2),3):((1,2),4).
  assert logical_product(Layout((2, 2), (1, 2)), Layout(3)) == Layout(((2, 2), 3), ((1, 2), 4))
  # A strided tiler picks every other copy: complement (2,4):(2,8) o 4:2 == 4:8.
  assert logical_product(A, Layout(4, 2)) == Layout(((2, 2), 4), ((4, 1), 8))
  # The cotarget is size(A) * cosize(B): for A = 2:2 (image {0,2}) and
  # B = 2:2 (cosize 3), complement(A, 6) = (2,2):(1,4), and copy B(1) = 2
  # starts at its offset 2 -> 4, disjoint from A's image.
  P = logical_product(Layout(2, 2), Layout(2, 2))
  assert P == Layout((2, 2), (2, 4))
  assert sorted(offsets(P).tolist()) == [0, 2, 4, 6]


@pytest.mark.parametrize(
    "A, B",
    [
        (Layout((2, 2), (1, 2)), Layout(3)),
        (Layout((2, 3), (3, 1)), Layout((2, 2), (2, 1))),
        (Layout(4), Layout((2, 3), (3, 1))),
        (Layout(4), Layout(3, 2)),
    ],
)
def test_logical_product_of_compact_block(A, B):
  # For a compact block A (image [0, n)), copy j of A starts at n * B(j).
  P = logical_product(A, B)
  n = size(A)
  assert P[0] == A and size(P) == size(A) * size(B)
  a, b = offsets(A), offsets(B)
  for j in range(size(B)):
    for i in range(n):
      assert P((i, j)) == a[i] + n * b[j]


def test_zipped_tiled_flat_product_by_mode():
  A = Layout((2, 3))
  tiler = (Layout(2), Layout(4))
  Z, T, F = zipped_product(A, tiler), tiled_product(A, tiler), flat_product(A, tiler)
  assert rank(Z) == 2 and [size(m) for m in (Z[0][0], Z[0][1], Z[1][0], Z[1][1])] == [2, 3, 2, 4]
  assert rank(T) == 3 and rank(F) == 4
  # Mode 0 (2:1) is compact: copy j0 starts at 2*j0. Mode 1 (3:2, image
  # {0,2,4}) leaves gaps: its copies start at the smallest uncovered
  # offsets 0, 1, 6, 7 (complement (2,2):(1,6)).
  origins1 = [0, 1, 6, 7]
  for i0, i1, j0, j1 in itertools.product(range(2), range(3), range(2), range(4)):
    want = i0 + 2 * j0 + 2 * i1 + origins1[j1]
    assert Z((i0, i1), (j0, j1)) == want
    assert T((i0, i1), j0, j1) == want
    assert F(i0, i1, j0, j1) == want


@pytest.mark.parametrize(
    "A, B",
    [
        (Layout((2, 2), (1, 2)), Layout((2, 3))),
        (Layout((2, 5), (5, 1)), Layout((3, 4), (4, 1))),
        (Layout((3, 2)), Layout((2, 2), (1, 4))),
    ],
)
def test_blocked_and_raked_products(A, B):
  a0, a1 = size(A[0]), size(A[1])
  b0, b1 = size(B[0]), size(B[1])
  n = size(A)
  bl, rk = blocked_product(A, B), raked_product(A, B)
  assert rank(bl) == rank(rk) == 2
  assert (size(bl[0]), size(bl[1])) == (a0 * b0, a1 * b1)
  assert (size(rk[0]), size(rk[1])) == (a0 * b0, a1 * b1)
  for r, c in itertools.product(range(a0 * b0), range(a1 * b1)):
    # blocked: block (r // a0, c // a1) holds a contiguous copy of A.
    assert bl(r, c) == A(r % a0, c % a1) + n * B(r // a0, c // a1)
    # raked: copies interleave, element (r % b0, c % b1) of B's grid.
    assert rk(r, c) == A(r // b0, c // b1) + n * B(r % b0, c % b1)


def test_blocked_and_raked_product_docstrings():
  assert blocked_product(Layout((2, 2), (1, 2)), Layout((2, 3))) == Layout(
      ((2, 2), (2, 3)), ((1, 4), (2, 8))
  )
  assert raked_product(Layout((2, 2), (1, 2)), Layout((2, 3))) == Layout(
      ((2, 2), (3, 2)), ((4, 1), (8, 2))
  )


def test_blocked_product_rank_mismatch_pads_with_unit_modes():
  P = blocked_product(Layout(4), Layout((2, 3)))
  assert rank(P) == 2 and (size(P[0]), size(P[1])) == (8, 3)
  for r, c in itertools.product(range(8), range(3)):
    assert P(r, c) == (r % 4) + 4 * (r // 4 + 2 * c)


# -- local_tile / local_partition --------------------------------------------------------


def test_local_tile():
  L = Layout((8, 6), (6, 1))
  for c0, c1 in itertools.product(range(2), range(2)):
    t = local_tile(L, (4, 3), (c0, c1))
    assert size(t.layout) == 12
    for i, j in itertools.product(range(4), range(3)):
      assert t(i, j) == L(4 * c0 + i, 3 * c1 + j)
  t = local_tile(L, (4, 3), (1, 1))
  assert (t.layout, t.offset) == (Layout((4, 3), (6, 1)), 4 * 6 + 3)


def test_local_tile_partial_coordinate_keeps_rest_modes():
  L = Layout((8, 6), (6, 1))
  t = local_tile(L, (4, 3), (1,))
  # As CuTe's slice, the kept modes are spliced: (tile0, tile1, rest1).
  assert rank(t.layout) == 3
  for i, j, k in itertools.product(range(4), range(3), range(2)):
    assert t(i, j, k) == L(4 + i, 3 * k + j)
  with pytest.raises(ValueError, match="more modes"):
    local_tile(L, (4, 3), (0, 0, 0))


@pytest.mark.parametrize(
    "thr", [Layout((4, 2), (2, 1)), Layout((4, 2), (1, 4)), Layout((2, 2), (1, 2))]
)
def test_local_partition(thr):
  L = Layout((8, 8), (8, 1))
  T0, T1 = size(thr[0]), size(thr[1])
  d0, d1 = thr.stride
  owned = []
  for tid in range(size(thr)):
    # CuTe: the thread's coordinate in thr is ((tid // d) % s) per mode.
    r0, r1 = (tid // d0) % T0, (tid // d1) % T1
    t = local_partition(L, thr, tid)
    assert size(t.layout) == 64 // size(thr)
    for a, b in itertools.product(range(8 // T0), range(8 // T1)):
      assert t(a, b) == L(r0 + T0 * a, r1 + T1 * b)
      owned.append(t(a, b))
  assert sorted(owned) == list(range(64))  # every element owned once
  t = local_partition(L, Layout((4, 2), (2, 1)), 3)
  assert (t.layout, t.offset) == (Layout((2, 4), (32, 2)), 9)


# -- vectors and recasts -------------------------------------------------------------------


def brute_common_vector(a, b):
  """Length of the common prefix of memory order: the largest n with
  a^-1(k) == b^-1(k) for all k < n (a, b bijections of the same shape)."""
  inv_a = np.argsort(offsets(a))
  inv_b = np.argsort(offsets(b))
  n = 0
  while n < len(inv_a) and inv_a[n] == inv_b[n]:
    n += 1
  return n


@pytest.mark.parametrize(
    "a, b",
    [
        (Layout((4, 8), (8, 1)), Layout((4, 8), (8, 1))),
        (Layout((4, 8), (8, 1)), Layout((4, 8), (1, 4))),
        (Layout((4, 8)), Layout((4, 8))),
        (Layout((4, 8), (1, 4)), Layout((4, (4, 2)), (1, (4, 16)))),
        (Layout((4, 8), (8, 1)), Layout((4, (2, 4)), (8, (4, 1)))),
        (Layout((2, 4, 8), (1, 16, 2)), Layout((2, 4, 8), (1, 2, 8))),
    ],
)
def test_max_common_vector_and_layout(a, b):
  n = max_common_vector(a, b)
  assert n == brute_common_vector(a, b)
  M = max_common_layout(a, b)
  assert size(M) == n
  # On M's indices both layouts agree and are contiguous.
  for i in range(size(M)):
    assert a(M(i)) == b(M(i)) == i


def test_max_common_vector_known_values():
  assert max_common_vector(Layout((4, 8), (8, 1)), Layout((4, 8), (1, 4))) == 1
  assert max_common_vector(Layout(8), Layout(8)) == 8
  assert max_common_vector(Layout((4, 8)), Layout((4, 8), (1, 8))) == 4
  assert max_common_layout(Layout((4, 8), (8, 1)), Layout((4, 8), (8, 1))) == Layout((8, 4), (4, 1))


@pytest.mark.parametrize(
    "L, n, expected",
    [
        (Layout((4, 8), (8, 1)), 4, Layout((4, 2), (2, 1))),
        (Layout((8, 64), (64, 1)), 8, Layout((8, 8), (8, 1))),
        (Layout((16, 2), (1, 32)), 4, Layout((4, 2), (1, 8))),
        (Layout((4, 3), (0, 4)), 2, Layout((4, 3), (0, 2))),  # broadcast mode untouched
        (Layout(4, 2), 4, Layout(2, 1)),  # stride 2 < 4: shape 4/(4/2)
    ],
)
def test_upcast(L, n, expected):
  U = upcast(L, n)
  assert U == expected


def test_upcast_image_is_offsets_divided():
  # Each wide unit of U is the set of n narrow elements of L (brute force).
  L = Layout((8, (2, 3)), (1, (96, 8)))
  U = upcast(L, 4)
  assert set((offsets(L) // 4).tolist()) == set(offsets(U).tolist())


@pytest.mark.parametrize(
    "L, n, expected",
    [
        (Layout((4, 2), (2, 1)), 4, Layout((4, 8), (8, 1))),
        (Layout((8, 8), (8, 1)), 2, Layout((8, 16), (16, 1))),
        (Layout((4, 3), (1, 4)), 2, Layout((8, 3), (1, 8))),
    ],
)
def test_downcast(L, n, expected):
  D = downcast(L, n)
  assert D == expected
  # Each element becomes n consecutive narrow elements: image {n*x + k}.
  want = {n * x + k for x in offsets(L).tolist() for k in range(n)}
  assert set(offsets(D).tolist()) == want
  assert upcast(D, n) == L


def test_downcast_of_a_reversed_mode():
  # CuTe: a mode of stride +-1 grows by n, keeping its stride.
  assert downcast(Layout(4, -1), 2) == Layout(8, -1)
  assert downcast(Layout((4, 3), (-1, 8)), 2) == Layout((8, 3), (-1, 16))
  assert upcast(Layout(8, -1), 2) == Layout(4, -1)


def test_recast():
  L = Layout((8, 64), (64, 1))
  assert recast(L, 16, 8) == Layout((8, 128), (128, 1))  # bf16 seen as bytes
  assert recast(L, 16, 16) == L
  assert recast(L, 8, 32) == Layout((8, 16), (16, 1))
  assert recast(recast(L, 16, 8), 8, 16) == L
  with pytest.raises(ValueError, match="multiple"):
    recast(L, 16, 24)
  with pytest.raises(ValueError, match="multiple"):
    recast(L, 24, 16)
  with pytest.raises(ValueError, match="positive"):
    recast(L, 0, 8)


# -- mode surgery -----------------------------------------------------------------------------


def test_group_modes():
  L = Layout((2, 3, 4, 5), (1, 2, 6, 24))
  G = group_modes(L, 1, 3)
  assert G == Layout((2, (3, 4), 5), (1, (2, 6), 24))
  same_function(G, L)
  assert group_modes(L, 0, 4) == Layout(((2, 3, 4, 5),), ((1, 2, 6, 24),))
  with pytest.raises(ValueError, match="range"):
    group_modes(L, 2, 5)
  with pytest.raises(ValueError, match="range"):
    group_modes(L, 3, 1)


def test_append_prepend_select():
  L = Layout((2, 3), (1, 2))
  assert append(L) == Layout((2, 3, 1), (1, 2, 0))
  assert append(L, Layout(4, 6)) == Layout((2, 3, 4), (1, 2, 6))
  assert append(L, 5) == Layout((2, 3, 5), (1, 2, 1))
  assert append(Layout(4), rank=3) == Layout((4, 1, 1), (1, 0, 0))
  assert append(L, rank=2) == L
  assert append(Layout(4), rank=1) == Layout(4)
  with pytest.raises(ValueError, match="more than"):
    append(Layout((2, 3, 4)), rank=2)
  assert prepend(L) == Layout((1, 2, 3), (0, 1, 2))
  assert prepend(L, Layout(4, 6)) == Layout((4, 2, 3), (6, 1, 2))
  assert select(Layout((2, 3, 4), (1, 2, 6)), 2, 0) == Layout((4, 2), (6, 1))
  assert select(L, 1, 0)(2, 1) == L(1, 2)
  # Appending a size-1 mode keeps the function.
  same_function(append(L), L)
