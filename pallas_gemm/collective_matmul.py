"""Tensor-parallel GEMMs with their collective: all-gather-matmul and matmul-reduce-scatter.

A column-parallel layer all-gathers its activation rows before the GEMM; a row-parallel
layer reduce-scatters its partial products after it:

  all_gather_matmul(x, w)      all_gather(x rows) @ w        x: (M, K) rows sharded,
                                                              w: (K, N) columns sharded
                                                              -> (M, N) columns sharded
  matmul_reduce_scatter(x, w)  reduce_scatter(x @ w, rows)   x: (M, K) columns sharded,
                                                              w: (K, N) rows sharded
                                                              -> (M, N) rows sharded

Each is the other's backward (the gradient of a gather is a reduce-scatter), and both
are differentiable in x, w and bias: the backward keeps the gathered rows and runs one
weight-gradient GEMM over them. The gather's epilogue (bias, activation) runs in its
kernel; the reduce-scatter's runs once on the summed rows, in one XLA pass ("fused": in
the kernel). Partial sums travel in the output dtype when it has 16 bits, as XLA's own
reduce-scatter does ("fused": too, each hop's sum taken in f32).

Three schedules of the collective against the GEMM:
  "bulk"   one NCCL all-gather (or reduce-scatter) and one GEMM over all rows: the default.
  "ring"   `size` steps over one mesh axis of `size` devices: each step multiplies one row
           chunk while `lax.ppermute` moves another to the neighbour. XLA issues the
           permutes asynchronously around the GEMMs, but on jax 0.11.2 the transfers did not
           overlap them, with our kernel or with cuBLAS (2 x H200, NOTES exp. 69), so the
           ring costs its extra passes and wins nothing there; it is kept, measured, for
           stacks that overlap it. `comm_sms` leaves SMs free of the ring's persistent
           GEMMs for NCCL's kernels.
  "fused"  the collective inside the GEMM kernel (`device_rings`). The gather
           (`hopper_gemm(all_gather=)`): the chunks go from GPU to GPU by TMA stores of
           the kernel's own A stages while it multiplies, as jax's `collective_matmul_mgpu`
           does. The reduce-scatter (`hopper_gemm(reduce_scatter=)`): each step's running
           sums go to the neighbour by TMA stores from the epilogue's SMEM, and the last
           step's sum runs the epilogue in the kernel. A mesh of the ring axis alone, a Hopper GPU,
           rows per device a multiple of 128 (NOTES exps. 72, 74).

>>> import jax, jax.numpy as jnp
>>> from jax.sharding import AxisType, PartitionSpec as P
>>> mesh = jax.make_mesh((1,), ("tp",), axis_types=(AxisType.Explicit,))
>>> with jax.set_mesh(mesh):
...   x = jax.device_put(jnp.ones((4, 3), jnp.float32), P("tp", None))
...   w = jax.device_put(jnp.ones((3, 2), jnp.float32), P(None, "tp"))
...   all_gather_matmul(x, w, axis_name="tp", implementation="xla").tolist()
[[3.0, 3.0], [3.0, 3.0], [3.0, 3.0], [3.0, 3.0]]
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from pallas_gemm import _compat
from pallas_gemm import autodiff
from pallas_gemm import batching
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import heuristics
from pallas_gemm import hopper_gemm
from pallas_gemm import sharding
from pallas_gemm.batching import GemmCall
from pallas_gemm.config import GemmConfig, GemmProblem, fit_stages
from pallas_gemm.gemm import IMPLEMENTATIONS
from pallas_gemm.operands import OPERANDS

SCHEDULES = ("bulk", "ring", "fused")


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class Collective:
  """The collective of one layer over mesh axis `axis` (`size` devices), how it is
  scheduled against the GEMM, and the layer's GEMM."""

  mesh: jax.sharding.AbstractMesh | jax.sharding.Mesh
  axis: str
  size: int
  call: GemmCall
  """The layer's GEMM: `out_dtype`, implementation, epilogue (activation)."""
  schedule: str = "bulk"
  comm_sms: int = 0

  def shard_map(self, fn, in_specs, out_specs):
    return jax.shard_map(
        fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
    )

  def step_call(self, call: GemmCall, m: int, n: int, k: int, dtype, has_bias=False) -> GemmCall:
    """`call` with a kernel config on all SMs but `comm_sms` (kernel implementations)."""
    if not self.comm_sms or call.implementation not in ("auto", "pallas"):
      return call
    sms = (_compat.device_sm_count() or heuristics.DEFAULT_NUM_SMS) - self.comm_sms
    problem = GemmProblem(
        m=m, n=n, k=k, dtype=jnp.dtype(dtype).name, out_dtype=call.out_dtype,
        transpose_a=call.transpose_a, transpose_b=call.transpose_b,
        has_bias=has_bias,
    )  # fmt: skip
    config = heuristics.default_config(problem, num_sms=sms)
    sms -= sms % config.cluster_size
    whole = dataclasses.replace(config.whole_tiles(), num_sms=sms)  # beside the collectives
    return dataclasses.replace(call, config=whole)

  def gather(self, x, call: GemmCall, w, bias=None):
    """(outputs of `call` on (all_gather(x), w, bias) as a tuple, all_gather(x)), rows
    in device order (inside `shard_map`).

    "ring": `size` steps; at step s device d multiplies device (d + s) % size's rows,
    which it sent on to d - 1 before multiplying them. "fused": one kernel that
    forwards the chunks itself (`hopper_gemm(all_gather=)`)."""
    step = lambda rows: _as_tuple(batching.gemm(call, rows, w, bias=bias))
    if self.schedule == "bulk":
      rows = lax.all_gather(x, self.axis, axis=0, tiled=True)
      return step(rows), rows
    if self.schedule == "fused":
      return self._fused_gather(x, call, w, bias)
    left = [(i, (i - 1) % self.size) for i in range(self.size)]
    results, chunks = [], []
    for s in range(self.size):
      following = lax.ppermute(x, self.axis, left) if s < self.size - 1 else None
      results.append(step(x))
      chunks.append(x)
      x = following
    outputs = tuple(self._device_order(list(r)) for r in zip(*results))
    return outputs, self._device_order(chunks)

  def _fused_gather(self, x, call, w, bias):
    """`gather` by the kernel with the all-gather inside (one launch, no NCCL)."""
    *outputs, received = self._ring_kernel("all_gather", x, x.shape[0], call, w, bias)
    chunks = [x, *(received[i] for i in range(self.size - 1))]  # ring order
    return tuple(outputs), self._device_order(chunks)

  def fused_reduce(self, rows, call, w, bias=None):
    """The outputs of `call` (epilogue included) on this device's rows of the sum over
    devices of rows @ w, by the kernel with the reduce-scatter inside."""
    m = rows.shape[0] // self.size
    *outputs, _ = self._ring_kernel("reduce_scatter", rows, m, call, w, bias)
    return tuple(outputs)

  def _ring_kernel(self, kind, rows, m, call, w, bias):
    """`hopper_gemm` with the collective `kind` inside, on chunks of `m` rows."""
    k = rows.shape[1]
    n = w.shape[0] if call.transpose_b else w.shape[1]
    problem = GemmProblem(
        m=m, n=n, k=k, dtype=rows.dtype.name, out_dtype=call.out_dtype,
        transpose_b=call.transpose_b, has_bias=bias is not None,
    )  # fmt: skip
    config = fused_config(problem, call.config)
    spec = epilogue_lib.EpilogueSpec(activation=call.activation)
    if bias is not None:  # f32, whole tiles (as `gemm` passes it)
      bias = jnp.pad(bias.astype(jnp.float32), (0, -n % config.tile_n))
    return hopper_gemm.hopper_gemm(
        rows, w, bias,
        problem=problem, config=config, epilogue=spec, return_pre=call.return_pre,
        **{kind: (self.axis, self.size)},
    )  # fmt: skip

  def reduce(self, rows, call, w):
    """This device's rows of the sum over devices of `call` on (rows, w) (no epilogue).

    "ring": one row chunk a step; a chunk's partial sum travels right, each device
    adding its product, and arrives complete at the chunk's device. "fused": one
    kernel that sends the partial sums on itself (`hopper_gemm(reduce_scatter=)`)."""
    partial = lambda r: batching.gemm(call, r, w)
    if self.schedule == "bulk":
      return lax.psum_scatter(partial(rows), self.axis, scatter_dimension=0, tiled=True)
    if self.schedule == "fused":
      return self.fused_reduce(rows, call, w)[0]
    chunks = rows.reshape(self.size, -1, rows.shape[-1])
    right = [(i, (i + 1) % self.size) for i in range(self.size)]
    here = lax.axis_index(self.axis)
    acc = None
    for s in range(self.size):
      chunk = lax.dynamic_index_in_dim(chunks, (here - s - 1) % self.size, keepdims=False)
      product = partial(chunk)
      acc = product if acc is None else acc + product.astype(acc.dtype)
      if s < self.size - 1:
        acc = lax.ppermute(acc, self.axis, right)
    return acc

  def _device_order(self, chunks):
    """The ring's chunks (step s: device (d + s) % size's) as rows in device order."""
    order = (jnp.arange(self.size) - lax.axis_index(self.axis)) % self.size
    taken = jnp.take(jnp.stack(chunks), order, axis=0)
    return taken.reshape(-1, *taken.shape[2:])


