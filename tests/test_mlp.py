"""`pallas_gemm.mlp` and the GEMM epilogue it relies on (`residual_slope`): outputs and
gradients against jax.grad of a float64 reference, on XLA and on the kernel in GPU
interpret mode, at shapes that are not multiples of a tile; the lowering for CUDA (one
fewer kernel than two differentiated `matmul`s: no separate dPre pass); bad input."""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_gemm
from pallas_gemm import _compat
from pallas_gemm import compile_once
from pallas_gemm import epilogue
from pallas_gemm.gemm import gemm
from pallas_gemm.perceptron import mlp
from tests.interpret_support import hang_guard, needs_transposes  # noqa: F401

F64 = {
    "relu": lambda z: jnp.maximum(z, 0.0),
    "gelu_tanh": lambda z: jax.nn.gelu(z, approximate=True),
    "gelu_exact": lambda z: jax.nn.gelu(z, approximate=False),
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
}
TOLERANCE = {"bfloat16": 2e-2, "float16": 3e-3}


def _arrays(shape_x, d, h, d_out, dtype, *, biases=True, residual=True, seed=0):
  rng = np.random.default_rng(zlib.crc32(repr((shape_x, d, h, d_out, dtype, seed)).encode()))
  normal = lambda shape, scale=1.0: jnp.asarray(
      (scale * rng.standard_normal(shape)).astype(np.float32)
  ).astype(dtype)
  return dict(
      x=normal((*shape_x, d)),
      w_in=normal((d, h), d**-0.5),
      w_out=normal((h, d_out), h**-0.5),
      b_in=normal((h,), 0.5) if biases else None,
      b_out=normal((d_out,), 0.5) if biases else None,
      residual=normal((*shape_x, d_out)) if residual else None,
  )


def _reference(activation, x, w_in, w_out, b_in, b_out, residual):
  hidden = x @ w_in + (0.0 if b_in is None else b_in)
  y = F64[activation](hidden) @ w_out + (0.0 if b_out is None else b_out)
  return y + (0.0 if residual is None else residual)


def _jit_vjp(fn, primals, cotangent):
  """`fn`'s value and vjp at `primals`, compiled as one program (the float64 reference:
  one compile per test instead of one per primitive)."""

  def value_and_vjp(primals, cotangent):
    y, vjp = jax.vjp(fn, *primals)
    return y, vjp(cotangent)

  return jax.jit(value_and_vjp)(primals, cotangent)


def _rel(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30)


def _check(args, activation, implementation, dtype):
  names = [k for k, v in args.items() if v is not None]
  rng = np.random.default_rng(7)
  shape = (*args["x"].shape[:-1], args["w_out"].shape[1])
  cot = jnp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)

  def ours(*vals):
    kw = dict(zip(names, vals))
    return mlp(activation=activation, implementation=implementation, **kw)

  y, vjp = jax.vjp(ours, *(args[k] for k in names))
  grads = jax.block_until_ready(vjp(cot))  # interpreter done before the reference runs
  with jax.enable_x64(True):
    f64 = [jnp.asarray(np.asarray(args[k], np.float64)) for k in names]
    ref_fn = lambda *vals: _reference(
        activation, **{**dict.fromkeys(args), **dict(zip(names, vals))}
    )
    y_ref, grads_ref = _jit_vjp(ref_fn, f64, jnp.asarray(np.asarray(cot, np.float64)))
  assert y.dtype == args["x"].dtype and y.shape == shape
  assert _rel(y, y_ref) < TOLERANCE[dtype.name], "output"
  for name, got, want in zip(names, grads, grads_ref):
    assert got.dtype == args[name].dtype and got.shape == args[name].shape, name
    assert _rel(got, want) < TOLERANCE[dtype.name], name


# Each activation once, the dtypes taking turns: the XLA path computes the epilogue and its
# derivative in f32 whatever the operands' dtype, so the activation x dtype product repeats
# itself; both dtypes' tolerances are still checked.
XLA_CASES = [
    pytest.param(activation, dtype, id=f"{dtype_id}-{activation}")
    for activation, (dtype, dtype_id) in zip(
        ["gelu_exact", "gelu_tanh", "relu", "sigmoid", "silu"],
        [(jnp.bfloat16, "bf16"), (jnp.float16, "f16")] * 3,
    )
]


@pytest.mark.parametrize("activation,dtype", XLA_CASES)
def test_outputs_and_gradients_match_float64_on_xla(activation, dtype):
  _check(_arrays((3, 7), 24, 40, 16, jnp.dtype(dtype)), activation, "xla", jnp.dtype(dtype))


@pytest.mark.parametrize("biases,residual", [(True, True), (False, False)])
def test_without_biases_or_residual(biases, residual):
  args = _arrays((9,), 16, 24, 8, jnp.dtype(jnp.bfloat16), biases=biases, residual=residual)
  _check(args, "silu", "xla", jnp.dtype(jnp.bfloat16))


@pytest.mark.slow  # the kernels' arithmetic: CI's jax 0.11.2 leg (the GPU machine's)
@needs_transposes
@pytest.mark.parametrize("activation", ["gelu_tanh", "relu"])
def test_the_kernels_match_float64_in_interpret_mode(activation):
  # 136 rows, 72 -> 72 -> 80: no dimension a multiple of a tile.
  args = _arrays((136,), 72, 72, 80, jnp.dtype(jnp.bfloat16))
  _check(args, activation, "interpret", jnp.dtype(jnp.bfloat16))


