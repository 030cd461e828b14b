"""Property tests (hypothesis) for the layout algebra on random small layouts.

The reference for every layout is ``ref_offsets``: numpy unravels each flat
index column-major and dots it with the strides. Complements are checked
against a greedy tiling (the smallest uncovered offset starts the next copy),
which uses none of the package's code.

Profiles: ``layouts`` (default, fast enough for CI's two cores) and
``layouts-thorough``; pick one with ``LAYOUTS_HYPOTHESIS_PROFILE``.
"""

import math

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from layouts import (
    Layout,
    blocked_product,
    coalesce,
    complement,
    composition,
    crd2idx,
    filter,
    idx2crd,
    left_inverse,
    logical_divide,
    logical_product,
    make_layout,
    max_common_layout,
    max_common_vector,
    nullspace,
    raked_product,
    right_inverse,
    size,
    tiled_divide,
    upcast,
    downcast,
    zipped_divide,
    flat_divide,
)

from layout_reference import PROFILE, leaves, offsets


def ev(L, idx):
  """The package's evaluation at an array of flat indices."""
  idx = np.asarray(idx, dtype=np.int64)
  return np.broadcast_to(np.asarray(L(idx), dtype=np.int64), idx.shape)


def greedy_origins(image, n):
  """Origins of copies of a layout's image that tile [0, n): each next origin
  is the smallest offset not yet covered."""
  image = sorted(set(int(x) for x in image))
  covered, origins, x = set(), [], 0
  while x < n:
    if x not in covered:
      origins.append(x)
      covered.update(x + y for y in image)
    x += 1
  return origins


def span(L):
  """End of the largest-stride mode: where the next copy of L would start."""
  return max(
      [s * d for s, d in zip(leaves(L.shape), leaves(L.stride)) if s > 1 and d > 0], default=1
  )


def nest(draw, items):
  """Random hierarchical grouping of a flat list of leaves."""
  items = list(items)
  if len(items) == 1:
    return items[0] if draw(st.booleans()) else (items[0],)
  out, i = [], 0
  while i < len(items):
    k = draw(st.integers(1, len(items) - i))
    out.append(items[i] if k == 1 else tuple(items[i : i + k]))
    i += k
  return tuple(out)


def unflatten_like(flat, profile):
  it = iter(flat)

  def build(p):
    return tuple(build(q) for q in p) if isinstance(p, tuple) else next(it)

  return build(profile)


# -- strategies ----------------------------------------------------------------------


@st.composite
def flat_shapes(draw, max_size=256, max_leaves=4, pow2=False):
  n = draw(st.integers(1, max_leaves))
  choices = [1, 2, 4, 8] if pow2 else list(range(1, 9))
  out = []
  for _ in range(n):
    s = draw(st.sampled_from(choices))
    if math.prod(out) * s > max_size:
      break
    out.append(s)
  return out or [1]


@st.composite
def layouts(draw, max_size=256, max_stride=16, pow2=False, rank2=False, min_stride=0):
  """Random layout: random nesting, strides in [min_stride, max_stride]."""
  if rank2:
    a = draw(flat_shapes(max_size=16, max_leaves=2, pow2=pow2))
    b = draw(flat_shapes(max_size=16, max_leaves=2, pow2=pow2))
    shape = (nest(draw, a), nest(draw, b))
    flat = a + b
  else:
    flat = draw(flat_shapes(max_size=max_size, pow2=pow2))
    shape = nest(draw, flat)
  strides = [draw(st.integers(min_stride, max_stride)) for _ in flat]
  return Layout(shape, unflatten_like(strides, shape))


@st.composite
def gapped_layouts(draw, max_size=64, max_leaves=4, pow2=False, max_gap=3):
  """Injective, complementable layouts: leaves visited in a random order,
  each stride a multiple (the gap) of the span of the leaves before it."""
  flat = draw(flat_shapes(max_size=max_size, max_leaves=max_leaves, pow2=pow2))
  order = draw(st.permutations(range(len(flat))))
  gaps = [1, 2, 4] if pow2 else list(range(1, max_gap + 1))
  strides, current = [0] * len(flat), 1
  for k in order:
    strides[k] = current * draw(st.sampled_from(gaps))
    current = strides[k] * flat[k]
  shape = nest(draw, flat)
  return Layout(shape, unflatten_like(strides, shape))


@st.composite
def compact_layouts(draw, max_size=256, max_leaves=4, pow2=False):
  return draw(gapped_layouts(max_size=max_size, max_leaves=max_leaves, pow2=pow2, max_gap=1))