def all_gather_matmul(
    x, w, bias=None, *, axis_name: str, activation=None, out_dtype=None,
    implementation: str | None = None, schedule: str = "bulk", comm_sms: int = 0,
):  # fmt: skip
  """act(all_gather(x) @ w + bias): a column-parallel layer.

  x: (M, K) with rows sharded over `axis_name`; w: (K, N) and bias (N,) with columns
  sharded over it. Arrays on a mesh with Explicit axes (or under `jax.set_mesh`);
  others are resharded to these specs first. Returns (M, N) with columns sharded.
  `schedule`: "bulk" or "ring" (see the module doc).
  """
  layer = _collective(
      x, w, bias, axis_name, activation, out_dtype, implementation, schedule, comm_sms
  )
  x = sharding.reshard(x, ((axis_name,), ()), layer.mesh)
  w = sharding.reshard(w, ((), (axis_name,)), layer.mesh)
  if bias is not None:
    bias = sharding.reshard(bias, ((axis_name,),), layer.mesh)
  return _all_gather_matmul(layer, x, w, bias)


def matmul_reduce_scatter(
    x, w, bias=None, *, axis_name: str, activation=None, out_dtype=None,
    implementation: str | None = None, schedule: str = "bulk", comm_sms: int = 0,
):  # fmt: skip
  """act(reduce_scatter(x @ w) + bias), scattered over rows: a row-parallel layer.

  x: (M, K) with columns sharded over `axis_name`; w: (K, N) with rows sharded over
  it; bias (N,) replicated. Returns (M, N) with rows sharded. `schedule`: "bulk" or
  "ring" (see the module doc).
  """
  layer = _collective(
      x, w, bias, axis_name, activation, out_dtype, implementation, schedule, comm_sms
  )
  x = sharding.reshard(x, ((), (axis_name,)), layer.mesh)
  w = sharding.reshard(w, ((axis_name,), ()), layer.mesh)
  if bias is not None:
    bias = sharding.reshard(bias, ((),), layer.mesh)
  return _matmul_reduce_scatter(layer, x, w, bias)