@needs_transposes
def test_the_slope_epilogue_matches_float64_in_interpret_mode():
  rng = np.random.default_rng(3)
  g, w, pre = (
      jnp.asarray(rng.standard_normal(s).astype(np.float32)).astype(jnp.bfloat16)
      for s in ((130, 72), (100, 72), (130, 100))
  )
  out = jnp.full((130, 100), jnp.nan, jnp.bfloat16)  # poisoned: every element must be written
  out = gemm(
      g, w, transpose_b=True, residual=pre, residual_slope="gelu_tanh", implementation="interpret"
  )
  with jax.enable_x64(True):
    f = lambda z: jax.nn.gelu(z, approximate=True)
    p64 = jnp.asarray(np.asarray(pre, np.float64))
    ref = (np.asarray(g, np.float64) @ np.asarray(w, np.float64).T) * np.asarray(
        jax.vmap(jax.vmap(jax.grad(f)))(p64)
    )
  assert not np.isnan(np.asarray(out, np.float64)).any()
  assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("bias", [True, False])
def test_the_backward_fuses_the_activation_derivative_into_a_gemm(bias):
  """On the CPU, lowered for CUDA: the hidden cotangent's GEMM carries the activation's
  derivative, and dH is never written; every GEMM is the Pallas kernel. Two `matmul`s
  write dH and read it back in a dPre pass (the Pallas dPre kernel, which also sums the
  bias gradient; an XLA pass without a bias); with a bias `mlp` sums dPre by a GEMV."""
  args = (
      jax.ShapeDtypeStruct((512, 256), jnp.bfloat16),
      jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16),
      jax.ShapeDtypeStruct((1024, 256), jnp.bfloat16),
      jax.ShapeDtypeStruct((1024,), jnp.bfloat16) if bias else None,
  )

  def fused(x, w1, w2, b1):
    return mlp(x, w1, w2, b_in=b1, activation="gelu", implementation="pallas")

  def two_matmuls(x, w1, w2, b1):
    h = pallas_gemm.matmul(x, w1, bias=b1, activation="gelu", implementation="pallas")
    return pallas_gemm.matmul(h, w2, implementation="pallas")

  def kernels(f):
    loss = lambda *a: f(*a).astype(jnp.float32).sum()
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3) if bias else (0, 1, 2)))
    text = jax.export.export(step, platforms=["cuda"])(*args).mlir_module()
    return compile_once.module_kernel_count(text), "_dgelu_tanh" in text, "dpre" in text

  # Forward 2; backward dPre (or dH and the dPre pass), dx, dw_in, dw_out (+ db_in).
  assert kernels(fused) == (7 if bias else 6, True, False)
  assert kernels(two_matmuls) == ((7, False, True) if bias else (6, False, False))


def test_bad_input_names_the_argument():
  x, w1, w2 = jnp.ones((4, 8)), jnp.ones((8, 16)), jnp.ones((16, 8))
  with pytest.raises(ValueError, match="activation must not be None"):
    mlp(x, w1, w2, activation=None)
  with pytest.raises(ValueError, match="shapes do not chain"):
    mlp(x, w1, jnp.ones((15, 8)))
  with pytest.raises(ValueError, match=r"b_in must have shape \(N,\) = \(16,\)"):
    mlp(x, w1, w2, b_in=jnp.ones((8,)))
  with pytest.raises(ValueError, match="activation must be None, one of"):
    mlp(x, w1, w2, activation="tanh")
  with pytest.raises(ValueError, match="residual_slope needs residual"):
    gemm(x, w1, residual_slope="relu", implementation="xla")
  with pytest.raises(ValueError, match="residual_slope must be None, one of"):
    gemm(x, w1, residual=jnp.ones((4, 16)), residual_slope="tanh", implementation="xla")
  assert epilogue.EpilogueSpec(residual_slope="silu").residual_slope == "silu"
  assert _compat.JAX_VERSION  # the version module imports (used by the skips above)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["gelu_tanh", "silu"])
def test_on_the_gpu_against_float64(activation):
  # 1000 tokens, 520 -> 1544 -> 776: edge tiles in every GEMM of the forward and backward.
  args = _arrays((4, 250), 520, 1544, 776, jnp.dtype(jnp.bfloat16))
  _check(args, activation, "pallas", jnp.dtype(jnp.bfloat16))


def test_inference_writes_no_pre():
  """Not differentiated, the first GEMM writes its output alone (no `pre` beside it)."""
  args = (
      jax.ShapeDtypeStruct((512, 256), jnp.bfloat16),
      jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16),
      jax.ShapeDtypeStruct((1024, 256), jnp.bfloat16),
  )
  f = lambda x, w1, w2: mlp(x, w1, w2, activation="gelu", implementation="pallas")
  text = jax.export.export(jax.jit(f), platforms=["cuda"])(*args).mlir_module()
  calls = [line for line in text.splitlines() if "stablehlo.custom_call @mosaic_gpu" in line]
  assert len(calls) == 2
  up = next(line for line in calls if "tensor<256x1024xbf16>" in line)
  assert up.rsplit("->", 1)[1].count("tensor<") == 1  # y only
