"""Clock and power under sustained load: what limits a GEMM's speed on this GPU?

For each shape, each contender (pallas_gemm, jnp.dot, jax's hopper_matmul_mgpu) runs back to
back for `--seconds`, interleaved in rounds, while `nvidia-smi` samples the SM clock, the
board power, its limit and the active clock-event (throttle) reasons every 50 ms. Reported per
contender: the median clock and power over its windows, the time per GEMM (host wall clock
over the window, so dispatch gaps count against everyone alike), and two derived numbers:

- flop per SM-clock: (flop/s) / (SMs x clock). The tensor cores' dense bf16 peak is 4096, so
  this is the kernel's efficiency per cycle, with the clock taken out;
- joules per GEMM: power x time. When the board sits at its power limit, the clock falls until
  power fits, and a kernel is only faster if it spends fewer joules per GEMM.

It reads the card's state and changes nothing (no clock or power settings).

    python -m benchmarks.power --shapes 4096x8192x4096,8192x8192x8192 --seconds 3

>>> parse_sample("1755, 699.12, 700.00, 0x0000000000000004")
(1755.0, 699.12, 700.0, 4)
>>> throttle_names(0x4 | 0x20)
['sw_power_cap', 'sw_thermal_slowdown']
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import jax

from benchmarks import matmul
from pallas_gemm import _compat

QUERIES = (
    "clocks.sm,power.draw.instant,power.limit,clocks_event_reasons.active",
    "clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active",
)
"""Newest field names first (power.draw averages over ~1 s on recent drivers; .instant does not)."""
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks",
}
"""nvidia-smi's clocks_event_reasons bits (nvml.h, nvmlClocksEventReason*)."""

DENSE_FLOP_PER_SM_CLOCK = 4096
"""H100 tensor cores, dense bf16/f16: 4 sub-cores x 512 FMA x 2."""


def parse_sample(line: str) -> tuple[float, float, float, int]:
  """(SM clock MHz, power W, power limit W, reason bits) from one nvidia-smi csv line."""
  clock, power, limit, reasons = (v.strip() for v in line.split(","))
  return float(clock), float(power), float(limit), int(reasons, 16)


def throttle_names(bits: int) -> list[str]:
  return [name for bit, name in THROTTLE_BITS.items() if bits & bit]


def gpu_selector(visible: str | None = None) -> list[str]:
  """nvidia-smi's arguments for the one GPU this process sees: nvidia-smi lists every GPU
  whatever CUDA_VISIBLE_DEVICES says, so a process given one GPU of several (as
  `run_device.sh par` does) names it.

  >>> gpu_selector("2"), gpu_selector("0,1")
  (['--id=2'], [])
  """
  if visible is None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
  return [f"--id={visible.strip()}"] if visible.strip().isdigit() else []


def _query_works(query: str) -> bool:
  once = subprocess.run(
      ["nvidia-smi", *gpu_selector(), f"--query-gpu={query}", "--format=csv,noheader,nounits"],
      capture_output=True,
      text=True,
  )
  try:
    parse_sample(once.stdout.splitlines()[0])
    return once.returncode == 0
  except (ValueError, IndexError):
    return False


