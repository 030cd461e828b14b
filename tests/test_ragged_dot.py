"""pallas_gemm.ragged_dot: the grouped GEMM against `jax.lax.ragged_dot`.

Tiers, as for the dense kernel:
- the work-item schedule decoded in pure JAX (every output row written exactly
  once, by its own group, within the static item bound);
- CUDA lowering on the CPU (`jax.export`) for the config matrix, and our own
  errors for rejected configs and bad arguments;
- numerics in GPU interpret mode (2 SMs, NaN-poisoned memory, so an unwritten
  row fails) at odd sizes with random group sizes, empty groups, a tail of
  rows past sum(group_sizes), one group taking every row, the custom_vjp and
  the drhs kernel (`ragged_tgmm`). jax 0.10.2's interpreter cannot run WGMMA
  on a transposed SMEM view, so the transposed-rhs forward, the gradient
  (dlhs flips the rhs layout) and ragged_tgmm (x is a transposed A operand)
  are skipped there with that reason;
- the XLA implementation path.
"""

import dataclasses

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_gemm import _compat
from pallas_gemm.grouped import _run_tgmm, ragged_dot
from pallas_gemm.ragged_tgmm import TgmmConfig, TgmmProblem, ragged_tgmm
from pallas_gemm.ragged_gemm import (
    RaggedConfig,
    RaggedProblem,
    _item_decoder,
    _Plan,
    item_table,
    default_ragged_config,
    max_items,
    ragged_gemm,
)

from interpret_support import hang_guard, needs_transposes  # noqa: F401 (hang_guard: autouse)

BOUND = 8e-3  # relative Frobenius error, bf16 output


def _random(rng, shape, dtype=jnp.bfloat16):
  return jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype)


def _random_sizes(rng, groups, m, *, total=None):
  """`groups` sizes summing to `total` (default m), some of them zero."""
  total = m if total is None else total
  cuts = np.sort(rng.integers(0, total + 1, groups - 1))
  sizes = np.diff(np.concatenate([[0], cuts, [total]]))
  sizes[rng.integers(0, groups)] = 0  # at least one empty group
  return jnp.asarray(sizes, jnp.int32)


def _reference(lhs, rhs, sizes, transpose_rhs):
  if transpose_rhs:
    rhs = jnp.swapaxes(rhs, 1, 2)
  return lax.ragged_dot(
      lhs.astype(jnp.float32), rhs.astype(jnp.float32), sizes, precision=lax.Precision.HIGHEST
  )


def _check(out, ref):
  out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
  ref = np.asarray(ref, np.float64)
  assert out.shape == ref.shape
  assert not np.isnan(out).any(), f"{np.isnan(out).sum()} output elements never written"
  zero_rows = ~ref.any(axis=1)
  assert not out[zero_rows].any(), "rows outside every group must be zero"
  err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
  assert err <= BOUND, f"relative error {err:.2e} > {BOUND}"


