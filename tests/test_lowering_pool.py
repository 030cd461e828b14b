"""Kernels lowered by helper processes (`pallas_gemm.lowering_pool` through
`kernel_cache`), on the CPU through jax's ahead-of-time lowering for CUDA: what a
worker lowers is what this process would have, a failed or missing worker costs
nothing but time, and a job nobody started yet is taken back."""

import os
import re

import jax
import jax.numpy as jnp
import pytest
from jax._src.interpreters import mlir as jax_mlir
from jax._src.lib import mosaic_gpu_dialect as mosaic_dialect
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import core as mosaic_core

import pallas_gemm
from pallas_gemm import kernel_cache
from pallas_gemm import lowering_pool


@pytest.fixture
def pool():
  """One worker, started and ready before the test's program is traced."""
  lowering_pool.reset(1)
  shared = lowering_pool.shared_pool()
  assert shared.submit(divmod, (7, 2)).result(timeout=120) == (3, 1)
  shared.served = 0
  yield shared
  lowering_pool.reset(0)
  kernel_cache.forget()


def _step(a, b, w):
  y = pallas_gemm.matmul(a, b, implementation="pallas")
  z = pallas_gemm.matmul(
      y,
      w,
      bias=jnp.ones((w.shape[1],), jnp.float32),
      activation="gelu_tanh",
      implementation="pallas",
  )
  return z.astype(jnp.float32).sum()


ARGS = (
    jax.ShapeDtypeStruct((1000, 512), jnp.bfloat16),
    jax.ShapeDtypeStruct((512, 256), jnp.bfloat16),
    jax.ShapeDtypeStruct((256, 128), jnp.bfloat16),
)


def _lowered(wait_for_workers: bool) -> tuple[str, list[str]]:
  """The training step lowered for CUDA as a fresh process would: its module's text with
  the kernels' serialized modules left out, and those modules as text without their
  debug locations (the call stacks of two traces differ). With
  `wait_for_workers`, every kernel the trace handed out is finished before lowering."""
  jax.clear_caches()
  kernel_cache.forget()
  traced = jax.jit(jax.grad(_step, argnums=(0, 1, 2))).trace(*ARGS)
  if wait_for_workers:
    for future in list(kernel_cache._pending.values()):
      future.result(timeout=300)
  module = traced.lower(lowering_platforms=("cuda",)).compiler_ir("stablehlo")
  context = jax_mlir.make_ir_context()
  mosaic_dialect.register_dialect(context)
  context.load_all_available_dialects()
  context.allow_unregistered_dialects = True  # the serialized form's own dialect
  with context:
    try:
      ir.Attribute.parse("#gpu.dim<x>")
      dim_form = rb"#gpu.dim<\2>"
    except ir.MLIRError:
      dim_form = rb"#gpu<dim \2>"
  kernels = []
  for op in _custom_calls(module.body):
    config = ir.DictAttr(op.attributes["mhlo.backend_config"])
    serialized = ir.StringAttr(config["module"]).value_bytes
    # The form a GPU dimension is written in depends on what the process loaded before;
    # this jaxlib's Python side reads only one of the two (both of one length).
    serialized = re.sub(rb"#gpu(<dim |\.dim<)([xyz])>", dim_form, serialized)
    with context:
      kernel = ir.Module.parse(serialized)
      text = str(mosaic_core._run_serde_pass(kernel, serialize=False))  # no locations
    # Mosaic numbers each lowering of a kernel name in a process (`..._NN_3`).
    kernels.append(re.sub(r'(dump_basename = "[^"]*)_\d+"', r'\1"', text))
  text = re.sub(r'kernel_hash = "[^"]*", module = "[^"]*"', "kernel", str(module))
  return text, kernels


def _custom_calls(block):
  for op in block.operations:
    if op.operation.name == "stablehlo.custom_call":
      yield op.operation
    for region in op.operation.regions:
      for inner in region.blocks:
        yield from _custom_calls(inner)


