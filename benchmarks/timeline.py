"""Where a step's GPU sits idle: the gaps between its kernels, from jax's profiler.

A step's wall time is its kernels' time plus the time the GPU waits between them.
`capture` traces one call with `jax.profiler` and returns the GPU's kernel events;
`idle_report` merges them into busy intervals and attributes every idle gap to the
kernels on either side of it, so "our kernels are fast but the step is not" gets a
cause: gaps before Mosaic launches, after them, or everywhere.

>>> events = [Event("fusion_1", 0, 10), Event("pallas_gemm_8x8x8_NN", 30, 60),
...           Event("fusion_2", 61, 70)]
>>> r = idle_report(events)
>>> r["idle_us"], r["busy_us"], r["gaps_before"]["mosaic"]["us"]
(0.021, 0.049, 0.02)
"""

from __future__ import annotations

import dataclasses
import glob
import os
import tempfile

import jax


@dataclasses.dataclass(frozen=True)
class Event:
  name: str
  start_ns: int
  end_ns: int


def capture(call):
  """(call() blocked until ready, the GPU kernel events it ran, host events).

  Host events are (name, duration ns) of the host threads' trace, for the top list.
  """
  from jax.profiler import ProfileData

  with tempfile.TemporaryDirectory(prefix="pallas-gemm-trace-") as log_dir:
    jax.profiler.start_trace(log_dir)
    try:
      out = jax.block_until_ready(call())
    finally:
      jax.profiler.stop_trace()
    (path,) = glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)
    data = ProfileData.from_file(path)
    kernels, host = [], []
    for plane in data.planes:
      if plane.name.startswith("/device:GPU"):
        for line in plane.lines:
          if line.name.startswith("Stream"):
            kernels += [Event(e.name, int(e.start_ns), int(e.end_ns)) for e in line.events]
      elif plane.name.startswith("/host:CPU"):
        for line in plane.lines:
          host += [(e.name, int(e.duration_ns)) for e in line.events]
  return out, sorted(kernels, key=lambda e: e.start_ns), host


def _kind(name: str) -> str:
  from benchmarks.model import kernel_group

  return (
      "mosaic"
      if name.startswith("pallas_gemm") and kernel_group(name) == "gemm"
      else kernel_group(name)
  )


def idle_report(events, top: int = 8) -> dict:
  """Busy and idle µs of a sorted kernel timeline; idle split by the neighbours' kinds."""
  busy = idle = 0
  before: dict[str, dict] = {}
  after: dict[str, dict] = {}
  gaps = []
  end, prev = None, None
  for e in events:
    if end is not None and e.start_ns > end:
      gap = e.start_ns - end
      idle += gap
      for table, kind in ((before, _kind(e.name)), (after, _kind(prev.name))):
        slot = table.setdefault(kind, {"us": 0.0, "count": 0})
        slot["us"] += gap / 1e3
        slot["count"] += 1
      gaps.append((gap, prev.name, e.name))
    if end is None or e.end_ns > end:
      busy += e.end_ns - max(e.start_ns, end if end is not None else e.start_ns)
      end, prev = e.end_ns, e
  gaps.sort(reverse=True)
  return dict(
      busy_us=busy / 1e3,
      idle_us=idle / 1e3,
      kernels=len(events),
      gaps_before=before,
      gaps_after=after,
      largest=[(round(g / 1e3, 1), a[:60], b[:60]) for g, a, b in gaps[:top]],
  )


def top_host(host_events, top: int = 15):
  """The host trace's event names by total time: [(name, total µs, count)], Python
  frames (names starting with '$') left out."""
  totals: dict[str, list] = {}
  for name, ns in host_events:
    if name.startswith("$"):
      continue
    slot = totals.setdefault(name[:80], [0.0, 0])
    slot[0] += ns / 1e3
    slot[1] += 1
  return sorted(((n, round(t, 1), c) for n, (t, c) in totals.items()), key=lambda x: -x[1])[:top]
