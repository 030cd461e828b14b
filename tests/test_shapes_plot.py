"""Shape sweeps, roofline bounds and the results plot (matplotlib optional)."""

import doctest
import json
import sys

import pytest

from benchmarks import plot
from benchmarks import roofline
from pallas_gemm import shapes
from pallas_gemm.tuner import candidate_configs
from pallas_gemm.config import GemmProblem


@pytest.mark.parametrize("module", [shapes, roofline, plot])
def test_docstring_examples(module):
  assert doctest.testmod(module).failed == 0


# -- sweeps -------------------------------------------------------------------
@pytest.mark.slow
def test_the_named_sweeps_exist_and_every_shape_can_be_tuned():
  assert shapes.sweep_names() == [
      "audit",
      "fit",
      "heldout",
      "heldout_models",
      "llm",
      "models",
      "odd",
      "tall_skinny_k",
      "training",
  ]
  for name in shapes.sweep_names():
    sweep = shapes.load_sweep(name)
    assert sweep and len(set(sweep)) == len(sweep)
    for shape in sweep:
      problem, _ = shape.problem()
      assert candidate_configs(problem), shape.label


def test_llm_sweep_crosses_decode_batches_with_7b_and_70b_projections():
  sweep = shapes.load_sweep("llm")
  assert {s.m for s in sweep} == {1, 2, 4, 8, 16, 32, 64, 128, 256}
  assert {(s.k, s.n) for s in sweep} == {
      (4096, 4096),
      (4096, 11008),
      (11008, 4096),
      (8192, 8192),
      (8192, 28672),
      (28672, 8192),
      (8192, 1024),
  }
  assert len(sweep) == 9 * 7


def test_sweeps_hold_the_shapes_the_issue_names():
  mnk = {name: {(s.m, s.n, s.k) for s in shapes.load_sweep(name)} for name in shapes.sweep_names()}
  assert {(4096,) * 3, (8192,) * 3, (4096, 8192, 4096), (16384, 4096, 4096)} <= mnk["training"]
  assert {(4000, 8000, 4000), (1000,) * 3, (4097,) * 3, (200, 136, 72)} <= mnk["odd"]
  assert {(128, 128, 65536), (256, 512, 32768)} <= mnk["tall_skinny_k"]
  assert all(k >= 16 * max(m, n) for m, n, k in mnk["tall_skinny_k"])
  assert {s.layout for s in shapes.load_sweep("training")} == {"NN", "NT", "TN"}


HELD_OUT_SWEEPS = ("heldout", "audit", "heldout_models")


@pytest.mark.parametrize("held_out_sweep", HELD_OUT_SWEEPS)
def test_held_out_shapes_are_in_no_fit_sweep_and_no_shipped_table_entry(held_out_sweep):
  from pallas_gemm import tuning_cache

  fit = {
      s.label
      for name in shapes.sweep_names()
      if name not in HELD_OUT_SWEEPS
      for s in shapes.load_sweep(name)
  }
  tuned = {
      r.key.device_kind
      for r in tuning_cache.TuningCache(tuning_cache.PACKAGED_PATH).records().values()
  }
  held_out = shapes.load_sweep(held_out_sweep)
  assert len(held_out) >= 30
  for shape in held_out:
    assert shape.label not in fit, shape.label
    problem, activation = shape.problem()
    for kind in tuned:
      assert (
          tuning_cache.packaged_config(problem, activation, device_kind=kind) is None
      ), f"{shape.label}: the shipped table serves a held-out shape"


def test_load_shapes_reads_json_with_lists_and_text_files(tmp_path):
  js = tmp_path / "s.json"
  js.write_text(
      json.dumps(
          {
              "defaults": {"dtype": "float16", "epilogue": "bias+relu"},
              "shapes": [{"m": [1, 2], "n": 64, "k": [32, 64], "layout": "NT"}],
          }
      )
  )
  loaded = shapes.load_shapes(str(js))
  assert [(s.m, s.k) for s in loaded] == [(1, 32), (1, 64), (2, 32), (2, 64)]
  assert loaded[0].label == "1x64x32 float16 NT bias+relu"
  problem, activation = loaded[0].problem()
  assert (problem.dtype, problem.transpose_b, problem.has_bias, activation) == (
      "float16",
      True,
      True,
      "relu",
  )
  txt = tmp_path / "s.txt"
  txt.write_text("# M N K\n4096x4096x4096\n\n  1 2 3  # tiny\n")
  assert [(s.m, s.n, s.k) for s in shapes.load_shapes(str(txt))] == [(4096, 4096, 4096), (1, 2, 3)]


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("bad.txt", "1 2\n", "expected 'M N K'"),
        ("bad.json", '{"shapes": [{"m": 1, "n": 2, "k": 3, "tile": 4}]}', "bad shape entry"),
    ],
)
def test_bad_shape_files_are_rejected(tmp_path, name, content, match):
  path = tmp_path / name
  path.write_text(content)
  with pytest.raises(ValueError, match=match):
    shapes.load_shapes(str(path))


