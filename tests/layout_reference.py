"""What the layout tests compare against, written independently of `layouts`.

A layout's offsets by brute force: numpy unravels every flat index
column-major over the flattened shape and dots it with the strides. Also the
hypothesis profiles the property tests share (``LAYOUTS_HYPOTHESIS_PROFILE=
layouts-thorough`` runs 1000 examples per test).
"""

import os

import numpy as np
from hypothesis import HealthCheck, settings

from hypothesis_budget import examples

settings.register_profile(
    "layouts",
    max_examples=examples(40),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile(
    "layouts-thorough",
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
PROFILE = settings.get_profile(os.environ.get("LAYOUTS_HYPOTHESIS_PROFILE", "layouts"))


def leaves(t):
  return tuple(x for s in t for x in leaves(s)) if isinstance(t, tuple) else (t,)


def ref_offsets(shape, stride):
  """Offset of every flat index 0..size-1: column-major unravel, then dot."""
  sh, st = leaves(shape), leaves(stride)
  n = int(np.prod(sh, dtype=np.int64))
  crd = np.unravel_index(np.arange(n), sh, order="F")
  out = np.zeros(n, dtype=np.int64)
  for c, d in zip(crd, st):
    out += c * d
  return out


def offsets(layout):
  return ref_offsets(layout.shape, layout.stride)


def injective(layout):
  return len(set(offsets(layout).tolist())) == len(offsets(layout))
