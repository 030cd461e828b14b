"""Running a test module again in a child process that has several fake CPU devices.

jax fixes the CPU device count when it initializes, so a module whose tests need
`count` devices marks them `needs(count)` and has one test call `rerun_with(file, count)`:
in a process that lacks the devices the marked tests skip and that one test runs the
module again with `--xla_force_host_platform_device_count`; in the child they run.

>>> needs(1).mark.args[0]   # one device: every process has it, nothing skips
False
"""

import os
import subprocess
import sys

import jax
import pytest


def needs(count: int):
  """A skip mark for tests that need `count` devices."""
  return pytest.mark.skipif(
      jax.device_count() < count, reason=f"needs {count} devices: run by the module's rerun test"
  )


def rerun_with(test_file: str, count: int, rerun_test: str) -> None:
  """Runs `test_file`'s tests but `rerun_test` in a child with `count` fake CPU devices;
  skips where this process already has them (the tests ran here)."""
  if jax.device_count() >= count:
    pytest.skip("this process has the devices: the tests ran in it")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(
      os.environ,
      JAX_PLATFORMS="cpu",
      XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}",
      PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
  )
  child = subprocess.run(
      [sys.executable, "-m", "pytest", os.path.abspath(test_file), "-q", "-p", "no:cacheprovider",
       "-o", "addopts=", "-k", f"not {rerun_test}"],
      cwd=root, env=env, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-3000:]
  assert " passed" in child.stdout, child.stdout[-2000:]
