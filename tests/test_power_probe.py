"""benchmarks.power without a GPU: parsing nvidia-smi samples, the table, the back-to-back loop."""

import doctest

import jax.numpy as jnp

from benchmarks import power


def test_docstring_examples():
  assert doctest.testmod(power).failed == 0


def test_bad_samples_raise_value_error_so_the_sampler_skips_them():
  for line in ("clocks.sm [MHz], power.draw [W]", "1755, [N/A], 700.00, 0x4", "1755, 699"):
    try:
      power.parse_sample(line)
    except ValueError:
      continue
    raise AssertionError(f"parsed {line!r}")


def test_throttle_names_cover_every_bit_once():
  every = 0
  for bit in power.THROTTLE_BITS:
    every |= bit
  assert sorted(power.throttle_names(every)) == sorted(power.THROTTLE_BITS.values())
  assert power.throttle_names(0) == []


def test_run_for_counts_calls_and_time_per_call():
  calls = []

  def fn(x):
    calls.append(1)
    return x + 1

  t0, t1, per_call, n = power.run_for(fn, (jnp.ones(4),), seconds=0.05, in_flight=2)
  assert n == len(calls) > 0 and t1 > t0
  assert abs(per_call * n - (t1 - t0)) < 1e-9


def test_table_reports_efficiency_per_clock_and_millijoules():
  row = dict(
      case="8x8x8 bfloat16 NN",
      contender="xla",
      tflops=700.0,
      clock_mhz=1400.0,
      power_w=700.0,
      power_limit_w=700.0,
      flop_per_sm_clock=2048.0,
      joules_per_gemm=0.25,
      reasons=["sw_power_cap"],
  )
  table = power.format_table([row])
  assert "| 2048 (50.0%) | 250.0 | sw_power_cap |" in table


def test_main_without_a_gpu_says_so(capsys):
  assert power.main([]) == 0
  assert "no GPU" in capsys.readouterr().out
