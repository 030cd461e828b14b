"""Identical kernels are lowered once per program (issue 15), checked on the CPU
through `jax.export(..., platforms=["cuda"])`: the Mosaic custom calls in the
exported module are counted, and N identical call sites must give as many as one."""

import jax
import jax.numpy as jnp
import pytest

import pallas_gemm
from pallas_gemm import compile_once
from pallas_gemm import kernel_cache

bf16 = jnp.bfloat16


def _sds(shape, dtype=bf16):
  return jax.ShapeDtypeStruct(shape, dtype)


def _exported_kernels(fn, *args):
  """(Mosaic kernels in the module, Pallas lowerings it took) of `fn` exported for CUDA,
  in a process that has lowered nothing yet (`kernel_cache.forget`)."""
  kernel_cache.forget()
  real, lowerings = kernel_cache.lower_kernel, []

  def counted(*lower_args):
    lowerings.append(1)
    return real(*lower_args)

  kernel_cache.lower_kernel = counted
  try:
    text = jax.export.export(jax.jit(fn), platforms=["cuda"])(*args).mlir_module()
  finally:
    kernel_cache.lower_kernel = real
  return compile_once.module_kernel_count(text), len(lowerings)


def _chain(gemm, sites):
  """x -> gemm(x, w) repeated over `sites` weights of one shape."""

  def f(x, *ws):
    for w in ws[:sites]:
      x = gemm(x, w)
    return x.astype(jnp.float32).sum()

  return f


GEMMS = {
    "matmul": lambda x, w: pallas_gemm.matmul(x, w, implementation="pallas"),
    "matmul bias+gelu": lambda x, w: pallas_gemm.matmul(
        x,
        w,
        bias=jnp.ones((w.shape[1],), jnp.float32),
        activation="gelu_tanh",
        implementation="pallas",
    ),
    "dot_general": lambda x, w: pallas_gemm.make_dot_general(implementation="pallas")(
        x, w, (((1,), (0,)), ((), ()))
    ),
    "residual": lambda x, w: pallas_gemm.matmul(x, w, residual=x, implementation="pallas"),
}


@pytest.mark.parametrize("name", sorted(GEMMS))
def test_identical_call_sites_lower_one_kernel(name):
  gemm = GEMMS[name]
  args = [_sds((512, 512))] * 9
  one, _ = _exported_kernels(_chain(gemm, 1), *args)
  eight, lowerings = _exported_kernels(_chain(gemm, 8), *args)
  assert one >= 1
  assert eight == one, f"8 identical call sites gave {eight} kernels, one gave {one}"
  # Each site was lowered again before issue 15 (8 sites cost ~7x one site's export);
  # now each distinct kernel is lowered once (or by the lowering pool: not here).
  assert lowerings <= one, f"8 identical call sites took {lowerings} lowerings"


@pytest.mark.parametrize("name", ["matmul", "matmul bias+gelu"])
def test_backward_kernels_do_not_grow_with_call_sites(name):
  gemm = GEMMS[name]
  args = [_sds((512, 512))] * 5
  grad = lambda sites: jax.grad(_chain(gemm, sites), argnums=tuple(range(5)))
  # With one site the loss ignores the forward's value: only dA and dB remain.
  two, _ = _exported_kernels(grad(2), *args)
  four, _ = _exported_kernels(grad(4), *args)
  assert two >= 3  # forward, dA, dB (and dPre with a bias and activation)
  assert four == two


def test_distinct_problems_get_distinct_kernels():
  f = lambda x, w1, w2: (
      pallas_gemm.matmul(x, w1, implementation="pallas").sum()
      + pallas_gemm.matmul(x, w2, implementation="pallas").sum()
  )
  kernels, _ = _exported_kernels(f, _sds((256, 512)), _sds((512, 256)), _sds((512, 384)))
  assert kernels == 2


def test_ragged_dot_and_scaled_matmul_lower_once():
  sizes = jnp.array([100, 156], jnp.int32)

  def ragged(x, w):
    for _ in range(4):
      x = pallas_gemm.ragged_dot(x, w, sizes, implementation="pallas")
    return x

  one, _ = _exported_kernels(
      lambda x, w: pallas_gemm.ragged_dot(x, w, sizes, implementation="pallas"),
      _sds((256, 256)),
      _sds((2, 256, 256)),
  )
  four, _ = _exported_kernels(ragged, _sds((256, 256)), _sds((2, 256, 256)))
  assert one == four == 1

  e4m3 = jnp.float8_e4m3fn
  scale = jnp.ones((), jnp.float32)
  scaled = lambda a, b: pallas_gemm.scaled_matmul(
      a, b, scale, scale, out_dtype=bf16, implementation="pallas"
  )
  args = (_sds((256, 256), e4m3), _sds((256, 256), e4m3))
  one, _ = _exported_kernels(scaled, *args)
  three, _ = _exported_kernels(lambda a, b: scaled(a, b) + scaled(a, b) + scaled(a, b), *args)
  assert one == three == 1


@pytest.mark.parametrize("packing", ["fragments", "k_blocks"])
def test_quantized_matmul_lowers_once(packing):
  """Weight-only decode: four projections of one shape are one kernel, lowered once."""
  qw = pallas_gemm.quantize_weights(
      jax.random.normal(jax.random.key(0), (256, 256)), bits=4, fragments=packing == "fragments"
  )

  def layers(x, sites):
    for _ in range(sites):
      x = pallas_gemm.quantized_matmul(x, qw, implementation="pallas")
    return x

  one = _exported_kernels(lambda x: layers(x, 1), _sds((16, 256)))
  four = _exported_kernels(lambda x: layers(x, 4), _sds((16, 256)))
  assert one == four == (1, 1)


def test_layers_of_a_model_share_kernels():
  """A Flax decoder's distinct kernels do not grow with its depth (fused layers, training step)."""
  pytest.importorskip("flax")
  from benchmarks import model as harness, models

  def kernels(layers):
    spec = models.ModelSpec(
        layers=layers, d_model=256, heads=2, kv_heads=2, mlp=512, vocab=512, batch=1, seq=128
    )
    graphdef, params, rest = harness.build(spec, "fused", implementation="pallas")
    step, tx = harness.make_train_step(graphdef)
    shapes = lambda tree: jax.tree.map(lambda x: _sds(x.shape, x.dtype), tree)
    tokens = _sds((spec.batch, spec.seq), jnp.int32)
    text = jax.export.export(step, platforms=["cuda"])(
        shapes(params), shapes(tx.init(params)), shapes(rest), tokens, tokens
    ).mlir_module()
    return compile_once.module_kernel_count(text)

  assert kernels(1) == kernels(2) > 5  # a second layer adds call sites, not kernels