def _collective(
    x, w, bias, axis_name, activation, out_dtype, implementation, schedule, comm_sms
) -> Collective:
  """The checked arguments as a `Collective`."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  if schedule not in SCHEDULES:
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
  if schedule == "fused" and implementation not in (None, "auto", "pallas"):
    raise ValueError(
        f"schedule='fused' runs the kernel on the GPU (remote stores have no interpreter "
        f"or XLA form); implementation={implementation!r} takes 'bulk' or 'ring'"
    )
  x, w = jnp.asarray(x), jnp.asarray(w)
  if x.ndim != 2 or w.ndim != 2:
    raise ValueError(f"x and w must be 2-D (M, K) and (K, N), got {x.shape} and {w.shape}")
  if x.shape[1] != w.shape[0]:
    raise ValueError(f"x's columns ({x.shape[1]}) must equal w's rows ({w.shape[0]})")
  if x.dtype != w.dtype:
    raise TypeError(f"x and w must have the same dtype, got {x.dtype} and {w.dtype}")
  try:
    out_dtype = jnp.dtype(out_dtype or x.dtype)
  except TypeError as e:
    raise TypeError(f"out_dtype must be a dtype, got {out_dtype!r}") from e
  OPERANDS["bias"].check(bias, 1, w.shape[1])
  if not isinstance(comm_sms, int) or comm_sms < 0:
    raise ValueError(f"comm_sms must be an int >= 0, got {comm_sms!r}")
  mesh = sharding.explicit_mesh(x, w, bias)
  if mesh is None or axis_name not in mesh.axis_names:
    raise ValueError(
        f"axis_name {axis_name!r} must name an Explicit axis of the mesh x and w live on "
        f"(or of `jax.set_mesh`'s); found {None if mesh is None else mesh.axis_names}"
    )
  if implementation is None:
    implementation = "auto" if _compat.on_hopper() else "xla"
  if schedule == "fused" and (implementation == "xla" or len(mesh.axis_names) != 1):
    raise ValueError(
        "schedule='fused' needs a Hopper GPU and a mesh of the ring axis alone (the kernel "
        f"addresses its peers by their index along it); mesh axes {mesh.axis_names}"
    )
  activation = epilogue_lib.activation_name(activation, custom=True)
  if epilogue_lib.routed_operands(activation):
    raise ValueError(
        "activation: the collective GEMMs take no with_operands epilogue (their backward "
        "differentiates the activation alone)"
    )
  call = GemmCall(out_dtype=out_dtype.name, implementation=implementation, activation=activation)
  size = mesh.shape[axis_name]
  if schedule == "fused":  # the kernel's lowering names its peers' device ids
    mesh = sharding.concrete_mesh(mesh)
  if x.shape[0] % size:
    raise ValueError(f"x's rows ({x.shape[0]}) must divide by the size of {axis_name!r} ({size})")
  return Collective(mesh, axis_name, size, call, schedule, comm_sms)


def _as_tuple(result):
  return result if isinstance(result, tuple) else (result,)


def fused_config(problem: GemmProblem, config: GemmConfig | None = None) -> GemmConfig:
  """A config for `hopper_gemm(all_gather=)`: `config` or the default for `problem`,
  made cooperative with whole row tiles (its tile_m if 128 or 256 divides the chunk's
  rows, else 128),
  one K slice, no stream-K or cluster.

  >>> fused_config(GemmProblem(m=8192, n=14336, k=8192)).tile_m
  128
  """
  base = config or heuristics.default_config(problem)
  fits = [t for t in (base.tile_m, 128) if t in (128, 256) and problem.m % t == 0]
  if not fits or problem.k % base.tile_k:
    raise ValueError(
        f"schedule='fused' needs the rows per device ({problem.m}) to divide by 128 and K "
        f"({problem.k}) by tile_k ({base.tile_k}); use schedule='bulk'"
    )
  fused = dataclasses.replace(
      base, tile_m=fits[0], schedule="cooperative", wg_split="m", split_k=1, stream_k=False,
      split_tail=False, cluster=(1, 1),
  )  # fmt: skip
  return fit_stages(fused, problem, fused.stages)


def _partial_dtype(call):
  """Partial sums travel in a 16-bit output's dtype (as XLA's reduce-scatter), else f32."""
  return call.out_dtype if jnp.dtype(call.out_dtype).itemsize == 2 else "float32"


def _affine_grad(call, pre, g, dtype):
  """(d(pre) in `dtype`, its f32 column sums): the epilogue's activation differentiated
  given the output's cotangent; one kernel pass where `autodiff.fuses_dpre`."""
  if pre is None:
    d_acc = g.astype(dtype)
  elif autodiff.fuses_dpre(call, pre, g, dtype):
    return autodiff.fused_dpre(call, pre, g)
  else:
    spec = epilogue_lib.EpilogueSpec(activation=call.activation)
    _, vjp = jax.vjp(lambda p: epilogue_lib.apply(spec, p), pre.astype(jnp.float32))
    d_acc = vjp(g.astype(jnp.float32))[0].astype(dtype)
  return d_acc, jnp.sum(d_acc, axis=0, dtype=jnp.float32)