# -- coalesce and filter ---------------------------------------------------------------


@PROFILE
@given(layouts(min_stride=-8))
def test_coalesce_preserves_function_and_is_minimal(L):
  C = coalesce(L)
  assert size(C) == size(L)
  np.testing.assert_array_equal(offsets(C), offsets(L))
  sh, dd = leaves(C.shape), leaves(C.stride)
  assert C.shape == sh[0] if len(sh) == 1 else C.shape == sh  # flat
  if C != Layout(1, 0):
    assert all(s > 1 for s in sh)  # no size-1 modes
  for k in range(len(sh) - 1):
    assert sh[k] * dd[k] != dd[k + 1]  # nothing mergeable


def test_a_trailing_size_one_mode_still_absorbs_the_overflow():
  L = Layout((4, 1), (1, 100))  # issue 20: evaluated to 5 while crd2idx (and CuTe) give 101
  assert L(5) == 101 and L(np.array([3, 5]))[1] == 101


@PROFILE
@given(layouts(min_stride=-8), st.integers(0, 3))
def test_indices_past_the_size_go_on_in_the_last_mode_as_crd2idx(L, wraps):
  """CuTe's `crd2idx` of an index past size(L): the last mode (of the layout as
  written, a trailing size-1 mode too) absorbs it; the compiled fast path agrees."""
  from layouts import crd2idx

  n = size(L)
  idx = np.arange(n * wraps, n * (wraps + 1) + 3)
  want = [crd2idx(int(i), L.shape, L.stride) for i in idx]
  assert [L(int(i)) for i in idx] == want
  np.testing.assert_array_equal(L(idx), want)


@PROFILE
@given(layouts(rank2=True))
def test_coalesce_by_mode_keeps_each_mode(L):
  C = coalesce(L, (1, 1))
  assert len(C) == 2
  for k in range(2):
    np.testing.assert_array_equal(offsets(C[k]), offsets(L[k]))
  np.testing.assert_array_equal(offsets(C), offsets(L))


@PROFILE
@given(layouts(min_stride=-8))
def test_filter_keeps_the_image(L):
  F = filter(L)
  assert set(offsets(F).tolist()) == set(offsets(L).tolist())
  assert all(d != 0 for s, d in zip(leaves(F.shape), leaves(F.stride)) if s > 1)
  assert size(F) <= size(L)


@PROFILE
@given(layouts(min_stride=-8))
def test_nullspace_is_the_kernel(L):
  N = nullspace(L)
  assert all(int(ev(L, int(N(i)))) == 0 for i in range(size(N)))
  assert size(N) * size(filter(L)) == size(L)
  assert len(set(int(N(i)) for i in range(size(N)))) == size(N)  # distinct domain indices


# -- composition -------------------------------------------------------------------------


def by_leaf_reference(A, B):
  """CuTe composes with each leaf of B: R(i) = sum_k A(c_k * d_k)."""
  a = offsets(A)
  sh, dd = leaves(B.shape), leaves(B.stride)
  crd = np.unravel_index(np.arange(size(B)), sh, order="F")
  out = np.zeros(size(B), dtype=np.int64)
  for c, d in zip(crd, dd):
    out += a[c * d]
  return out


@PROFILE
@given(layouts(max_size=64), layouts(max_size=32, max_stride=8))
def test_composition_when_it_succeeds(A, B):
  assume(offsets(B).max() < size(A))
  try:
    R = composition(A, B)
  except ValueError as err:
    assert "divisibility" in str(err)
    return
  assert size(R) == size(B)
  np.testing.assert_array_equal(offsets(R), by_leaf_reference(A, B))
  if len(leaves(B.shape)) == 1:
    np.testing.assert_array_equal(offsets(R), offsets(A)[offsets(B)])


@st.composite
def disjoint_bit_tilers(draw, total_bits):
  """A layout whose leaves are disjoint bit ranges of [0, 2**total_bits), in
  random order, plus perhaps a broadcast leaf: injective, power-of-2."""
  widths = []
  left = total_bits
  while left > 0 and len(widths) < 4:
    w = draw(st.integers(1, left))
    widths.append(w)
    left -= w
  starts, pos = [], 0
  for w in widths:
    starts.append(pos)
    pos += w
  perm = draw(st.permutations(range(len(widths))))
  shape = [1 << widths[k] for k in perm]
  stride = [1 << starts[k] for k in perm]
  if draw(st.booleans()):
    # Drop a leaf from the top: B then covers only part of A.
    shape, stride = shape[:-1] or [1], stride[:-1] or [0]
  if draw(st.booleans()):
    at = draw(st.integers(0, len(shape)))
    shape.insert(at, 2)
    stride.insert(at, 0)
  nested = nest(draw, shape)
  return Layout(nested, unflatten_like(stride, nested))


