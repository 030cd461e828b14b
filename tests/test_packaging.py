"""Package metadata (issue 20): a version, a license."""

import pathlib
import re

import pytest

import pallas_gemm

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_version_is_the_projects():
  declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
  assert pallas_gemm.__version__ == declared.group(1)


def test_apache_license_ships_with_the_source():
  assert "Apache License" in (ROOT / "LICENSE").read_text()
  assert 'license = {text = "Apache-2.0"}' in (ROOT / "pyproject.toml").read_text()


def test_console_script_and_extras_and_no_benchmarks_package():
  import tomllib

  project = tomllib.loads((ROOT / "pyproject.toml").read_text())
  assert project["project"]["scripts"]["pallas-gemm-tune"] == "pallas_gemm.tune:run"
  from pallas_gemm import tune

  assert callable(tune.run)
  extras = project["project"]["optional-dependencies"]
  assert extras["cuda12"] == ["jax[cuda12]"] and extras["cuda13"] == ["jax[cuda13]"]
  # The harness runs from the source tree: a top-level `benchmarks` would shadow PyPI's.
  assert project["tool"]["setuptools"]["packages"]["find"]["include"] == [
      "layouts*",
      "pallas_gemm*",
  ]
  assert "recursive-include examples" in (ROOT / "MANIFEST.in").read_text()


def test_no_module_is_shadowed_by_a_function_of_the_same_name():
  """`import pallas_gemm.X` gives the module X wherever `pallas_gemm.X` is exported."""
  import importlib
  import pkgutil

  import pallas_gemm

  for info in pkgutil.iter_modules(pallas_gemm.__path__):
    module = importlib.import_module(f"pallas_gemm.{info.name}")
    exported = getattr(pallas_gemm, info.name)
    assert exported is module, f"pallas_gemm.{info.name} is {type(exported).__name__}"


def test_the_main_job_honours_help(capsys):
  """`python -m benchmarks --help` prints its help and runs nothing."""
  from benchmarks import __main__ as job

  with pytest.raises(SystemExit) as exit_info:
    job.main(["--help"])
  assert exit_info.value.code == 0
  out = capsys.readouterr().out
  assert out.startswith("usage: python -m benchmarks") and "benchmarks.blockwise_fp8" in out
