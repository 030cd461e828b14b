"""Everything that differs between the supported jax versions (0.10.2 and 0.11.x).

The rest of the package imports these names instead of testing versions itself.

>>> from pallas_gemm import _compat
>>> _compat.JAX_VERSION >= (0, 10, 2)
True
"""

from __future__ import annotations

import functools
import inspect
import re
import warnings

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu

JAX_VERSION: tuple[int, ...] = tuple(
    int(part) for part in jax.__version__.split(".")[:3] if part.isdigit()
)

# 0.11 turned `plgpu.transpose_ref` into a deprecated alias of `ref.transpose`;
# 0.10.2 has only the plgpu function for Mosaic GPU refs.
_USE_REF_TRANSPOSE = JAX_VERSION >= (0, 11, 0)

# 0.10.2's GPU interpreter cannot evaluate a WGMMA whose operand went through
# `transpose_ref` (AttributeError in its callback, which then hangs the kernel).
INTERPRET_SUPPORTS_TRANSPOSED_OPERANDS = JAX_VERSION >= (0, 11, 0)

# Cluster barriers (needed by TMA multicast) run in the interpreter from 0.11.
INTERPRET_SUPPORTS_CLUSTERS = JAX_VERSION >= (0, 11, 0)

# Storing a WGMMA-layout register array through a transposed SMEM view (the
# weight-only kernel's "tile" output) lowers from 0.11; 0.10.2's layout inference
# finds no layout for it.
STORES_THROUGH_TRANSPOSED_SMEM = JAX_VERSION >= (0, 11, 0)

# Warp-level MMA (`plgpu.mma`, mma.sync m16n8k16) is in Pallas's Mosaic GPU API from 0.11.
HAS_WARP_MMA = hasattr(plgpu, "mma")


def require_interpret_transposes(transpose_a: bool, transpose_b: bool) -> None:
  """Raises where this jax's GPU interpreter cannot run transposed operands: it would
  hang (its callback fails inside a warp-specialized kernel, and the barrier waits)."""
  if (transpose_a or transpose_b) and not INTERPRET_SUPPORTS_TRANSPOSED_OPERANDS:
    raise NotImplementedError(
        f"the GPU interpreter of jax {jax.__version__} cannot run transposed operands "
        f"(transpose_a={transpose_a}, transpose_b={transpose_b}), which every "
        "backward GEMM has; use jax >= 0.11 or implementation='xla'"
    )


def transpose_2d(ref):
  """The transposed view of a 2-D SMEM ref, as WGMMA wants an MN-major operand."""
  if _USE_REF_TRANSPOSE:
    return ref.transpose((1, 0))
  return plgpu.transpose_ref(ref, (1, 0))


def compiler_params(*, approx_math: bool = False, **extra) -> plgpu.CompilerParams:
  """Warpgroup lowering, spelled out: the default changed from Lane to Warpgroup in 0.11."""
  return plgpu.CompilerParams(
      approx_math=approx_math,
      lowering_semantics=plgpu.LoweringSemantics.Warpgroup,
      **extra,
  )


def interpret_params(*, zero_fill: bool, detect_races: bool = False):
  """GPU interpret-mode parameters (private API, same import path in both versions).

  `zero_fill=True` emulates TMA's zero fill of out-of-bounds loads; it also makes
  never-written memory read as zero, so only use it where that cannot hide a bug.
  """
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

  if zero_fill:
    return InterpretGPUParams(
        out_of_bounds_reads="uninitialized",
        uninitialized_memory="zero",
        detect_races=detect_races,
    )
  return InterpretGPUParams(detect_races=detect_races)


def reset_interpret_state() -> None:
  """Clears the GPU interpreter's global state (needed after a failed kernel)."""
  from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call

  interpret_pallas_call.reset_gpu_interpret_mode_state()


_TARGET_SM_COUNT: int | None = None


