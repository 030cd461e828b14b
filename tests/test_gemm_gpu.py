"""Tier 3: the kernel on a Hopper GPU (skipped elsewhere).

Runs the device correctness matrix of `benchmarks.device_check` (all layouts,
dtypes, schedules, clusters, epilogues, true edge tiles and odd shapes that the
interpreter cannot check), one test per case.
"""

import pytest

from benchmarks import device_check

CHECKS = device_check.checks()


@pytest.mark.gpu
@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_device_matrix(check):
  result = device_check.run_check(check, seed=hash(check.name) % 2**31)
  assert result["ok"], result
