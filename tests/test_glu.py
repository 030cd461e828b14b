"""`pallas_gemm.gated_linear_unit` and the gated GEMM under it: outputs and gradients
against jax.vjp of a float64 reference on XLA and on the kernel in GPU interpret mode,
at shapes that are not multiples of a tile; the CUDA lowering (one kernel forward, what
is saved for the backward); bad input."""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_gemm import _compat
from pallas_gemm import compile_once
from pallas_gemm import glu
from pallas_gemm.config import GemmConfig, GemmProblem
from tests.interpret_support import hang_guard, needs_transposes  # noqa: F401

F64 = {
    None: lambda z: z,
    "relu": lambda z: jnp.maximum(z, 0.0),
    "gelu_tanh": lambda z: jax.nn.gelu(z, approximate=True),
    "gelu_exact": lambda z: jax.nn.gelu(z, approximate=False),
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
}
TOLERANCE = {"bfloat16": 2e-2, "float16": 3e-3}


def _arrays(shape_x, k, n, dtype, *, biases=True, seed=0):
  rng = np.random.default_rng(zlib.crc32(repr((shape_x, k, n, dtype, seed)).encode()))
  normal = lambda shape, scale=1.0: jnp.asarray(
      (scale * rng.standard_normal(shape)).astype(np.float32)
  ).astype(dtype)
  return dict(
      x=normal((*shape_x, k)),
      w_gate=normal((k, n), k**-0.5),
      w_up=normal((k, n), k**-0.5),
      bias_gate=normal((n,), 0.5) if biases else None,
      bias_up=normal((n,), 0.5) if biases else None,
  )


def _reference(activation, x, w_gate, w_up, bias_gate, bias_up):
  gate = x @ w_gate + (0.0 if bias_gate is None else bias_gate)
  up = x @ w_up + (0.0 if bias_up is None else bias_up)
  return F64[activation](gate) * up


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


def _check(args, activation, implementation, config=None):
  names = [k for k, v in args.items() if v is not None]
  dtype = args["x"].dtype
  shape = (*args["x"].shape[:-1], args["w_gate"].shape[1])
  cot = jnp.asarray(np.random.default_rng(7).standard_normal(shape).astype(np.float32))
  cot = cot.astype(dtype)

  def ours(*vals):
    kw = dict(zip(names, vals))
    return glu.gated_linear_unit(
        activation=activation, implementation=implementation, config=config, **kw
    )

  y, vjp = jax.vjp(ours, *(args[k] for k in names))
  grads = jax.block_until_ready(vjp(cot))  # interpreter done before the reference runs
  with jax.enable_x64(True):
    f64 = [jnp.asarray(np.asarray(args[k], np.float64)) for k in names]
    ref_fn = lambda *vals: _reference(
        activation, **{**dict.fromkeys(args), **dict(zip(names, vals))}
    )
    y_ref, grads_ref = _jit_vjp(ref_fn, f64, jnp.asarray(np.asarray(cot, np.float64)))
  assert y.dtype == dtype and y.shape == shape
  assert not np.isnan(np.asarray(y, np.float32)).any()
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
  _check(_arrays((3, 7), 24, 40, jnp.dtype(dtype)), activation, "xla")


@pytest.mark.parametrize(
    "config,activation",
    [
        pytest.param(None, "silu", marks=pytest.mark.slow),  # the default, made gated-ready
        pytest.param(
            GemmConfig(tile_m=128, tile_n=128, tile_k=64, stages=2, epilogue_tile=(64, 32)),
            "silu",
            marks=pytest.mark.slow,
        ),
        (GemmConfig(tile_m=64, tile_n=256, tile_k=64, stages=4, schedule="pingpong"), "relu"),
    ],
    ids=["default", "tile_n128", "pingpong-relu"],
)
@needs_transposes  # the backward's GEMMs read transposed operands
def test_the_kernel_matches_float64_in_interpret_mode(config, activation):
  # 136 rows, K=72, N=136: no dimension a multiple of a tile, two or more tiles along each
  # (a full one and an edge one); output poisoned (NaN fill).
  _check(_arrays((136,), 72, 136, jnp.dtype(jnp.bfloat16)), activation, "interpret", config)


@pytest.mark.slow
@needs_transposes
def test_without_biases_in_interpret_mode():
  # relu runs in the pingpong case above: each activation once through the kernels.
  args = _arrays((2, 36), 64, 136, jnp.dtype(jnp.float16), biases=False)
  _check(args, "gelu_exact", "interpret")


