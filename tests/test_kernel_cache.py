"""Lowered kernels on disk (`pallas_gemm.kernel_cache`), on the CPU through
`jax.export(..., platforms=["cuda"])`: a second lowering of the same program with jax's
persistent cache on emits the stored custom calls without lowering a kernel, and the
module is the same."""

import json
import re

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core
import pytest

import pallas_gemm
from pallas_gemm import kernel_cache


@pytest.fixture
def cache_dir(tmp_path):
  previous = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", str(tmp_path))
  jax.clear_caches()
  yield tmp_path
  jax.config.update("jax_compilation_cache_dir", previous)
  jax.clear_caches()


def _loss(a, b, w):
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


def _module():
  """The training step's module for CUDA, without source locations, lowered as a fresh
  process would (what this one lowered before is forgotten)."""
  jax.clear_caches()
  kernel_cache.forget()
  text = jax.export.export(jax.jit(jax.grad(_loss, argnums=(0, 1, 2))), platforms=["cuda"])(
      *ARGS
  ).mlir_module()
  return _without_locations(text)


def _without_locations(text):
  text = re.sub(r"loc\([^)]*\)", "", text)
  return "\n".join(
      line for line in text.splitlines() if line.strip() and not line.startswith("#loc")
  )


def _no_lowering(*_):
  raise AssertionError("a stored kernel was lowered again")


def _stored(directory):
  return sorted((directory / kernel_cache.SUBDIR).glob("*.json"))


def test_a_stored_lowering_is_emitted_without_lowering_the_kernel(cache_dir, monkeypatch):
  first = _module()
  stored = _stored(cache_dir)
  assert len(stored) == first.count("stablehlo.custom_call @mosaic_gpu") >= 4

  monkeypatch.setattr(kernel_cache, "lower_kernel", _no_lowering)
  assert _module() == first


def _tail_split_loss(a, b):
  config = pallas_gemm.GemmConfig(stream_k=True, split_tail=True)
  y = pallas_gemm.matmul(a, b, config=config, implementation="pallas")
  return y.astype(jnp.float32).sum()


def _no_trace(*_):
  raise AssertionError("a stored kernel's body was traced again")


def test_a_warm_start_neither_traces_nor_lowers_a_stored_kernel(cache_dir, monkeypatch):
  first = _module()
  assert all("out_avals" in json.loads(path.read_text()) for path in _stored(cache_dir))

  monkeypatch.setattr(kernel_cache, "lower_kernel", _no_lowering)
  monkeypatch.setattr(kernel_cache, "_flat_fn", _no_trace)
  assert _module() == first


def test_a_deferred_kernel_traces_its_body_when_asked(cache_dir):
  _module()
  kernel_cache.forget()  # a fresh process: the store on disk is all it has
  jax.clear_caches()
  jaxpr = jax.make_jaxpr(jax.grad(_loss, argnums=(0, 1, 2)))(*ARGS)
  params = [
      eqn.params["jaxpr"]
      for inner in _sub_jaxprs(jaxpr.jaxpr)
      for eqn in inner.eqns
      if eqn.primitive is kernel_cache.kernel_p
  ]
  deferred = [p for p in params if isinstance(p, kernel_cache.Deferred)]
  assert len({d.key for d in deferred}) == len(_stored(cache_dir))  # every stored kernel
  for d in deferred:
    assert d.closed.out_avals == d.out_avals  # traced now, and it agrees with the store


def _sub_jaxprs(jaxpr):
  yield jaxpr
  for eqn in jaxpr.eqns:
    for sub in jex_core.jaxprs_in_params(eqn.params):
      yield from _sub_jaxprs(sub)


def test_a_stream_k_kernel_is_stored_with_its_zeroed_semaphores(cache_dir, monkeypatch):
  # Its custom call takes a constant (the zeroed semaphores) and returns its f32 workspace
  # and semaphores beside the output: stored too (stop 48: 4 of a GPT step's 15 kernels,
  # lowered again in every process before).
  args = (
      jax.ShapeDtypeStruct((2304, 1600), jnp.bfloat16),
      jax.ShapeDtypeStruct((1600, 2112), jnp.bfloat16),
  )

  def module():
    jax.clear_caches()
    kernel_cache.forget()
    text = jax.export.export(jax.jit(_tail_split_loss), platforms=["cuda"])(*args).mlir_module()
    return _without_locations(text)

  first = module()
  assert len(_stored(cache_dir)) == 1
  monkeypatch.setattr(kernel_cache, "lower_kernel", _no_lowering)
  assert module() == first


def test_an_unreadable_entry_is_lowered_again_and_replaced(cache_dir, monkeypatch):
  first = _module()
  broken = _stored(cache_dir)[0]
  broken.write_text("{not json")
  second = _module()  # the kernel lowered again (its module's debug locations may differ)
  assert second.count("@mosaic_gpu") == first.count("@mosaic_gpu")
  assert broken.read_text().startswith('{"results"')
  monkeypatch.setattr(kernel_cache, "lower_kernel", _no_lowering)
  assert _module() == second


def test_nothing_is_stored_without_jax_s_persistent_cache(tmp_path):
  assert jax.config.jax_compilation_cache_dir is None
  _module()
  assert kernel_cache.store_dir() is None


