"""Package metadata (issue 20): a version, a license."""

import pathlib
import re

import pallas_gemm

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_version_is_the_projects():
  declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
  assert pallas_gemm.__version__ == declared.group(1)


def test_apache_license_ships_with_the_source():
  assert "Apache License" in (ROOT / "LICENSE").read_text()
  assert 'license = {text = "Apache-2.0"}' in (ROOT / "pyproject.toml").read_text()