def _rows(layer, total_rows):
  """Rows of one device's chunk (a ring step's GEMM) or of all (a bulk GEMM)."""
  return total_rows // layer.size if layer.schedule == "ring" else total_rows


def _operands(*arrays):
  """The arrays that are not None (shard_map takes no None)."""
  return tuple(a for a in arrays if a is not None)


# all_gather_matmul -------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _all_gather_matmul(layer, x, w, bias):
  return _ag_forward(layer, x, w, bias)[0]


def _ag_forward(layer, x, w, bias):
  """(out, pre or None, all_gather(x))."""
  a = layer.axis
  call = layer.step_call(
      dataclasses.replace(layer.call, return_pre=layer.call.nonlinear),
      _rows(layer, x.shape[0]), w.shape[1] // layer.size, x.shape[1], x.dtype,
      has_bias=bias is not None,
  )  # fmt: skip

  def local(x, w, *bias):
    outputs, rows = layer.gather(x, call, w, bias[0] if bias else None)
    pre = outputs[1] if call.return_pre else jnp.zeros((0,), x.dtype)
    return outputs[0], pre, rows

  specs = (P(a, None), P(None, a)) + ((P(a),) if bias is not None else ())
  pre_spec = P(None, a) if call.return_pre else P()
  out, pre, rows = layer.shard_map(local, specs, (P(None, a), pre_spec, P()))(
      x, w, *_operands(bias)
  )
  return out, (pre if call.return_pre else None), rows


