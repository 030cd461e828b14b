"""Unit tests for layouts.int_tuple (CuTe's IntTuple functions).

Expected values are derived by hand from CuTe's definitions or computed by
brute force with numpy (``np.ravel_multi_index`` / ``np.unravel_index`` in
Fortran order are the column-major reference), never copied from the code.
"""

import itertools

import numpy as np
import pytest

from layouts import (
    compatible,
    congruent,
    crd2idx,
    flatten,
    idx2crd,
    inner_product,
    prefix_product,
    product,
    shape_div,
    suffix_product,
)
from layouts import int_tuple as it

# -- flatten / unflatten / product / rank / depth -----------------------------


@pytest.mark.parametrize(
    "t, leaves",
    [
        (5, (5,)),
        ((), ()),
        ((1, 2, 3), (1, 2, 3)),
        ((1, (2, 3)), (1, 2, 3)),
        (((1,), ((2,), 3), ()), (1, 2, 3)),
        ((((4,),),), (4,)),
    ],
)
def test_flatten(t, leaves):
  assert flatten(t) == leaves


def test_unflatten_rebuilds_profile():
  assert it.unflatten((1, 2, 3), (0, (0, 0))) == (1, (2, 3))
  assert it.unflatten((7, 8, 9), ((0, 0), 0)) == ((7, 8), 9)
  assert it.unflatten([4], 0) == 4
  with pytest.raises(ValueError, match="profile"):
    it.unflatten((1, 2), (0, 0, 0))


@pytest.mark.parametrize(
    "t, expected",
    [
        (7, 7),
        ((), 1),
        ((2, 3), 6),
        ((2, (3, 4)), 24),
        (((2, 2), (1, (5,))), 20),
    ],
)
def test_product(t, expected):
  assert product(t) == expected


def test_product_each():
  assert it.product_each((2, (3, 4), 5)) == (2, 12, 5)
  assert it.product_each(6) == (6,)


@pytest.mark.parametrize(
    "t, rank, depth",
    [
        (3, 1, 0),
        ((), 0, 1),
        ((2, 3), 2, 1),
        ((2, (3, 4)), 2, 2),
        (((2, (3,)),), 1, 3),
    ],
)
def test_rank_depth(t, rank, depth):
  assert it.rank(t) == rank
  assert it.depth(t) == depth


def test_ceil_div():
  assert [it.ceil_div(a, 4) for a in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


# -- inner / prefix / suffix products -----------------------------------------


def test_inner_product():
  assert inner_product(3, 4) == 12
  assert inner_product((1, (2, 3)), (4, (5, 6))) == 1 * 4 + 2 * 5 + 3 * 6
  assert inner_product((), ()) == 0


@pytest.mark.parametrize("a, b", [((1, 2), (1, 2, 3)), (1, (1,)), ((1,), 1), ((1, (2, 3)), (1, 2))])
def test_inner_product_rejects_non_congruent(a, b):
  with pytest.raises(ValueError, match="not congruent"):
    inner_product(a, b)


def test_prefix_product():
  assert prefix_product(5) == 1
  assert prefix_product((2, 3, 4)) == (1, 2, 6)
  assert prefix_product((2, (3, 4), 5)) == (1, (2, 6), 24)
  assert prefix_product((2, (3, 4)), init=5) == (5, (10, 30))
  assert prefix_product(()) == ()


def test_suffix_product():
  assert suffix_product((2, 3, 4)) == (12, 4, 1)
  assert suffix_product((2, (3, 4))) == (12, (4, 1))
  assert suffix_product(((2, 3), 4)) == ((12, 4), 1)


def test_prefix_suffix_products_are_column_and_row_major_strides():
  # Brute force: with prefix-product strides, the offset of a multi-index is
  # numpy's Fortran-order ravel; with suffix-product strides, C order.
  shape = (3, 4, 5)
  for crd in itertools.product(*(range(s) for s in shape)):
    assert inner_product(crd, prefix_product(shape)) == np.ravel_multi_index(crd, shape, order="F")
    assert inner_product(crd, suffix_product(shape)) == np.ravel_multi_index(crd, shape, order="C")


# -- shape_div ---------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (12, 4, 3),
        (4, 12, 1),  # b is a multiple of a: signum(a*b)
        (5, 5, 1),
        (-8, 4, -2),  # truncating division, as in C++
        (8, -4, -2),
        (-2, 4, -1),  # C++: -2/4 == 0, so signum(-8) == -1
        (0, 4, 0),  # signum(0 * 4) == 0
        ((4, 6), 8, (1, 3)),  # 8 eats the 4, then 2 of the 6
        ((4, 6), 2, (2, 6)),
        ((2, 3, 4), 6, (1, 1, 4)),
        ((2, 3), (2, 3), (1, 1)),  # by mode
        (4, (2, 2), 1),  # tuple divisor: its product
        ((8, (4, 2)), 16, (1, (2, 2))),  # 16 eats the 8, then 2 of the 4
    ],
)
def test_shape_div(a, b, expected):
  assert shape_div(a, b) == expected


@pytest.mark.parametrize("a, b", [(6, 4), (4, 0), (-7, 2), ((6, 4), 4)])
def test_shape_div_requires_divisibility(a, b):
  with pytest.raises(ValueError, match="divides"):
    shape_div(a, b)


