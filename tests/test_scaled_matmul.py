"""`scaled_matmul` (runtime fp8 scales, kernel amax) and `pallas_gemm.flax.Fp8Linear`.

Tiers as for the dense kernel: every supported variant lowers for CUDA on the
CPU (jax.export), unsupported ones fail with our error; numerics in GPU
interpret mode vs a float64 reference at a non-tile-multiple shape, with the
interpreter's NaN poisoning of unwritten memory. jax 0.10.2's interpreter
cannot run fp8 (the kernel reads B through a transposed SMEM view), so there
the fp8 interpret tests are skipped and the same epilogue (scales + amax) is
checked on bf16 operands in the NN layout.
"""

import math

import jax
import jax.experimental.pallas.fuser  # noqa: F401 (see test_new_scale_values_reuse_the_compilation)
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_gemm import GemmConfig, GemmProblem, _compat, scaled, scaled_matmul
from pallas_gemm.gemm import epilogue_spec, kernel_gemm, gemm_problem

from interpret_support import hang_guard, needs_transposes  # noqa: F401 (hang_guard: autouse)

E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
M, N, K = 200, 136, 128  # not multiples of the 128x256 tile
BOUNDS = {"bfloat16": 8e-3, "float32": 1e-5, E4M3: 5e-2}


def _random(rng, shape, dtype):
  return jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype)


def _gelu(y):
  return 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))


def _reference(a, b, a_scale, b_scale, *, bias=None, activation=None, transpose_b=True):
  """(y, amax) in float64; y before any fp8 output scaling."""
  a64 = np.asarray(a.astype(jnp.float32), np.float64)
  b64 = np.asarray(b.astype(jnp.float32), np.float64)
  y = a64 @ (b64.T if transpose_b else b64)
  a_s, b_s = np.asarray(a_scale, np.float64), np.asarray(b_scale, np.float64)
  y = y * (a_s[:, None] if a_s.ndim else a_s) * b_s
  if bias is not None:
    y = y + np.asarray(bias, np.float64)
  if activation == "gelu_tanh":
    y = _gelu(y)
  return y, np.abs(y).max()


def _rel_err(out, ref):
  out = np.asarray(jnp.asarray(out).astype(jnp.float32), np.float64)
  assert out.shape == ref.shape
  assert not np.isnan(out).any(), f"{np.isnan(out).sum()} output elements never written"
  return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def _inputs(seed, a_scale_shape=(), b_scale_shape=(), b_dtype=E4M3):
  rng = np.random.default_rng(seed)
  a, b = _random(rng, (M, K), E4M3), _random(rng, (N, K), b_dtype)
  a_scale = jnp.asarray(rng.uniform(0.5, 2.0, a_scale_shape), jnp.float32)
  b_scale = jnp.asarray(rng.uniform(0.5, 2.0, b_scale_shape), jnp.float32)
  bias = _random(rng, (N,), jnp.float32)
  return a, b, a_scale, b_scale, bias


# -- lowering for CUDA (export) ----------------------------------------------------------
def _export(
    *,
    m=1000,
    n=1016,
    k=1024,
    a_dtype=E4M3,
    b_dtype=E4M3,
    lead=(),
    a_scale=(),
    b_scale=(),
    bias=False,
    out_scale=False,
    transpose_b=True,
    **kw,
):
  b_shape = (n, k) if transpose_b else (k, n)
  args = (
      jax.ShapeDtypeStruct((*lead, m, k), a_dtype),
      jax.ShapeDtypeStruct(b_shape, b_dtype),
      jax.ShapeDtypeStruct(a_scale, jnp.float32),
      jax.ShapeDtypeStruct(b_scale, jnp.float32),
      jax.ShapeDtypeStruct((n,), jnp.float32) if bias else None,
      jax.ShapeDtypeStruct((), jnp.float32) if out_scale else None,
  )
  fn = jax.jit(
      lambda a, b, sa, sb, bias, so: scaled_matmul(
          a,
          b,
          sa,
          sb,
          bias=bias,
          out_scale=so,
          transpose_b=transpose_b,
          implementation="pallas",
          **kw,
      )
  )
  exported = jax.export.export(fn, platforms=["cuda"])(*args)
  assert "mosaic_gpu" in exported.mlir_module()
  return exported


