"""Which GPUs the kernels run on: Hopper only (compute capability 9.x). On another GPU,
`implementation=None` runs XLA (one warning) and an explicit kernel is a clear error;
exporting for CUDA from a CPU stays allowed. Devices are pretended on the CPU."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import pytest

import pallas_gemm
from pallas_gemm import _compat


@dataclasses.dataclass
class FakeGpu:
  device_kind: str
  compute_capability: str
  platform: str = "gpu"
  core_count: int = 108


@pytest.fixture
def gpu(monkeypatch):
  def pretend(kind, capability):
    monkeypatch.setattr(_compat.jax, "devices", lambda *a: [FakeGpu(kind, capability)])
    _compat._warn_not_hopper.cache_clear()

  return pretend


def test_only_hopper_counts_as_hopper(gpu):
  gpu("NVIDIA H100 80GB HBM3", "9.0")
  assert _compat.on_hopper()
  for kind, capability in (
      ("NVIDIA A100-SXM4-80GB", "8.0"),
      ("NVIDIA B200", "10.0"),
      ("AMD Instinct MI300X", ""),
  ):
    gpu(kind, capability)
    with pytest.warns(RuntimeWarning, match="not a Hopper GPU"):
      assert not _compat.on_hopper()


def test_a_device_without_a_capability_is_known_by_its_name(gpu):
  gpu("NVIDIA H200", "")
  assert _compat.on_hopper()


def test_the_warning_comes_once(gpu):
  gpu("NVIDIA A100-SXM4-80GB", "8.0")
  with pytest.warns(RuntimeWarning):
    _compat.on_hopper()
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert not _compat.on_hopper()


def test_the_default_runs_xla_and_the_kernel_refuses_on_another_gpu(gpu):
  a = jnp.ones((256, 128), jnp.bfloat16)
  gpu("NVIDIA A100-SXM4-80GB", "8.0")
  with pytest.warns(RuntimeWarning):
    y = pallas_gemm.matmul(a, a.T)  # the arrays live on the CPU: XLA computes it there
  assert y.shape == (256, 256) and float(y[0, 0]) == 128.0
  with pytest.raises(ValueError, match=r"implementation='pallas'\) needs a Hopper GPU.*A100"):
    pallas_gemm.matmul(a, a.T, implementation="pallas")


def test_exporting_the_kernel_for_cuda_from_a_cpu_is_allowed():
  assert jax.devices()[0].platform == "cpu"
  args = [
      jax.ShapeDtypeStruct((256, 128), jnp.bfloat16),
      jax.ShapeDtypeStruct((128, 256), jnp.bfloat16),
  ]
  fn = jax.jit(lambda a, b: pallas_gemm.matmul(a, b, implementation="pallas"))
  assert "mosaic_gpu" in jax.export.export(fn, platforms=["cuda"])(*args).mlir_module()
