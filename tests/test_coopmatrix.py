"""Cooperative-matrix layouts against ``shared/reference/coopmatrix_layout.txt`` ("the document")."""

import doctest
import itertools
import math

import numpy as np
import pytest

import layouts.coopmatrix
from layouts.coopmatrix import coopmatrix_layout, coopmatrix_load, coopmatrix_params

jax = pytest.importorskip("jax")
jnp = jax.numpy


def row_col(layout, p, v):
  """(row, column): basis layouts leave out trailing zero coordinates."""
  rc = tuple(layout(p, v))
  return rc + (0,) * (2 - len(rc))


def test_docstring_examples():
  assert doctest.testmod(layouts.coopmatrix).failed == 0


# -- the document's tables -------------------------------------------------------------

TABLE_4x15 = """
.x 0,0  1,0  2,0  3,0  0,1  1,1  2,1  3,1  0,2  1,2  2,2  3,2  0,3  1,3  2,3  3,3
.y 0,4  1,4  2,4  3,4  0,5  1,5  2,5  3,5  0,6  1,6  2,6  3,6  0,7  1,7  2,7  3,7
.z 0,8  1,8  2,8  3,8  0,9  1,9  2,9  3,9  0,10 1,10 2,10 3,10 0,11 1,11 2,11 3,11
.w 0,12 1,12 2,12 3,12 0,13 1,13 2,13 3,13 0,14 1,14 2,14 3,14 -,- -,- -,- -,-
"""
TABLE_1x17 = """
.x 0,0  0,1  0,2  0,3  0,4  0,5  0,6  0,7  0,8  0,9  0,10 0,11 0,12 0,13 0,14 0,15
.y 0,16 -,-  -,-  -,-  -,-  -,-  -,-  -,-  -,-  -,-  -,-  -,-  -,-  -,-  -,-  -,-
"""


def parse_table(text):
  """Rows are components (.x .y ...), columns work-items; '-,-' is padding (None)."""
  rows = []
  for line in text.strip().splitlines():
    cells = line.split()[1:]
    rows.append([None if c == "-,-" else tuple(int(x) for x in c.split(",")) for c in cells])
  return rows


def layout_table(m, n, s):
  """The layout in the document's format: padding (column >= N) as None."""
  params = coopmatrix_params(m, n, s, "matrix_acc", "f32")
  cells = [[row_col(params.layout, p, v) for p in range(s)] for v in range(params.components)]
  return [[cell if cell[1] < n else None for cell in row] for row in cells]


@pytest.mark.parametrize("m,n,table", [(4, 15, TABLE_4x15), (1, 17, TABLE_1x17)])
def test_document_tables(m, n, table):
  assert layout_table(m, n, 16) == parse_table(table)


# -- the document's formulas -----------------------------------------------------------

CASES = [
    (m, n, s, use, dtype)
    for m, s in [(1, 16), (4, 16), (8, 16), (16, 16), (64, 16), (16, 8), (32, 32), (4, 1)]
    for n in (1, 5, 15, 16, 17, 33)
    for use, dtype in [
        ("matrix_acc", "f32"),
        ("matrix_b", "i8"),
        ("matrix_b", "f16"),
        ("matrix_a", "f32"),
    ]
]


def held(p):
  """(rows, cols) of every (work-item, component), as (S, V) arrays."""
  work_item, v = np.meshgrid(np.arange(p.subgroup_size), np.arange(p.components), indexing="ij")
  return np.broadcast_arrays(*row_col(p.layout, work_item, v))


