"""`benchmarks.wave_tile` on the CPU: the plan it prints, and that its cases are the ones
the rule of `heuristics.WAVE_TILE` changes (or, M not in whole tiles, leaves alone)."""

import jax
import pytest

from benchmarks import wave_tile


def test_the_pick_changes_exactly_where_m_is_whole_tiles():
  for case in wave_tile.CASES:
    default = wave_tile.heuristics.default_config(case.problem(), 132, 1.0)
    before = wave_tile.before_config(case)
    whole_rows = case.m % wave_tile.heuristics.WAVE_TILE.tile_m == 0
    assert (default.consumers == 3) == whole_rows, case
    assert before.consumers == 2, case
    if not whole_rows:
      assert default == before, case


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="on a GPU it times the cases")
def test_the_cpu_run_prints_the_plan(capsys):
  assert wave_tile.main([]) == 0
  out = capsys.readouterr().out
  assert "no GPU: the plan only" in out
  assert all(case.label in out for case in wave_tile.CASES)
