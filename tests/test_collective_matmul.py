"""all_gather_matmul and matmul_reduce_scatter on 2 and 4 fake CPU devices (XLA path).

Values and gradients against float64 on the host, at extents that are not multiples
of a tile; the sharding of results and gradients; the kernel path lowered for CUDA
(not run: jax's GPU interpreter is not safe with several devices executing at once).
"""

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_gemm import collective_matmul as cm
from pallas_gemm.batching import GemmCall
from pallas_gemm.config import GemmConfig
from tests import fake_devices

DEVICES = 4
needs_devices = fake_devices.needs(DEVICES)
LAYOUTS = {  # x, w, bias specs over the ring axis "tp"
    "all_gather_matmul": (P("tp", None), P(None, "tp"), P("tp")),
    "matmul_reduce_scatter": (P(None, "tp"), P("tp", None), P()),
}


def test_on_four_fake_cpu_devices():
  fake_devices.rerun_with(__file__, DEVICES, "test_on_four_fake_cpu_devices")


def _mesh(size):
  return jax.make_mesh(
      (size,), ("tp",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:size]
  )


def _rel(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return np.linalg.norm(x - ref) / np.linalg.norm(ref)


@needs_devices
@pytest.mark.parametrize(
    "schedule, size, activation",
    [("bulk", 2, "gelu_tanh"), ("bulk", 4, None), ("ring", 2, None), ("ring", 4, "gelu_tanh")],
)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_value_and_gradients_match_float64(name, schedule, size, activation):
  m, k, n = 24, 40, 36
  rng = np.random.default_rng(size)
  x, w, bias = (
      rng.standard_normal((m, k)),
      rng.standard_normal((k, n)) * k**-0.5,
      rng.standard_normal(n),
  )
  y_of = {None: lambda t: t, "gelu_tanh": lambda t: jax.nn.gelu(t, approximate=True)}[activation]
  with jax.enable_x64(True):
    ref_y = y_of(jnp.asarray(x) @ w + bias)
    ref_grads = jax.grad(lambda *v: jnp.mean(y_of(v[0] @ v[1] + v[2]) ** 2), (0, 1, 2))(x, w, bias)
  mesh = _mesh(size)
  args = [
      jax.device_put(jnp.asarray(v, jnp.float32), NamedSharding(mesh, spec))
      for v, spec in zip((x, w, bias), LAYOUTS[name])
  ]
  fn = getattr(cm, name)
  f = lambda x, w, b: fn(
      x, w, b, axis_name="tp", activation=activation, implementation="xla", schedule=schedule
  )
  y = jax.jit(f)(*args)
  grads = jax.jit(jax.grad(lambda *v: jnp.mean(f(*v) ** 2), (0, 1, 2)))(*args)
  assert _rel(y, ref_y) < 1e-5
  out_spec = P(None, "tp") if name == "all_gather_matmul" else P("tp", None)
  assert y.sharding.is_equivalent_to(NamedSharding(mesh, out_spec), 2)
  for g, r, arg in zip(grads, ref_grads, args):
    assert _rel(g, r) < 1e-5
    assert g.sharding.is_equivalent_to(arg.sharding, g.ndim)


@needs_devices
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_16_bit_operands_with_an_f32_output_and_no_bias(name):
  m, k, n = 16, 24, 20
  rng = np.random.default_rng(7)
  x, w = rng.standard_normal((m, k)), rng.standard_normal((k, n))
  mesh = _mesh(2)
  specs = LAYOUTS[name]
  xs, ws = (
      jax.device_put(jnp.asarray(v, jnp.bfloat16), NamedSharding(mesh, s))
      for v, s in zip((x, w), specs)
  )
  y = jax.jit(lambda x, w: getattr(cm, name)(x, w, axis_name="tp", out_dtype=jnp.float32,
                                             implementation="xla"))(xs, ws)  # fmt: skip
  assert y.dtype == jnp.float32
  ref = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64) @ np.asarray(
      jnp.asarray(w, jnp.bfloat16), np.float64
  )
  assert _rel(y, ref) < 1e-2


