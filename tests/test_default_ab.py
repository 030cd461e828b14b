"""`benchmarks.default_ab`, the harness of `benchmarks.tail_split`, `short_k` and `skinny`:
the CPU part (on a CPU it lists what each contender runs)."""

import jax
import pytest

from benchmarks import default_ab, tail_split


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="on a GPU it times the cases")
def test_only_keeps_the_named_cases(capsys):
  assert tail_split.main(["--only", "4096x256000x2048 NN,16384x16384x16384 NN"]) == 0
  listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:-1]]
  assert listed == ["4096x256000x2048", "16384x16384x16384"]


def test_only_refuses_a_label_that_is_no_case(capsys):
  with pytest.raises(SystemExit):
    tail_split.main(["--only", "1x1x1 NN"])
  assert "['1x1x1 NN'] are not cases" in capsys.readouterr().err


def test_case_labels_name_batch_and_layout():
  assert default_ab.Case(1024, 16, 1024, batch=64).label == "64x1024x16x1024 NN"


def test_tail_model_cases_are_the_picks_it_moves():
  from benchmarks import tail_model
  from pallas_gemm import heuristics

  for case in tail_model.CASES:
    moved = heuristics.default_config(case.problem(), 132, 1.0)
    assert tail_model.before_config(case) != moved, case.label


def test_fill_route_cases_are_routed_away_from_the_kernel():
  from benchmarks import fill_route

  for case in fill_route.CASES:
    assert default_ab.default_plan(case) == "xla", case.label