# -- the schedule ---------------------------------------------------------------
@pytest.mark.parametrize(
    "case",
    [
        dict(m=1000, sizes=[300, 0, 0, 511, 189]),  # sum == m, empty groups
        dict(m=1000, sizes=[128, 128, 0, 300]),  # boundaries on tile edges, a tail
        dict(m=1000, sizes=[1000, 0, 0]),  # one group takes all rows
        dict(m=1000, sizes=[0, 0, 0]),  # all empty: only zeros
        dict(m=1000, sizes=[700, 700, 5]),  # sum > m: cut at m
        dict(m=130, sizes=[1, 1, 1, 1, 1, 1, 1, 1, 100]),  # many groups in one tile
        dict(m=300, rows=384, sizes=[10, 250]),  # padded output rows (interpret)
        dict(m=2000, sizes=[0, 7, 100, 1, 0] * 8),  # 40 groups: the decoder's loop form
        dict(m=1000, sizes=[700, -3, 2**31 - 1, 5]),  # negative and huge sizes: clipped
    ],
)
@pytest.mark.parametrize("table", [False, True], ids=["in-kernel", "item_table"])
def test_schedule_writes_every_row_once(case, table):
  m, rows, sizes = case["m"], case.get("rows"), np.asarray(case["sizes"], np.int32)
  problem = RaggedProblem(m=m, n=256, k=64, groups=len(sizes), m_out=rows)
  config = RaggedConfig()
  plan = _Plan(problem, config, 128, 64, item_table=table)
  rows = problem.rows
  owner = np.full(rows, -2)
  ends = np.minimum(np.cumsum(np.clip(sizes, 0, m).astype(np.int64)), m)
  group_of_row = np.searchsorted(ends, np.arange(rows), side="right")  # G for the tail
  source = jnp.asarray(sizes)
  if table:  # the items listed by XLA, read per item by the kernel
    source = item_table(source, problem, config.tile_m, max_items(problem, config))
  decode = jax.jit(jax.vmap(lambda w: dataclasses.astuple(_item_decoder(source, plan)(w))))
  items = [np.asarray(x) for x in decode(jnp.arange(max_items(problem, config)))]
  for group, r0, lo, hi, active, compute in zip(*items):
    if not active:
      continue
    written = np.arange(max(lo, r0), min(hi, r0 + config.tile_m))
    assert written.size, "an active item writes at least one row"
    assert compute == (group < len(sizes))
    assert (owner[written] == -2).all(), "a row written twice"
    assert (group_of_row[written] == group).all(), "a row written by another group's item"
    owner[written] = group
  assert (owner != -2).all(), f"rows never written: {np.flatnonzero(owner == -2)[:10]}"
  # Boxes start at each group's first row (rounded down to 8): one partial box per group.
  starts = np.concatenate([[0], ends[:-1]])
  spans = np.where(ends > starts, -(-(ends - starts // 8 * 8) // config.tile_m), 0)
  assert int(np.sum(items[4] & items[5])) == int(np.sum(spans))


# -- CUDA lowering (jax.export on the CPU) --------------------------------------
def _export(m, k, n, g, *, dtype="bfloat16", transpose_rhs=False, **kw):
  rhs_shape = (g, n, k) if transpose_rhs else (g, k, n)
  args = (
      jax.ShapeDtypeStruct((m, k), dtype),
      jax.ShapeDtypeStruct(rhs_shape, dtype),
      jax.ShapeDtypeStruct((g,), jnp.int32),
  )
  fn = jax.jit(
      lambda a, b, s: ragged_dot(
          a, b, s, transpose_rhs=transpose_rhs, implementation="pallas", **kw
      )
  )
  exported = jax.export.export(fn, platforms=["cuda"])(*args)
  assert "mosaic_gpu" in exported.mlir_module()
  return exported


@pytest.mark.parametrize(
    "transpose_rhs,case",
    [
        (False, dict()),
        (True, dict()),
        (False, dict(dtype="float16")),
        (True, dict(preferred_element_type=jnp.float32)),
        (False, dict(config=RaggedConfig(tile_n=128, stages=6))),
        (
            True,
            dict(config=RaggedConfig(stages=3, epilogue_tile=(64, 64), raster="along_m", group=2)),
        ),
    ],
    ids=[
        "default-KN",
        "default-NK",
        "f16-KN",
        "f32-out-NK",
        "tile_n128-6stages-KN",
        "epi64-along_m-NK",
    ],
)
def test_export_configs(transpose_rhs, case):
  exp = _export(16384, 2048, 16384, 16, transpose_rhs=transpose_rhs, **case)
  assert exp.out_avals[0].shape == (16384, 16384)


@pytest.mark.parametrize(
    "m,k,n,g,transpose_rhs",
    [
        (1000, 1000, 1016, 5, False),  # K % 64 != 0 -> 64-byte swizzle, no copy
        (200, 72, 136, 3, True),  # nothing aligned -> pads
        (1001, 130, 30, 7, True),
    ],
)
def test_export_odd_shapes(m, k, n, g, transpose_rhs):
  assert _export(m, k, n, g, transpose_rhs=transpose_rhs).out_avals[0].shape == (m, n)


@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_rows_not_a_multiple_of_8_are_neither_padded_nor_cut(transpose_rhs):
  """A routed-token count like 12345: lhs and the output go through the kernel's
  row-wise TMA views (`ragged_gemm.row_views`), so no pad of lhs and no output slice,
  f32 outputs too (64 x 32 chunks: one span a row); 128-wide K tiles (two spans a row)
  have no such view and keep the padding."""
  for out in (None, jnp.float32):
    kw = dict(transpose_rhs=transpose_rhs, preferred_element_type=out)
    text = _export(12345, 2048, 1024, 8, **kw).mlir_module()
    assert "stablehlo.pad" not in text and "stablehlo.slice" not in text
  wide_k = RaggedConfig(tile_k=128, stages=2)
  text = _export(12345, 2048, 1024, 8, transpose_rhs=transpose_rhs, config=wide_k).mlir_module()
  assert "stablehlo.pad" in text and "stablehlo.slice" in text


@pytest.mark.parametrize(
    "config,field",
    [
        (RaggedConfig(tile_m=64), "tile_m"),
        (RaggedConfig(tile_n=512), "tile_n"),
        (RaggedConfig(tile_n=200), "tile_n"),
        (RaggedConfig(tile_k=48), "tile_k"),
        (RaggedConfig(stages=1), "stages"),
        (RaggedConfig(stages=5), "stages"),  # shared memory
        (RaggedConfig(raster="hilbert"), "raster"),
        (RaggedConfig(epilogue_tile=(32, 32)), "epilogue_tile"),
        (RaggedConfig(epilogue_tile=(64, 24)), "epilogue_tile"),
    ],
)
def test_rejected_configs(config, field):
  with pytest.raises(ValueError, match=rf"^RaggedConfig\.{field}="):
    _export(1024, 1024, 1024, 4, config=config)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(group=0), "group"),
        (dict(num_sms=0), "num_sms"),
        (dict(tile_n=0), "tile_n"),
        (dict(stages=2.5), "stages"),
        (dict(tile_k=True), "tile_k"),
        (dict(epilogue_tile=(64,)), "epilogue_tile"),
        (dict(raster=1), "raster"),
    ],
)
def test_config_types_are_checked_at_construction(kwargs, field):
  with pytest.raises(ValueError, match=rf"^RaggedConfig\.{field}="):
    RaggedConfig(**kwargs)


