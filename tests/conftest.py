"""Shared pytest settings: tests marked ``gpu`` are skipped unless a Hopper (sm_90) GPU is present."""

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
  gpu_items = [item for item in items if item.get_closest_marker("gpu")]
  if gpu_items and not _has_hopper_gpu():
    skip = pytest.mark.skip(reason="needs a Hopper GPU")
    for item in gpu_items:
      item.add_marker(skip)
