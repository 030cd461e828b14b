"""The default config's time model (`pallas_gemm.heuristics`): fitted to the shipped
calibration, valid everywhere, and no worse than the grid's best by much on the fit shapes."""

import dataclasses
import json
import os
import statistics

from hypothesis import given, settings, strategies as st
import pytest

from pallas_gemm import heuristics
from pallas_gemm.config import SMEM_LIMIT_BYTES, GemmConfig, GemmProblem, fit_stages
from hypothesis_budget import examples

CALIBRATION_DIR = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "calibration")
BOARDS = ("h100", "h200")


@pytest.fixture(scope="module")
def calibrations():
  loaded = []
  for board in BOARDS:
    with open(os.path.join(CALIBRATION_DIR, f"{board}_fit.json"), encoding="utf-8") as f:
      loaded.append(json.load(f))
  return loaded


@pytest.mark.slow
def test_shipped_model_is_the_fit_of_the_shipped_calibrations(calibrations):
  params, steps = heuristics.fit(calibrations)
  assert steps == heuristics.STEP_S
  assert params == heuristics.Params()


@pytest.mark.parametrize("board", range(len(BOARDS)), ids=BOARDS)
def test_picks_on_the_fit_shapes_are_near_the_fastest_candidate(calibrations, board):
  regrets = [r[1] for r in heuristics.regret([calibrations[board]])]
  assert len(regrets) == len(calibrations[board]["shapes"])
  assert statistics.geometric_mean(regrets) < 1.03
  assert max(regrets) < 1.2


@pytest.mark.parametrize(
    "problem, tile_n",
    [
        (GemmProblem(m=65536, n=16, k=2048, transpose_b=True), 16),
        (GemmProblem(m=12345, n=24, k=4096, transpose_b=True), 32),
        (GemmProblem(m=8192, n=32, k=4096, transpose_a=True, transpose_b=True), 32),
        (GemmProblem(m=8192, n=16, k=4096, transpose_a=True, transpose_b=True), 32),
        (GemmProblem(m=65536, n=32, k=512), 32),
        (GemmProblem(m=65536, n=16, k=2048), 64),  # B (K, N) 32 bytes wide: routed to XLA
        (GemmProblem(m=32768, n=24, k=2048), 64),
        (GemmProblem(m=1001, n=32, k=2048), 64),  # A's odd rows: no row view at 64 bytes
        (GemmProblem(m=65536, n=48, k=2048, transpose_b=True), 64),
    ],
)
def test_outputs_of_at_most_32_columns_take_a_narrow_tile(problem, tile_n):
  assert heuristics.default_config(problem, 132, 1.0).tile_n == tile_n


@pytest.mark.parametrize(
    "problem, whole",
    [
        (GemmProblem(m=8192, n=8192, k=96), True),
        (GemmProblem(m=2048, n=2048, k=64, batch=16, transpose_b=True), True),
        (GemmProblem(m=24576, n=3072, k=128), True),
        (GemmProblem(m=8192, n=8192, k=256), False),  # four K steps: chunks, deeper ring
        (GemmProblem(m=8192, n=8192, k=64, out_dtype="float32"), False),  # ring too shallow
        (GemmProblem(m=8192, n=8192, k=64, residual_dtype="bfloat16"), False),
        (GemmProblem(m=8192, n=8192, k=8192), False),
    ],
)
def test_short_k_gemms_store_whole_warpgroup_tiles(problem, whole):
  config = heuristics.default_config(problem, 132, 1.0)
  config.validate(problem)
  assert (config.epilogue_shape == config.wg_tile) == whole
  assert config.stages >= heuristics.SHORT_K_MIN_STAGES
  chunked = dataclasses.replace(config, epilogue_tile=(64, 64))
  if whole:  # the pick of the time model, only its stores changed
    assert heuristics.short_k_stores(problem, fit_stages(chunked, problem, 8)) == config


def test_estimate_orders_waves_and_tiles():
  big = GemmProblem(m=8192, n=8192, k=8192)
  wide, narrow = heuristics.GemmConfig(), heuristics.GemmConfig(tile_n=64, stages=8)
  assert heuristics.estimate(big, wide) < heuristics.estimate(big, narrow)
  # One more wave of whole tiles costs most of a wave's time (the launch and the HBM stream
  # are shared)...
  one = GemmProblem(m=128 * 132, n=256, k=4096)
  two = GemmProblem(m=128 * 133, n=256, k=4096)
  assert heuristics.estimate(two, wide, tail_model=False) > 1.5 * heuristics.estimate(one, wide)
  # ...and with the tail split the default gives it, one K slice of the extra tile (64 steps
  # in 5 slices of >= 12) and the split's fixed costs.
  step = heuristics.STEP_S[(128, 256, 1)]
  slice_s = 13 * step + heuristics.TILE_FIXED_S + heuristics.TAIL_FIXED_S
  slice_s += 5 * heuristics.TAIL_SLICE_S
  extra = heuristics.estimate(two, wide) - heuristics.estimate(one, wide)
  assert extra == pytest.approx(slice_s, rel=1e-6)