@pytest.mark.parametrize(
    "case",
    [
        dict(out_dtype="bfloat16"),
        dict(out_dtype="bfloat16", bias=True, activation="gelu_tanh", return_amax=True),
        dict(out_dtype=E4M3, out_scale=True, return_amax=True, a_scale=(1000,), b_scale=(1016,)),
        dict(out_dtype="float32", b_scale=(1016,), lead=(2, 3), m=100, return_amax=True),
        dict(out_dtype="bfloat16", transpose_b=False, a_scale=(1000,), bias=True),
        dict(out_dtype=E5M2, a_dtype=E5M2, b_dtype=E5M2, out_scale=True, return_amax=True),
        dict(
            out_dtype="bfloat16",
            return_amax=True,
            activation="relu",
            config=GemmConfig(schedule="pingpong", tile_m=128, tile_n=128, stages=4, tile_k=128),
        ),
        dict(
            out_dtype="bfloat16",
            return_amax=True,
            b_scale=(1016,),
            config=GemmConfig(wg_split="n", cluster=(1, 2), tile_k=128, stages=3),
        ),
        dict(
            out_dtype="bfloat16",
            m=8192,
            n=8192,
            k=8192,
            bias=True,
            activation="gelu_tanh",
            return_amax=True,
        ),
    ],
    ids=[
        "per-tensor",
        "bias-gelu-amax",
        "e4m3-out-rowcol-amax",
        "batched-f32-col-amax",
        "b-KN-row-bias",
        "e5m2",
        "pingpong-amax",
        "split-n-cluster12-col-amax",
        "8192-fused",
    ],
)
def test_lowers_for_cuda(case):
  exported = _export(**case)
  out_shape = exported.out_avals[0].shape
  assert out_shape[-1] == case.get("n", 1016)
  if case.get("return_amax"):
    assert exported.out_avals[1].shape == () and exported.out_avals[1].dtype == jnp.float32


def test_mixed_fp8_lowers_or_is_rejected():
  if _compat.SUPPORTS_MIXED_FP8:
    _export(out_dtype="bfloat16", b_dtype=E5M2, return_amax=True)
  else:
    with pytest.raises(TypeError, match="^a and b: mixed fp8"):
      _export(out_dtype="bfloat16", b_dtype=E5M2)


def test_config_that_does_not_fit_is_rejected_before_mosaic():
  # 4 stages of 128x256x128 fp8 + bf16 epilogue tiles + bias + amax buffers > 227 KiB.
  with pytest.raises(ValueError, match=r"^GemmConfig\.stages=4: needs"):
    _export(
        out_dtype="bfloat16",
        bias=True,
        return_amax=True,
        config=GemmConfig(tile_k=128, stages=4, cluster=(2, 1)),
    )


def test_cached_config_that_does_not_fit_is_not_used():
  """The tuning cache's key omits amax/scales; a cached config without room for them is dropped."""
  from pallas_gemm.gemm import usable_config

  problem = GemmProblem(
      m=8192, n=8192, k=8192, dtype=E4M3, transpose_b=True, has_bias=True, amax=True
  )
  assert usable_config(GemmConfig(tile_k=128, stages=4), problem) is None
  assert usable_config(GemmConfig(tile_k=128, stages=3), problem) == GemmConfig(
      tile_k=128, stages=3
  )
  assert usable_config(None, problem) is None


def test_scales_are_kernel_operands():
  """The scales are arguments of the exported kernel, not constants compiled into it."""
  exported = _export(out_dtype=E4M3, a_scale=(1000,), b_scale=(), out_scale=True)
  assert [a.shape for a in exported.in_avals] == [(1000, 1024), (1016, 1024), (1000,), (), ()]
  assert exported.mlir_module().count("mosaic_gpu") >= 1


# -- numerics in GPU interpret mode ------------------------------------------------------
def _f(*, implementation, **kw):
  traces = []

  def f(a, b, a_scale, b_scale, bias, out_scale):
    traces.append(1)
    return scaled_matmul(
        a, b, a_scale, b_scale, bias=bias, out_scale=out_scale, implementation=implementation, **kw
    )

  return jax.jit(f), traces


