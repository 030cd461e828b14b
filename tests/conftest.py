"""Shared pytest settings: tests marked ``gpu`` are skipped unless a Hopper (sm_90) GPU is
present; tests marked ``slow`` (the benchmark harnesses' CPU runs, the longest interpret-mode
runs) are skipped where ``PALLAS_GEMM_SKIP_SLOW=1``: CI's legs on other jax versions set it,
and its leg on the GPU machine's jax runs them (the suite fits CI's 20 minutes that way)."""

import os

import pytest


def _has_hopper_gpu() -> bool:
  try:
    import jax

    return any(
        d.platform == "gpu" and getattr(d, "compute_capability", None) == "9.0"
        for d in jax.devices()
    )
  except Exception:  # no usable backend at all
    return False


def pytest_collection_modifyitems(config, items):
  if os.environ.get("PALLAS_GEMM_SKIP_SLOW") == "1":
    skip_slow = pytest.mark.skip(reason="slow: PALLAS_GEMM_SKIP_SLOW=1 (CI runs it in one leg)")
    for item in items:
      if item.get_closest_marker("slow"):
        item.add_marker(skip_slow)
  gpu_items = [item for item in items if item.get_closest_marker("gpu")]
  if gpu_items and not _has_hopper_gpu():
    skip = pytest.mark.skip(reason="needs a Hopper GPU")
    for item in gpu_items:
      item.add_marker(skip)
