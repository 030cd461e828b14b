"""Where a kernel's warpgroups spend their cycles: Mosaic GPU's in-kernel profiler.

Inside `tracing(directory)`, every kernel the package launches (`pipeline.launch`)
records the named regions of its body (`jax.named_scope` in the kernel: the ring's
waits, a convert stage, a store) per warpgroup, with the SM's cycle counter, and
writes one Perfetto JSON trace per call into `directory`. Outside it nothing is
recorded and the named scopes cost nothing. `summarize` turns a trace into cycles
per region, and `table` prints them: a consumer that spends most of its cycles in
"ring_wait" is starved by memory; one that does not is the limit itself.

The profiler's buffer takes `ranges` x 16 bytes of shared memory per warpgroup, so a
traced kernel may need a stage fewer than its config's.

>>> events = [
...     {"name": "ring_wait", "ph": "B", "ts": 0.0, "tid": 1},
...     {"name": "ring_wait", "ph": "E", "ts": 0.3, "tid": 1},
...     {"name": "convert", "ph": "B", "ts": 0.3, "tid": 1},
...     {"name": "convert", "ph": "E", "ts": 1.0, "tid": 1},
... ]
>>> s = summarize({"traceEvents": events})
>>> s["ring_wait"]["cycles"], s["ring_wait"]["count"], round(s["convert"]["share"], 2)
(300.0, 1, 0.7)
>>> s["(span)"]["cycles"], start_spread_us({"traceEvents": events})
(1000.0, 0.0)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import glob
import json
import os
from typing import Iterator

import jax

_ACTIVE: dict | None = None


@contextlib.contextmanager
def tracing(directory: str, ranges: int = 256) -> Iterator[str]:
  """Records the named regions of every kernel launched inside (at most `ranges` per
  warpgroup and call; events past it are dropped) into `directory`. jax's caches are
  cleared on entry and exit, so that no kernel lowered without the profiler is reused
  inside, or one with it outside."""
  global _ACTIVE
  if not isinstance(ranges, int) or ranges < 1:
    raise ValueError(f"ranges={ranges!r}: a positive int (regions recorded per warpgroup)")
  os.makedirs(directory, exist_ok=True)
  jax.clear_caches()
  _ACTIVE = dict(profile_space=ranges, profile_dir=directory, profile_bounds_check=True)
  try:
    yield directory
  finally:
    _ACTIVE = None
    jax.clear_caches()


def active() -> bool:
  """Whether kernels are being traced now (inside `tracing`)."""
  return _ACTIVE is not None


def with_profiler(params):
  """`params` (a `plgpu.CompilerParams`) with the profiler on inside `tracing`, else as is."""
  if _ACTIVE is None:
    return params
  fields = {k: v for k, v in _ACTIVE.items() if hasattr(params, k)}  # 0.10.2: no bounds check
  return dataclasses.replace(params, **fields)


def smem_bytes(warpgroups: int) -> int:
  """Shared memory the profiler's buffer takes in a CTA of `warpgroups` (0 outside
  `tracing`): a config's SMEM budget counts it, so a traced ring may lose a stage.

  >>> smem_bytes(3)
  0
  """
  if _ACTIVE is None:
    return 0
  return warpgroups * _ACTIVE["profile_space"] * 4 * 4  # 2 events of 2 words per range


def traces(directory: str) -> list[str]:
  """The trace files written into `directory`, oldest first."""
  return sorted(glob.glob(os.path.join(directory, "*trace.json")))


def summarize(trace: dict) -> dict:
  """{region: {"cycles", "count", "share", "first"}} over every warpgroup of a trace:
  `cycles` summed over the warpgroups that ran the region, `count` how many times it
  ran, `share` its cycles over the spans (first to last event) of those warpgroups,
  `first` the mean cycles of each warpgroup's first run (a ring's first wait is its
  fill latency). The special region "(span)" is the warpgroups' spans themselves.

  The profiler writes SM clock cycles into the trace's microsecond field scaled by
  1e-3, so a duration of 1.0 there is 1000 cycles. Nested regions count in each."""
  by_warpgroup = collections.defaultdict(list)
  for event in trace["traceEvents"]:
    by_warpgroup[event["tid"]].append(event)
  cycles, counts, spans, firsts = (collections.Counter() for _ in range(4))
  for events in by_warpgroup.values():
    events.sort(key=lambda e: e["ts"])
    span = 1e3 * (events[-1]["ts"] - events[0]["ts"])
    cycles["(span)"] += span
    counts["(span)"] += 1
    spans["(span)"] += span
    firsts["(span)"] += span
    open_at: dict[str, list[float]] = collections.defaultdict(list)
    seen = set()
    for event in events:
      name = event["name"]
      if event["ph"] == "B":
        open_at[name].append(event["ts"])
      elif open_at[name]:
        duration = 1e3 * (event["ts"] - open_at[name].pop())
        cycles[name] += duration
        counts[name] += 1
        if name not in seen:
          firsts[name] += duration
          seen.add(name)
    for name in seen:
      spans[name] += span
  warpgroups = {name: 0 for name in cycles}
  for events in by_warpgroup.values():
    for name in {e["name"] for e in events} | {"(span)"}:
      if name in warpgroups:
        warpgroups[name] += 1
  return {
      name: dict(
          cycles=cycles[name],
          count=counts[name],
          share=cycles[name] / max(spans[name], 1),
          first=firsts[name] / max(warpgroups[name], 1),
      )
      for name in sorted(cycles)
  }


def start_spread_us(trace: dict) -> float:
  """How far apart (us, by the global timer) the warpgroups of a trace started: the
  time the GPU took to launch every CTA of the kernel."""
  firsts = {}
  for event in trace["traceEvents"]:
    firsts[event["tid"]] = min(event["ts"], firsts.get(event["tid"], event["ts"]))
  return max(firsts.values()) - min(firsts.values()) if firsts else 0.0


def span_range(trace: dict) -> tuple[float, float]:
  """The shortest and the longest span (cycles, first to last event) of a trace's
  warpgroups: with work spread evenly (stream-K) the two are close, and the longest
  is the kernel's critical path.

  >>> e = lambda tid, ts: dict(name="r", ph="B", ts=ts, tid=tid)
  >>> span_range({"traceEvents": [e(1, 0.0), e(1, 2.0), e(2, 5.0), e(2, 5.5)]})
  (500.0, 2000.0)
  """
  first, last = {}, {}
  for event in trace["traceEvents"]:
    tid, ts = event["tid"], event["ts"]
    first[tid] = min(ts, first.get(tid, ts))
    last[tid] = max(ts, last.get(tid, ts))
  spans = [1e3 * (last[t] - first[t]) for t in first]
  return (min(spans), max(spans)) if spans else (0.0, 0.0)


def table(summary: dict) -> str:
  """A markdown table of `summarize`'s result: region, runs, cycles per run, share."""
  lines = [
      "| region | runs | cycles per run | first run | share of its warpgroups' span |",
      "|---|---|---|---|---|",
  ]
  for name, s in sorted(summary.items(), key=lambda kv: -kv[1]["share"]):
    per_run = s["cycles"] / max(s["count"], 1)
    lines.append(
        f"| {name} | {s['count']} | {per_run:.0f} | {s['first']:.0f} | {100 * s['share']:.1f}% |"
    )
  return "\n".join(lines)


def load(path: str) -> dict:
  """A trace file as written by the profiler."""
  with open(path) as f:
    return json.load(f)