def test_a_list_epilogue_tile_becomes_a_tuple():
  assert hash(RaggedConfig(epilogue_tile=[64, 64])) == hash(RaggedConfig(epilogue_tile=(64, 64)))


def test_export_many_groups():
  """Past UNROLL_GROUPS the kernel reads its items from `item_table`: (4, items) int32."""
  problem = RaggedProblem(m=4096, n=1024, k=512, groups=64)
  items = max_items(problem, default_ragged_config(problem))
  assert f"tensor<4x{items}xi32>" in _export(4096, 512, 1024, 64).mlir_module()


@pytest.mark.parametrize("m,p,q,g", [(16384, 2048, 16384, 16), (1001, 72, 136, 40)])
def test_export_tgmm(m, p, q, g):
  """The drhs kernel lowers (target shape; odd, padded shape with the decoder loop)."""
  args = (
      jax.ShapeDtypeStruct((m, p), jnp.bfloat16),
      jax.ShapeDtypeStruct((m, q), jnp.bfloat16),
      jax.ShapeDtypeStruct((g,), jnp.int32),
  )
  fn = jax.jit(lambda x, y, s: _run_tgmm(x, y, s, "bfloat16", interpret=False))
  assert jax.export.export(fn, platforms=["cuda"])(*args).out_avals[0].shape == (g, p, q)


def test_export_gradient():
  """The whole backward (both kernels) lowers for CUDA."""
  args = (
      jax.ShapeDtypeStruct((4096, 1024), jnp.bfloat16),
      jax.ShapeDtypeStruct((8, 1024, 2048), jnp.bfloat16),
      jax.ShapeDtypeStruct((8,), jnp.int32),
  )
  fn = jax.jit(
      jax.grad(
          lambda a, b, s: jnp.sum(ragged_dot(a, b, s, implementation="pallas").astype(jnp.float32)),
          (0, 1),
      )
  )
  exported = jax.export.export(fn, platforms=["cuda"])(*args)
  assert exported.mlir_module().count("mosaic_gpu") >= 3


@pytest.mark.parametrize(
    "config,field",
    [
        (TgmmConfig(tile_p=96), "tile_p"),
        (TgmmConfig(tile_q=384), "tile_q"),
        (TgmmConfig(tile_r=32), "tile_r"),
        (TgmmConfig(stages=6), "stages"),
    ],
)
def test_rejected_tgmm_configs(config, field):
  x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
  s = jax.ShapeDtypeStruct((2,), jnp.int32)
  with pytest.raises(ValueError, match=rf"^TgmmConfig\.{field}="):
    jax.eval_shape(
        lambda x, y, s: ragged_tgmm(
            x, y, s, problem=TgmmProblem(m=256, p=256, q=256, groups=2), config=config
        ),
        x,
        x,
        s,
    )


def test_empty_arrays_take_the_xla_path():
  lhs, rhs = jnp.ones((4, 0), jnp.bfloat16), jnp.ones((2, 0, 8), jnp.bfloat16)
  out = ragged_dot(lhs, rhs, jnp.array([1, 2], jnp.int32), implementation="pallas")
  assert out.shape == (4, 8) and not out.any()


