"""benchmarks.wgmma_rate without a GPU: every probe (N, operand A's place, warpgroups)
lowers for CUDA, and its arithmetic of instructions is the one the table reports."""

import jax
import pytest

from benchmarks import wgmma_rate


def test_every_probe_lowers_for_cuda(capsys):
  assert wgmma_rate.main(["--export", "--iters", "4"]) == 0
  lines = capsys.readouterr().out.splitlines()
  expected = [
      f"lowered {wgmma_rate.probe(n, register_a=r, warpgroups=w, iters=4).__name__}"
      for n, r, w in wgmma_rate.cases()
  ]
  assert lines == expected and len(lines) == 2 * len(wgmma_rate.NS) * 2


@pytest.mark.parametrize("register_a", [True, False])
def test_probe_returns_one_accumulator_tile(register_a):
  fn = wgmma_rate.probe(32, register_a=register_a, warpgroups=2, iters=4)
  exported = jax.export.export(fn, platforms=["cuda"])()
  assert exported.out_avals[0].shape == (64, 32)
  assert "mosaic_gpu" in exported.mlir_module()