class Sampler:
  """Runs `nvidia-smi -lms` in the background; `window(t0, t1)` returns the samples in it."""

  def __init__(self, period_ms: int = 50):
    self.query = next(q for q in QUERIES + ("",) if not q or _query_works(q))
    if not self.query:
      raise RuntimeError(f"nvidia-smi knows none of these queries: {QUERIES}")
    self._proc = subprocess.Popen(
        [
            "nvidia-smi",
            *gpu_selector(),
            f"--query-gpu={self.query}",
            "--format=csv,noheader,nounits",
            f"-lms={period_ms}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    self._samples = []
    self._thread = threading.Thread(target=self._read, daemon=True)
    self._thread.start()

  def _read(self):
    for line in self._proc.stdout:
      try:
        self._samples.append((time.perf_counter(), *parse_sample(line)))
      except ValueError:
        pass  # a header or a "[N/A]" field: not a sample

  def window(self, t0: float, t1: float):
    return [s[1:] for s in list(self._samples) if t0 <= s[0] <= t1]

  def close(self):
    self._proc.terminate()
    self._proc.wait()


def run_for(fn, args, seconds: float, in_flight: int = 32) -> tuple[float, float, float, int]:
  """Calls fn back to back for `seconds` (at most `in_flight` queued); (t0, t1, s per call, calls)."""
  queue = collections.deque()
  calls, t0 = 0, time.perf_counter()
  while time.perf_counter() - t0 < seconds:
    queue.append(fn(*args))
    calls += 1
    if len(queue) > in_flight:
      jax.block_until_ready(queue.popleft())
  jax.block_until_ready(list(queue))
  t1 = time.perf_counter()
  return t0, t1, (t1 - t0) / calls, calls


def contenders(case, variants=()):
  """pallas_gemm, jnp.dot, jax's kernel at its fastest config, and device_check EXPERIMENTS."""
  from benchmarks import device_check

  fns = {"pallas_gemm": matmul.pallas_fn(case), "xla": matmul.xla_fn(case)}
  family = matmul.jax_mgpu_fns(case)
  if family:  # CUPTI, one short round each
    args = matmul.make_inputs(case, seed=0)
    fns["jax_mgpu"] = family[
        min(family, key=lambda n: statistics.median(matmul.cupti_times_ms(family[n], args, 5)))
    ]
  for name in variants:
    config, params = device_check.EXPERIMENTS[name]
    fn = matmul.pallas_fn(case, config)
    fns[name] = device_check.with_compiler_params(fn, params) if params else fn
  return fns


def measure(cases, seconds: float, rounds: int, variants=(), log=print) -> list[dict]:
  num_sms = _compat.device_sm_count()
  sampler = Sampler()
  log(f"nvidia-smi --query-gpu={sampler.query}")
  rows = []
  try:
    for case in cases:
      args = matmul.make_inputs(case, seed=0)
      fns = contenders(case, variants)
      for fn in fns.values():
        run_for(fn, args, 0.5)  # compile and warm up
      per = {name: dict(sec=[], clock=[], power=[], limit=[], reasons=0) for name in fns}
      for _ in range(rounds):
        for name, fn in fns.items():
          t0, t1, sec, _ = run_for(fn, args, seconds)
          samples = sampler.window(t0 + 0.25, t1)  # skip the clock's first response
          per[name]["sec"].append(sec)
          for clock, power, limit, bits in samples:
            per[name]["clock"].append(clock)
            per[name]["power"].append(power)
            per[name]["limit"].append(limit)
            per[name]["reasons"] |= bits
      for name, p in per.items():
        sec = statistics.median(p["sec"])
        clock = statistics.median(p["clock"]) if p["clock"] else float("nan")
        power = statistics.median(p["power"]) if p["power"] else float("nan")
        row = dict(
            case=case.label,
            contender=name,
            us_per_gemm=sec * 1e6,
            tflops=case.flops / sec / 1e12,
            clock_mhz=clock,
            power_w=power,
            power_limit_w=max(p["limit"], default=float("nan")),
            samples=len(p["clock"]),
            reasons=throttle_names(p["reasons"]),
            flop_per_sm_clock=case.flops / sec / (num_sms * clock * 1e6),
            joules_per_gemm=power * sec,
        )
        rows.append(row)
        log(json.dumps(row))
  finally:
    sampler.close()
  return rows


def format_table(rows) -> str:
  lines = [
      "| case | contender | TFLOP/s | SM MHz | W (limit) | flop/SM-clk (of 4096) "
      "| mJ/GEMM | clock-event reasons |",
      "|---" * 8 + "|",
  ]
  for r in rows:
    lines.append(
        f"| {r['case']} | {r['contender']} | {r['tflops']:.0f} | {r['clock_mhz']:.0f} | "
        f"{r['power_w']:.0f} ({r['power_limit_w']:.0f}) | {r['flop_per_sm_clock']:.0f} "
        f"({100 * r['flop_per_sm_clock'] / DENSE_FLOP_PER_SM_CLOCK:.1f}%) | "
        f"{r['joules_per_gemm'] * 1e3:.1f} | {', '.join(r['reasons']) or '-'} |"
    )
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--shapes", default="4096x8192x4096,8192x8192x8192,4096x4096x4096")
  parser.add_argument("--seconds", type=float, default=3.0, help="length of one contender's window")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument(
      "--variants",
      default="",
      help="comma list of benchmarks.device_check.EXPERIMENTS to run as well",
  )
  parser.add_argument("--out", default=os.environ.get("OUT"))
  args = parser.parse_args(argv)
  env = matmul.environment()
  env["method"] = (
      "back-to-back calls, host wall clock per window; nvidia-smi -lms 50 "
      "(clocks.sm, power.draw, clocks_event_reasons.active), medians"
  )
  print(json.dumps(env))
  if env["platform"] != "gpu":
    print("no GPU: nothing to measure (this probe reads nvidia-smi during GPU runs)")
    return 0
  cases = [matmul.Case(m, n, k) for (m, n, k) in matmul.parse_shapes(args.shapes)]
  rows = measure(cases, args.seconds, args.rounds, [v for v in args.variants.split(",") if v])
  if args.out:
    matmul.write_json(args.out, "power.json", environment=env, rows=rows)
  print(format_table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
