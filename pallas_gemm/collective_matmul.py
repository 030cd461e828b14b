"""Tensor-parallel GEMMs with their collective hidden behind the multiply.

A column-parallel layer all-gathers its activation rows before the GEMM; a row-parallel
layer reduce-scatters its partial products after it. Done one after the other, the
collective's time adds to the GEMM's. Here both are rings of `n` steps over one mesh
axis of `n` devices: each step multiplies one row chunk while `lax.ppermute` moves
another to the neighbour, so the transfers run during the GEMMs (XLA issues the
collective-permute asynchronously on its own stream; the GEMM of a step does not wait
on the transfer started beside it).

  all_gather_matmul(x, w)      all_gather(x rows) @ w        x: (M, K) rows sharded,
                                                              w: (K, N) columns sharded
                                                              -> (M, N) columns sharded
  matmul_reduce_scatter(x, w)  reduce_scatter(x @ w, rows)   x: (M, K) columns sharded,
                                                              w: (K, N) rows sharded
                                                              -> (M, N) rows sharded

Each is the other's backward (the gradient of a gather is a reduce-scatter), and both
are differentiable in x, w and bias. The epilogue (bias, activation) of the gather runs
fused in every step's kernel; the reduce-scatter's runs once on the summed rows, in the
same XLA pass that adds the last partial. Partial sums travel in the output dtype when
it has 16 bits, as XLA's own reduce-scatter does.

`comm_sms` leaves SMs free of the persistent GEMM for NCCL's kernels: with every SM
held, a transfer's kernel cannot start until the GEMM has finished.

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
from pallas_gemm import batching
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import heuristics
from pallas_gemm import sharding
from pallas_gemm.batching import GemmCall
from pallas_gemm.config import GemmProblem
from pallas_gemm.gemm import IMPLEMENTATIONS


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class Ring:
  """One ring over mesh axis `axis` of `size` devices, and the GEMM of its steps."""

  mesh: jax.sharding.AbstractMesh | jax.sharding.Mesh
  axis: str
  size: int
  call: GemmCall
  """The step GEMM: `out_dtype`, implementation, epilogue (activation) of the layer."""
  comm_sms: int

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
    return dataclasses.replace(call, config=dataclasses.replace(config, num_sms=sms))

  def gather(self, x, step):
    """[step(chunk) for each device's `x`], in ring order: at step s, device d holds
    device (d + s) % size's chunk, sent on before it is multiplied."""
    left = [(i, (i - 1) % self.size) for i in range(self.size)]
    results, chunks = [], []
    for s in range(self.size):
      following = lax.ppermute(x, self.axis, left) if s < self.size - 1 else None
      results.append(step(x))
      chunks.append(x)
      x = following
    return results, chunks

  def reduce(self, rows, partial):
    """Device d's chunk of sum over devices of partial(chunk) for each row chunk of `rows`
    (leading dim `size`): a partial sum travels right, each device adding its product."""
    right = [(i, (i + 1) % self.size) for i in range(self.size)]
    here = lax.axis_index(self.axis)
    acc = None
    for s in range(self.size):
      chunk = lax.dynamic_index_in_dim(rows, (here - s - 1) % self.size, keepdims=False)
      product = partial(chunk)
      acc = product if acc is None else acc + product.astype(acc.dtype)
      if s < self.size - 1:
        acc = lax.ppermute(acc, self.axis, right)
    return acc

  def device_order(self, chunks):
    """Ring-ordered chunks (list, or leading dim `size`) as rows in device order."""
    stacked = jnp.stack(chunks) if isinstance(chunks, list) else chunks
    order = (jnp.arange(self.size) - lax.axis_index(self.axis)) % self.size
    taken = jnp.take(stacked, order, axis=0)
    return taken.reshape(-1, *taken.shape[2:])

  def ring_order(self, rows):
    """Rows in device order as (size, rows / size, ...) chunks in this device's ring order."""
    chunks = rows.reshape(self.size, -1, *rows.shape[1:])
    order = (jnp.arange(self.size) + lax.axis_index(self.axis)) % self.size
    return jnp.take(chunks, order, axis=0)


def all_gather_matmul(
    x, w, bias=None, *, axis_name: str, activation=None, out_dtype=None,
    implementation: str | None = None, comm_sms: int = 0,
):  # fmt: skip
  """act(all_gather(x) @ w + bias) with the gather of x's rows hidden behind the GEMM.

  x: (M, K) with rows sharded over `axis_name`; w: (K, N) and bias (N,) with columns
  sharded over it (a column-parallel layer). Arrays on a mesh with Explicit axes (or
  under `jax.set_mesh`); others are resharded to these specs first. Returns (M, N)
  with columns sharded. See the module doc.
  """
  ring = _ring(x, w, bias, axis_name, activation, out_dtype, implementation, comm_sms)
  x = sharding.reshard(x, ((axis_name,), ()), ring.mesh)
  w = sharding.reshard(w, ((), (axis_name,)), ring.mesh)
  if bias is not None:
    bias = sharding.reshard(bias, ((axis_name,),), ring.mesh)
  return _all_gather_matmul(ring, x, w, bias)


def matmul_reduce_scatter(
    x, w, bias=None, *, axis_name: str, activation=None, out_dtype=None,
    implementation: str | None = None, comm_sms: int = 0,
):  # fmt: skip
  """act(reduce_scatter(x @ w) + bias), the scatter over rows hidden behind the GEMM.

  x: (M, K) with columns sharded over `axis_name`; w: (K, N) with rows sharded over it
  (a row-parallel layer); bias (N,) replicated. Returns (M, N) with rows sharded.
  See the module doc.
  """
  ring = _ring(x, w, bias, axis_name, activation, out_dtype, implementation, comm_sms)
  x = sharding.reshard(x, ((), (axis_name,)), ring.mesh)
  w = sharding.reshard(w, ((axis_name,), ()), ring.mesh)
  if bias is not None:
    bias = sharding.reshard(bias, ((),), ring.mesh)
  return _matmul_reduce_scatter(ring, x, w, bias)


def _ring(x, w, bias, axis_name, activation, out_dtype, implementation, comm_sms) -> Ring:
  """The checked arguments as a `Ring`."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  x, w = jnp.asarray(x), jnp.asarray(w)
  if x.ndim != 2 or w.ndim != 2:
    raise ValueError(f"x and w must be 2-D (M, K) and (K, N), got {x.shape} and {w.shape}")
  if x.shape[1] != w.shape[0]:
    raise ValueError(f"x's columns ({x.shape[1]}) must equal w's rows ({w.shape[0]})")
  if bias is not None and jnp.shape(bias) != (w.shape[1],):
    raise ValueError(f"bias must have shape ({w.shape[1]},), got {jnp.shape(bias)}")
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
  call = GemmCall(
      out_dtype=jnp.dtype(out_dtype or x.dtype).name,
      implementation=implementation,
      activation=epilogue_lib.activation_name(activation),
  )
  size = mesh.shape[axis_name]
  if x.shape[0] % size:
    raise ValueError(f"x's rows ({x.shape[0]}) must divide by the size of {axis_name!r} ({size})")
  return Ring(mesh, axis_name, size, call, comm_sms)


def _partial_dtype(call):
  """Partial sums travel in a 16-bit output's dtype (as XLA's reduce-scatter), else f32."""
  return call.out_dtype if jnp.dtype(call.out_dtype).itemsize == 2 else "float32"


def _epilogue_grad(call, pre, g, dtype):
  """d(pre) of the epilogue's activation given the output's cotangent, in `dtype`."""
  if pre is None:
    return g.astype(dtype)
  spec = epilogue_lib.EpilogueSpec(activation=call.activation)
  _, vjp = jax.vjp(lambda p: epilogue_lib.apply(spec, p), pre.astype(jnp.float32))
  return vjp(g.astype(jnp.float32))[0].astype(dtype)


# all_gather_matmul -------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _all_gather_matmul(ring, x, w, bias):
  return _ag_forward(ring, x, w, bias)[0]


def _ag_forward(ring, x, w, bias):
  """(out, pre or None, x's chunks in each device's ring order)."""
  a = ring.axis
  m, k = x.shape[0] // ring.size, x.shape[1]
  call = ring.step_call(
      dataclasses.replace(ring.call, return_pre=ring.call.nonlinear),
      m, w.shape[1] // ring.size, k, x.dtype, has_bias=bias is not None,
  )  # fmt: skip

  def local(x, w, *bias):
    step = lambda chunk: batching.gemm(call, chunk, w, bias=bias[0] if bias else None)
    results, chunks = ring.gather(x, step)
    if call.return_pre:
      out, pre = (ring.device_order([r[i] for r in results]) for i in (0, 1))
    else:
      out, pre = ring.device_order(results), jnp.zeros((0,), x.dtype)
    return out, pre, jnp.concatenate(chunks)

  specs = (P(a, None), P(None, a)) + ((P(a),) if bias is not None else ())
  pre_spec = P(None, a) if call.return_pre else P()
  out, pre, chunks = ring.shard_map(local, specs, (P(None, a), pre_spec, P(a, None)))(
      x, w, *(() if bias is None else (bias,))
  )
  return out, (pre if call.return_pre else None), chunks


def _ag_fwd(ring, x, w, bias):
  out, pre, chunks = _ag_forward(ring, x, w, bias)
  return out, (pre, chunks, w, bias)


def _ag_bwd(ring, saved, g):
  pre, chunks, w, bias = saved
  a = ring.axis
  dtype = w.dtype
  m, k, n_local = chunks.shape[0] // ring.size**2, w.shape[0], w.shape[1] // ring.size
  dx_call = ring.step_call(
      GemmCall(out_dtype=_partial_dtype(ring.call), implementation=ring.call.implementation,
               transpose_b=True),
      m, k, n_local, dtype,
  )  # fmt: skip
  dw_call = GemmCall(
      out_dtype=dtype.name, implementation=ring.call.implementation, transpose_a=True
  )

  def local(g, pre, chunks, w):
    d_acc = _epilogue_grad(ring.call, pre if ring.call.nonlinear else None, g, dtype)
    rows = d_acc.reshape(ring.size, m, n_local)
    dx = ring.reduce(rows, lambda chunk: batching.gemm(dx_call, chunk, w))
    dw = batching.gemm(dw_call, chunks, ring.ring_order(d_acc).reshape(-1, n_local))
    db = jnp.sum(d_acc, axis=0, dtype=jnp.float32).astype(dtype if bias is None else bias.dtype)
    return dx.astype(chunks.dtype), dw, db

  pre = jnp.zeros((0,), g.dtype) if pre is None else pre
  pre_spec = P(None, a) if ring.call.nonlinear else P()
  dx, dw, db = ring.shard_map(
      local, (P(None, a), pre_spec, P(a, None), P(None, a)), (P(a, None), P(None, a), P(a))
  )(g, pre, chunks, w)
  return dx, dw, None if bias is None else db


_all_gather_matmul.defvjp(_ag_fwd, _ag_bwd)


# matmul_reduce_scatter ---------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _matmul_reduce_scatter(ring, x, w, bias):
  return _rs_forward(ring, x, w, bias)[0]


def _rs_forward(ring, x, w, bias):
  """(out, pre or None): each device's rows of the summed products, with the epilogue."""
  a = ring.axis
  m, k_local, n = x.shape[0] // ring.size, x.shape[1] // ring.size, w.shape[1]
  product = GemmCall(out_dtype=_partial_dtype(ring.call), implementation=ring.call.implementation)
  product = ring.step_call(product, m, n, k_local, x.dtype)
  finish = dataclasses.replace(ring.call, return_pre=ring.call.nonlinear)

  def local(x, w, *bias):
    acc = ring.reduce(x.reshape(ring.size, m, k_local), lambda c: batching.gemm(product, c, w))
    y = batching.finish_epilogue(finish, acc.astype(jnp.float32), bias=bias[0] if bias else None)
    return y if finish.return_pre else (y, jnp.zeros((0,), x.dtype))

  specs = (P(None, a), P(a, None)) + ((P(),) if bias is not None else ())
  out, pre = ring.shard_map(local, specs, (P(a, None), P(a, None) if finish.return_pre else P()))(
      x, w, *(() if bias is None else (bias,))
  )
  return out, (pre if finish.return_pre else None)