@PROFILE
@given(st.data())
def test_composition_power_of_two_family_always_succeeds(data):
  # All sizes and strides powers of two: CuTe's divisibility conditions
  # always hold, and B's leaves occupy disjoint digits of A, so the
  # by-mode composition is the functional one.
  A = data.draw(layouts(max_size=256, pow2=True))
  total_bits = size(A).bit_length() - 1
  assume(total_bits >= 1)
  B = data.draw(disjoint_bit_tilers(total_bits))
  R = composition(A, B)
  assert size(R) == size(B)
  np.testing.assert_array_equal(offsets(R), offsets(A)[offsets(B)])


@PROFILE
@given(layouts(max_size=128), st.data())
def test_composition_with_a_tiler_along_coalesced_modes_succeeds(A, data):
  # B = m:d with d the size of the first j coalesced modes of A and m | the
  # size of mode j (or j the last mode): always a layout.
  C = coalesce(A)
  sizes = list(leaves(C.shape))
  j = data.draw(st.integers(0, len(sizes) - 1))
  d = math.prod(sizes[:j])
  divisors = [m for m in range(1, sizes[j] + 1) if sizes[j] % m == 0]
  m = data.draw(st.sampled_from(divisors))
  B = Layout(m, d)
  R = composition(A, B)
  np.testing.assert_array_equal(offsets(R), offsets(A)[offsets(B)])


@PROFILE
@given(st.data())
def test_composition_is_associative(data):
  # On bijections of one shape (random orders and nestings), where it succeeds.
  flat = data.draw(flat_shapes(max_size=64))

  def bijection():
    order = data.draw(st.permutations(range(len(flat))))
    shape = nest(data.draw, flat)
    return Layout(shape, order=unflatten_like([order.index(k) for k in range(len(flat))], shape))

  A, B, C = bijection(), bijection(), bijection()
  try:
    left = composition(composition(A, B), C)
    right = composition(A, composition(B, C))
  except ValueError:
    return
  np.testing.assert_array_equal(offsets(left), offsets(right))


# -- complement ---------------------------------------------------------------------------


