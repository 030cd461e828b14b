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


def test_fill_route_routes_every_case_but_the_small_tiles_it_measured_faster():
  from benchmarks import fill_route

  kept = {  # 64x128 tiles at the default board (an H100's): 1.11-2.01x jnp.dot on the H200
      "512x1536x3072 NT",
      "1024x768x2048 TN",
      "640x1536x4096 TN",
      "1024x1024x5120 NN",
      "512x1536x2560 NT",
      "512x1536x3584 TN",  # the H200's default takes 128x192 there: 0.90x, routed
      "640x1024x2048 NT",
      "768x1024x2560 NT",
      "896x1024x3072 NN",
      "1024x1024x3072 TN",
  }
  for cases in fill_route.GROUPS.values():
    for case in cases:
      plan = default_ab.default_plan(case)
      if case.label in kept:
        assert plan.startswith("64x128x64"), (case.label, plan)
      else:
        assert plan == "xla", (case.label, plan)


def test_random_shapes_draws_the_same_bounded_shapes_for_a_seed():
  from benchmarks import random_shapes

  first, again = random_shapes.draw(7, 40), random_shapes.draw(7, 40)
  assert [c.label for c in first] == [c.label for c in again]
  assert [c.label for c in random_shapes.draw(8, 40)] != [c.label for c in first]
  for case in first:
    assert random_shapes.MIN_VOLUME <= case.m * case.n * case.k <= random_shapes.MAX_VOLUME
    assert all(256 <= x <= 16384 for x in (case.m, case.n, case.k))
    assert case.layout in ("NN", "NT", "TN")
  extents = [x for case in first for x in (case.m, case.n, case.k)]
  assert any(x % 64 for x in extents) and sum(x % 64 == 0 for x in extents) > len(extents) / 2