@needs_transposes
def test_new_scale_values_reuse_the_compilation():
  """Per-tensor scales, bias, gelu, amax, bf16 out; then new scale values: no retrace.

  (`jax.experimental.pallas.fuser` is imported above: jax registers a trace-context
  flag when the interpreter first imports it, which would retrace once by itself.)
  """
  a, b, a_scale, b_scale, bias = _inputs(0)
  f, traces = _f(
      implementation="interpret", out_dtype="bfloat16", activation="gelu_tanh", return_amax=True
  )
  for scale in (a_scale, a_scale * 4):
    y, amax = f(a, b, scale, b_scale, bias, None)
    ref, ref_amax = _reference(a, b, scale, b_scale, bias=bias, activation="gelu_tanh")
    assert _rel_err(y, ref) <= BOUNDS["bfloat16"]
    assert abs(float(amax) - ref_amax) <= 1e-5 * ref_amax
  assert len(traces) == 1 and f._cache_size() == 1


@needs_transposes
def test_row_col_scales_fp8_out_amax():
  """Per-row a_scale, per-column b_scale, runtime out_scale, e4m3 output, amax."""
  a, b, a_scale, b_scale, bias = _inputs(1, (M,), (N,))
  f, _ = _f(implementation="interpret", out_dtype=E4M3, return_amax=True)
  out_scale = jnp.float32(8.0)
  y, amax = f(a, b, a_scale, b_scale, bias, out_scale)
  assert y.dtype == E4M3
  ref, ref_amax = _reference(a, b, a_scale, b_scale, bias=bias)
  assert _rel_err(y, np.clip(ref * 8.0, -448, 448)) <= BOUNDS[E4M3]
  assert abs(float(amax) - ref_amax) <= 1e-5 * ref_amax


def test_scaled_epilogue_on_bf16_operands():
  """The kernel's scale vectors, scalars and amax on bf16 NN operands, which every
  jax version's interpreter runs: per-row and per-column scales, an accumulator
  scalar, bias + sigmoid, an f32 output. N=136 leaves a ragged column tile, whose
  padding columns compute sigmoid(0) = 0.5 > every real output here: the amax
  must leave them out."""
  rng = np.random.default_rng(2)
  a, b = _random(rng, (M, K), "bfloat16"), _random(rng, (K, N), "bfloat16")
  row, col = (jnp.asarray(rng.uniform(0.5, 2.0, n), jnp.float32) for n in (M, N))
  bias = _random(rng, (N,), jnp.float32) - 8.0
  problem, batch = gemm_problem(a, b, False, False, bias, None, 0.0, "float32")
  spec = epilogue_spec(problem, "sigmoid", 1.0, 0.0, None, None)
  y, amax = kernel_gemm(
      a,
      b,
      problem,
      batch,
      spec,
      bias,
      None,
      None,
      interpret=True,
      autotune=None,
      scalars=jnp.array([0.05, 1.0], jnp.float32),
      row_scale=row,
      col_scale=col,
      amax=True,
  )
  ref, _ = _reference(a, b, row * 0.05, col, bias=bias, transpose_b=False)
  ref = 1 / (1 + np.exp(-ref))
  assert ref.max() < 0.4
  assert _rel_err(y, ref) <= BOUNDS["float32"]
  assert abs(float(amax) - ref.max()) <= 1e-5 * ref.max()


# -- the XLA implementation (the same epilogue functions) ----------------------------------
@pytest.mark.parametrize(
    "a_shape,b_shape",
    [((), ()), ((M,), ()), ((), (N,)), ((1,), (M,))],
    ids=["tensor", "row", "col", "tensor1-row"],
)
def test_xla_scales(a_shape, b_shape):
  if b_shape == (M,):
    b_shape = (N,)
  a, b, a_scale, b_scale, bias = _inputs(3, a_shape, b_shape)
  y, amax = scaled_matmul(
      a, b, a_scale, b_scale, bias=bias, out_dtype="float32", return_amax=True, implementation="xla"
  )
  ref, ref_amax = _reference(
      a, b, a_scale.reshape(a_shape if a_shape != (1,) else ()), b_scale, bias=bias
  )
  assert _rel_err(y, ref) <= 1e-5
  assert abs(float(amax) - ref_amax) <= 1e-5 * ref_amax