def _count_in_process(monkeypatch) -> list:
  calls = []
  original = kernel_cache.lower_kernel

  def counted(*args):
    calls.append(1)
    return original(*args)

  monkeypatch.setattr(kernel_cache, "lower_kernel", counted)
  return calls


def test_workers_lower_what_this_process_would(pool, monkeypatch):
  lowering_pool.reset(0)
  alone = _lowered(wait_for_workers=False)
  assert len(alone[1]) >= 4  # forward and backward GEMMs

  lowering_pool.reset(1)
  in_process = _count_in_process(monkeypatch)
  pooled = _lowered(wait_for_workers=True)
  served = lowering_pool.shared_pool().served
  assert pooled == alone
  assert served == len(alone[1]) and not in_process


def test_queued_jobs_are_taken_back_and_lowered_here(monkeypatch):
  lowering_pool.reset(0)
  alone = _lowered(wait_for_workers=False)
  # A pool whose worker never starts: every job stays queued until its kernel is needed.
  monkeypatch.setattr(lowering_pool, "_start_worker", lambda: None)
  lowering_pool.reset(1)
  in_process = _count_in_process(monkeypatch)
  try:
    assert _lowered(wait_for_workers=False) == alone
  finally:
    lowering_pool.reset(0)
  assert len(in_process) == len(alone[1])


def test_failed_jobs_answer_none_and_the_worker_goes_on(pool):
  assert pool.submit(divmod, (1, 0)).result(timeout=60) is None  # raises in the worker
  assert pool.submit(lambda: 0, ()).result(timeout=60) is None  # not picklable
  assert pool.submit(os._exit, (3,)).result(timeout=60) is None  # the worker dies
  assert pool.submit(divmod, (9, 4)).result(timeout=120) == (2, 1)  # a new one serves


def test_the_worker_count_comes_from_the_environment(monkeypatch):
  monkeypatch.setenv(lowering_pool.ENV_WORKERS, "3")
  assert lowering_pool.default_workers() == 3
  monkeypatch.setenv(lowering_pool.ENV_WORKERS, "many")
  with pytest.raises(ValueError, match="PALLAS_GEMM_LOWERING_WORKERS='many'"):
    lowering_pool.default_workers()
  monkeypatch.delenv(lowering_pool.ENV_WORKERS)
  assert lowering_pool.default_workers() == 0  # no GPU here


def test_what_workers_lowered_is_stored_for_the_next_process(pool, tmp_path, monkeypatch):
  jax.config.update("jax_compilation_cache_dir", str(tmp_path))
  try:
    cold = _lowered(wait_for_workers=True)
    assert pool.served == len(cold[1])
    stored = sorted((tmp_path / kernel_cache.SUBDIR).glob("*.json"))
    assert len(stored) == len(cold[1])
    in_process = _count_in_process(monkeypatch)
    lowering_pool.reset(0)
    warm = _lowered(wait_for_workers=False)  # a fresh process: memory forgotten
  finally:
    jax.config.update("jax_compilation_cache_dir", None)
  assert not in_process
  assert warm == cold


@pytest.mark.parametrize(
    "implementation, started", [("pallas", True), (None, True), ("xla", False)]
)
def test_building_a_layer_starts_the_pool_before_any_trace(monkeypatch, implementation, started):
  # NOTES exp. 134: workers started at the first kernel's trace were still importing jax
  # when the first kernels were lowered; a model's layers start them when built.
  from flax import nnx

  monkeypatch.setenv(lowering_pool.ENV_WORKERS, "1")
  lowering_pool.reset(None)  # the next use decides from the environment
  try:
    pallas_gemm.flax.Linear(8, 8, implementation=implementation, rngs=nnx.Rngs(0))
    assert (lowering_pool._pool is not None) == started
    lowering_pool.reset(None)
    pallas_gemm.make_dot_general(implementation=implementation)  # the injected layers' way
    assert (lowering_pool._pool is not None) == started
  finally:
    lowering_pool.reset(0)