def test_shape_div_rank_mismatch():
  with pytest.raises(ValueError, match="rank"):
    shape_div((2, 3), (2,))


# -- crd2idx / idx2crd -------------------------------------------------------


def test_crd2idx_hierarchical_coordinate():
  shape = (2, (3, 4))
  # Column-major default strides (1, (2, 6)): a + 2b + 6c.
  for a, b, c in itertools.product(range(2), range(3), range(4)):
    assert crd2idx((a, (b, c)), shape) == a + 2 * b + 6 * c
  # Explicit strides.
  assert crd2idx((1, (2, 3)), shape, (100, (10, 1))) == 100 + 20 + 3


def test_crd2idx_int_coordinate_is_split_colexicographically():
  shape, stride = (2, (3, 4)), (7, (11, 13))
  for idx in range(24):
    a, b, c = np.unravel_index(idx, (2, 3, 4), order="F")
    assert crd2idx(idx, shape, stride) == 7 * a + 11 * b + 13 * c
  # A mode-wise int coordinate is split within its own mode.
  for k in range(12):
    b, c = np.unravel_index(k, (3, 4), order="F")
    assert crd2idx((1, k), shape, stride) == 7 + 11 * b + 13 * c


def test_crd2idx_out_of_range_extends_last_mode():
  # 30 -> (0, 15): the last mode takes the remainder (CuTe's convention).
  assert crd2idx(30, (2, 3)) == 0 + 15 * 2
  assert crd2idx(7, (2, 3), (3, 1)) == 1 * 3 + 3 * 1


def test_crd2idx_mismatch_raises():
  with pytest.raises(ValueError, match="does not match"):
    crd2idx((1, 2), (2, 3, 4))
  with pytest.raises(ValueError, match="does not match"):
    crd2idx((1, 2), 6)


def test_idx2crd_default_stride_matches_numpy_unravel():
  shape = (2, (3, 4), 5)
  for idx in range(product(shape)):
    a, b, c, d = (int(x) for x in np.unravel_index(idx, (2, 3, 4, 5), order="F"))
    assert idx2crd(idx, shape) == (a, (b, c), d)


def test_idx2crd_with_stride_is_cute_div_mod():
  # CuTe: each leaf is (idx // stride) % shape.
  assert idx2crd(5, (2, 3), (3, 1)) == ((5 // 3) % 2, 5 % 3)
  assert idx2crd(13, (4, 8), (8, 1)) == (1, 5)
  assert idx2crd((3, 7), (4, 8)) == (3, 7)  # already a coordinate
  # A tuple index is split mode by mode, each entry over its own mode.
  assert idx2crd((3, 5), (4, (2, 4))) == (3, (1, 2))
  assert idx2crd((3, 5), (4, (2, 4)), (1, (100, 1))) == (3, ((5 // 100) % 2, 5 % 4))
  with pytest.raises(ValueError, match="does not match"):
    idx2crd((1, 2), (1, 2, 3))


@pytest.mark.parametrize("shape", [6, (2, 3), (2, (3, 4)), ((2, 2), (3, (1, 2)))])
def test_idx2crd_crd2idx_round_trip(shape):
  n = product(shape)
  seen = set()
  for idx in range(n):
    crd = idx2crd(idx, shape)
    assert crd2idx(crd, shape) == idx
    seen.add(crd)
  assert len(seen) == n


def test_crd2idx_idx2crd_vectorize_over_numpy_arrays():
  shape, stride = (3, (2, 4)), (1, (24, 3))
  idx = np.arange(24, dtype=np.int32)
  crd = idx2crd(idx, shape)
  assert isinstance(crd[0], np.ndarray)
  np.testing.assert_array_equal(crd2idx(crd, shape), idx)
  expected = [crd2idx(int(i), shape, stride) for i in idx]
  np.testing.assert_array_equal(crd2idx(idx, shape, stride), expected)


# -- congruent / compatible ----------------------------------------------------


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (1, 7, True),
        ((1, (2, 3)), (4, (5, 6)), True),
        ((1, (2, 3)), (4, 5, 6), False),
        ((1, 2), (1, (2,)), False),
        (1, (1,), False),
        ((), (), True),
        ((1, 2), (1, 2, 3), False),
    ],
)
def test_congruent(a, b, expected):
  assert congruent(a, b) is expected
  assert congruent(b, a) is expected


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (24, (4, 6), True),  # an index is a coordinate of any shape of that size
        ((4, 6), 24, False),  # but a pair is not a coordinate of an int shape
        ((4, 6), (4, (2, 3)), True),
        ((4, (2, 3)), (4, 6), False),
        (5, (2, 3), False),  # sizes differ
        ((4, 6), (4, 6, 1), False),  # ranks differ
        ((4, 6), (4, 6), True),
        (((2, 2), 6), ((2, 2), (2, 3)), True),
    ],
)
def test_compatible(a, b, expected):
  assert compatible(a, b) is expected


def test_is_int():
  assert it.is_int(3) and it.is_int(np.int32(3)) and it.is_int(np.int64(-1))
  assert not it.is_int(True) and not it.is_int(3.0) and not it.is_int((3,))
