"""`python -m benchmarks.multi_gpu --cpu-smoke`: the sharded checks on 4 fake CPU devices
(XLA path; on several GPUs the same checks run the kernels per shard)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("flax")


@pytest.mark.slow
def test_the_multi_gpu_harness_runs_on_fake_cpu_devices():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  # The harness asks for its 4 devices only where XLA_FLAGS is unset: ask here, keeping the
  # caller's flags (CI's: no LLVM optimizations, the same arithmetic, less compile time).
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()
  env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu", XLA_FLAGS=flags)
  out = subprocess.run(
      # one check of each kind (the checked functions have their own tests)
      [sys.executable, "-m", "benchmarks.multi_gpu", "--cpu-smoke", "--checks",
       "column,ragged,tp_flax,ag_matmul"],  # fmt: skip
      cwd=root,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  checks = [line for line in out.stdout.splitlines() if line.startswith("check ")]
  assert len(checks) == 4 and all(line.endswith(" ok") for line in checks), out.stdout