def test_unknown_sweeps_name_the_known_ones():
  with pytest.raises(ValueError, match="llm, models, odd, tall_skinny_k, training"):
    shapes.load_sweep("nope")


def test_batched_shapes_keep_their_batch():
  problem, _ = shapes.Shape(64, 64, 64, batch=3).problem()
  assert problem.batch == 3 and problem.flops == 2 * 3 * 64**3


# -- roofline -----------------------------------------------------------------
def test_roofline_is_compute_bound_for_big_and_memory_bound_for_skinny_problems():
  h100 = roofline.H100_SXM
  assert (h100.peak_flops, h100.bandwidth) == (989e12, 3.35e12)
  big = GemmProblem(m=8192, n=8192, k=8192)
  assert h100.seconds(big) == roofline.flops(big) / 989e12
  decode = GemmProblem(m=1, n=4096, k=4096)
  assert roofline.min_bytes(decode) == (4096 + 4096 * 4096) * 2 + 4096 * 2
  assert h100.seconds(decode) == roofline.min_bytes(decode) / 3.35e12
  assert h100.tflops(decode) < 5 < h100.tflops(big)


def test_roofline_counts_c_bias_and_wider_outputs():
  base = GemmProblem(m=64, n=128, k=32)
  full = GemmProblem(m=64, n=128, k=32, out_dtype="float32", has_bias=True, has_c=True, batch=2)
  per_batch = (64 * 32 + 32 * 128) * 2 + 2 * 64 * 128 * 4
  assert roofline.min_bytes(full) == 2 * per_batch + 128 * 4
  assert roofline.min_bytes(base) < roofline.min_bytes(full)
  slow = roofline.Roofline(peak_flops=1e12, bandwidth=1e9)
  assert slow.tflops(base) == pytest.approx(
      roofline.flops(base) / (roofline.min_bytes(base) / 1e9) / 1e12
  )


# -- plot ---------------------------------------------------------------------
def _rows():
  rows = []
  for shape in shapes.load_sweep("tall_skinny_k") + shapes.load_sweep("training")[:3]:
    problem, _ = shape.problem()
    bound = roofline.H100_SXM.tflops(problem)
    rows += [
        dict(
            case=shape.label,
            m=shape.m,
            n=shape.n,
            k=shape.k,
            contender="pallas_gemm",
            tflops=0.8 * bound,
        ),
        dict(
            case=shape.label, m=shape.m, n=shape.n, k=shape.k, contender="xla", tflops=0.7 * bound
        ),
    ]
  rows.append(dict(case="broken", contender="jax_mgpu", error="RuntimeError: x"))
  return rows


def test_plot_writes_a_png(tmp_path):
  pytest.importorskip("matplotlib")
  path = plot.plot_rows(_rows(), str(tmp_path / "p.png"), title="synthetic")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_command_reads_harness_results(tmp_path, capsys):
  pytest.importorskip("matplotlib")
  results = tmp_path / "results.json"
  results.write_text(json.dumps({"environment": {}, "rows": _rows()}))
  assert plot.main([str(results), "--peak-tflops", "500", "--bandwidth-tbs", "2"]) == 0
  assert (tmp_path / "results.png").stat().st_size > 0
  assert "wrote" in capsys.readouterr().out


def test_plot_skips_cleanly_without_matplotlib(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "matplotlib", None)
  monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
  with pytest.warns(UserWarning, match="matplotlib is not installed"):
    assert plot.plot_rows(_rows(), str(tmp_path / "p.png")) is None
  assert not (tmp_path / "p.png").exists()