def test_default_config_fits():
  for out_dtype in ("bfloat16", "float32"):
    p = RaggedProblem(m=16384, n=16384, k=2048, groups=16, out_dtype=out_dtype)
    default_ragged_config(p).validate(p)


@pytest.mark.parametrize(
    "kwargs,error,name",
    [
        (dict(lhs=jnp.ones((2, 8, 8), jnp.bfloat16)), ValueError, "lhs must be 2-D"),
        (dict(rhs=jnp.ones((8, 8), jnp.bfloat16)), ValueError, "rhs must be 3-D"),
        (
            dict(group_sizes=jnp.array([4, 4, 0], jnp.int32)),
            ValueError,
            "group_sizes must have shape",
        ),
        (dict(group_sizes=jnp.ones((2, 1), jnp.int32)), ValueError, "group_sizes must have shape"),
        (dict(group_sizes=jnp.array([4.0, 4.0])), TypeError, "group_sizes must be an integer"),
        (dict(rhs=jnp.ones((2, 9, 8), jnp.bfloat16)), ValueError, "contracting dims"),
        (
            dict(rhs=jnp.ones((2, 8, 9), jnp.bfloat16), transpose_rhs=True),
            ValueError,
            "contracting dims",
        ),
        (dict(rhs=jnp.ones((2, 8, 8), jnp.float16)), TypeError, "lhs and rhs"),
        (dict(lhs=jnp.ones((8, 8)), rhs=jnp.ones((2, 8, 8))), TypeError, "lhs must be one of"),
        (dict(preferred_element_type=jnp.int32), TypeError, "preferred_element_type"),
        (dict(implementation="triton"), ValueError, "implementation"),
        (dict(config=dict(tile_m=128)), TypeError, "config"),
    ],
)
def test_bad_arguments(kwargs, error, name):
  args = dict(
      lhs=jnp.ones((8, 8), jnp.bfloat16),
      rhs=jnp.ones((2, 8, 8), jnp.bfloat16),
      group_sizes=jnp.array([4, 4], jnp.int32),
      implementation="pallas",
  )
  args.update(kwargs)
  with pytest.raises(error, match=name):
    ragged_dot(args.pop("lhs"), args.pop("rhs"), args.pop("group_sizes"), **args)


# -- numerics in GPU interpret mode ---------------------------------------------
def test_interpret_random_groups():
  """Odd M/K/N (all padded), 4 groups with an empty one, 23 rows past the sum."""
  rng = np.random.default_rng(0)
  m, k, n = 200, 72, 100
  sizes = _random_sizes(rng, 4, m, total=177)
  lhs, rhs = _random(rng, (m, k)), _random(rng, (4, k, n))
  out = ragged_dot(lhs, rhs, sizes, implementation="interpret", config=RaggedConfig(tile_n=128))
  assert out.dtype == jnp.bfloat16
  _check(out, _reference(lhs, rhs, sizes, False))


@pytest.mark.slow
def test_interpret_many_groups_read_the_item_table():
  """40 groups (past UNROLL_GROUPS: the kernel reads `item_table`), most of them tiny or
  empty, rows past the sum."""
  rng = np.random.default_rng(4)
  m, k, n, g = 160, 64, 128, 40
  sizes = _random_sizes(rng, g, m, total=150)
  lhs, rhs = _random(rng, (m, k)), _random(rng, (g, k, n))
  out = ragged_dot(lhs, rhs, sizes, implementation="interpret", config=RaggedConfig(tile_n=128))
  _check(out, _reference(lhs, rhs, sizes, False))


def test_interpret_one_group_takes_all_rows():
  """Many tiny groups inside one tile, then one group with every other row; f32 out."""
  rng = np.random.default_rng(1)
  m, k, n = 160, 64, 64
  sizes = jnp.asarray([0, 3, 0, 157, 0], jnp.int32)
  lhs, rhs = _random(rng, (m, k)), _random(rng, (5, k, n))
  out = ragged_dot(
      lhs,
      rhs,
      sizes,
      preferred_element_type=jnp.float32,
      implementation="interpret",
      config=RaggedConfig(tile_n=64, epilogue_tile=(64, 64), stages=2),
  )
  assert out.dtype == jnp.float32
  _check(out, _reference(lhs, rhs, sizes, False))


