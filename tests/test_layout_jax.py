"""Layouts, swizzles, composed and coordinate layouts evaluate unchanged on
Python ints, numpy arrays and traced jax integers (jit, vmap, Pallas kernel
bodies in interpret mode), and are hashable static arguments of ``jax.jit``.

Expected values come from an independent numpy reference (column-major
unravel, bit-by-bit swizzle) or from a plain Python loop over ints.
"""

import functools
import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402

from layouts import (  # noqa: E402
    ComposedLayout,
    E,
    Layout,
    Swizzle,
    composition,
    local_tile,
    make_identity_layout,
    make_identity_tensor,
    make_tensor,
)


from layout_reference import offsets as ref_offsets  # noqa: E402


def ref_swizzle(x, B, M, S):
  out = np.array(x, dtype=np.int64)
  x = np.array(x, dtype=np.int64)
  for k in range(B):
    out ^= ((x >> (M + S + k)) & 1) << (M + k)
  return out


LAYOUT = Layout((4, (2, 8)), (16, (1, 2)))  # a permutation of [0, 64)
SWIZZLE = Swizzle(2, 1, 3)
COMPOSED = composition(Swizzle(3, 3, 3), Layout((8, 64), (64, 1)))
COORDS = make_identity_layout((8, (2, 4)))
N = 64


def expected_layout(i):
  return ref_offsets(LAYOUT)[np.asarray(i)]


def expected_composed(i):
  return ref_swizzle(ref_offsets(COMPOSED.inner)[np.asarray(i)], 3, 3, 3)


def expected_coords(i):
  i = np.asarray(i)
  return i % 8, i // 8  # flat coordinate per mode


# -- (a) Python ints and (b) numpy arrays ----------------------------------------------------


def test_python_ints():
  assert [LAYOUT(i) for i in range(N)] == expected_layout(np.arange(N)).tolist()
  assert [SWIZZLE(i) for i in range(N)] == ref_swizzle(np.arange(N), 2, 1, 3).tolist()
  assert [COMPOSED(i) for i in range(512)] == expected_composed(np.arange(512)).tolist()
  rows, cols = expected_coords(np.arange(N))
  assert [COORDS(i) for i in range(N)] == list(zip(rows.tolist(), cols.tolist()))
  assert all(type(LAYOUT(i)) is int for i in range(N))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_numpy_arrays_vectorize_like_a_python_loop(dtype):
  idx = np.arange(N, dtype=dtype)
  for obj in (LAYOUT, SWIZZLE, COMPOSED):
    got = obj(idx)
    assert isinstance(got, np.ndarray) and got.shape == idx.shape
    np.testing.assert_array_equal(got, [obj(int(i)) for i in idx])
  rows, cols = COORDS(idx)
  loop = [COORDS(int(i)) for i in idx]
  assert rows.tolist() == [a for a, _ in loop] and cols.tolist() == [b for _, b in loop]
  # Coordinates and 2-D index grids too.
  r, c = np.meshgrid(np.arange(4), np.arange(16), indexing="ij")
  np.testing.assert_array_equal(
      LAYOUT(r, c), [[LAYOUT(int(a), int(b)) for b in range(16)] for a in range(4)]
  )
  j, k = c % 2, c // 2
  np.testing.assert_array_equal(LAYOUT((r, (j, k))), 16 * r + j + 2 * k)


# -- (c) traced jax integers ----------------------------------------------------------------------


def test_jit():
  idx = jnp.arange(N, dtype=jnp.int32)
  np.testing.assert_array_equal(jax.jit(LAYOUT)(idx), expected_layout(np.arange(N)))
  np.testing.assert_array_equal(jax.jit(SWIZZLE)(idx), ref_swizzle(np.arange(N), 2, 1, 3))
  big = jnp.arange(512, dtype=jnp.int32)
  np.testing.assert_array_equal(jax.jit(COMPOSED)(big), expected_composed(np.arange(512)))
  rows, cols = jax.jit(COORDS)(idx)
  want = expected_coords(np.arange(N))
  np.testing.assert_array_equal(rows, want[0])
  np.testing.assert_array_equal(cols, want[1])


def test_jit_hierarchical_coordinates_and_scalars():
  f = jax.jit(lambda i, j, k: LAYOUT((i, (j, k))))
  for i, j, k in itertools.product(range(4), range(2), range(8)):
    assert int(f(jnp.int32(i), jnp.int32(j), jnp.int32(k))) == 16 * i + j + 2 * k
  g = jax.jit(lambda r, c: COMPOSED(r, c))
  assert int(g(jnp.int32(3), jnp.int32(17))) == int(ref_swizzle(64 * 3 + 17, 3, 3, 3))


def test_vmap():
  idx = jnp.arange(N, dtype=jnp.int32)
  np.testing.assert_array_equal(jax.vmap(LAYOUT)(idx), expected_layout(np.arange(N)))
  np.testing.assert_array_equal(jax.vmap(SWIZZLE)(idx), ref_swizzle(np.arange(N), 2, 1, 3))
  np.testing.assert_array_equal(jax.vmap(COMPOSED)(idx), expected_composed(np.arange(N)))
  rows, cols = jax.vmap(COORDS)(idx)
  np.testing.assert_array_equal(rows, expected_coords(np.arange(N))[0])
  np.testing.assert_array_equal(cols, expected_coords(np.arange(N))[1])
  r, c = (x.ravel() for x in np.meshgrid(np.arange(8), np.arange(64), indexing="ij"))
  two = jax.jit(jax.vmap(lambda a, b: COMPOSED(a, b)))(jnp.asarray(r), jnp.asarray(c))
  np.testing.assert_array_equal(two, ref_swizzle(64 * r + c, 3, 3, 3))