def test_keys_change_with_any_static_argument_and_refuse_unstable_reprs():
  avals = [jax.typeof(jnp.ones((2, 2)))]
  tree = jax.tree.structure(((1,), {}))
  key = lambda **static: kernel_cache.entry_key(_loss, static, tree, avals)
  assert key(k=1) == key(k=1) != key(k=2)
  assert key(f=lambda: 0) is None
  assert key(f=_loss) is not None and key(f=_loss) != key(f=_module)  # named functions


def test_a_kernel_lowered_for_one_program_is_not_lowered_for_the_next(monkeypatch):
  jax.clear_caches()
  kernel_cache.forget()
  jax.export.export(jax.jit(_loss), platforms=["cuda"])(*ARGS)
  jax.clear_caches()  # a new program: traced and lowered again, its kernels not
  monkeypatch.setattr(kernel_cache, "lower_kernel", _no_lowering)
  text = jax.export.export(jax.jit(_loss), platforms=["cuda"])(*ARGS).mlir_module()
  assert text.count("stablehlo.custom_call @mosaic_gpu") == 2


def _double(x, *, k):
  return x * k


def test_a_pooled_lowering_is_stored_and_compiled_ahead_when_it_arrives(monkeypatch):
  # On the GPU the one-kernel program leaves the Mosaic kernel compiled for the model's
  # own compile (Mosaic caches kernels by hash per process); here it is the CPU's program.
  import concurrent.futures

  from pallas_gemm import compile_ahead

  kernel_cache.forget()
  monkeypatch.setattr(compile_ahead, "enabled", lambda: True)
  submitted = {}
  real_submit = compile_ahead.submit
  monkeypatch.setattr(
      compile_ahead,
      "submit",
      lambda key, program: submitted.setdefault(key, real_submit(key, program)),
  )
  x = jnp.ones((4,), jnp.float32)
  closed = jax.make_jaxpr(lambda x: _double(x, k=3.0))(x)
  future = concurrent.futures.Future()
  kernel_cache._pending["k1"] = future
  future.add_done_callback(
      lambda f: kernel_cache._lowered_by_pool("k1", closed, [jax.typeof(x)], f)
  )
  stored = {"results": ["tensor<4xf32>"], "attributes": {}}
  future.set_result(stored)
  assert kernel_cache._lowered["k1"] == stored
  assert submitted["k1"].result(timeout=60) is True  # the program compiled
  assert real_submit("k1", lambda: None) is None  # once per kernel
  cancelled = concurrent.futures.Future()
  cancelled.cancel()
  kernel_cache._lowered_by_pool("k2", closed, [jax.typeof(x)], cancelled)
  assert "k2" not in kernel_cache._lowered and "k2" not in submitted
  kernel_cache.forget()


def test_compile_ahead_is_off_without_a_gpu_and_drops_failures(monkeypatch):
  from pallas_gemm import compile_ahead

  compile_ahead.forget()
  assert compile_ahead.submit("off", lambda: None) is None  # the CPU backend
  monkeypatch.setattr(compile_ahead, "enabled", lambda: True)
  failing = compile_ahead.submit("fails", lambda: 1 / 0)
  assert failing.result(timeout=60) is False
  compile_ahead.forget()


@pytest.mark.parametrize("G", [pytest.param(4, marks=pytest.mark.slow), 40])
def test_grouped_kernels_are_lowered_once_for_every_program(monkeypatch, G):
  """The grouped kernels' entries lower to exactly their custom calls (their arguments in
  the kernel's order; past the unrolled limits, 40 groups, the work lists `item_table`
  and `group_bounds` made outside the entries), so a later program reuses them."""

  def loss(x, w, sizes):
    y = pallas_gemm.ragged_dot(x, w, sizes, implementation="pallas")
    return jnp.square(y.astype(jnp.float32)).sum()  # the backward needs y: three kernels

  args = (
      jax.ShapeDtypeStruct((4096, 512), jnp.bfloat16),
      jax.ShapeDtypeStruct((G, 512, 256), jnp.bfloat16),
      jax.ShapeDtypeStruct((G,), jnp.int32),
  )
  step = lambda: jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1))), platforms=["cuda"])(
      *args
  )
  kernels = lambda: step().mlir_module().count("stablehlo.custom_call @mosaic_gpu")
  jax.clear_caches()
  kernel_cache.forget()
  assert kernels() == 3  # forward, dlhs, drhs
  jax.clear_caches()
  monkeypatch.setattr(kernel_cache, "lower_kernel", _no_lowering)
  assert kernels() == 3


@pytest.mark.parametrize("bits,m", [(4, 16), (8, 512)])
def test_weight_only_kernels_are_lowered_once_for_every_program(monkeypatch, bits, m):
  """The weight-only launcher passes x again where an operand is absent: the store keeps
  the call's operands as indices into the entry's arguments."""
  w = jax.random.normal(jax.random.key(0), (1024, 512), jnp.float32).astype(jnp.bfloat16)
  qw = pallas_gemm.quantize_weights(w, bits=bits)
  fn = jax.jit(lambda x: pallas_gemm.quantized_matmul(x, qw, implementation="pallas"))
  x = jax.ShapeDtypeStruct((m, 1024), jnp.bfloat16)
  kernels = (
      lambda: jax.export.export(fn, platforms=["cuda"])(x)
      .mlir_module()
      .count("stablehlo.custom_call @mosaic_gpu")
  )
  jax.clear_caches()
  kernel_cache.forget()
  assert kernels() == 1
  jax.clear_caches()
  monkeypatch.setattr(kernel_cache, "lower_kernel", _no_lowering)
  assert kernels() == 1
