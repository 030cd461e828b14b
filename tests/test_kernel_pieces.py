"""Property tests of the small pieces every kernel shares (issue 19: each module has its
tests): the tile raster, shared-memory budgeting and swizzles, TMA padding, the register
split, split-K's partial sums. Pure Python and numpy; no kernel runs."""

import jax.numpy as jnp
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

from pallas_gemm import pipeline, raster, smem, split_k, tma_padding  # noqa: E402
from hypothesis_budget import examples

DTYPES = ["bfloat16", "float16", "float32", "float8_e4m3fn"]


# -- raster -----------------------------------------------------------------------------
@pytest.mark.slow
@settings(max_examples=examples(20), deadline=None)  # each example runs jnp ops eagerly (~0.2 s)
@given(
    m_tiles=st.integers(1, 40),
    n_tiles=st.integers(1, 40),
    group=st.integers(1, 12),
    order=st.sampled_from(raster.ORDERS),
)
def test_the_raster_visits_every_tile_once_each_step_to_a_neighbour(m_tiles, n_tiles, group, order):
  index = np.arange(m_tiles * n_tiles)
  mi, ni = (
      np.asarray(v) for v in raster.tile_coords(index, m_tiles, n_tiles, group=group, order=order)
  )
  assert ((0 <= mi) & (mi < m_tiles) & (0 <= ni) & (ni < n_tiles)).all()
  assert len(set(zip(mi.tolist(), ni.tolist()))) == m_tiles * n_tiles  # a bijection
  along = ni if order == "along_n" else mi
  across = mi if order == "along_n" else ni
  # the snake: one step along the sweep at most, and within a band of `group` across
  assert (np.abs(np.diff(along)) <= 1).all()
  assert (
      np.abs(np.diff(across)) <= max(1, min(group, m_tiles if order == "along_n" else n_tiles))
  ).all()


def test_an_unknown_raster_order_is_named():
  with pytest.raises(ValueError, match="order must be one of"):
    raster.tile_coords(0, 2, 2, group=1, order="diagonal")


# -- shared memory ----------------------------------------------------------------------
@settings(max_examples=examples(60), deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=0, max_size=5),
    dtype=st.sampled_from(DTYPES),
)
def test_the_footprint_counts_each_buffer_in_whole_kib_plus_the_barriers(shapes, dtype):
  total = smem.footprint(*[(shape, dtype) for shape in shapes], None)  # None: an absent one
  raw = [a * b * jnp.dtype(dtype).itemsize for a, b in shapes]
  assert total == smem.RESERVED_BYTES + sum(
      -(-r // smem.ALIGN_BYTES) * smem.ALIGN_BYTES for r in raw
  )
  assert total >= smem.RESERVED_BYTES + sum(raw)


@settings(max_examples=examples(80), deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    tile_minor=st.sampled_from([16, 32, 64, 128, 256]),
    minors=st.lists(st.integers(1, 5000), min_size=1, max_size=2),
)
def test_the_widest_swizzle_is_legal_for_every_array_and_nothing_wider_is(
    dtype, tile_minor, minors
):
  width = smem.widest_swizzle(dtype, tile_minor, *minors)
  if width is not None:
    assert width in smem.SWIZZLE_BYTES
    assert all(smem.is_tma_compatible_extent(dtype, e, width) for e in minors)
  for wider in smem.SWIZZLE_BYTES:
    if width is None or wider > width:  # no wider width gives the tile a legal layout
      assert smem.operand_spec(dtype, (8, tile_minor), "K", *minors, swizzle=wider) is None


def test_deepest_returns_the_first_fit_or_the_last_candidate():
  made = []
  pick = smem.deepest(lambda s: made.append(s) or s, [6, 5, 4, 3], lambda s: s <= 4)
  assert pick == 4 and made == [6, 5, 4]
  assert smem.deepest(lambda s: s, [6, 5], lambda s: False) == 5


# -- TMA padding ------------------------------------------------------------------------
@settings(max_examples=examples(100), deadline=None)
@given(x=st.integers(0, 100_000), multiple=st.integers(1, 512))
def test_round_up_is_the_least_multiple_not_below(x, multiple):
  r = tma_padding.round_up(x, multiple)
  assert r % multiple == 0 and x <= r < x + multiple


@settings(max_examples=examples(100), deadline=None)
@given(rows=st.integers(1, 10_000), cols=st.integers(1, 10_000), dtype=st.sampled_from(DTYPES))
def test_tma_extents_are_legal_and_minimal(rows, cols, dtype):
  r = tma_padding.tma_rows(rows)
  assert r == rows if rows < 8 else (r % 8 == 0 and rows <= r < rows + 8)
  c = tma_padding.tma_operand_cols(cols, dtype)
  span = smem.swizzle_span(dtype, 128)
  assert smem.is_tma_compatible_extent(dtype, c, 128) and cols <= c < cols + span


@settings(max_examples=examples(30), deadline=None)
@given(
    shape=st.tuples(st.integers(1, 4), st.integers(1, 9), st.integers(1, 9)),
    grow=st.tuples(st.integers(-3, 5), st.integers(-3, 5)),
)
def test_pad_last2_keeps_the_values_and_pads_zeros(shape, grow):
  x = jnp.asarray(np.random.default_rng(0).standard_normal(shape) + 3.0, jnp.float32)
  rows, cols = shape[1] + grow[0], shape[2] + grow[1]
  y = np.asarray(tma_padding.pad_last2(x, rows, cols))
  assert y.shape == (shape[0], max(rows, shape[1]), max(cols, shape[2]))
  np.testing.assert_array_equal(y[:, : shape[1], : shape[2]], np.asarray(x))
  assert (y[:, shape[1] :, :] == 0).all() and (y[:, :, shape[2] :] == 0).all()


# -- registers and split-K --------------------------------------------------------------
@pytest.mark.parametrize("consumers", [1, 2, 3, 4])
def test_the_register_split_fits_the_register_file(consumers):
  start = 65536 // (128 * (consumers + 1)) // 8 * 8
  grown = pipeline.compute_registers(consumers)
  assert grown % 8 == 0 and grown >= start
  # what the producer gives back pays for what the consumers take
  assert consumers * (grown - start) <= start - pipeline.MEMORY_REGISTERS
  assert 128 * (consumers * grown + pipeline.MEMORY_REGISTERS) <= 65536


@settings(max_examples=examples(30), deadline=None)
@given(splits=st.integers(1, 6), batch=st.integers(1, 3), m=st.integers(1, 7), n=st.integers(1, 7))
def test_split_k_partials_sum_slice_by_slice(splits, batch, m, n):
  parts = np.random.default_rng(splits * 7 + batch).standard_normal((splits, batch, m, n))
  got = np.asarray(split_k.sum_partials(jnp.asarray(parts.reshape(-1, m, n), jnp.float32), splits))
  np.testing.assert_allclose(got, parts.sum(axis=0), rtol=1e-5, atol=1e-5)
