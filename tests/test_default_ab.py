"""`benchmarks.default_ab`, the harness of `benchmarks.tail_split`, `short_k` and `skinny`:
the CPU part (on a CPU it lists what each contender runs)."""

import jax
import pytest

from benchmarks import default_ab, tail_split
from pallas_gemm import route


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

  kept = {  # at the default board (an H100's); XLA / the kernel on the H200
      "512x1536x3072 NT": "64x128",  # 1.25
      "1024x768x2048 TN": "64x128",  # 1.19
      "640x1536x4096 TN": "64x128",  # 1.19
      "1024x1024x5120 NN": "64x128",  # 1.13
      "512x1536x2560 NT": "64x128",  # 1.13
      "512x1536x3584 TN": "64x128",  # the H200's default takes 128x192 there: 0.90x, routed
      "640x1024x2048 NT": "64x128",  # 2.01
      "768x1024x2560 NT": "64x128",  # 1.11
      "896x1024x3072 NN": "64x128",  # 1.24
      "1024x1024x3072 TN": "64x128",  # 1.33
      "2880x1920x1088 NT": "128x192",  # 0.90: over_ideal under 1.4
      "768x1536x1280 NT": "64x256",  # 1.40 (K < 2048: 64-row tiles stay)
      "768x1792x1280 NT": "64x256",  # 1.34
      "768x1792x1536 TN": "64x256",  # 1.34
      "896x2048x1280 NT": "64x256",  # 1.36
      "1024x1536x1024 TN": "64x256",  # 1.35
      "2048x896x1024 NN": "64x256",  # 1.36
      "2048x896x1152 TN": "64x256",  # 1.40
      "512x3584x1920 NN": "64x256",  # drawn56: 1.30 (the H200's default: 128x128)
      "1024x1280x1408 NN": "64x256",  # 1.48
      "1024x1792x1024 NN": "64x256",  # 1.47
      "1792x1024x1408 NT": "64x256",  # 1.48
  }
  for case in fill_route.GROUPS["odd_m"]:  # routed although M is off the alignment
    assert case.m % route.ALIGNED and not case.problem().transpose_a, case.label
  for cases in fill_route.GROUPS.values():
    for case in cases:
      plan = default_ab.default_plan(case)
      if case.label in kept:
        assert plan.startswith(kept[case.label] + "x64"), (case.label, plan)
      else:
        assert plan == "xla", (case.label, plan)


def test_copy_route_routes_every_case_it_measured():
  from benchmarks import copy_route

  # drawn202 fit `route.slow_output_slice`: it routes the losers of at least 4 us (and one
  # shape not timed), the kernel keeps the rest (NOTES exp. 150)
  sliced = {
      "14016x13494x896 NT",
      "9806x8623x2880 NT",
      "8384x652x256 NT",
      "4416x3548x448 NT",
      "2364x1821x1088 NT",
  }
  for name, cases in copy_route.GROUPS.items():
    for case in cases:
      problem = case.problem()
      assert route.padding_copy_bytes(problem), case.label
      why = route.choose(problem)[1]
      if name in ("probe53", "drawn171"):  # XLA reads every row stride as it is
        assert route.xla_aligned(problem), case.label
        assert default_ab.default_plan(case) == "xla", case.label
        continue
      assert not route.xla_aligned(problem), case.label
      if name == "drawn300":  # memory-bound behind copies, XLA off its alignment: kept
        assert why == "the kernel", case.label
      elif name == "drawn210" or case.label in sliced:
        assert "C's row stride" in why, case.label
      else:
        assert why == "the kernel", case.label


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