@needs_transposes
def test_interpret_transposed_rhs():
  rng = np.random.default_rng(2)
  m, k, n = 300, 128, 136
  sizes = _random_sizes(rng, 6, m)
  lhs, rhs = _random(rng, (m, k)), _random(rng, (6, n, k))
  out = ragged_dot(
      lhs,
      rhs,
      sizes,
      transpose_rhs=True,
      implementation="interpret",
      config=RaggedConfig(tile_n=128, raster="along_m", group=2),
  )
  _check(out, _reference(lhs, rhs, sizes, True))


@pytest.mark.slow  # ~7 s
@needs_transposes
@pytest.mark.parametrize("transpose_rhs", [True], ids=["rhs-NK"])
def test_interpret_gradient_matches_lax(transpose_rhs):
  """custom_vjp: dlhs from ragged_gemm (rhs layout flipped), drhs from ragged_tgmm.

  One layout only (CI time): (G, N, K) exercises the swapped tgmm operands; the
  (G, K, N) backward's kernels run in the transposed-rhs and tgmm tests, and
  its wiring is checked by shape in test_export_gradient and on the device."""
  rng = np.random.default_rng(3)
  m, k, n = 150, 64, 128
  sizes = jnp.asarray([40, 0, 90], jnp.int32)  # 20 tail rows: zero dlhs; an empty group: zero drhs
  lhs = _random(rng, (m, k))
  rhs = _random(rng, (3, n, k) if transpose_rhs else (3, k, n))
  weights = _random(rng, (m, n), jnp.float32)
  as_kn = (lambda b: jnp.swapaxes(b, 1, 2)) if transpose_rhs else (lambda b: b)

  def loss(fn):
    return lambda a, b: jnp.sum(fn(a, b).astype(jnp.float32) * weights)

  ours = jax.grad(
      loss(
          lambda a, b: ragged_dot(
              a,
              b,
              sizes,
              transpose_rhs=transpose_rhs,
              implementation="interpret",
              config=RaggedConfig(tile_n=128),
          )
      ),
      (0, 1),
  )(lhs, rhs)
  want = jax.grad(
      loss(lambda a, b: lax.ragged_dot(a.astype(jnp.float32), as_kn(b).astype(jnp.float32), sizes)),
      (0, 1),
  )(lhs, rhs)
  for got, ref in zip(ours, want):
    assert got.dtype == jnp.bfloat16 and got.shape == ref.shape
    got = np.asarray(got.astype(jnp.float32), np.float64).reshape(-1, got.shape[-1])
    ref = np.asarray(ref, np.float64).reshape(-1, ref.shape[-1])
    _check(got, ref)


@pytest.mark.slow
@needs_transposes
@pytest.mark.parametrize(
    "sizes,p,q",
    [
        ([0, 70, 1, 0, 190, 40], 200, 300),
        pytest.param(  # 38 groups: `group_bounds`
            [0, 9, 1, 0, 30, 2, 3, 0, 5] * 4 + [7, 2**31 - 1], 72, 100, marks=pytest.mark.slow
        ),
    ],
    ids=["6-groups", "38-groups"],
)
def test_interpret_tgmm_boundaries(sizes, p, q):
  """ragged_tgmm alone: groups starting and ending inside 64-row chunks, empty groups,
  a tail of rows in no group (or a huge last size, clipped), odd P/Q (padded), several P
  and Q tiles; past UNROLL_PREFIX groups the kernel reads `group_bounds`."""
  rng = np.random.default_rng(6)
  m = 330
  sizes = jnp.asarray(sizes, jnp.int32)
  x, y = _random(rng, (m, p)), _random(rng, (m, q))
  out = _run_tgmm(x, y, sizes, "bfloat16", interpret=True)
  ends = np.minimum(np.cumsum(np.clip(np.asarray(sizes, np.int64), 0, m)), m)
  sizes = jnp.asarray(np.diff(np.concatenate([[0], ends])), jnp.int32)  # as the kernel clips
  dims = lax.RaggedDotDimensionNumbers(
      dot_dimension_numbers=(([0], [0]), ([], [])),
      lhs_ragged_dimensions=[0],
      rhs_group_dimensions=[],
  )
  ref = lax.ragged_dot_general(
      x.astype(jnp.float32), y.astype(jnp.float32), sizes, dims, precision=lax.Precision.HIGHEST
  )
  assert out.shape == (len(sizes), p, q)
  _check(np.asarray(out.astype(jnp.float32)).reshape(-1, q), np.asarray(ref).reshape(-1, q))