def test_the_forward_kernel_matches_float64_in_interpret_mode():
  """The forward alone (every jax version's interpreter runs it), output poisoned."""
  args = _arrays((3, 70), 136, 200, jnp.dtype(jnp.bfloat16))
  y = glu.gated_linear_unit(activation="silu", implementation="interpret", **args)
  with jax.enable_x64(True):
    ref = _reference("silu", **{k: jnp.asarray(np.asarray(v, np.float64)) for k, v in args.items()})
  assert y.shape == (3, 70, 200) and not np.isnan(np.asarray(y, np.float32)).any()
  assert _rel(y, ref) < TOLERANCE["bfloat16"]


def test_stacked_weights_and_leading_dims():
  args = _arrays((2, 3), 16, 24, jnp.dtype(jnp.bfloat16), biases=False)
  stacked = jnp.stack([args["w_gate"], args["w_up"]], axis=1)
  a = glu.gated_linear_unit(args["x"], stacked, implementation="xla")
  b = glu.gated_linear_unit(args["x"], args["w_gate"], args["w_up"], implementation="xla")
  assert a.shape == (2, 3, 24)
  np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def _lowered(f, *shapes):
  args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in shapes]
  return jax.export.export(jax.jit(f), platforms=["cuda"])(*args).mlir_module()


def test_the_forward_is_one_kernel_and_saves_two_arrays():
  """Lowered for CUDA on the CPU: one Mosaic kernel forward (writing y alone when not
  differentiated), and the backward keeps the two pre-activations and nothing else."""
  shapes = ((512, 256), (256, 1024), (256, 1024))
  f = lambda x, wg, wu: glu.gated_linear_unit(x, wg, wu, implementation="pallas")
  text = _lowered(f, *shapes)
  calls = [line for line in text.splitlines() if "stablehlo.custom_call @mosaic_gpu" in line]
  assert len(calls) == 1 and calls[0].rsplit("->", 1)[1].count("tensor<") == 1
  assert "_glu" in text
  loss = lambda *a: f(*a).astype(jnp.float32).sum()
  text = _lowered(jax.grad(loss, argnums=(0, 1, 2)), *shapes)
  # Distinct kernels: forward (y, gate, up), dx's two GEMMs (the second adds the first),
  # and one for dw_gate and dw_up (the same problem).
  assert compile_once.module_kernel_count(text) == 4
  args = [jnp.zeros(s, jnp.bfloat16) for s in shapes]
  saved = [
      aval.shape for aval, source in _compat.saved_residuals(f, *args) if "argument" not in source
  ]
  assert saved == [(512, 1024)] * 2


@pytest.mark.parametrize(
    "config",
    [
        GemmConfig(tile_m=128, tile_n=256, cluster=(2, 1)),
        GemmConfig(tile_m=64, tile_n=256, schedule="pingpong", stages=4),
    ],
    ids=["cluster", "pingpong"],
)
def test_gated_configs_lower(config):
  f = lambda x, wg, wu: glu.gated_gemm(
      x,
      wg,
      wu,
      None,
      None,
      activation="silu",
      out_dtype="bfloat16",
      implementation="pallas",
      config=config,
      return_pre=True,
  )
  text = _lowered(f, (1000, 520), (520, 1544), (520, 1544))
  assert compile_once.module_kernel_count(text) == 1


def test_gated_config_is_ready_for_the_kernel():
  for m, n, k in ((1, 14336, 4096), (64, 256, 4096), (16384, 28672, 8192)):
    cfg = glu.gated_config(GemmProblem(m=m, n=2 * n, k=k))
    cfg.validate(GemmProblem(m=m, n=2 * n, k=k))
    assert cfg.wg_split == "m" or cfg.schedule == "pingpong"
    assert cfg.split_k == 1 and not cfg.stream_k and cfg.tile_n >= 128


