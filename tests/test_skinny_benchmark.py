"""`benchmarks.skinny` on the CPU: the plan it prints (what the default runs for each case)."""

from benchmarks import skinny


def test_the_plan_narrows_or_routes_every_case(capsys):
  assert skinny.main([]) == 0
  out = capsys.readouterr().out
  assert "no GPU: the plan only" in out
  for case in skinny.CASES:
    plan = skinny.default_plan(case)
    # N-major B under 64 bytes a row goes to XLA; everything else runs a tile as narrow as N.
    stored_kn = case.layout[1] == "N"
    if stored_kn and case.n < 32:
      assert plan == "xla", case
    else:
      assert plan.split("x")[1] == ("16" if case.n <= 16 else "32"), (case, plan)
    assert case.label in out