@PROFILE
@given(gapped_layouts(), st.integers(1, 3), st.integers(0, 8))
def test_complement_properties(L, reps, extra):
  n = reps * span(L) + extra
  C = complement(L, n)
  flat = [(s, d) for s, d in zip(leaves(C.shape), leaves(C.stride)) if s > 1]
  assert [d for _, d in flat] == sorted(d for _, d in flat)  # ordered
  assert set(offsets(L).tolist()) & set(offsets(C).tolist()) == {0}  # disjoint images
  full = offsets(make_layout(L, C))
  assert len(set(full.tolist())) == len(full)  # injective
  rounded = -(-n // span(L)) * span(L)
  assert set(full.tolist()) == set(range(rounded))  # covers [0, n) exactly
  np.testing.assert_array_equal(offsets(C), greedy_origins(offsets(L), rounded))


@PROFILE
@given(layouts(max_size=64, max_stride=12), st.integers(1, 200))
def test_complement_succeeds_only_for_non_overlapping_layouts(L, n):
  try:
    C = complement(L, n)
  except ValueError as err:
    assert "complementable" in str(err)
    return
  F = filter(L)
  assert len(set(offsets(F).tolist())) == size(F)  # injective
  full = offsets(make_layout(F, C))
  assert len(set(full.tolist())) == len(full)
  assert set(range(n)) <= set(full.tolist())


# -- inverses ------------------------------------------------------------------------------


@PROFILE
@given(layouts(max_stride=8))
def test_right_inverse(L):
  R = right_inverse(L)
  r = offsets(R)
  assert r.max() < size(L)
  np.testing.assert_array_equal(ev(L, r), np.arange(size(R)))


@PROFILE
@given(compact_layouts())
def test_right_inverse_of_a_bijection_is_its_inverse(L):
  R = right_inverse(L)
  assert size(R) == size(L)
  np.testing.assert_array_equal(offsets(L)[offsets(R)], np.arange(size(L)))
  np.testing.assert_array_equal(offsets(R)[offsets(L)], np.arange(size(L)))


@PROFILE
@given(gapped_layouts())
def test_left_inverse(L):
  Linv = left_inverse(L)
  np.testing.assert_array_equal(ev(Linv, offsets(L)), np.arange(size(L)))


@PROFILE
@given(layouts(max_size=64, max_stride=8))
def test_left_inverse_exists_only_for_injective_layouts(L):
  injective = len(set(offsets(L).tolist())) == size(L)
  try:
    Linv = left_inverse(L)
  except ValueError as err:
    assert "inject" in str(err) or "left inverse" in str(err)
    return
  assert injective
  np.testing.assert_array_equal(ev(Linv, offsets(L)), np.arange(size(L)))


# -- divides ----------------------------------------------------------------------------------


@PROFILE
@given(layouts(max_size=256, pow2=True), st.data())
def test_logical_divide_by_layout(L, data):
  nbits = size(L).bit_length() - 1
  assume(nbits >= 1)
  T = data.draw(gapped_layouts(max_size=1 << nbits, pow2=True))
  assume(span(T) <= size(L))
  D = logical_divide(L, T)
  assert len(D) == 2 and size(D[0]) == size(T) and size(D) == size(L)
  assert D == composition(L, make_layout(T, complement(T, size(L))))
  # D((i, j)) == L(T(i) + origin_j): tile i of copy j of T.
  origins = greedy_origins(offsets(T), size(L))
  t, l = offsets(T), offsets(L)
  ii, jj = np.meshgrid(np.arange(size(T)), np.arange(len(origins)), indexing="ij")
  got = np.asarray(D((ii.ravel(), jj.ravel())))
  np.testing.assert_array_equal(got, l[t[ii.ravel()] + np.asarray(origins)[jj.ravel()]])


@PROFILE
@given(layouts(rank2=True, pow2=True, max_stride=12), st.data())
def test_zipped_tiled_flat_divide_by_mode(L, data):
  n0, n1 = size(L[0]), size(L[1])
  t0 = data.draw(st.sampled_from([t for t in (1, 2, 4, 8, 16) if n0 % t == 0]))
  t1 = data.draw(st.sampled_from([t for t in (1, 2, 4, 8, 16) if n1 % t == 0]))
  Z, T, F = zipped_divide(L, (t0, t1)), tiled_divide(L, (t0, t1)), flat_divide(L, (t0, t1))
  r0, r1 = n0 // t0, n1 // t1
  assert [size(Z[0][0]), size(Z[0][1]), size(Z[1][0]), size(Z[1][1])] == [t0, t1, r0, r1]
  i0, i1, j0, j1 = (
      a.ravel()
      for a in np.meshgrid(
          np.arange(t0), np.arange(t1), np.arange(r0), np.arange(r1), indexing="ij"
      )
  )
  # Reference: L at the mode-wise flat coordinates (i + t*j), by numpy.
  l2 = offsets(L).reshape((n0, n1), order="F")
  want = l2[i0 + t0 * j0, i1 + t1 * j1]
  np.testing.assert_array_equal(np.asarray(Z((i0, i1), (j0, j1))) + 0 * i0, want)
  assert len(T) == 3 and len(F) == 4
  np.testing.assert_array_equal(np.asarray(T((i0, i1), j0, j1)) + 0 * i0, want)
  np.testing.assert_array_equal(np.asarray(F(i0, i1, j0, j1)) + 0 * i0, want)


# -- products -----------------------------------------------------------------------------------


@PROFILE
@given(compact_layouts(max_size=32), layouts(max_size=16, max_stride=6))
def test_logical_product_of_compact_block(A, B):
  P = logical_product(A, B)
  assert P[0] == A
  assert size(P) == size(A) * size(B)
  # Copy j of A starts at size(A) * B(j).
  a, b = offsets(A), offsets(B)
  want = (a[:, None] + size(A) * b[None, :]).ravel(order="F")
  np.testing.assert_array_equal(offsets(P), want)


@PROFILE
@given(gapped_layouts(max_size=32), st.integers(1, 8))
def test_logical_product_fills_the_gaps_first(A, m):
  # B = m:1 asks for m copies of A; they start at the greedy origins.
  try:
    P = logical_product(A, Layout(m))
  except ValueError as err:
    assert "divisibility" in str(err)
    return
  assert P[0] == A and size(P) == size(A) * m
  origins = greedy_origins(offsets(A), size(A) * m + span(A))[:m]
  want = (offsets(A)[:, None] + np.asarray(origins)[None, :]).ravel(order="F")
  np.testing.assert_array_equal(offsets(P), want)
  assert len(set(want.tolist())) == len(want)  # injective


@PROFILE
@given(gapped_layouts(max_size=16, pow2=True), st.data())
def test_logical_product_with_strided_tiler_is_injective(A, data):
  # Power-of-two sizes: always a layout. Copy j of A starts at origin B(j)
  # of the complement (the greedy tiling of A's gaps), so the product is
  # injective whenever B is.
  B = data.draw(gapped_layouts(max_size=8, max_leaves=2, pow2=True))
  P = logical_product(A, B)
  assert P[0] == A and size(P) == size(A) * size(B)
  origins = np.asarray(greedy_origins(offsets(A), size(A) * (offsets(B).max() + 1) + span(A)))
  want = (offsets(A)[:, None] + origins[offsets(B)][None, :]).ravel(order="F")
  np.testing.assert_array_equal(offsets(P), want)
  assert len(set(want.tolist())) == len(want)


@PROFILE
@given(compact_layouts(max_size=16, max_leaves=2), layouts(rank2=True, max_stride=6), st.data())
def test_blocked_and_raked_products(A1, B, data):
  A0 = data.draw(compact_layouts(max_size=16, max_leaves=2))
  # A compact rank-2 block (random order), B any rank-2 layout.
  A = Layout((A0.shape, A1.shape), (A0.stride, tuple_scale(A1.stride, size(A0))))
  a0, a1, b0, b1 = size(A[0]), size(A[1]), size(B[0]), size(B[1])
  n = size(A)
  a = offsets(A).reshape((a0, a1), order="F")
  b = offsets(B).reshape((b0, b1), order="F")
  r, c = (x.ravel() for x in np.meshgrid(np.arange(a0 * b0), np.arange(a1 * b1), indexing="ij"))
  bl, rk = blocked_product(A, B), raked_product(A, B)
  np.testing.assert_array_equal(np.asarray(bl(r, c)), a[r % a0, c % a1] + n * b[r // a0, c // a1])
  np.testing.assert_array_equal(np.asarray(rk(r, c)), a[r // b0, c // b1] + n * b[r % b0, c % b1])


def tuple_scale(t, k):
  return tuple(tuple_scale(x, k) for x in t) if isinstance(t, tuple) else t * k


# -- vectors and casts ----------------------------------------------------------------------


@PROFILE
@given(st.data())
def test_max_common_vector_is_the_common_memory_prefix(data):
  flat = data.draw(flat_shapes(max_size=64, pow2=True))
  shape = tuple(flat)

  def bijection():
    order = data.draw(st.permutations(range(len(flat))))
    return Layout(shape, order=tuple(order.index(k) for k in range(len(flat))))

  a, b = bijection(), bijection()
  inv_a, inv_b = np.argsort(offsets(a)), np.argsort(offsets(b))
  n = 0
  while n < len(inv_a) and inv_a[n] == inv_b[n]:
    n += 1
  assert max_common_vector(a, b) == n
  M = max_common_layout(a, b)
  assert size(M) == n
  m = offsets(M)
  np.testing.assert_array_equal(ev(a, m), np.arange(n))
  np.testing.assert_array_equal(ev(b, m), np.arange(n))


@PROFILE
@given(layouts(max_size=64), st.sampled_from([2, 4, 8]))
def test_downcast_then_upcast_round_trips(L, n):
  D = downcast(L, n)
  assert upcast(D, n) == L
  unit = [s for s, d in zip(leaves(L.shape), leaves(L.stride)) if d == 1]
  if len(unit) == 1:
    # Each element becomes n consecutive narrower ones.
    want = {n * x + k for x in offsets(L).tolist() for k in range(n)}
    assert set(offsets(D).tolist()) == want


# -- int tuples ------------------------------------------------------------------------------


@PROFILE
@given(st.data())
def test_idx2crd_crd2idx_round_trip(data):
  flat = data.draw(flat_shapes(max_size=256))
  shape = nest(data.draw, flat)
  n = math.prod(flat)
  idx = np.arange(n)
  crd = idx2crd(idx, shape)
  np.testing.assert_array_equal(crd2idx(crd, shape) + 0 * idx, idx)
  # The leaves of the coordinate are numpy's Fortran-order unravel.
  for got, want in zip(leaves(crd), np.unravel_index(idx, flat, order="F")):
    np.testing.assert_array_equal(np.asarray(got) + 0 * idx, want)
  for i in data.draw(st.lists(st.integers(0, n - 1), max_size=5)):
    assert crd2idx(idx2crd(i, shape), shape) == i
