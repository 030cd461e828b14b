"""Basis strides (E, ScaledBasis, ArithmeticTuple), identity (coordinate)
layouts and tensors.

A coordinate layout sends a coordinate to a coordinate; the expected values
are the coordinates themselves (numpy's Fortran-order unravel for flat
indices), so nothing here is compared with the code's own output.
"""

import itertools

import numpy as np
import pytest

from layouts import (
    ArithmeticTuple,
    E,
    Layout,
    ScaledBasis,
    Tensor,
    coalesce,
    complement,
    composition,
    cosize,
    filter,
    local_partition,
    local_tile,
    logical_divide,
    make_identity_layout,
    make_identity_tensor,
    make_tensor,
    right_inverse,
    zipped_divide,
)

# -- E, ScaledBasis, ArithmeticTuple ------------------------------------------------------


def test_scaled_basis_arithmetic():
  assert repr(E(1)) == "1@1" and repr(3 * E(1)) == "3@1" and repr(E(0) * 4) == "4@0"
  assert E(1) * 3 == ScaledBasis(3, 1) and 3 * E(1) == ScaledBasis(3, 1)
  assert ScaledBasis(12, 1) // 4 == ScaledBasis(3, 1)
  assert -ScaledBasis(2, 0) == ScaledBasis(-2, 0)
  assert ScaledBasis(2, 1) != ScaledBasis(2, 0) and ScaledBasis(2, 1) != 2
  assert hash(ScaledBasis(2, 1)) == hash(E(1) * 2)
  assert E(0) * 2 + E(1) * 5 == (2, 5)
  assert E(2) * 7 + E(0) == (1, 0, 7)
  assert ScaledBasis(5, 2).to_tuple() == (0, 0, 5)
  with pytest.raises(AttributeError):
    E(0).value = 3
  with pytest.raises(ValueError, match="mode"):
    ScaledBasis(1, -1)


def test_arithmetic_tuple_adds_elementwise():
  a = ArithmeticTuple((1, 2))
  assert a + ArithmeticTuple((10,)) == (11, 2)
  assert a + (5, 6, 7) == (6, 8, 7) and (5, 6, 7) + a == (6, 8, 7)
  assert a + E(1) * 3 == (1, 5)
  assert a + 0 == a and 0 + a == a  # a stride-0 term
  assert a * 3 == (3, 6) and 3 * a == (3, 6)
  assert repr(a) == "(1,2)"
  with pytest.raises(TypeError, match="cannot add"):
    a + 1


def test_arithmetic_tuple_holds_numpy_arrays():
  x = ArithmeticTuple((np.arange(3), 0)) + ArithmeticTuple((1, np.arange(3) * 2))
  np.testing.assert_array_equal(x[0], [1, 2, 3])
  np.testing.assert_array_equal(x[1], [0, 2, 4])


# -- coordinate layouts -----------------------------------------------------------------------


def test_identity_layout_maps_coordinates_to_themselves():
  I = make_identity_layout((4, 8))
  assert repr(I) == "(4,8):(1@0,1@1)"
  for i, j in itertools.product(range(4), range(8)):
    assert I(i, j) == (i, j)
    assert I((i, j)) == (i, j)
  for idx in range(32):
    assert I(idx) == tuple(int(c) for c in np.unravel_index(idx, (4, 8), order="F"))
  assert type(I(5)) is tuple  # a plain tuple: a jax pytree


def test_rank_one_identity_layout_gives_a_one_tuple():
  I = make_identity_layout(8)
  assert I == Layout(8, E(0))
  assert [I(i) for i in range(8)] == [(i,) for i in range(8)]
  assert Layout(8, E(1))(5) == (0, 5)
  assert make_identity_tensor(8)(5) == (5,)


def test_transposing_basis_strides():
  # TMA doc: strides (_1@1,_1@0) turn i@1 + j@0 into the coordinate (j, i).
  T = Layout((4, 8), (E(1), E(0)))
  assert repr(T) == "(4,8):(1@1,1@0)"
  for i, j in itertools.product(range(4), range(8)):
    assert T(i, j) == (j, i)


def test_scaled_and_nested_identity_layouts():
  # A nested mode yields its flat (column-major) coordinate.
  I = make_identity_layout(((2, 3), 4))
  assert I == Layout(((2, 3), 4), ((E(0), 2 * E(0)), E(1)))
  for a, b, c in itertools.product(range(2), range(3), range(4)):
    assert I(((a, b), c)) == (a + 2 * b, c)
    assert I(a + 2 * b, c) == (a + 2 * b, c)
  # Scaled bases: every other row, every column times 3.
  S = Layout((4, 8), (2 * E(0), 3 * E(1)))
  assert S(3, 5) == (6, 15)
  # A stride-0 mode contributes nothing.
  B = Layout((4, 2), (E(0), 0))
  assert [B(i, j) for i in range(4) for j in range(2)] == [(i,) for i in range(4) for _ in range(2)]