def test_bad_input_names_the_argument():
  x, w = jnp.ones((4, 8), jnp.bfloat16), jnp.ones((8, 16), jnp.bfloat16)
  with pytest.raises(ValueError, match=r"w_gate must be \(K, 2, N\)"):
    glu.gated_linear_unit(x, w)
  with pytest.raises(ValueError, match="w_gate, w_up"):
    glu.gated_linear_unit(x, w, jnp.ones((8, 8)))
  with pytest.raises(ValueError, match="must equal w_gate's K=8"):
    glu.gated_linear_unit(jnp.ones((4, 9)), w, w)
  with pytest.raises(ValueError, match=r"bias_up must have shape \(N,\) = \(16,\)"):
    glu.gated_linear_unit(x, w, w, bias_up=jnp.ones(8))
  with pytest.raises(ValueError, match="activation must be None, one of"):
    glu.gated_linear_unit(x, w, w, activation="tanh")
  with pytest.raises(ValueError, match="implementation must be one of"):
    glu.gated_linear_unit(x, w, w, implementation="cuda")
  with pytest.raises(ValueError, match="wg_split must be 'm'"):
    glu.gated_gemm(
        x,
        w,
        w,
        None,
        None,
        activation="silu",
        out_dtype="bfloat16",
        implementation="pallas",
        config=GemmConfig(wg_split="n"),
    )
  with pytest.raises(ValueError, match="consumers=3: a gated GEMM runs 2 consumers"):
    glu.gated_gemm(
        jnp.ones((384, 64), jnp.bfloat16),
        jnp.ones((64, 192), jnp.bfloat16),
        jnp.ones((64, 192), jnp.bfloat16),
        None,
        None,
        activation="silu",
        out_dtype="bfloat16",
        implementation="pallas",
        config=GemmConfig(tile_m=192, tile_n=96, consumers=3, stages=3, epilogue_tile=(64, 32)),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_on_the_gpu_against_float64(activation):
  # 1000 tokens, K=520, N=1544: edge tiles in every GEMM of the forward and backward.
  _check(_arrays((4, 250), 520, 1544, jnp.dtype(jnp.bfloat16)), activation, "pallas")


# -- gated_mlp: the down projection, and the backward's slope epilogue ---------------------
def _mlp_arrays(rows, d, h, d_out, dtype, *, extras=True, seed=1):
  rng = np.random.default_rng(zlib.crc32(repr((rows, d, h, d_out, dtype, seed)).encode()))
  normal = lambda shape, scale=1.0: jnp.asarray(
      (scale * rng.standard_normal(shape)).astype(np.float32)
  ).astype(dtype)
  return dict(
      x=normal((rows, d)),
      w_gate=normal((d, h), d**-0.5),
      w_up=normal((d, h), d**-0.5),
      w_down=normal((h, d_out), h**-0.5),
      bias_gate=normal((h,), 0.5) if extras else None,
      bias_up=normal((h,), 0.5) if extras else None,
      bias_down=normal((d_out,), 0.5) if extras else None,
      residual=normal((rows, d_out)) if extras else None,
  )


def _check_mlp(args, activation, implementation, fuse_backward=False):
  names = [k for k, v in args.items() if v is not None]
  shape = (args["x"].shape[0], args["w_down"].shape[1])
  cot = jnp.asarray(np.random.default_rng(5).standard_normal(shape).astype(np.float32))
  cot = cot.astype(args["x"].dtype)

  def ours(*vals):
    return glu.gated_mlp(
        activation=activation,
        implementation=implementation,
        fuse_backward=fuse_backward,
        **dict(zip(names, vals)),
    )

  def reference(x, w_gate, w_up, w_down, bias_gate, bias_up, bias_down, residual):
    hidden = _reference(activation, x, w_gate, w_up, bias_gate, bias_up)
    y = hidden @ w_down + (0.0 if bias_down is None else bias_down)
    return y + (0.0 if residual is None else residual)

  y, vjp = jax.vjp(ours, *(args[k] for k in names))
  grads = jax.block_until_ready(vjp(cot))  # interpreter done before the reference runs
  with jax.enable_x64(True):
    f64 = [jnp.asarray(np.asarray(args[k], np.float64)) for k in names]
    ref_fn = lambda *vals: reference(**{**dict.fromkeys(args), **dict(zip(names, vals))})
    y_ref, grads_ref = _jit_vjp(ref_fn, f64, jnp.asarray(np.asarray(cot, np.float64)))
  assert y.shape == shape and _rel(y, y_ref) < TOLERANCE[y.dtype.name], "output"
  for name, got, want in zip(names, grads, grads_ref):
    assert got.dtype == args[name].dtype and got.shape == args[name].shape, name
    assert _rel(got, want) < TOLERANCE[y.dtype.name], name


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", None])
def test_gated_mlp_matches_float64_on_xla(activation):
  _check_mlp(_mlp_arrays(21, 24, 40, 16, jnp.dtype(jnp.bfloat16)), activation, "xla")


@pytest.mark.slow  # the kernels' arithmetic: CI's jax 0.11.2 leg (the GPU machine's)
@needs_transposes
@pytest.mark.parametrize("extras,fuse_backward", [(True, True), (False, False)])
def test_gated_mlp_kernels_match_float64_in_interpret_mode(extras, fuse_backward):
  # 136 rows, 72 -> 72 -> 80: no dimension a multiple of a tile.
  args = _mlp_arrays(136, 72, 72, 80, jnp.dtype(jnp.bfloat16), extras=extras)
  _check_mlp(args, "silu" if extras else "gelu_exact", "interpret", fuse_backward)


def test_the_fused_backward_writes_no_hidden_cotangent():
  """Lowered for CUDA: the hidden cotangent's GEMM writes the gate and up cotangents
  itself (the `_dglu` kernel); no other kernel or XLA pass reads the saved pre-activations."""
  shapes = ((512, 256), (256, 1024), (256, 1024), (1024, 256))
  f = lambda x, wg, wu, wd: glu.gated_mlp(
      x, wg, wu, wd, implementation="pallas", fuse_backward=True
  )
  loss = lambda *a: f(*a).astype(jnp.float32).sum()
  text = _lowered(jax.grad(loss, argnums=(0, 1, 2, 3)), *shapes)
  calls = [line for line in text.splitlines() if "stablehlo.custom_call @mosaic_gpu" in line]
  dglu = [line for line in calls if "512x1024xbf16>, tensor<512x1024xbf16>) ->" in line]
  assert "_dglu_silu" in text and len(dglu) == 1
  # (d_gate, d_up): two results of the hidden cotangent's shape
  assert dglu[0].rsplit("->", 1)[1].count("tensor<512x1024xbf16>") == 2
  assert "logistic" not in text and "exponential" not in text  # no XLA elementwise slope


def test_gated_mlp_bad_input_names_the_argument():
  x, w = jnp.ones((4, 8), jnp.bfloat16), jnp.ones((8, 16), jnp.bfloat16)
  with pytest.raises(ValueError, match="shapes do not chain"):
    glu.gated_mlp(x, w, w, jnp.ones((15, 8), jnp.bfloat16))
  with pytest.raises(ValueError, match=r"bias_down must have shape \(N,\) = \(8,\)"):
    glu.gated_mlp(x, w, w, w.T, bias_down=jnp.ones(16))
  with pytest.raises(ValueError, match=r"residual must have shape \(4, 8\)"):
    glu.gated_mlp(x, w, w, w.T, residual=jnp.ones((4, 16)))


def test_the_default_backward_makes_the_hidden_cotangent_with_a_plain_gemm():
  shapes = ((512, 256), (256, 1024), (256, 1024), (1024, 256))
  f = lambda x, wg, wu, wd: glu.gated_mlp(x, wg, wu, wd, implementation="pallas")
  loss = lambda *a: f(*a).astype(jnp.float32).sum()
  text = _lowered(jax.grad(loss, argnums=(0, 1, 2, 3)), *shapes)
  assert "_dglu" not in text and "exponential" in text  # the slope: XLA's elementwise pass
  with pytest.raises(TypeError, match="fuse_backward must be a bool"):
    glu.gated_mlp(*(jnp.ones(s, jnp.bfloat16) for s in shapes), fuse_backward="yes")


@pytest.mark.gpu
@pytest.mark.parametrize("fuse_backward", [False, True])
def test_gated_mlp_on_the_gpu_against_float64(fuse_backward):
  args = _mlp_arrays(1000, 520, 1544, 776, jnp.dtype(jnp.bfloat16))
  _check_mlp(args, "silu", "pallas", fuse_backward)


@pytest.mark.slow
@pytest.mark.parametrize("block", ["glu", "mlp"])
def test_the_benchmark_runs_on_the_cpu(block, capsys):
  from benchmarks import glu as harness

  assert harness.main(["--cpu-smoke", "--block", block, "--rounds", "1", "--iterations", "1"]) == 0
  table = capsys.readouterr().out.splitlines()
  assert table[-2].startswith(f"| {block} 64x96x32 fwd |") and "fwd+bwd" in table[-1]


@pytest.mark.skipif(
    _compat.INTERPRET_SUPPORTS_TRANSPOSED_OPERANDS, reason="this jax's interpreter runs them"
)
def test_old_interpreters_refuse_the_backward_instead_of_hanging():
  args = _mlp_arrays(16, 8, 16, 8, jnp.dtype(jnp.bfloat16), extras=False)
  loss = lambda x: glu.gated_mlp(x, *list(args.values())[1:4], implementation="interpret").sum()
  with pytest.raises(NotImplementedError, match="cannot run transposed operands"):
    jax.grad(loss)(args["x"])
