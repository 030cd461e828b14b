"""Every docstring example in `layouts`, `pallas_gemm`, `benchmarks` and the README runs and
prints what it says."""

import doctest
import importlib
import pathlib
import pkgutil

import pytest

import benchmarks
import layouts
import pallas_gemm

NEEDS_FLAX = (
    "pallas_gemm.flax",
    "pallas_gemm.blockwise",
    "benchmarks.model",
    "benchmarks.models",
    "benchmarks.timeline",
)
# 8-10 s each on CI's CPU (they train or run kernels in interpret mode): CI runs them on the
# GPU machine's jax only.
SLOW = ("pallas_gemm.flax", "pallas_gemm.blockwise", "benchmarks.models")


def _modules():
  return sorted(
      [layouts.__name__, pallas_gemm.__name__]  # the packages' own docstrings too
      + [
          m.name
          for package in (layouts, pallas_gemm, benchmarks)
          for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
          if not m.name.endswith("__main__")
      ]
  )


@pytest.mark.parametrize(
    "name", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m for m in _modules()]
)
def test_docstring_examples(name):
  if name in NEEDS_FLAX:
    pytest.importorskip("flax")
  module = importlib.import_module(name)
  result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
  assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_readme_examples():
  readme = pathlib.Path(__file__).resolve().parent.parent / "README.md"
  result = doctest.testfile(
      str(readme), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE
  )
  assert result.attempted > 0 and result.failed == 0
