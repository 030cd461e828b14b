"""`benchmarks.short_k` on the CPU: the plan it prints (what the default runs for each case)."""

from benchmarks import short_k


def test_every_case_stores_whole_warpgroup_tiles_where_it_stored_chunks(capsys):
  assert short_k.main([]) == 0
  out = capsys.readouterr().out
  assert "no GPU: the plan only" in out
  for case in short_k.CASES:
    problem = case.problem()
    default = short_k.heuristics.default_config(problem)
    before = short_k.chunked_config(case)
    assert default.epilogue_shape == default.wg_tile, case
    assert before.epilogue_tile == (64, 64) and before.stages > default.stages, case
    assert case.label in out