def test_xla_batched_a_and_kn_b():
  rng = np.random.default_rng(4)
  a, b = _random(rng, (2, 3, 40, K), E4M3), _random(rng, (K, N), E4M3)
  y = scaled_matmul(
      a,
      b,
      jnp.float32(2.0),
      jnp.float32(0.5),
      out_dtype="float32",
      transpose_b=False,
      implementation="xla",
  )
  ref = np.asarray(a.astype(jnp.float32), np.float64) @ np.asarray(b.astype(jnp.float32))
  assert _rel_err(y, ref) <= 1e-5


# -- bad arguments ------------------------------------------------------------------------
_A, _B = jnp.ones((8, 32), E4M3), jnp.ones((16, 32), E4M3)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(a=jnp.ones((8, 32), jnp.bfloat16)), TypeError, "^a must be one of"),
        (dict(b=jnp.ones((2, 16, 32), E4M3)), ValueError, "^b must be 2-D"),
        (dict(a_scale=jnp.ones((3,))), ValueError, r"^a_scale must have shape .*\(M,\) = \(8,\)"),
        (dict(b_scale=jnp.ones((8,))), ValueError, r"^b_scale must have shape .*\(N,\) = \(16,\)"),
        (dict(a_scale="2"), TypeError, "^a_scale must be a real"),
        (dict(b_scale=jnp.array(True)), TypeError, "^b_scale must be a real"),
        (dict(out_scale=jnp.float32(2)), ValueError, "^out_scale applies to fp8 outputs only"),
        (dict(out_scale=jnp.ones((16,)), out_dtype=E4M3), ValueError, "^out_scale must have shape"),
        (dict(out_dtype=None), TypeError, "^out_dtype must be a dtype"),
        (dict(out_dtype=jnp.int8), TypeError, "^out_dtype must be one of"),
        (dict(bias=jnp.ones((8,))), ValueError, r"^bias must have shape \(N,\)"),
        (dict(activation="tanh"), ValueError, "^activation must be None, one of"),
        (dict(return_amax=1), TypeError, "^return_amax must be a bool"),
        (dict(implementation="cuda"), ValueError, "^implementation must be one of"),
        (dict(config={"stages": 3}), TypeError, "^config must be a GemmConfig"),
        (dict(b=jnp.ones((16, 24), E4M3)), ValueError, "^contracting dims differ"),
    ],
)
def test_bad_arguments(kwargs, error, match):
  args = dict(
      a=_A,
      b=_B,
      a_scale=jnp.float32(1),
      b_scale=jnp.float32(1),
      out_dtype="bfloat16",
      implementation="xla",
  )
  args.update(kwargs)
  with pytest.raises(error, match=match):
    scaled_matmul(args.pop("a"), args.pop("b"), args.pop("a_scale"), args.pop("b_scale"), **args)


@pytest.mark.skipif(
    _compat.INTERPRET_SUPPORTS_TRANSPOSED_OPERANDS,
    reason="only interpreters without transposed operands reject fp8",
)
def test_old_interpreter_rejects_fp8_instead_of_hanging():
  with pytest.raises(NotImplementedError, match="cannot run fp8"):
    scaled_matmul(_A, _B, 1.0, 1.0, out_dtype="bfloat16", implementation="interpret")


