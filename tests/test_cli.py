"""The console scripts' shared flag parsing (`pallas_gemm.cli`) and `pallas-gemm-bench`."""

import tomllib
import pathlib

from absl import app
import pytest

from pallas_gemm import _compat, bench, cli


def test_bench_parses_dashed_flags_and_needs_a_hopper_gpu(capsys):
  try:
    cli.parse_flags(["bench", "--shapes", "16x4096x14336,8x8x8", "--layout", "NT"], bench.FLAGS)
    assert bench.FLAGS.layout == "NT"
    assert [bench.parse_shape(s) for s in bench.FLAGS.shapes] == [(16, 4096, 14336), (8, 8, 8)]
    if not _compat.on_hopper():
      assert bench.main(["bench"]) == bench.NO_GPU_STATUS
      assert "needs a Hopper GPU" in capsys.readouterr().err
  finally:
    bench.FLAGS.unparse_flags()


@pytest.mark.parametrize("text", ["16x32", "0x8x8", "axbxc", "8x8x8x8"])
def test_bench_rejects_malformed_shapes(text):
  with pytest.raises(app.UsageError, match="is not MxNxK"):
    bench.parse_shape(text)


def test_help_lists_every_flag_with_its_default(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.parse_flags(["bench", "--help"], bench.FLAGS)
  assert exit_info.value.code == 0
  text = capsys.readouterr().out
  for name in ("--shapes", "--layout", "--dtype", "--iterations"):
    assert name in text
  assert "(default: '20')" in text


def test_both_tools_are_console_scripts():
  project = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())
  scripts = project["project"]["scripts"]
  assert scripts["pallas-gemm-tune"] == "pallas_gemm.tune:run"
  assert scripts["pallas-gemm-bench"] == "pallas_gemm.bench:run"