@pytest.mark.parametrize("m,n,s,use,dtype", CASES)
def test_layout_matches_the_documents_formulas(m, n, s, use, dtype):
  p = coopmatrix_params(m, n, s, use, dtype)
  big_i, big_j, k1, k2 = p.I, p.J, p.K1, p.K2
  k = m // big_i
  # J := min{n' >= N : I n' mod S = 0} = ceil(I N / S) S / I
  assert (
      big_j
      == min(x for x in range(n, n + s + 1) if big_i * x % s == 0)
      == math.ceil(big_i * n / s) * s // big_i
  )
  v_count = big_i * k * big_j // s
  assert p.components == v_count and v_count // k == big_i * big_j // s  # "V/K = IJ/S"
  work_item, v = np.meshgrid(np.arange(s), np.arange(v_count), indexing="ij")
  rows, cols = held(p)
  # W^p[v] = A*[L^-1(p + vS)] with the document's inverse of L
  flat = work_item + v * s
  i, kk1 = flat % big_i, flat // big_i % k1
  j, kk2 = flat // (big_i * k1) % big_j, flat // (big_i * k1 * big_j)
  assert np.array_equal(rows, i + kk1 * big_i + kk2 * big_i * k1) and np.array_equal(cols, j)
  # the combined closed form, with v = w1 + u K1 + w2 K1 (V/K)
  w1, u, w2 = v % k1, v // k1 % (v_count // k), v // (k1 * (v_count // k))
  assert (
      np.array_equal(i, work_item % big_i) and np.array_equal(kk1, w1) and np.array_equal(kk2, w2)
  )
  assert np.array_equal(j, work_item // big_i + u * (s // big_i))
  # every element of the M x N matrix is held exactly once; the rest is padding
  inside = cols < n
  assert rows.max() < m
  assert sorted(zip(rows[inside].tolist(), cols[inside].tolist())) == sorted(
      itertools.product(range(m), range(n))
  )
  assert (~inside).sum() == s * p.components - m * n


def test_matrix_b_k1_choice():
  # "omega_b = max(1, 2/size(ty)). We choose K1 = omega_b if M/S > 1 else 1."
  assert coopmatrix_params(32, 8, 16, "matrix_b", "i8").K1 == 2
  assert coopmatrix_params(32, 8, 16, "matrix_b", "f16").K1 == 1
  assert coopmatrix_params(32, 8, 16, "matrix_b", "f32").K1 == 1
  assert coopmatrix_params(16, 8, 16, "matrix_b", "i8").K1 == 1
  assert {coopmatrix_params(64, 8, 16, use, "i8").K1 for use in ("matrix_a", "matrix_acc")} == {1}
  # With K1 = 2, components 2u and 2u+1 of work-item p are rows p and p+S of column u.
  layout = coopmatrix_layout(32, 8, 16, "matrix_b", "i8")
  for p, u in itertools.product(range(16), range(8)):
    assert (row_col(layout, p, 2 * u), row_col(layout, p, 2 * u + 1)) == ((p, u), (p + 16, u))


# -- VNNI packing of matrix_a ---------------------------------------------------------------


@pytest.mark.parametrize("dtype,omega", [("bf16", 2), ("f16", 2), ("i8", 4), ("f32", 1)])
def test_matrix_a_vnni(dtype, omega):
  p = coopmatrix_params(16, 32, 16, "matrix_a", dtype)
  assert (p.omega, p.K1) == (omega, 1)
  for work_item, c, j in itertools.product(range(16), range(omega), range(32 // omega)):
    # A**[c, i, k1, j, k2] = A*[i, k1, c + j*omega, k2]; one work-item owns all channels of an entry
    assert row_col(p.layout, work_item, c + omega * j) == (work_item, c + j * omega)


@pytest.mark.parametrize(
    "m,n,s",
    [
        (m, n, s)
        for m, s in [(16, 16), (32, 16), (64, 8), (8, 16), (4, 16)]
        for n in (4, 8, 16, 24, 32, 64)
    ],
)
@pytest.mark.parametrize("dtype,omega", [("bf16", 2), ("i8", 4)])
def test_vnni_layouts_hold_every_element_once(m, n, s, dtype, omega):
  big_i = min(m, s)
  j = math.ceil(big_i * n / s) * s // big_i
  if (big_i * (m // big_i) * (j // omega)) % s:  # only when I < S: see the rejection test below
    assert big_i < s
    with pytest.raises(ValueError, match="does not spread it evenly"):
      coopmatrix_params(m, n, s, "matrix_a", dtype)
    return
  p = coopmatrix_params(m, n, s, "matrix_a", dtype)
  assert p.omega == omega
  rows, cols = held(p)
  inside = cols < n
  assert sorted(zip(rows[inside].tolist(), cols[inside].tolist())) == sorted(
      itertools.product(range(m), range(n))
  )
  # the omega channels of an entry are adjacent columns c + omega*j of one row
  assert np.array_equal(
      cols.reshape(s, -1, omega) % omega,
      np.broadcast_to(np.arange(omega), (s, p.components // omega, omega)),
  )
  assert (rows.reshape(s, -1, omega) == rows.reshape(s, -1, omega)[..., :1]).all()


def test_vnni_packs_channel_0_in_the_low_bits():
  # "we pack A**_{0,...} in the lower 16 bits of an i32 and A**_{1,...} in the higher 16 bits"
  p = coopmatrix_params(16, 32, 16, "matrix_a", "f16")
  a = np.arange(16 * 32, dtype=np.float16).reshape(16, 32)
  loaded = np.asarray(jax.jit(lambda mem: coopmatrix_load(mem, p, (0, 0), (16, 32), (32, 1)))(a))
  packed = loaded.reshape(16, p.components // 2, 2).view(np.uint32)[..., 0]
  assert np.array_equal((packed & 0xFFFF).astype(np.uint16).view(np.float16), a[:, 0::2])
  assert np.array_equal((packed >> 16).astype(np.uint16).view(np.float16), a[:, 1::2])


def test_vnni_needs_omega_to_divide_n():
  # "low precision matrices are VNNI transformed if N is a multiple of omega"
  assert coopmatrix_params(16, 30, 16, "matrix_a", "i8").omega == 1
  assert coopmatrix_params(16, 30, 16, "matrix_a", "bf16").omega == 2


def test_vnni_tensor_that_does_not_spread_evenly_is_rejected():
  # I = 2, J = 8, omega = 4: A** has 2*1*ceil(8/4) = 4 entries for 16 work-items.
  with pytest.raises(ValueError, match="not a multiple of the subgroup size 16"):
    coopmatrix_params(2, 8, 16, "matrix_a", "i8")


@pytest.mark.parametrize(
    "args,rule",
    [
        ((3, 8, 16, "matrix_acc", "f32"), "M must be a power of two"),
        ((4, 8, 12, "matrix_acc", "f32"), "subgroup_size must be a power of two"),
        ((4, 0, 16, "matrix_acc", "f32"), "N must be a positive int"),
        ((4, 8, 16, "matrix_c", "f32"), "use must be"),
        ((4, 8, 16, "matrix_acc", "int4"), "whole bytes"),
    ],
)
def test_parameter_rules(args, rule):
  with pytest.raises(ValueError, match=rule):
    coopmatrix_params(*args)


# -- the SIMT load ----------------------------------------------------------------------------


def load_pseudo_code(
    a,
    m,
    n,
    k1,
    s,
    pos0,
    pos1,
    shape0,
    shape1,
    stride0,
    stride1,
    transpose,
    rows_checked,
    cols_checked,
):
  """The document's ``load_coopmatrix``, line by line (with a real ceil, see below)."""
  big_i = min(m, s)
  big_j = math.ceil(big_i * n / s) * s // big_i
  k = m // big_i
  assert k % k1 == 0
  k2 = k // k1
  needs_mask = big_j * s // big_i > n
  if transpose:
    shape0, shape1 = shape1, shape0
    stride0, stride1 = stride1, stride0
  v = big_i * k * big_j // s
  r = np.zeros((s, v), a.dtype)
  for p in range(s):
    i0, j0 = p % big_i, p // big_i
    for w1 in range(k1):
      for w2 in range(k2):
        row = pos0 + i0 + (w1 + w2 * k1) * big_i
        row_ok = not rows_checked or 0 <= row < shape0
        for u in range(v // k):
          index = w1 + u * k1 + w2 * k1 * (v // k)
          if not row_ok:
            r[p, index] = 0
            continue
          j = j0 + u * (s // big_i)
          col = pos1 + j
          col_ok = not cols_checked or 0 <= col < shape1
          mask_ok = not needs_mask or j < n
          r[p, index] = a[row * stride0 + col * stride1] if mask_ok and col_ok else 0
  return r


LOAD_CASES = [
    # m, n, s, use, dtype, pos, shape, stride, transpose, rows_checked, cols_checked
    (4, 15, 16, "matrix_acc", np.float32, (10, 20), (20, 30), (30, 1), False, True, True),
    (1, 17, 16, "matrix_acc", np.float32, (3, 5), (20, 30), (30, 1), False, True, True),
    (32, 8, 16, "matrix_b", np.int8, (-4, 25), (20, 30), (30, 1), False, True, True),
    (64, 24, 16, "matrix_acc", np.float32, (0, 0), (70, 30), (1, 70), True, True, True),
    (8, 5, 16, "matrix_acc", np.float32, (2, 3), (20, 30), (30, 1), False, False, False),
    (16, 16, 8, "matrix_b", np.float16, (5, 14), (20, 30), (1, 20), True, True, False),
    (16, 20, 16, "matrix_acc", np.float32, (12, 12), (20, 30), (30, 1), False, False, True),
]


@pytest.mark.parametrize(
    "m,n,s,use,dtype,pos,shape,stride,transpose,rows_checked,cols_checked", LOAD_CASES
)
def test_load_matches_the_pseudo_code(
    m, n, s, use, dtype, pos, shape, stride, transpose, rows_checked, cols_checked
):
  a = (np.arange(4096) % 97 + 1).astype(dtype)
  params = coopmatrix_params(m, n, s, use, dtype)
  expected = load_pseudo_code(
      a, m, n, params.K1, s, *pos, *shape, *stride, transpose, rows_checked, cols_checked
  )
  load = jax.jit(
      lambda mem: coopmatrix_load(
          mem,
          params,
          pos,
          shape,
          stride,
          transpose=transpose,
          rows_checked=rows_checked,
          cols_checked=cols_checked,
      )
  )
  got = load(jnp.asarray(a))
  assert np.array_equal(np.asarray(got), expected)


def test_load_under_jit_with_traced_position():
  a = jnp.arange(20 * 30, dtype=jnp.float32)
  params = coopmatrix_params(4, 15, 16, "matrix_acc", "f32")
  load = jax.jit(lambda mem, p0, p1: coopmatrix_load(mem, params, (p0, p1), (20, 30), (30, 1)))
  for pos in [(0, 0), (17, 20), (-2, -3)]:
    expected = load_pseudo_code(np.asarray(a), 4, 15, 1, 16, *pos, 20, 30, 30, 1, False, True, True)
    assert np.array_equal(np.asarray(load(a, *pos)), expected)


def test_pseudo_code_integer_ceil_loses_columns():
  # The pseudo-code's "constexpr int J = ceil(I*N/S)*S/I;" divides ints before
  # ceil: for the 4x15 example I*N/S = 60/16 = 3, so J = 12 (not 16) and
  # V = I*K*J/S = 3: the table's fourth component (.w, columns 12..14) is never loaded.
  big_i, n, s = 4, 15, 16
  j_as_written = math.ceil(big_i * n // s) * s // big_i
  assert j_as_written == 12 < n
  assert coopmatrix_params(4, 15, 16, "matrix_acc", "f32").J == 16
