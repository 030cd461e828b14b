"""Swizzle(B, M, S) and ComposedLayout.

The reference swizzle ``ref_swizzle`` moves one bit at a time, straight from
CuTe's definition (``Swizzle<B,M,S>``: bits ``[M+S, M+S+B)`` XOR-ed onto
``[M, M+B)``; for negative S the other way round), so it shares no code with
``Swizzle.__call__``'s mask-and-shift.
"""

import itertools
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from layouts import (
    ComposedLayout,
    Layout,
    Swizzle,
    coalesce,
    composition,
    downcast,
    filter,
    local_partition,
    local_tile,
    logical_product,
    make_tensor,
    size,
    tiled_divide,
    upcast,
    zipped_divide,
)

from layout_reference import PROFILE


def ref_swizzle(x, B, M, S):
  out = x
  for k in range(B):
    src, dst = (M + S + k, M + k) if S >= 0 else (M + k, M - S + k)
    out ^= ((x >> src) & 1) << dst
  return out


@st.composite
def swizzles(draw):
  B = draw(st.integers(0, 4))
  M = draw(st.integers(0, 4))
  mag = draw(st.integers(B, 5)) if B else draw(st.integers(0, 5))
  S = mag if draw(st.booleans()) else -mag
  return B, M, S


# -- Swizzle as a function ------------------------------------------------------------


@PROFILE
@given(swizzles())
def test_swizzle_matches_bitwise_definition_and_is_a_bijection(params):
  B, M, S = params
  sw = Swizzle(B, M, S)
  n = 1 << (M + abs(S) + B)
  xs = list(range(2 * n))
  got = [sw(x) for x in xs]
  assert got == [ref_swizzle(x, B, M, S) for x in xs]
  # A bijection on each aligned block of 2**(M+|S|+B) offsets ...
  assert sorted(got[:n]) == list(range(n))
  assert sorted(got[n:]) == list(range(n, 2 * n))
  # ... and an involution (the source bits are left untouched).
  assert [sw(y) for y in got] == xs


@pytest.mark.parametrize(
    "B, M, S, x, expected",
    [
        (3, 4, 3, 0x080, 0x090),  # bit 7 (row 1) flips bit 4 (chunk 0 -> 1)
        (3, 4, 3, 0x090, 0x080),
        (3, 4, 3, 0x3F0, 0x380),  # row 7, chunk 7 -> chunk 0
        (3, 4, 3, 0x40F, 0x40F),  # bit 10 is above the swizzle: unchanged
        (2, 0, 2, 12, 15),  # bits [2,4) = 0b11 onto bits [0,2)
        (1, 0, 1, 2, 3),
        (1, 0, -1, 1, 3),  # negative S: bit 0 onto bit 1
        (0, 4, 3, 12345, 12345),  # B = 0: identity
    ],
)
def test_swizzle_values(B, M, S, x, expected):
  assert ref_swizzle(x, B, M, S) == expected
  assert Swizzle(B, M, S)(x) == expected


def test_swizzle_128b_pattern():
  # PTX 128B swizzle on byte addresses: in each 1024-byte block, the 16-byte
  # chunk c of 128-byte row r moves to chunk c ^ r.
  sw = Swizzle(3, 4, 3)
  for blk, r, c, b in itertools.product(range(2), range(8), range(8), (0, 5, 15)):
    x = 1024 * blk + 128 * r + 16 * c + b
    assert sw(x) == 1024 * blk + 128 * r + 16 * (c ^ r) + b


def test_masks():
  sw = Swizzle(3, 4, 3)
  assert sw.yyy_mask == 0b111 << 7 and sw.zzz_mask == 0b111 << 4
  neg = Swizzle(2, 1, -3)
  assert neg.yyy_mask == 0b11 << 1 and neg.zzz_mask == 0b11 << 4


@pytest.mark.parametrize("B, M, S", [(3, 0, 2), (2, 0, 1), (3, 4, -2), (1, 0, 0)])
def test_swizzle_rejects_overlapping_bit_ranges(B, M, S):
  with pytest.raises(ValueError, match=r"\|S\|"):
    Swizzle(B, M, S)


