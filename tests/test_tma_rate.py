"""benchmarks.tma_rate without a GPU: every probe (element type, box, layout, consumer)
lowers for CUDA, and the weight it streams has the shape its layout names."""

import jax
import pytest

from benchmarks import tma_rate


def test_every_probe_lowers_for_cuda(capsys):
  assert tma_rate.main(["--export"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines == [f"lowered {probe.name}" for probe in tma_rate.cases()]
  assert len(lines) == 13


@pytest.mark.parametrize("layout,shape", [("rows", (65536, 4096)), ("tiles", (256, 32, 256, 128))])
def test_layouts_name_the_weight_shape(layout, shape):
  probe = tma_rate.Probe("int4", 256, 128, layout)
  assert probe.shape() == shape and probe.nbytes == 65536 * 4096 // 2
  assert probe.stages == 8  # 16 KB boxes in 160 KB
  exported = jax.export.export(probe.kernel(), platforms=["cuda"])(
      jax.ShapeDtypeStruct(shape, tma_rate.DTYPES["int4"])
  )
  assert "mosaic_gpu" in exported.mlir_module()
