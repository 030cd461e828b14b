"""The in-kernel profiler switch and its trace summaries (the traces come from a GPU;
here: the switch, the SMEM it reserves, and the arithmetic on a written trace)."""

import json

import pytest

from pallas_gemm import _compat
from pallas_gemm import kernel_trace
from pallas_gemm import weight_only as wo
from pallas_gemm import weight_only_gemm as kernel_lib


def _range(name, begin, end, tid):
  return [
      {"name": name, "ph": "B", "ts": begin, "tid": tid},
      {"name": name, "ph": "E", "ts": end, "tid": tid},
  ]


def test_summary_sums_cycles_per_region_over_the_warpgroups_that_ran_it(tmp_path):
  events = (
      _range("ring_wait", 0.0, 0.5, 1)  # consumer: 500 + 100 cycles waiting of a 2000 span
      + _range("convert", 0.5, 1.5, 1)
      + _range("ring_wait", 1.5, 1.6, 1)
      + _range("convert", 1.6, 2.0, 1)
      + _range("slot_wait", 0.0, 0.2, 2)  # producer: 200 of a 1000 span
      + _range("tma_issue", 0.2, 1.0, 2)
  )
  path = tmp_path / "1-trace.json"
  path.write_text(json.dumps({"traceEvents": events}))
  assert kernel_trace.traces(str(tmp_path)) == [str(path)]
  s = kernel_trace.summarize(kernel_trace.load(str(path)))
  assert s["ring_wait"]["count"] == 2
  assert s["ring_wait"]["cycles"] == pytest.approx(600)
  assert s["ring_wait"]["first"] == pytest.approx(500)
  assert s["ring_wait"]["share"] == pytest.approx(0.3)  # only the consumer's span counts
  assert s["slot_wait"]["share"] == pytest.approx(0.2)
  assert s["(span)"]["cycles"] == pytest.approx(3000)
  rows = kernel_trace.table(s).splitlines()
  assert rows[2].startswith("| (span) |") and "| convert | 2 | 700 |" in kernel_trace.table(s)


def test_tracing_turns_the_profiler_on_only_inside_and_reserves_its_smem(tmp_path):
  params = _compat.compiler_params()
  problem = kernel_lib.WeightOnlyProblem(m=16, n=14336, k=4096, bits=4, group_size=128)
  config = wo.default_config(problem, 132)
  assert kernel_trace.with_profiler(params) is params
  untraced = config.smem_bytes(problem)
  with kernel_trace.tracing(str(tmp_path / "traces"), ranges=64):
    traced = kernel_trace.with_profiler(params)
    assert (traced.profile_space, traced.profile_dir) == (64, str(tmp_path / "traces"))
    reserved = kernel_trace.smem_bytes(3)
    assert reserved == 3 * 64 * 16
    assert config.smem_bytes(problem) == untraced + reserved
    deeper = wo.deepest_ring(config, problem)
    assert deeper.smem_bytes(problem) <= kernel_lib.SMEM_BYTES
  assert kernel_trace.with_profiler(params).profile_space == 0
  assert kernel_trace.smem_bytes(3) == 0
  with pytest.raises(ValueError, match="ranges"):
    with kernel_trace.tracing(str(tmp_path), ranges=0):
      pass