@pytest.mark.parametrize("args", [(-1, 0, 3), (2, -1, 3), (2.0, 0, 3), (2, 0, "3")])
def test_swizzle_rejects_bad_parameters(args):
  with pytest.raises(ValueError):
    Swizzle(*args)


def test_swizzle_value_semantics():
  sw = Swizzle(3, 4, 3)
  assert repr(sw) == "Sw<3,4,3>"
  assert sw == Swizzle(3, 4, 3) and sw != Swizzle(3, 3, 3) and sw != "Sw<3,4,3>"
  assert hash(sw) == hash(Swizzle(3, 4, 3))
  with pytest.raises(AttributeError):
    sw.bits = 2


def test_swizzle_upcast_and_downcast():
  # 128B swizzle on bytes is Swizzle(3,3,3) on 16-bit elements.
  sw = Swizzle(3, 4, 3)
  elem = upcast(sw, 2)
  assert elem == Swizzle(3, 3, 3)
  for e in range(2048):
    assert sw(2 * e) == 2 * elem(e)
    assert sw(2 * e + 1) == 2 * elem(e) + 1
  assert downcast(elem, 2) == sw
  assert upcast(sw, 16) == Swizzle(3, 0, 3)
  with pytest.raises(ValueError, match="power of two"):
    upcast(sw, 3)
  with pytest.raises(ValueError, match="cannot view"):
    upcast(sw, 32)


# -- ComposedLayout -------------------------------------------------------------------------

SW = Swizzle(3, 4, 3)
L = Layout((8, 64), (64, 1))


def test_composition_builds_composed_layout_and_prints_cute_notation():
  cl = composition(SW, L)
  assert isinstance(cl, ComposedLayout)
  assert repr(cl) == "Sw<3,4,3> o _0 o (8,64):(64,1)"
  assert (cl.outer, cl.offset, cl.inner) == (SW, 0, L)
  assert ComposedLayout.parse(repr(cl)) == cl
  assert cl.shape == (8, 64) and cl.size == 512 and cl.cosize == 512 and len(cl) == 2
  assert composition(SW, None) == SW
  assert composition(SW, 16) == ComposedLayout(SW, 0, Layout(16))
  with pytest.raises(ValueError, match="cannot compose"):
    composition(SW, "x")
  with pytest.raises(ValueError, match="inner must be a Layout"):
    ComposedLayout(SW, 0, (8, 64))


def test_composed_layout_evaluates_swizzle_of_layout():
  cl = composition(SW, L)
  for r, c in itertools.product(range(8), range(64)):
    want = ref_swizzle(64 * r + c, 3, 4, 3)
    assert cl(r, c) == want
    assert cl((r, c)) == want
    assert cl(r + 8 * c) == want
  # 512 distinct offsets: a permutation of [0, 512).
  assert sorted(cl(i) for i in range(512)) == list(range(512))


def test_composed_layout_modes_and_slices_keep_absolute_offsets():
  cl = composition(SW, L)
  assert cl[1] == ComposedLayout(SW, 0, Layout(64, 1))
  assert [m.inner for m in cl] == [Layout(8, 64), Layout(64, 1)]
  for r in range(8):
    row = cl(r, None)
    assert row.offset == 64 * r
    # The swizzle sees the absolute offset: a sliced row is still right.
    assert [row(c) for c in range(64)] == [ref_swizzle(64 * r + c, 3, 4, 3) for c in range(64)]
  col = cl(None, 37)
  assert [col(r) for r in range(8)] == [ref_swizzle(64 * r + 37, 3, 4, 3) for r in range(8)]
  sub, off = cl.slice_and_offset((None, 5))
  assert off == 0 and sub.offset == 5