def test_basis_and_integer_strides_do_not_mix():
  with pytest.raises(ValueError, match="mixes"):
    Layout((4, 2), (E(0), 1))
  with pytest.raises(ValueError, match="basis strides"):
    cosize(make_identity_layout((4, 8)))
  with pytest.raises(ValueError, match="basis strides"):
    right_inverse(make_identity_layout((4, 8)))
  with pytest.raises(ValueError):
    complement(make_identity_layout((4, 8)), 32)


def test_algebra_on_coordinate_layouts():
  I = make_identity_layout((8, 6))
  # Dividing the coordinate space: tile (i0,i1) of tile-grid (j0,j1).
  Z = zipped_divide(I, (4, 3))
  assert repr(Z) == "((4,3),(2,2)):((1@0,1@1),(4@0,3@1))"
  for i0, i1, j0, j1 in itertools.product(range(4), range(3), range(2), range(2)):
    assert Z((i0, i1), (j0, j1)) == (i0 + 4 * j0, i1 + 3 * j1)
  # Composition with an index layout: every other flat index.
  C = composition(make_identity_layout((4, 8)), Layout(8, 2))
  for k in range(8):
    assert C(k) == tuple(int(c) for c in np.unravel_index(2 * k, (4, 8), order="F"))
  D = logical_divide(make_identity_layout((4, 8)), Layout(4, 2))
  for i, j in itertools.product(range(4), range(8)):
    tile = 2 * i
    rest = [0, 1, 8, 9, 16, 17, 24, 25][j]
    assert D(i, j) == tuple(int(c) for c in np.unravel_index(tile + rest, (4, 8), order="F"))
  # Nothing merges across different modes; same-mode runs do.
  assert coalesce(make_identity_layout((4, 8))) == make_identity_layout((4, 8))
  assert coalesce(Layout((2, 4), (E(0), 2 * E(0)))) == Layout(8, E(0))
  assert filter(Layout((4, 2), (E(0), 0))) == Layout(4, E(0))


def test_numpy_arrays_through_a_coordinate_layout():
  I = make_identity_layout((4, 8))
  idx = np.arange(32)
  rows, cols = I(idx)
  want = np.unravel_index(idx, (4, 8), order="F")
  np.testing.assert_array_equal(rows, want[0])
  np.testing.assert_array_equal(cols, want[1])


# -- tensors ----------------------------------------------------------------------------------


def test_make_tensor_indexes_its_engine():
  data = np.arange(12).reshape(3, 4) * 10  # row-major 3x4
  t = make_tensor(data, Layout((3, 4), (4, 1)))
  assert t.shape == (3, 4)
  for i, j in itertools.product(range(3), range(4)):
    assert t(i, j) == data[i, j]
  col = t(None, 2)
  assert isinstance(col, Tensor) and (col.layout, col.offset) == (Layout((3,), (4,)), 2)
  assert [col(i) for i in range(3)] == list(data[:, 2])
  row = t(1, None)
  assert [row(j) for j in range(4)] == list(data[1])
  assert "offset=2" in repr(col) and "engine" in repr(col)
  with pytest.raises(AttributeError):
    t.offset = 3


def test_tensor_without_engine_returns_offsets():
  t = Tensor(Layout((4, 8), (8, 1)), offset=100)
  assert t(2, 3) == 100 + 19
  assert t(None, 3).offset == 103


def test_local_tile_and_partition_of_a_tensor():
  data = np.arange(64).reshape(8, 8)  # element (r, c) holds 8r + c
  t = make_tensor(data, Layout((8, 8), (8, 1)))
  tile = local_tile(t, (4, 2), (1, 3))
  assert tile.offset == 8 * 4 + 6
  for i, j in itertools.product(range(4), range(2)):
    assert tile(i, j) == data[4 + i, 6 + j]
  part = local_partition(tile, Layout((2, 2), (2, 1)), 3)  # thread 3 -> (1, 1)
  for a in range(2):
    assert part(a, 0) == data[4 + 1 + 2 * a, 6 + 1]


def test_identity_tensor_slices_move_the_base_coordinate():
  # TMA doc: the whole tensor's base coordinate is (0, 0); slicing it
  # gives a different base coordinate.
  t = make_identity_tensor((8, 6))
  assert t.offset == (0, 0) and type(t.offset) is tuple
  assert t(5, 4) == (5, 4)
  tile = local_tile(t, (4, 3), (1, 1))
  assert tile.offset == (4, 3)
  for i, j in itertools.product(range(4), range(3)):
    assert tile(i, j) == (4 + i, 3 + j)
  col = t(None, 2)
  assert col.offset == (0, 2)
  assert [col(i) for i in range(8)] == [(i, 2) for i in range(8)]
  part = local_partition(t, Layout((4, 3)), 5)  # thread 5 -> (1, 1)
  assert part.offset == (1, 1)
  for a, b in itertools.product(range(2), range(2)):
    assert part(a, b) == (1 + 4 * a, 1 + 3 * b)