@needs_devices
@pytest.mark.parametrize("schedule", ["bulk", "ring", "fused"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_kernel_path_lowers_for_cuda(name, schedule):
  if schedule == "fused" and cm._compat.JAX_VERSION < (0, 11, 0):
    pytest.skip(f"jax {jax.__version__}: the fused schedule's kernel is built for jax >= 0.11")
  mesh = _mesh(2)
  sds = [
      jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
      for shape, spec in zip(((512, 256), (256, 384), (384,)), LAYOUTS[name])
  ]
  fn = getattr(cm, name)

  def loss(x, w, b):
    y = fn(x, w, b, axis_name="tp", activation="gelu_tanh", implementation="pallas",
           schedule=schedule, comm_sms=8)  # fmt: skip
    return jnp.mean(y.astype(jnp.float32) ** 2)

  with jax.set_mesh(mesh):
    text = jax.export.export(jax.jit(jax.grad(loss, (0, 1, 2))), platforms=["cuda"])(
        *sds
    ).mlir_module()
  if schedule == "fused":  # the kernel names its peers (no replica ids: a runtime error)
    assert 'xla_replica_ids = "0,1"' in text
  ops = ("all_gather", "reduce_scatter", "collective_permute")
  expected = {"bulk": ops[:2], "ring": ops[2:], "fused": ()}[schedule]  # fused: in the kernels
  found = tuple(op for op in ops if f"stablehlo.{op}" in text)  # forward and backward
  assert found == expected
  assert "mosaic_gpu" in text


@needs_devices
def test_the_fused_kernel_names_its_peers_without_set_mesh():
  """Arrays on a mesh, no `jax.set_mesh`: jit traces on the abstract mesh, and the
  kernel's lowering still names the devices (else a runtime error, 'No replica ids')."""
  if cm._compat.JAX_VERSION < (0, 11, 0):
    pytest.skip(f"jax {jax.__version__}: the fused schedule's kernel is built for jax >= 0.11")
  mesh = _mesh(2)
  sds = [
      jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
      for shape, spec in zip(((512, 256), (256, 384)), LAYOUTS["all_gather_matmul"])
  ]
  f = lambda x, w: cm.all_gather_matmul(
      x, w, axis_name="tp", implementation="pallas", schedule="fused"
  )
  text = jax.export.export(jax.jit(f), platforms=["cuda"])(*sds).mlir_module()
  assert 'xla_replica_ids = "0,1"' in text


def test_a_ring_step_leaves_comm_sms_to_the_collective():
  ring = cm.Collective(_mesh(1), "tp", 1, GemmCall(out_dtype="bfloat16", implementation="pallas"),
                       "ring", comm_sms=8)  # fmt: skip
  call = ring.step_call(ring.call, 4096, 4096, 4096, jnp.bfloat16)
  sms = (cm._compat.device_sm_count() or cm.heuristics.DEFAULT_NUM_SMS) - 8
  assert call.config.num_sms == sms - sms % call.config.cluster_size
  xla = cm.Collective(_mesh(1), "tp", 1, GemmCall(out_dtype="bfloat16", implementation="xla"),
                      "ring", comm_sms=8)  # fmt: skip
  assert xla.step_call(xla.call, 64, 64, 64, jnp.bfloat16).config is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(axis_name="nope"), "axis_name 'nope' must name an Explicit axis"),
        (dict(axis_name="tp", implementation="cuda"), "implementation must be one of"),
        (dict(axis_name="tp", comm_sms=-1), "comm_sms must be an int >= 0"),
        (dict(axis_name="tp", schedule="tree"), "schedule must be one of"),
        (dict(axis_name="tp", schedule="fused"), "schedule='fused' runs the kernel on the GPU"),
        (dict(axis_name="tp", w_shape=(5, 8)), "x's columns (4) must equal w's rows (5)"),
        (dict(axis_name="tp", bias_shape=(3,)), "bias must have shape (N,) = (8,)"),
        (dict(axis_name="tp", x_shape=(4,)), "x and w must be 2-D"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
  mesh = _mesh(1)
  x_shape, w_shape = kwargs.pop("x_shape", (6, 4)), kwargs.pop("w_shape", (4, 8))
  bias_shape = kwargs.pop("bias_shape", None)
  put = lambda shape: jax.device_put(jnp.ones(shape, jnp.float32), NamedSharding(mesh, P()))
  bias = None if bias_shape is None else put(bias_shape)
  for fn in (cm.all_gather_matmul, cm.matmul_reduce_scatter):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
      fn(put(x_shape), put(w_shape), bias, **{"implementation": "xla", **kwargs})


@needs_devices
def test_rows_that_do_not_divide_by_the_ring_are_named():
  mesh = _mesh(2)
  put = lambda shape: jax.device_put(jnp.ones(shape, jnp.float32), NamedSharding(mesh, P()))
  for fn in (cm.all_gather_matmul, cm.matmul_reduce_scatter):
    with pytest.raises(ValueError, match=r"x's rows \(5\) must divide by the size of 'tp' \(2\)"):
      fn(put((5, 4)), put((4, 8)), axis_name="tp", implementation="xla")


def test_the_fused_schedule_needs_whole_row_tiles_and_its_kernel_rules():
  assert cm.fused_config(cm.GemmProblem(m=1024, n=512, k=512)).schedule == "cooperative"
  with pytest.raises(ValueError, match=r"rows per device \(100\) to divide by 128"):
    cm.fused_config(cm.GemmProblem(m=100, n=512, k=512))
  problem = cm.GemmProblem(m=256, n=512, k=512)
  pingpong = GemmConfig(tile_m=64, tile_n=128, schedule="pingpong")
  a, b = jnp.ones((256, 512), jnp.bfloat16), jnp.ones((512, 512), jnp.bfloat16)
  interpret = cm._compat.interpret_params(zero_fill=False)
  for kind in ("all_gather", "reduce_scatter"):
    rules = rf"{kind}=\('tp', 1\) needs a schedule 'cooperative'; .*2 devices or more; the kernel on hardware"
    with pytest.raises(ValueError, match=rules):
      cm.hopper_gemm.hopper_gemm(
          a, b, problem=problem, config=pingpong, interpret=interpret, **{kind: ("tp", 1)}
      )
  with pytest.raises(ValueError, match="one ring per kernel"):
    cm.hopper_gemm.hopper_gemm(
        a, b, problem=problem, config=GemmConfig(), all_gather=("tp", 2),
        reduce_scatter=("tp", 2), interpret=interpret,
    )  # fmt: skip


def test_bad_dtypes_are_named():
  mesh = _mesh(1)
  put = lambda a: jax.device_put(a, NamedSharding(mesh, P()))
  x, w = put(jnp.ones((4, 8), jnp.bfloat16)), put(jnp.ones((8, 2), jnp.float32))
  with pytest.raises(TypeError, match="x and w must have the same dtype, got bfloat16 and float32"):
    cm.all_gather_matmul(x, w, axis_name="tp", implementation="xla")
  with pytest.raises(TypeError, match="out_dtype must be a dtype, got 'int3'"):
    cm.matmul_reduce_scatter(x, x.T, axis_name="tp", out_dtype="int3", implementation="xla")


def test_operands_off_any_explicit_mesh_are_rejected():
  with pytest.raises(ValueError, match="must name an Explicit axis"):
    cm.all_gather_matmul(jnp.ones((4, 4)), jnp.ones((4, 4)), axis_name="tp", implementation="xla")


@needs_devices
@pytest.mark.parametrize("schedule", ["bulk", "ring"])
def test_the_flax_tensor_parallel_pair_matches_the_unsharded_layers(schedule):
  nnx = pytest.importorskip("flax.nnx")
  from pallas_gemm import flax as pflax

  d, h, tokens = 16, 48, 24
  kw = dict(implementation="xla", param_dtype=jnp.float32)

  def loss(up, down, x):
    return jnp.mean(down(up(x)) ** 2)

  reference = (
      pflax.Linear(d, h, activation="gelu_tanh", rngs=nnx.Rngs(1), **kw),
      pflax.Linear(h, d, rngs=nnx.Rngs(2), **kw),
  )
  x = jnp.asarray(np.random.default_rng(0).standard_normal((4, tokens // 4, d)), jnp.float32)
  ref_value, ref_grads = nnx.value_and_grad(loss, argnums=(0, 1))(*reference, x)
  mesh = _mesh(DEVICES)
  with jax.set_mesh(mesh):
    up = pflax.ColumnParallelLinear(
        d, h, axis_name="tp", activation="gelu_tanh", schedule=schedule, rngs=nnx.Rngs(1), **kw
    )
    down = pflax.RowParallelLinear(h, d, axis_name="tp", schedule=schedule, rngs=nnx.Rngs(2), **kw)
    assert up.kernel[...].sharding.spec == P(None, "tp") and down.kernel[...].sharding.spec == P(
        "tp", None
    )
    x_sharded = jax.device_put(x, NamedSharding(mesh, P("tp", None, None)))  # batch rows
    value, grads = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1)))(up, down, x_sharded)
  assert abs(float(value) - float(ref_value)) < 1e-5 * abs(float(ref_value))
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    assert _rel(got, want) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["bulk", "fused"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_kernels_on_every_gpu_match_float64(name, schedule):
  """The kernels (fused: the collective inside them) on all GPUs of the machine: value and
  gradients of a bf16 layer with bias and tanh-GELU against float64 on the host."""
  size = len(jax.devices())
  if size < 2:
    pytest.skip("needs 2 GPUs or more")
  m, k, n = 256 * size, 256 * size, 384 * size  # 256 rows per device: whole 128-row tiles
  rng = np.random.default_rng(size + 3)
  x, w, bias = (
      rng.standard_normal((m, k)),
      rng.standard_normal((k, n)) * k**-0.5,
      rng.standard_normal(n),
  )
  x, w = (np.asarray(jnp.asarray(v, jnp.bfloat16), np.float64) for v in (x, w))
  gelu = lambda t: jax.nn.gelu(t, approximate=True)
  with jax.enable_x64(True):
    ref_y = gelu(jnp.asarray(x) @ w + bias)
    ref_grads = jax.grad(lambda *v: jnp.mean(gelu(v[0] @ v[1] + v[2]) ** 2), (0, 1, 2))(x, w, bias)
  mesh = _mesh(size)
  dtypes = (jnp.bfloat16, jnp.bfloat16, jnp.float32)
  args = [
      jax.device_put(jnp.asarray(v, dtype), NamedSharding(mesh, spec))
      for v, dtype, spec in zip((x, w, bias), dtypes, LAYOUTS[name])
  ]
  fn = getattr(cm, name)
  f = lambda x, w, b: fn(x, w, b, axis_name="tp", activation="gelu_tanh", schedule=schedule)
  y = jax.block_until_ready(jax.jit(f)(*args))
  loss = lambda *v: jnp.mean(f(*v).astype(jnp.float32) ** 2)
  grads = jax.block_until_ready(jax.jit(jax.grad(loss, (0, 1, 2)))(*args))
  assert _rel(y, ref_y) < 1e-2
  for g, r in zip(grads, ref_grads):
    assert _rel(g, r) < 1e-2