def test_repeated_slices_accumulate_the_offset():
  cl = composition(SW, Layout((2, 8, 64), (512, 64, 1)))
  plane = cl(1, None, None)
  assert plane.offset == 512
  row = plane(3, None)
  assert row.offset == 512 + 3 * 64
  assert [row(c) for c in range(64)] == [ref_swizzle(512 + 192 + c, 3, 4, 3) for c in range(64)]
  tile = local_tile(plane, (4, 8), (1, 2))
  assert [tile(i, j) for i in range(4) for j in range(8)] == [
      ref_swizzle(512 + 64 * (4 + i) + 16 + j, 3, 4, 3) for i in range(4) for j in range(8)
  ]


def test_composed_layout_algebra_acts_on_inner():
  cl = composition(SW, L)
  T = Layout((4, 4), (1, 64))
  sub = composition(cl, T)
  assert sub.inner == composition(L, T)
  for i in range(16):
    assert sub(i) == ref_swizzle(L(T(i)), 3, 4, 3)
  Z = zipped_divide(cl, (4, 8))
  assert isinstance(Z, ComposedLayout)
  for i0, i1, j0, j1 in itertools.product(range(4), range(8), range(2), range(8)):
    assert Z((i0, i1), (j0, j1)) == ref_swizzle(L(i0 + 4 * j0, i1 + 8 * j1), 3, 4, 3)
  assert tiled_divide(cl, (4, 8)).inner == tiled_divide(L, (4, 8))
  assert coalesce(cl).inner == coalesce(L) and filter(cl).inner == filter(L)
  assert logical_product(cl, Layout(2)).inner == logical_product(L, Layout(2))


def test_local_tile_and_partition_of_a_swizzled_layout():
  cl = composition(Swizzle(3, 3, 3), L)
  for c0, c1 in itertools.product(range(2), range(8)):
    t = local_tile(cl, (4, 8), (c0, c1))
    for i, j in itertools.product(range(4), range(8)):
      assert t(i, j) == ref_swizzle(L(4 * c0 + i, 8 * c1 + j), 3, 3, 3)
  thr = Layout((4, 8), (8, 1))
  owned = []
  for tid in range(32):
    t = local_partition(cl, thr, tid)
    r0, r1 = (tid // 8) % 4, tid % 8
    for a, b in itertools.product(range(2), range(8)):
      assert t(a, b) == ref_swizzle(L(r0 + 4 * a, r1 + 8 * b), 3, 3, 3)
      owned.append(t(a, b))
  assert sorted(owned) == list(range(512))


def test_tensor_over_a_swizzled_layout_reads_the_swizzled_element():
  data = np.arange(512) * 10
  cl = composition(Swizzle(3, 3, 3), L)
  t = make_tensor(data, cl)
  for r, c in [(0, 0), (1, 2), (7, 63), (3, 17)]:
    assert t(r, c) == 10 * ref_swizzle(64 * r + c, 3, 3, 3)


def test_composed_layout_upcast_downcast():
  # A bf16 tile (8,64):(64,1) under Sw<3,3,3> is the byte tile (8,128):(128,1)
  # under Sw<3,4,3>: byte 2e and 2e+1 hold element e.
  elems = composition(Swizzle(3, 3, 3), L)
  as_bytes = downcast(elems, 2)
  assert as_bytes == ComposedLayout(Swizzle(3, 4, 3), 0, Layout((8, 128), (128, 1)))
  for r, c in itertools.product(range(8), range(64)):
    assert as_bytes(r, 2 * c) == 2 * elems(r, c)
    assert as_bytes(r, 2 * c + 1) == 2 * elems(r, c) + 1
  assert upcast(as_bytes, 2) == elems
  with pytest.raises(ValueError, match="not a multiple"):
    upcast(ComposedLayout(Swizzle(3, 4, 3), 3, Layout((8, 128), (128, 1))), 2)


def test_composed_layout_value_semantics():
  a, b = composition(SW, L), composition(SW, Layout((8, 64), (64, 1)))
  assert a == b and hash(a) == hash(b)
  assert a != composition(Swizzle(3, 3, 3), L) and a != ComposedLayout(SW, 64, L)
  assert repr(ComposedLayout(SW, 64, L)) == "Sw<3,4,3> o 64 o (8,64):(64,1)"
  with pytest.raises(AttributeError):
    a.offset = 3
  assert size(a) == 512