@pytest.mark.slow
@needs_transposes
def test_interpret_no_races():
  """Both kernels under the 0.11 interpreter's race detector (2-stage rings, 2 SMs)."""
  from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call

  rng = np.random.default_rng(7)
  m, k, n = 256, 128, 128
  sizes = jnp.asarray([60, 0, 100, 50], jnp.int32)
  lhs, rhs = _random(rng, (m, k)), _random(rng, (4, n, k))
  params = _compat.interpret_params(zero_fill=False, detect_races=True)
  out = ragged_gemm(
      lhs,
      rhs,
      sizes,
      interpret=params,
      problem=RaggedProblem(m=m, n=n, k=k, groups=4, transpose_rhs=True),
      config=RaggedConfig(tile_n=128, num_sms=2, stages=2),
  )
  _check(out, _reference(lhs, rhs, sizes, True))
  x, y = _random(rng, (m, 128)), _random(rng, (m, 256))
  ragged_tgmm(
      x,
      y,
      sizes,
      problem=TgmmProblem(m=m, p=128, q=256, groups=4),
      config=TgmmConfig(num_sms=2, stages=2),
      interpret=params,
  ).block_until_ready()
  assert not interpret_pallas_call.get_races().races_found


# -- the XLA path -----------------------------------------------------------------
@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_xla_path_matches_lax(transpose_rhs):
  rng = np.random.default_rng(4)
  m, k, n = 77, 40, 24
  sizes = _random_sizes(rng, 5, m, total=70)
  lhs = _random(rng, (m, k))
  rhs = _random(rng, (5, n, k) if transpose_rhs else (5, k, n))
  out = ragged_dot(
      lhs,
      rhs,
      sizes,
      transpose_rhs=transpose_rhs,
      implementation="xla",
      preferred_element_type=jnp.float32,
  )
  _check(out, _reference(lhs, rhs, sizes, transpose_rhs))
  # No GPU here: implementation=None takes the XLA path too.
  assert jnp.array_equal(
      out,
      ragged_dot(lhs, rhs, sizes, transpose_rhs=transpose_rhs, preferred_element_type=jnp.float32),
  )


def test_xla_path_accepts_f32_and_other_int_sizes():
  rng = np.random.default_rng(5)
  lhs, rhs = _random(rng, (10, 8), jnp.float32), _random(rng, (2, 8, 3), jnp.float32)
  out = ragged_dot(lhs, rhs, np.array([4, 6], np.int64), implementation="xla")
  _check(out, _reference(lhs, rhs, jnp.array([4, 6], jnp.int32), False))


# -- on a Hopper GPU (skipped elsewhere) ------------------------------------------
@pytest.mark.gpu
def test_device_checks():
  """benchmarks.ragged_dot's device pass: forward and backward cases that the
  interpreter cannot check (TMA row-ladder stores, edge clipping, masking)."""
  from benchmarks import ragged_dot as bench

  assert bench.check()


# -- lax's signature; sizes near 2^31 ----------------------------------------------
def test_group_offset_is_refused_as_lax_refuses_it():
  rng = np.random.default_rng(8)
  lhs, rhs = _random(rng, (16, 8)), _random(rng, (2, 8, 4))
  sizes = jnp.asarray([10, 6], jnp.int32)
  with pytest.raises(NotImplementedError, match="group_offset"):
    ragged_dot(lhs, rhs, sizes, group_offset=jnp.zeros((1,), jnp.int32), implementation="xla")


@pytest.mark.slow
@needs_transposes
def test_interpret_group_sizes_near_int32_max():
  """A size of 2^31 - 1 after 100 rows: offsets are clipped before they are added, so
  the forward writes every row and the backward's row ranges end (no int32 wrap)."""
  rng = np.random.default_rng(9)
  m, k, n = 256, 64, 128
  huge = np.iinfo(np.int32).max
  sizes = jnp.asarray([100, huge, huge], jnp.int32)
  clipped = jnp.asarray([100, m - 100, 0], jnp.int32)
  lhs, rhs = _random(rng, (m, k)), _random(rng, (3, k, n))
  out = ragged_dot(lhs, rhs, sizes, implementation="interpret", config=RaggedConfig(tile_n=128))
  _check(out, _reference(lhs, rhs, clipped, False))
  x, y = _random(rng, (m, 128)), _random(rng, (m, 128))
  grads = _run_tgmm(x, y, sizes, "bfloat16", interpret=True)
  want = _run_tgmm(x, y, clipped, "bfloat16", interpret=True)
  np.testing.assert_array_equal(np.asarray(grads, np.float32), np.asarray(want, np.float32))