def device_sm_count() -> int | None:
  """The number of SMs of the default device if it is a GPU (or of the GPU a kernel is
  lowered for elsewhere: `target_sm_count`), else None."""
  if _TARGET_SM_COUNT is not None:
    return _TARGET_SM_COUNT
  device = jax.devices()[0]
  if device.platform != "gpu":
    return None
  return int(device.core_count)


def target_sm_count(count: int | None) -> None:
  """Lower kernels for a GPU of `count` SMs from a process without it (a lowering
  worker, `pallas_gemm.lowering_pool`); None: the default device's again."""
  global _TARGET_SM_COUNT
  _TARGET_SM_COUNT = count


HOPPER_KINDS = re.compile(r"\bG?H(100|200|800|20)\b")
"""Device kinds of the Hopper family (sm_90)."""

H100_SXM_HBM_BYTES_PER_S = 3.35e12
"""The board the time models were fitted on."""

HBM_BYTES_PER_S = (
    (re.compile(r"PCIe"), 2.0e12),
    (re.compile(r"\bH100 NVL\b"), 3.9e12),
    (re.compile(r"\bGH200\b"), 4.0e12),
    (re.compile(r"\bH200\b"), 4.8e12),
)
"""Spec HBM bandwidth by device kind, first match; other Hopper boards: the H100 SXM's."""


def hbm_scale(device_kind: str | None = None) -> float:
  """The default (or named) GPU's HBM bandwidth over the H100 SXM's (1.0 without a GPU):
  the time models scale their memory rates by it.

  >>> hbm_scale("NVIDIA H200"), hbm_scale("NVIDIA H100 80GB HBM3")
  (1.4328358208955223, 1.0)
  """
  if device_kind is None:
    device = jax.devices()[0]
    if device.platform != "gpu":
      return 1.0
    device_kind = device.device_kind
  for pattern, rate in HBM_BYTES_PER_S:
    if pattern.search(device_kind):
      return rate / H100_SXM_HBM_BYTES_PER_S
  return 1.0


def on_hopper() -> bool:
  """Whether the default device is a Hopper GPU (compute capability 9.x), where the
  kernels run; `implementation=None` runs XLA elsewhere. Another GPU (an A100, a
  Blackwell card, a ROCm GPU) gets one warning that XLA's GEMMs run instead."""
  device = jax.devices()[0]
  if device.platform != "gpu":
    return False
  capability = str(getattr(device, "compute_capability", ""))
  if capability.split(".")[0] == "9" or (
      not capability and HOPPER_KINDS.search(device.device_kind)
  ):
    return True
  _warn_not_hopper(device.device_kind, capability)
  return False


@functools.cache
def _warn_not_hopper(kind: str, capability: str) -> None:
  warnings.warn(
      f"pallas_gemm: {kind} (compute capability {capability or 'unknown'}) is not a "
      "Hopper GPU; implementation=None runs XLA's GEMMs",
      RuntimeWarning,
      stacklevel=3,
  )


def require_hopper(what: str) -> None:
  """Raises if the default device is a GPU the kernels cannot run on (exporting for
  CUDA from a CPU is allowed: nothing runs here)."""
  device = jax.devices()[0]
  if device.platform == "gpu" and not on_hopper():
    raise ValueError(
        f"{what} needs a Hopper GPU (compute capability 9.x); this is {device.device_kind} "
        f"(compute capability {getattr(device, 'compute_capability', 'unknown')}): use "
        "implementation=None or 'xla'"
    )


# Mixed e4m3 x e5m2 WGMMA operands: the verifier accepts them from jaxlib 0.11
# (jax-ml/jax#38859); 0.10.2 requires equal operand dtypes.
SUPPORTS_MIXED_FP8 = JAX_VERSION >= (0, 11, 0)

# `jax.nn.scaled_matmul` lowers on the CPU from jax 0.11 (0.10.2: "MLIR translation rule for
# primitive 'scaled_matmul' not found for platform cpu").
SCALED_MATMUL_ON_CPU = JAX_VERSION >= (0, 11, 0)