# -- Fp8Linear ----------------------------------------------------------------------------
def test_fp8_linear_trains_and_updates_its_scaling_state():
  pytest.importorskip("flax")
  import optax
  from flax import nnx
  from pallas_gemm.flax import Fp8Linear, Fp8Meta

  model = Fp8Linear(64, 32, activation="gelu_tanh", amax_history_len=4, rngs=nnx.Rngs(0))
  reference = nnx.Linear(64, 32, rngs=nnx.Rngs(0))
  shapes = lambda state: jax.tree.map(jnp.shape, nnx.to_pure_dict(state))
  assert shapes(nnx.state(model, nnx.Param)) == shapes(nnx.state(reference, nnx.Param))
  assert shapes(nnx.state(model, Fp8Meta)) == {
      "input_amax_history": (4,),
      "kernel_amax_history": (4,),
      "input_scale": (),
      "kernel_scale": (),
  }
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
  traces = []

  @nnx.jit
  def step(model, optimizer, x, y):
    traces.append(1)
    loss, grads = nnx.value_and_grad(
        lambda model: jnp.mean((model(x).astype(jnp.float32) - y) ** 2)
    )(model)
    optimizer.update(model, grads)
    return loss

  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.standard_normal((128, 64)), jnp.float32)
  y = jnp.tanh(x[:, :32] * 2)
  losses, scales = [], []
  for _ in range(6):
    losses.append(float(step(model, optimizer, x, y)))
    scales.append(float(model.input_scale[...]))
  x_amax = float(jnp.max(jnp.abs(x.astype(jnp.bfloat16))))
  np.testing.assert_allclose(model.input_amax_history[...], [x_amax] * 4, rtol=1e-6)
  assert scales[-1] == pytest.approx(448.0 / x_amax)
  assert scales[0] != 1.0  # the first step's update already took effect
  w_amax = float(jnp.max(jnp.abs(model.kernel[...].astype(jnp.bfloat16))))
  assert float(model.kernel_amax_history[...][0]) <= w_amax * 1.1
  assert losses[-1] < 0.9 * losses[0]
  assert len(traces) == 1  # new scale values every step, one compilation


@pytest.mark.parametrize("backward,bound", [("bf16", 2e-2), ("e5m2", 0.15)])
def test_fp8_linear_gradients_in_bf16_and_e5m2(backward, bound):
  """dx and dkernel against float64 grads of the unquantized layer: straight through the
  forward's e4m3 quantization; e5m2 (2 mantissa bits) costs ~5-10% relative error."""
  pytest.importorskip("flax")
  from flax import nnx
  from pallas_gemm.flax import Fp8Linear

  model = Fp8Linear(72, 40, backward=backward, implementation="xla", rngs=nnx.Rngs(1))
  rng = np.random.default_rng(7)
  x = jnp.asarray(rng.standard_normal((24, 72)), jnp.float32)
  g = jnp.asarray(rng.standard_normal((24, 40)), jnp.float32)
  model(x)  # one step sets the scales from the amaxes (the first call quantizes with scale 1)

  def loss(model, x):
    return jnp.sum(model(x).astype(jnp.float32) * g)

  grads, dx = nnx.grad(loss, argnums=(0, 1))(model, x)
  x64, w64, g64 = (np.asarray(v, np.float64) for v in (x, model.kernel[...], g))
  rel = lambda got, want: np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want)
  assert rel(dx, g64 @ w64.T) < bound
  assert rel(grads.kernel[...], x64.T @ g64) < bound
  assert rel(grads.bias[...], g64.sum(0)) < 1e-2
  assert rel(dx, g64 @ w64.T) > 1e-4  # it did quantize: not the exact product


def test_fp8_linear_rejects_an_unknown_backward():
  pytest.importorskip("flax")
  from flax import nnx
  from pallas_gemm.flax import Fp8Linear

  with pytest.raises(ValueError, match="backward must be one of"):
    Fp8Linear(8, 8, backward="e4m3", rngs=nnx.Rngs(0))


# -- on a Hopper GPU (skipped elsewhere) ---------------------------------------------------
def _device_checks():
  from benchmarks import scaled_matmul as bench

  return bench.checks()


@pytest.mark.gpu
@pytest.mark.parametrize("check", _device_checks(), ids=lambda c: c.name)
def test_device_matrix(check):
  from benchmarks import scaled_matmul as bench

  if check.a_dtype != check.b_dtype and not _compat.SUPPORTS_MIXED_FP8:
    pytest.skip("mixed fp8 needs jax >= 0.11")
  result = bench.run_check(check, seed=hash(check.name) % 2**31)
  assert result["ok"], result