@settings(max_examples=examples(60), deadline=None)
@given(
    m=st.integers(1, 70000),
    n=st.integers(1, 70000),
    k=st.integers(1, 70000),
    dtype=st.sampled_from(["bfloat16", "float16", "float8_e4m3fn", "float32"]),
    transpose_a=st.booleans(),
    transpose_b=st.booleans(),
)
def test_default_config_is_valid_for_any_problem(m, n, k, dtype, transpose_a, transpose_b):
  if dtype in ("float8_e4m3fn", "float32"):  # the kernel takes these K-major only
    transpose_a, transpose_b = False, True
  problem = GemmProblem(
      m=m,
      n=n,
      k=k,
      dtype=dtype,
      transpose_a=transpose_a,
      transpose_b=transpose_b,
      out_dtype="float32" if dtype == "float32" else "bfloat16",
  )
  config = heuristics.default_config(problem, num_sms=132)
  config.validate(problem)
  options = heuristics.candidates(problem, 132)
  picks = {
      heuristics.split_tail(problem, heuristics.short_k_stores(problem, c), 132) for c in options
  }
  assert config in picks or not options


@settings(max_examples=examples(40), deadline=None)
@given(
    schedule=st.sampled_from(["cooperative", "pingpong"]),
    tile=st.sampled_from([(64, 128), (128, 128), (128, 256), (64, 256)]),
    max_stages=st.integers(1, 9),
    residual=st.sampled_from([None, "bfloat16", "float32"]),
)
def test_fit_stages_gives_a_ring_the_schedule_takes(schedule, tile, max_stages, residual):
  # The deepest ring that fits, of a depth the schedule runs (pingpong: even, >= 4).
  problem = GemmProblem(m=4096, n=4096, k=4096, residual_dtype=residual)
  base = GemmConfig(tile_m=tile[0], tile_n=tile[1], schedule=schedule)
  try:
    base.validate(problem)
  except ValueError:
    pass  # the tile itself may not suit the schedule; the ring depth is what is checked
  config = fit_stages(base, problem, max_stages)
  if schedule == "pingpong":
    assert config.stages % 2 == 0 and config.stages >= 4
  else:
    assert 2 <= config.stages <= max(max_stages, 2)
  deeper = dataclasses.replace(config, stages=config.stages + (2 if schedule == "pingpong" else 1))
  if config.stages < max_stages - (schedule == "pingpong"):
    assert deeper.smem_bytes(problem) > SMEM_LIMIT_BYTES or config.epilogue_tile == (64, 32)


@pytest.mark.parametrize(
    "problem, three",
    [
        (GemmProblem(m=1536, n=1536, k=1536), True),  # 128 tiles of 192x96: one wave
        (GemmProblem(m=1536, n=1536, k=1536, transpose_b=True), True),
        (GemmProblem(m=1152, n=1920, k=768, has_bias=True), True),
        (GemmProblem(m=1600, n=1344, k=1024), False),  # M not in whole 192-row tiles
        (GemmProblem(m=2304, n=2304, k=2304), False),  # 192 tiles: two waves
        (GemmProblem(m=1536, n=1536, k=1536, transpose_a=True), False),  # A stored (K, M)
        (GemmProblem(m=1536, n=1536, k=1536, dtype="float8_e4m3fn", transpose_b=True), False),
        (GemmProblem(m=8192, n=8192, k=8192), False),
    ],
)
def test_wave_tile_only_where_whole_row_tiles_fill_one_wave(problem, three):
  # NOTES exp. 131: three consumers on 192x96 tiles won 1.03-1.18x over the two-consumer
  # pick on one-wave problems with M a multiple of 192, lost elsewhere.
  config = heuristics.default_config(problem, num_sms=132, hbm_scale=1.0)
  assert (config.consumers == 3) == three
  if three:
    assert (config.tile_m, config.tile_n, config.cluster) == (192, 96, (1, 2))
    config.validate(problem)
