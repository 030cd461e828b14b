"""GEMMs on sharded arrays: per-shard kernels in shard_map, psum over a sharded K.

These tests need 4 devices. jax fixes the CPU device count when it initializes,
so unless this process already has 4 (XLA_FLAGS=--xla_force_host_platform_device_count=4),
`test_on_four_fake_cpu_devices` runs this module again in a child process that
has them, and the tests below skip here.

They use the XLA implementation, plus the Pallas kernel lowered for CUDA (not
run): jax's Mosaic GPU interpreter is not safe with several devices executing
at once (it asserts "Barrier remains allocated" at random).
"""

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_gemm import epilogue
from pallas_gemm.autodiff import matmul
from pallas_gemm.dot import make_dot_general
from tests import fake_devices

DEVICES = 4
needs_devices = fake_devices.needs(DEVICES)


def test_on_four_fake_cpu_devices():
  fake_devices.rerun_with(__file__, DEVICES, "test_on_four_fake_cpu_devices")


def _mesh(kind=AxisType.Explicit):
  return jax.make_mesh((2, 2), ("data", "model"), axis_types=(kind, kind))


def _normal(shape, dtype=jnp.bfloat16, seed=0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _rel_err(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return np.linalg.norm(x - ref) / np.linalg.norm(ref)


def _layer_loss(x, w, bias, c):
  y = matmul(x, w, bias=bias, c=c, beta=0.5, activation="gelu_tanh", implementation="xla")
  return jnp.mean(y.astype(jnp.float32) ** 2), y


# x spec, w spec, expected output spec
LAYER_SHARDINGS = {
    "rows_and_columns": (P("data", None), P(None, "model"), P("data", "model")),
    "contracting_dim": (P(None, "model"), P("model", None), P(None, None)),
    "rows_and_contracting_dim": (P("data", "model"), P("model", None), P("data", None)),
    "conflicting_K_resharded": (P("data", None), P("data", "model"), P("data", "model")),
}


@needs_devices
@pytest.mark.parametrize("name", list(LAYER_SHARDINGS))
def test_layer_on_explicit_mesh_matches_unsharded(name):
  x_spec, w_spec, out_spec = LAYER_SHARDINGS[name]
  mesh = _mesh()
  x, w = _normal((16, 64)), _normal((64, 32), seed=1)
  bias, c = _normal((32,), jnp.float32, seed=2), _normal((16, 32), seed=3)
  grad = jax.jit(jax.value_and_grad(_layer_loss, argnums=(0, 1, 2, 3), has_aux=True))
  (loss, y), grads = grad(x, w, bias, c)
  put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
  sharded = (put(x, x_spec), put(w, w_spec), put(bias, P(w_spec[1])), put(c, out_spec))
  (s_loss, s_y), s_grads = grad(*sharded)
  assert s_y.sharding.spec == out_spec
  assert _rel_err(s_y, y) < 1e-2 and _rel_err(s_loss, loss) < 1e-3
  for g, s_g, arg in zip(grads, s_grads, sharded):
    assert s_g.sharding.spec == arg.sharding.spec
    assert _rel_err(s_g, g) < 1e-2


SOFTCAP = epilogue.with_operands(lambda pre, cap: cap * jnp.tanh(pre / cap), "scalar")


@needs_devices
@pytest.mark.parametrize("name", ["rows_and_columns", "contracting_dim"])
def test_a_user_epilogue_scalar_is_replicated_over_the_mesh(name):
  # Per shard (rows and columns) and after the psum of a sharded K, with its gradient.
  x_spec, w_spec, out_spec = LAYER_SHARDINGS[name]
  mesh = _mesh()
  x, w, cap = _normal((16, 64)), _normal((64, 32), seed=1), jnp.float32(2.5)
  loss = lambda x, w, cap: jnp.sum(
      matmul(x, w, activation=SOFTCAP, scalar=cap, implementation="xla").astype(jnp.float32) ** 2
  )
  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
  value, grads = grad(x, w, cap)
  put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
  s_value, s_grads = grad(put(x, x_spec), put(w, w_spec), cap)
  assert _rel_err(s_value, value) < 1e-3
  for g, s_g in zip(grads, s_grads):
    assert _rel_err(s_g, g) < 1e-2


@needs_devices
def test_eager_call_on_sharded_arrays():
  mesh = _mesh()
  x, w = _normal((16, 64)), _normal((64, 32), seed=1)
  y = matmul(
      jax.device_put(x, NamedSharding(mesh, P("data", "model"))),
      jax.device_put(w, NamedSharding(mesh, P("model", None))),
      implementation="xla",
  )
  assert _rel_err(y, matmul(x, w, implementation="xla")) < 1e-2


@needs_devices
def test_batched_dot_general_with_sharded_batch_and_heads():
  mesh = _mesh()
  q, k = _normal((4, 2, 8, 16)), _normal((4, 2, 6, 16), seed=1)
  dn = (((3,), (3,)), ((0, 1), (0, 1)))
  dot = make_dot_general(implementation="xla")
  loss = lambda q, k: jnp.sum(dot(q, k, dn, preferred_element_type=jnp.float32) ** 2)
  spec = NamedSharding(mesh, P("data", "model"))
  value, grads = jax.jit(jax.value_and_grad(loss, (0, 1)))(
      jax.device_put(q, spec), jax.device_put(k, spec)
  )
  ref_value, ref_grads = jax.value_and_grad(
      lambda q, k: jnp.sum(jax.lax.dot_general(q, k, dn, preferred_element_type=jnp.float32) ** 2),
      (0, 1),
  )(q, k)
  assert _rel_err(value, ref_value) < 1e-5
  for g, r in zip(grads, ref_grads):
    assert g.sharding.is_equivalent_to(spec, g.ndim) and _rel_err(g, r) < 1e-2


@needs_devices
def test_out_sharding_is_honoured():
  mesh = _mesh()
  dot = make_dot_general(implementation="xla")
  with jax.set_mesh(mesh):
    x = jax.device_put(_normal((16, 64)), P("data", None))
    y = jax.jit(lambda x, w: dot(x, w, (((1,), (0,)), ((), ())), out_sharding=P(None, "model")))(
        x, _normal((64, 32), seed=1)
    )
  assert y.sharding.spec == P(None, "model")


@needs_devices
def test_ragged_dot_out_sharding_is_honoured():
  from pallas_gemm import ragged_dot

  mesh = _mesh()
  sizes = jnp.asarray([10, 6], jnp.int32)
  lhs, rhs = _normal((16, 64)), _normal((2, 64, 32), seed=1)
  ref = jax.lax.ragged_dot(lhs, rhs, sizes)
  with jax.set_mesh(mesh):
    y = jax.jit(
        lambda a, b, s: ragged_dot(a, b, s, out_sharding=P(None, "model"), implementation="xla")
    )(lhs, rhs, sizes)
  assert y.sharding.spec == P(None, "model")
  assert _rel_err(np.asarray(y, np.float32), np.asarray(ref, np.float32)) < 1e-2


@needs_devices
def test_auto_mesh_named_sharding_under_jit():
  mesh = _mesh(AxisType.Auto)
  x, w = _normal((16, 64)), _normal((64, 32), seed=1)
  loss = lambda x, w: jnp.mean(
      matmul(x, w, activation="relu", implementation="xla").astype(jnp.float32) ** 2
  )
  ref_value, ref_grads = jax.value_and_grad(loss, (0, 1))(x, w)
  value, grads = jax.jit(jax.value_and_grad(loss, (0, 1)))(
      jax.device_put(x, NamedSharding(mesh, P("data", "model"))),
      jax.device_put(w, NamedSharding(mesh, P("model", None))),
  )
  assert _rel_err(value, ref_value) < 1e-5
  for g, r in zip(grads, ref_grads):
    assert _rel_err(g, r) < 1e-2


@needs_devices
def test_nnx_mlp_with_sharded_parameters():
  nnx = pytest.importorskip("flax.nnx")
  from pallas_gemm import flax as pflax  # noqa: PLC0415 (needs flax)

  class MLP(nnx.Module):

    def __init__(self, rngs, sharded):
      names = lambda *n: {"out_sharding": n} if sharded else {}
      self.up = pflax.Linear(
          64,
          128,
          activation="gelu_tanh",
          dtype=jnp.bfloat16,
          kernel_metadata=names(None, "model"),
          bias_metadata=names("model"),
          rngs=rngs,
      )
      self.down = pflax.Linear(
          128, 32, dtype=jnp.bfloat16, kernel_metadata=names("model", None), rngs=rngs
      )

    def __call__(self, x):
      return self.down(self.up(x))

  @nnx.jit
  def step(model, x):
    return nnx.value_and_grad(lambda m, x: jnp.mean(m(x).astype(jnp.float32) ** 2))(model, x)

  x = _normal((16, 64), jnp.float32)
  ref_value, ref_grads = step(MLP(nnx.Rngs(0), sharded=False), x)
  with jax.set_mesh(_mesh()):
    model = MLP(nnx.Rngs(0), sharded=True)
    value, grads = step(model, jax.device_put(x, P("data", None)))
  assert _rel_err(value, ref_value) < 1e-3
  for g, r, p in zip(
      jax.tree.leaves(grads),
      jax.tree.leaves(ref_grads),
      jax.tree.leaves(nnx.state(model, nnx.Param)),
  ):
    assert g.sharding.spec == p.sharding.spec and _rel_err(g, r) < 1e-2


@needs_devices
def test_kernel_runs_per_shard_when_lowered_for_cuda():
  mesh = _mesh()
  spec = lambda *names: NamedSharding(mesh, P(*names))
  x = jax.ShapeDtypeStruct((256, 512), jnp.bfloat16, sharding=spec("data", "model"))
  w = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16, sharding=spec("model", None))
  loss = lambda x, w: jnp.mean(
      matmul(x, w, activation="gelu_tanh", implementation="pallas").astype(jnp.float32) ** 2
  )
  exported = jax.export.export(jax.jit(jax.value_and_grad(loss, (0, 1))), platforms=["cuda"])(x, w)
  module = exported.mlir_module()
  # forward, dX, dW kernels; psums over K of the forward ('model') and of dW ('data')
  assert module.count("@mosaic_gpu_v2") == 3
  assert module.count("stablehlo.all_reduce") == 2


@needs_devices
@pytest.mark.parametrize("k_sharded", [False, True])
def test_ragged_kernel_runs_per_shard_when_lowered_for_cuda(k_sharded):
  from pallas_gemm import ragged_dot

  mesh = _mesh()
  spec = lambda *names: NamedSharding(mesh, P(*names))
  lhs = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16, sharding=spec("data", None))
  rhs_spec = spec(None, "model", "data") if k_sharded else spec(None, None, "model")
  rhs = jax.ShapeDtypeStruct((4, 256, 512), jnp.bfloat16, sharding=rhs_spec)
  sizes = jax.ShapeDtypeStruct((4,), jnp.int32, sharding=spec(None))
  f = lambda a, b, s: ragged_dot(a, b, s, implementation="pallas")
  with jax.set_mesh(mesh):
    exported = jax.export.export(jax.jit(f), platforms=["cuda"])(lhs, rhs, sizes)
    out = jax.eval_shape(jax.jit(f), lhs, rhs, sizes)
  module = exported.mlir_module()
  assert module.count("@mosaic_gpu_v2") == 1  # one kernel, on the local blocks
  # N by "data" and K by "model" (summed) or N by "model" alone
  assert module.count("stablehlo.all_reduce") == (1 if k_sharded else 0)
  assert out.sharding.spec == P(None, "data" if k_sharded else "model")


@needs_devices
def test_kernel_gradients_inside_a_users_shard_map_keep_their_varying_axes():
  # A kernel's output carries no varying axes; the custom_vjp's gradients must match
  # their primals' (jax rejects the bwd rule otherwise). Lowered for CUDA, not run.
  mesh = jax.make_mesh((DEVICES,), ("d",), axis_types=(AxisType.Auto,))

  def local(h, w, b):
    y = matmul(h, w, implementation="pallas")
    return jax.lax.psum_scatter(y, "d", scatter_dimension=0, tiled=True) + b

  def loss(h, w, b):
    specs = (P(None, "d"), P("d", None), P())
    return jnp.sum(jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P("d", None))(h, w, b))

  sds = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((256, 512), (512, 256), (256,))]
  exported = jax.export.export(jax.jit(jax.grad(loss, (0, 1, 2))), platforms=["cuda"])(*sds)
  assert "mosaic_gpu" in exported.mlir_module()