@pytest.mark.slow
def test_example_trains_fp8_like_bf16(capsys, monkeypatch):
  pytest.importorskip("flax")
  import importlib.util  # noqa: PLC0415
  import pathlib  # noqa: PLC0415

  examples = pathlib.Path(__file__).parents[1] / "examples"
  monkeypatch.syspath_prepend(str(examples))  # train_fp8 imports train_mlp
  spec = importlib.util.spec_from_file_location("train_fp8", examples / "train_fp8.py")
  example = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(example)
  assert (
      example.main(
          [
              "--steps",
              "40",
              "--batch",
              "64",
              "--sizes",
              "32,64,16",
              "--implementation",
              "xla",
              "--log-every",
              "20",
          ]
      )
      == 0
  )
  assert (
      example.main(
          [
              "--steps",
              "40",
              "--batch",
              "64",
              "--sizes",
              "32,64,16",
              "--implementation",
              "xla",
              "--log-every",
              "20",
              "--backward",
              "e5m2",
          ]
      )
      == 0
  )
  assert "PASS" in capsys.readouterr().out
  small = ["--steps", "40", "--batch", "64", "--sizes", "32,64,16", "--implementation", "xla"]
  assert example.main([*small, "--log-every", "20", "--recipe", "blockwise"]) == 0
  assert "BlockwiseFp8Linear" in capsys.readouterr().out


@pytest.mark.parametrize("implementation", ["xla", "interpret"])
def test_amax_propagates_nan_as_xla_on_a_gpu_does(implementation):
  """A diverged step must not hide behind a finite amax (issue 20): max over |y|'s bits."""
  if implementation == "interpret" and not _compat.INTERPRET_SUPPORTS_TRANSPOSED_OPERANDS:
    pytest.skip("the GPU interpreter of this jax cannot run fp8 operands")
  k1, k2 = jax.random.split(jax.random.key(3))
  a = jax.random.normal(k1, (200, 128), jnp.float32).at[5, 7].set(jnp.nan)
  b = jax.random.normal(k2, (136, 128), jnp.float32)
  one = jnp.float32(1)
  y, amax = scaled_matmul(
      a.astype(E4M3),
      b.astype(E4M3),
      one,
      one,
      out_dtype=jnp.bfloat16,
      return_amax=True,
      implementation=implementation,
  )
  assert np.isnan(np.asarray(y, np.float32)[5]).all() and np.isnan(float(amax))
  _, finite = scaled_matmul(
      a.at[5, 7].set(0.0).astype(E4M3),
      b.astype(E4M3),
      one,
      one,
      out_dtype=jnp.bfloat16,
      return_amax=True,
      implementation=implementation,
  )
  assert np.isfinite(float(finite)) and float(finite) > 0


@pytest.mark.parametrize(
    "name, value, error, match",
    [
        ("x_scale", jnp.ones(3), ValueError, r"x_scale must have shape \(\) or \(1,\)"),
        ("kernel_scale", jnp.ones((2, 2)), ValueError, r"kernel_scale must have shape"),
        ("x_scale", jnp.array(True), TypeError, "x_scale must be a real number"),
    ],
)
def test_fp8_linear_checks_its_scales(name, value, error, match):
  x, w = jnp.ones((4, 8), jnp.bfloat16), jnp.ones((8, 16), jnp.bfloat16)
  scales = {"x_scale": 1.0, "kernel_scale": 1.0, name: value}
  with pytest.raises(error, match=match):
    scaled.fp8_linear(x, w, None, scales["x_scale"], scales["kernel_scale"], implementation="xla")


def test_fp8_linear_freezes_its_scales_in_evaluation():
  """`model.eval()` stops the delayed-scaling updates (as BatchNorm's statistics);
  `model.train()` resumes them. The default history is 1024 long (Flax, TE)."""
  pytest.importorskip("flax")
  from flax import nnx
  from pallas_gemm.flax import Fp8Linear

  model = Fp8Linear(16, 8, implementation="xla", rngs=nnx.Rngs(0))
  assert model.input_amax_history[...].shape == (1024,)
  x = jnp.ones((4, 16))
  model(x)
  state = [v[...] for v in (model.input_amax_history, model.input_scale, model.kernel_scale)]
  model.eval()
  y_eval = model(3 * x)
  after = [v[...] for v in (model.input_amax_history, model.input_scale, model.kernel_scale)]
  for before, now in zip(state, after):
    np.testing.assert_array_equal(np.asarray(before), np.asarray(now))
  assert y_eval.shape == (4, 8)
  model.train()
  model(3 * x)
  assert float(model.input_amax_history[...].max()) == 3.0