def _rs_fwd(ring, x, w, bias):
  out, pre = _rs_forward(ring, x, w, bias)
  return out, (pre, x, w, bias)


def _rs_bwd(ring, saved, g):
  pre, x, w, bias = saved
  a = ring.axis
  dtype = w.dtype
  m, k_local, n = x.shape[0] // ring.size, w.shape[0] // ring.size, w.shape[1]
  dx_call = ring.step_call(
      GemmCall(out_dtype=x.dtype.name, implementation=ring.call.implementation, transpose_b=True),
      m, k_local, n, dtype,
  )  # fmt: skip
  dw_call = GemmCall(
      out_dtype=dtype.name, implementation=ring.call.implementation, transpose_a=True
  )

  def local(g, pre, x, w):
    d_acc = _epilogue_grad(ring.call, pre if ring.call.nonlinear else None, g, dtype)
    dx_chunks, d_chunks = ring.gather(d_acc, lambda chunk: batching.gemm(dx_call, chunk, w))
    dw = batching.gemm(dw_call, x, ring.device_order(d_chunks))
    db = lax.psum(jnp.sum(d_acc, axis=0, dtype=jnp.float32), a).astype(
        dtype if bias is None else bias.dtype
    )
    return ring.device_order(dx_chunks), dw, db

  pre = jnp.zeros((0,), g.dtype) if pre is None else pre
  pre_spec = P(a, None) if ring.call.nonlinear else P()
  dx, dw, db = ring.shard_map(
      local, (P(a, None), pre_spec, P(None, a), P(a, None)), (P(None, a), P(a, None), P())
  )(g, pre, x, w)
  return dx, dw, None if bias is None else db


_matmul_reduce_scatter.defvjp(_rs_fwd, _rs_bwd)
