"""`python -m benchmarks.model` at the CPU size: the harness, the models and the
agreement of the variants' loss curves (every variant runs XLA's GEMMs here)."""

import json

import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")

from benchmarks import model as harness  # noqa: E402
from benchmarks import models  # noqa: E402


@pytest.mark.slow
def test_small_models_train_alike_in_every_variant(tmp_path, capsys):
  out = tmp_path / "model.json"
  assert (
      harness.main(
          [
              "--size",
              "small",
              "--in-process",
              "--loss-steps",
              "4",
              "--rounds",
              "1",
              "--iters",
              "1",
              "--decode",
              "1",  # one decode size: each costs a forward compile per variant and model
              "--json",
              str(out),
          ]
      )
      == 0
  )
  results = json.loads(out.read_text())
  assert set(results["models"]) == {"gpt", "llama"}
  for arch, result in results["models"].items():
    rows = result["variants"]
    assert set(rows) == set(models.VARIANTS)
    params = {row["params"] for row in rows.values()}
    assert len(params) == 1, f"{arch}: variants differ in parameter count {params}"
    for variant, row in rows.items():
      curve = row["loss_curve"]
      assert len(curve) == 4 and all(5.0 < x < 8.0 for x in curve), (arch, variant, curve)
      # bf16 compute: the fused epilogue rounds once where XLA rounds twice.
      assert row["loss_max_diff"] < 2e-2, (arch, variant, row["loss_max_diff"])
      assert row["step_ms"] > 0 and row["tokens_per_s"] > 0
      assert set(row["inference"]) == {"prefill", "decode1"}
      assert row["temp_bytes"] > 0  # XLA's memory analysis: the table's temp GiB
  table = capsys.readouterr().out.splitlines()
  assert (
      table[-1].startswith("x XLA")
      and sum(line.startswith(("gpt", "llama")) for line in table[-8:]) == 6
  )


@pytest.mark.slow
def test_quantized_rows_serve_the_trained_xla_model(tmp_path, capsys):
  out = tmp_path / "model.json"
  argv = ["--size", "small", "--arch", "llama", "--variants", "xla", "--in-process"]
  argv += ["--loss-steps", "1", "--rounds", "1", "--iters", "1", "--decode", "1"]
  assert harness.main(argv + ["--quantized", "4,8", "--json", str(out)]) == 0
  rows = json.loads(out.read_text())["models"]["llama"]["variants"]
  assert set(rows) == {"xla", "int4", "int8"}
  for name in ("int4", "int8"):
    assert set(rows[name]["inference"]) == {"prefill", "decode1"}
    assert all(case["ms"] > 0 for case in rows[name]["inference"].values())
  assert any(line.startswith("llama  int4") for line in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--variants", "fused", "--quantized", "4"], "include it in --variants"),
        (["--quantized", "3"], "takes bits 4 and/or 8"),
    ],
)
def test_quantized_rows_need_the_xla_variant_and_known_bits(argv, match, capsys):
  with pytest.raises(SystemExit):
    harness.parse_args(argv)
  assert match in capsys.readouterr().err


@pytest.mark.slow
def test_cold_and_warm_compiles_run_in_fresh_processes(tmp_path):
  spec = models.SIZES["small"]
  # One variant: the worker builds and compiles any variant alike (all three run in
  # process above); each fresh process costs an interpreter start and a cold compile.
  reports = harness.fresh_compiles(spec, ("fused",), str(tmp_path), log=lambda *_: None)
  assert set(reports) == {"fused"}
  for variant, report in reports.items():
    assert set(report) == {"cold", "warm"}
    for kind in ("cold", "warm"):
      assert "error" not in report[kind], report[kind]
      assert report[kind]["compile_s"] > 0 and report[kind]["lower_s"] > 0
    assert report["warm"]["cache_files"] >= report["cold"]["cache_files"] > 0


def test_kernel_groups():
  assert harness.kernel_group("pallas_gemm_dpre") == "elementwise"
  assert harness.kernel_group("pallas_gemm_16384x2048x8192_NN") == "gemm"
  assert harness.kernel_group("sm90_xmma_gemm_bf16bf16_bf16f32") == "gemm"
  assert harness.kernel_group("loop_multiply_fusion") == "elementwise"
  summary = harness.group_kernels(
      [("pallas_gemm_gemm", 10.0), ("input_reduce_fusion", 2.0), ("pallas_gemm_gemm", 5.0)]
  )
  assert summary["groups"]["gemm"] == 15.0 and summary["launches"] == 3


@pytest.mark.parametrize("arch", models.ARCHS)
def test_default_size_is_about_half_a_billion_parameters(arch):
  from flax import nnx

  spec = models.for_arch(models.SIZES["default"], arch)
  abstract = nnx.eval_shape(lambda: models.Decoder(spec, "xla", nnx.Rngs(0)))
  params = harness.count_params(nnx.state(abstract, nnx.Param))
  assert 0.4e9 < params < 0.6e9, params
  embedding = spec.vocab * spec.d_model  # a lookup, no FLOPs
  assert spec.tokens == 16384 and spec.train_flops > 6 * (params - embedding) * spec.tokens


def test_heldout_presets_carry_their_arch(capsys):
  args = harness.parse_args(["--size", "llama3-3b-4l", "--batch", "1"])
  (spec,) = harness.specs_from(args)
  assert (spec.arch, spec.kv_heads, spec.vocab, spec.batch) == ("llama", 8, 128256, 1)
  with pytest.raises(SystemExit):
    harness.parse_args(["--size", "gpt2-medium", "--arch", "llama"])
  assert "is a gpt model" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(models.HELDOUT))
def test_heldout_models_build(name):
  from flax import nnx

  spec = models.HELDOUT[name]
  abstract = nnx.eval_shape(lambda: models.Decoder(spec, "fused", nnx.Rngs(0)))
  assert harness.count_params(nnx.state(abstract, nnx.Param)) > 0.1e9


def test_heldout_models_sweep_is_their_projection_gemms():
  from pallas_gemm import shapes

  want = [(g["m"], g["n"], g["k"], g["layout"]) for g in models.heldout_gemms()]
  have = [(s.m, s.n, s.k, s.layout) for s in shapes.load_sweep("heldout_models")]
  assert have == want


def test_llama_needs_an_even_head_dim():
  with pytest.raises(ValueError, match="head_dim .* must be even"):
    models.ModelSpec(arch="llama", d_model=1000, heads=8, kv_heads=2)