def test_traced_slices_and_tiles():
  # A traced tile coordinate only moves the offset; the tile layout is static.
  L = Layout((8, 16), (16, 1))

  @jax.jit
  def tile_values(p0, p1):
    t = local_tile(L, (4, 8), (p0, p1))
    r, c = jnp.meshgrid(jnp.arange(4), jnp.arange(8), indexing="ij")
    return t(r, c)

  for p0, p1 in itertools.product(range(2), range(2)):
    want = np.arange(128).reshape(8, 16)[4 * p0 : 4 * p0 + 4, 8 * p1 : 8 * p1 + 8]
    np.testing.assert_array_equal(tile_values(jnp.int32(p0), jnp.int32(p1)), want)

  data = jnp.arange(128, dtype=jnp.float32).reshape(8, 16) * 2
  col = jax.jit(lambda a, j: make_tensor(a, L)(None, j)(jnp.arange(8)))(data, jnp.int32(5))
  np.testing.assert_array_equal(col, np.asarray(data)[:, 5])
  base = jax.jit(lambda p: local_tile(make_identity_tensor((8, 16)), (4, 8), (p, 1)).offset)(
      jnp.int32(1)
  )
  assert tuple(int(x) for x in base) == (4, 8)


# -- Pallas kernel bodies (interpret mode on CPU) ------------------------------------------------


def test_pallas_kernel_evaluates_layouts():
  def kernel(lay_ref, sw_ref, comp_ref, row_ref, col_ref):
    i = jax.lax.broadcasted_iota(jnp.int32, (N,), 0)
    lay_ref[...] = LAYOUT(i)
    sw_ref[...] = SWIZZLE(i)
    comp_ref[...] = COMPOSED(i)
    r, c = COORDS(i)
    row_ref[...] = r
    col_ref[...] = c

  outs = pl.pallas_call(
      kernel, out_shape=[jax.ShapeDtypeStruct((N,), jnp.int32)] * 5, interpret=True
  )()
  lay, sw, comp, rows, cols = (np.asarray(o) for o in outs)
  np.testing.assert_array_equal(lay, expected_layout(np.arange(N)))
  np.testing.assert_array_equal(sw, ref_swizzle(np.arange(N), 2, 1, 3))
  np.testing.assert_array_equal(comp, expected_composed(np.arange(N)))
  np.testing.assert_array_equal(rows, expected_coords(np.arange(N))[0])
  np.testing.assert_array_equal(cols, expected_coords(np.arange(N))[1])


def test_pallas_grid_kernel_with_program_id_tiles():
  # Each program writes the offsets of its (4, 8) tile of a swizzled
  # (8, 64) layout, located with local_tile at its traced program ids.
  def kernel(o_ref):
    p0, p1 = pl.program_id(0), pl.program_id(1)
    t = local_tile(COMPOSED, (4, 8), (p0, p1))
    r = jax.lax.broadcasted_iota(jnp.int32, (4, 8), 0)
    c = jax.lax.broadcasted_iota(jnp.int32, (4, 8), 1)
    o_ref[...] = t(r, c)

  out = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((8, 64), jnp.int32),
      grid=(2, 8),
      out_specs=pl.BlockSpec((4, 8), lambda i, j: (i, j)),
      interpret=True,
  )()
  r, c = np.meshgrid(np.arange(8), np.arange(64), indexing="ij")
  np.testing.assert_array_equal(np.asarray(out), ref_swizzle(64 * r + c, 3, 3, 3))


# -- static arguments of jax.jit ------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: Layout((4, (2, 8)), (16, (1, 2))),
        lambda: Swizzle(2, 1, 3),
        lambda: composition(Swizzle(3, 3, 3), Layout((8, 64), (64, 1))),
        lambda: make_identity_layout((8, (2, 4))),
        lambda: Layout((8, 8), (E(1), E(0))),
    ],
)
def test_hashable_static_arguments_cache_by_value(make):
  traces = []

  @functools.partial(jax.jit, static_argnums=0)
  def apply(obj, x):
    traces.append(obj)
    return obj(x)

  x = jnp.arange(N, dtype=jnp.int32)
  first = apply(make(), x)
  again = apply(make(), x)  # an equal object built anew: cached
  assert len(traces) == 1
  assert make() == make() and hash(make()) == hash(make())
  np.testing.assert_array_equal(
      np.asarray(jax.tree_util.tree_leaves(first)), np.asarray(jax.tree_util.tree_leaves(again))
  )
  other = {
      Swizzle: Swizzle(1, 0, 2),
      ComposedLayout: composition(Swizzle(2, 3, 3), Layout((8, 64), (64, 1))),
  }.get(type(make()), Layout(64, 3))
  assert other != make()
  apply(other, x)  # a different object: traced again
  assert len(traces) == 2
  apply(other, x)
  assert len(traces) == 2


def test_static_layout_argument_changes_the_result():
  @functools.partial(jax.jit, static_argnums=0)
  def gather(layout, data):
    return data[layout(jnp.arange(16))]

  data = jnp.arange(100, dtype=jnp.int32)
  np.testing.assert_array_equal(
      gather(Layout((4, 4), (4, 1)), data), [4 * (i % 4) + i // 4 for i in range(16)]
  )
  np.testing.assert_array_equal(
      gather(Layout((4, 4), (1, 10)), data), [(i % 4) + 10 * (i // 4) for i in range(16)]
  )