def is_ref_union(ref) -> bool:
  """Whether a kernel ref is a `plgpu.RefUnion` (aliased SMEM views), by its type (a
  ref with transforms, which is no union, has no abstract type of its own)."""
  from jax._src.pallas.mosaic_gpu import core as gpu_core  # the only home of the class
  from jax._src.state.types import TransformedRef

  if isinstance(ref, TransformedRef):
    return False
  return isinstance(jax.typeof(ref), gpu_core.AbstractRefUnion)


def load_registers(ref, layout, *, optimized: bool = False):
  """`ref` (SMEM or GMEM) read into registers in `layout`: element by element, or
  with `optimized` in the layout's vector loads (SMEM tiles Mosaic can address so).

  0.11 deprecated the separate (empty) index argument that 0.10.2 requires.
  """
  if JAX_VERSION >= (0, 11, 0):
    return plgpu.load(ref, layout=layout, optimized=optimized)
  return plgpu.load(ref, (), layout=layout, optimized=optimized)


_GPU_SCOPED_SEMAPHORES = (
    "memory_scope"
    in inspect.signature(getattr(plgpu, "semaphore_signal", lambda *a: None)).parameters
)


def semaphore_signal_gpu(sem) -> None:
  """Adds 1 to a GMEM semaphore with a release at GPU scope (`red.release.gpu`): another
  SM of this GPU sees this warpgroup's stores before the signal. jax < 0.11 releases at
  system scope (`pl.semaphore_signal`), which is correct and slower."""
  if _GPU_SCOPED_SEMAPHORES:
    plgpu.semaphore_signal(sem, 1, memory_scope="gpu")
  else:
    pl.semaphore_signal(sem, 1)


def semaphore_wait_gpu(sem, value) -> None:
  """Waits until a GMEM semaphore holds `value` and takes it off (acquire at GPU scope
  where jax has it; see `semaphore_signal_gpu`)."""
  if _GPU_SCOPED_SEMAPHORES:
    plgpu.semaphore_wait(sem, value, memory_scope="gpu")
  else:
    pl.semaphore_wait(sem, value)


def saved_residuals(f, *args) -> list:
  """(aval, source) of each residual `jax.vjp(f, *args)` keeps (jax's private
  `saved_residuals`; `jax.ad_checkpoint` exports only a printing version)."""
  from jax._src import ad_checkpoint

  return ad_checkpoint.saved_residuals(f, *args)


def varying_axes(x) -> frozenset:
  """The manual mesh axes along which `x` varies inside `shard_map` (its type's
  `manual_axis_type.varying` from 0.11, `vma` on 0.10)."""
  aval = jax.typeof(x)
  mat = getattr(aval, "manual_axis_type", None)
  return frozenset(mat.varying if mat is not None else getattr(aval, "vma", ()))


def with_leading_dim(aval, size: int):
  """`aval` with a new unsharded leading dim of `size` (a vmapped value's type).

  >>> with_leading_dim(jax.core.ShapedArray((2, 4), jax.numpy.float32), 3).shape
  (3, 2, 4)
  """
  sharding = aval.sharding
  spec = jax.sharding.PartitionSpec(None, *sharding.spec)
  return aval.update(shape=(size, *aval.shape), sharding=sharding.update(spec=spec))


def vary_like(x, axes: frozenset):
  """`x` marked varying along `axes` it is not yet varying along (a kernel's output
  inside `shard_map` carries no axes; a custom_vjp gradient must match its primal's)."""
  missing = tuple(sorted(axes - varying_axes(x)))
  return jax.lax.pcast(x, missing, to="varying") if missing else x


def concrete_mesh_context():
  """The concrete mesh `jax.set_mesh` put in context (devices and all), or None.
  (jax has no public getter for it in 0.10-0.11.)"""
  from jax._src import mesh as mesh_lib

  mesh = mesh_lib.get_concrete_mesh()
  return None if mesh is None or mesh.empty else mesh