def _ag_fwd(layer, x, w, bias):
  out, pre, rows = _ag_forward(layer, x, w, bias)
  return out, (pre, rows, w, bias)


def _ag_bwd(layer, saved, g):
  pre, rows, w, bias = saved
  a = layer.axis
  dtype = w.dtype
  k, n_local = w.shape[0], w.shape[1] // layer.size
  dx_call = layer.step_call(
      GemmCall(out_dtype=_partial_dtype(layer.call), implementation=layer.call.implementation,
               transpose_b=True),
      _rows(layer, rows.shape[0]), k, n_local, dtype,
  )  # fmt: skip
  dw_call = GemmCall(
      out_dtype=dtype.name, implementation=layer.call.implementation, transpose_a=True
  )

  def local(g, pre, rows, w):
    d_acc, sums = _affine_grad(layer.call, pre if layer.call.nonlinear else None, g, dtype)
    dx = layer.reduce(d_acc, dx_call, w)
    dw = batching.gemm(dw_call, rows, d_acc)
    return dx.astype(rows.dtype), dw, sums.astype(dtype if bias is None else bias.dtype)

  pre = jnp.zeros((0,), g.dtype) if pre is None else pre
  pre_spec = P(None, a) if layer.call.nonlinear else P()
  dx, dw, db = layer.shard_map(
      local, (P(None, a), pre_spec, P(), P(None, a)), (P(a, None), P(None, a), P(a))
  )(g, pre, rows, w)
  return dx, dw, None if bias is None else db


_all_gather_matmul.defvjp(_ag_fwd, _ag_bwd)


# matmul_reduce_scatter ---------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _matmul_reduce_scatter(layer, x, w, bias):
  return _rs_forward(layer, x, w, bias)[0]


def _rs_forward(layer, x, w, bias):
  """(out, pre or None): each device's rows of the summed products, with the epilogue."""
  a = layer.axis
  product = GemmCall(out_dtype=_partial_dtype(layer.call), implementation=layer.call.implementation)
  product = layer.step_call(
      product, _rows(layer, x.shape[0]), w.shape[1], x.shape[1] // layer.size, x.dtype
  )
  finish = dataclasses.replace(layer.call, return_pre=layer.call.nonlinear)

  def local(x, w, *bias):
    bias = bias[0] if bias else None
    if layer.schedule == "fused":  # the epilogue in the kernel, on the sum
      y = layer.fused_reduce(x, finish, w, bias)
      y = y if finish.return_pre else y[0]
    else:
      acc = layer.reduce(x, product, w)
      y = batching.finish_epilogue(finish, acc.astype(jnp.float32), bias=bias)
    return y if finish.return_pre else (y, jnp.zeros((0,), x.dtype))

  specs = (P(None, a), P(a, None)) + ((P(),) if bias is not None else ())
  pre_spec = P(a, None) if finish.return_pre else P()
  out, pre = layer.shard_map(local, specs, (P(a, None), pre_spec))(x, w, *_operands(bias))
  return out, (pre if finish.return_pre else None)


def _rs_fwd(layer, x, w, bias):
  out, pre = _rs_forward(layer, x, w, bias)
  return out, (pre, x, w, bias)


def _rs_bwd(layer, saved, g):
  pre, x, w, bias = saved
  a = layer.axis
  dtype = w.dtype
  k_local, n = w.shape[0] // layer.size, w.shape[1]
  dx_call = layer.step_call(
      GemmCall(out_dtype=x.dtype.name, implementation=layer.call.implementation, transpose_b=True),
      _rows(layer, x.shape[0]), k_local, n, dtype,
  )  # fmt: skip
  dw_call = GemmCall(
      out_dtype=dtype.name, implementation=layer.call.implementation, transpose_a=True
  )

  def local(g, pre, x, w):
    d_acc, sums = _affine_grad(layer.call, pre if layer.call.nonlinear else None, g, dtype)
    (dx,), d_rows = layer.gather(d_acc, dx_call, w)
    dw = batching.gemm(dw_call, x, d_rows)
    db = lax.psum(sums, a)
    return dx, dw, db.astype(dtype if bias is None else bias.dtype)

  pre = jnp.zeros((0,), g.dtype) if pre is None else pre
  pre_spec = P(a, None) if layer.call.nonlinear else P()
  dx, dw, db = layer.shard_map(
      local, (P(a, None), pre_spec, P(None, a), P(a, None)), (P(None, a), P(a, None), P())
  )(g, pre, x, w)
  return dx, dw, None if bias is None else db


_matmul_reduce_scatter.defvjp(_rs_fwd, _rs_bwd)
