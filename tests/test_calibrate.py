"""`python -m benchmarks.calibrate --compare`: which shapes a time-model variant would
change (the CPU part; the timing needs a Hopper GPU)."""

import pytest

from benchmarks import calibrate


def test_overrides_name_params_fields():
  assert calibrate.parse_overrides("cluster_fixed_s=1e-7") == {"cluster_fixed_s": 1e-7}
  with pytest.raises(ValueError, match="not NAME=VALUE"):
    calibrate.parse_overrides("cluster_cost=1")
  with pytest.raises(ValueError, match="not NAME=VALUE"):
    calibrate.parse_overrides("launch_s=")


def test_a_variant_lists_the_shapes_whose_pick_changes():
  rows = calibrate.compare_models(
      ["fit"], {"cluster_fixed_s": 0.0}, num_sms=132, hbm_scale=1.0, timed=False,
      log=lambda *_: None,
  )  # fmt: skip
  changed = {row["label"]: row for row in rows}
  square = changed["384x384x384 bfloat16 NN"]  # free clusters: 2x1 over 6 K steps a tile
  assert "cluster 1x1" in square["shipped"] and "cluster 2x1" in square["variant"]
  assert "8192x13824x5120 bfloat16 NN" not in changed  # a large projection keeps its pick


def test_the_shipped_parameters_change_nothing():
  rows = calibrate.compare_models(
      ["fit", "heldout"], {}, num_sms=132, hbm_scale=1.0, timed=False, log=lambda *_: None
  )
  assert rows == []


def test_shards_partition_a_sweep():
  shapes = list(range(33))
  shards = [calibrate.shard_shapes(shapes, (i, 3)) for i in range(3)]
  assert sorted(sum(shards, [])) == shapes
  with pytest.raises(ValueError, match="index must be"):
    calibrate.shard_shapes(shapes, (3, 3))


def test_a_bad_shard_is_refused():
  with pytest.raises(SystemExit):
    calibrate.main(["--shard", "2/2"])
