"""Every docstring example in `layouts` and the README runs and prints what it says."""

import doctest
import importlib
import pathlib
import pkgutil

import pytest

import layouts


def _modules():
    return sorted(m.name for m in pkgutil.walk_packages(layouts.__path__, "layouts.")
                  if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_readme_examples():
    readme = pathlib.Path(__file__).resolve().parent.parent / "README.md"
    result = doctest.testfile(str(readme), module_relative=False,
                              optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("name", ["pallas_gemm.compile_once", "benchmarks.models", "benchmarks.model",
                                  "benchmarks.timeline"])
def test_docstring_examples_of_model_modules(name):
    if name.startswith(("benchmarks.model", "benchmarks.timeline")):
        pytest.importorskip("flax")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0 and result.failed == 0, name
