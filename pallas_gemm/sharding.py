"""The GEMM on sharded arrays: the kernel runs per shard inside `shard_map`.

A Mosaic kernel is an opaque custom call that XLA's partitioner cannot split,
and under meshes with Explicit axes (the default of `jax.make_mesh`) a bare
kernel call is rejected outright. So when an operand's type carries a
sharding over Explicit mesh axes, `gemm` reads the specs from the types,
runs the kernel on the local blocks, and `psum`s over the mesh axes that
shard the contracting dimension:

  batch and M follow A, N follows B, K follows A (or B where A's K is not
  sharded); an operand sharded otherwise is resharded first, and a mesh axis
  claimed by two roles keeps the first (batch, M, N, K).

With a sharded K the epilogue (biases, c, activation, ...) does not commute
with the sum of partial products, so each shard computes `alpha * op(a) @ op(b)`
(in the output dtype if it has 16 bits, as XLA's sharded dot sums; else f32), the
sum is taken, and the epilogue runs in XLA on it in f32, still per shard.

Arrays on meshes with Auto axes carry no sharding in their types inside
`jax.jit`; for them `gemm` runs the kernel on the global arrays and leaves
the partitioning to XLA (correct; the XLA implementation is partitioned,
the kernel is not).

>>> import jax, jax.numpy as jnp
>>> from pallas_gemm.batching import GemmCall
>>> call = GemmCall(out_dtype="float32", implementation="xla")
>>> gemm(call, jnp.ones((4, 3), jnp.bfloat16), jnp.ones((3, 2), jnp.bfloat16)).tolist()
[[3.0, 3.0], [3.0, 3.0], [3.0, 3.0], [3.0, 3.0]]
"""

from __future__ import annotations

import dataclasses

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from pallas_gemm import _compat
from pallas_gemm import batching
from pallas_gemm.batching import GemmCall
from pallas_gemm.operands import OPERANDS


def gemm(call: GemmCall, a, b, **operands):
  """`batching.gemm`, per shard when the operands live on a mesh with Explicit axes: each
  epilogue operand partitioned as its kind lines up with the output (`Kind.partition`; a
  scalar replicated)."""
  mesh = explicit_mesh(a, b, *operands.values())
  if mesh is None:
    return batching.gemm(call, a, b, **operands)
  plan = _Plan.of(call, a, b)
  arrays = {name: x for name, x in {"a": a, "b": b, **operands}.items() if x is not None}
  specs = {"a": plan.a, "b": plan.b}
  specs.update(
      (name, OPERANDS[name].kind.partition(plan.out, x.ndim))
      for name, x in arrays.items()
      if name in OPERANDS
  )

  def local(*values):
    kw = dict(zip(arrays, values))
    a, b = kw.pop("a"), kw.pop("b")
    if not plan.k:
      return batching.gemm(call, a, b, **kw)
    kw = {name: OPERANDS[name].kind.broadcastable(x) for name, x in kw.items()}
    acc = lax.psum(batching.gemm(_partial_product(call), a, b), plan.k)
    return batching.finish_epilogue(call, acc.astype(jnp.float32), **kw)

  sharded = jax.shard_map(
      local,
      mesh=mesh,
      in_specs=tuple(partition_spec(specs[name]) for name in arrays),
      out_specs=(partition_spec(plan.out),) * 2 if call.return_pre else partition_spec(plan.out),
      check_vma=False,
  )
  return jax.jit(sharded)(*(reshard(x, specs[name], mesh) for name, x in arrays.items()))


def _partial_product(call):
  """The per-shard product of a sharded K: f32, or a 16-bit output's dtype, in which the
  partial sums then travel (half the bytes of f32; XLA's sharded dot does the same). Two
  H100s, 16384x8192x2048 row-parallel: 4.82 ms with f32 partials, XLA 2.44 (NOTES exp. 65)."""
  product = call.product()
  if jnp.dtype(call.out_dtype).itemsize == 2:
    product = dataclasses.replace(product, out_dtype=jnp.dtype(call.out_dtype).name)
  return product


def explicit_mesh(*arrays):
  """The mesh with Explicit axes the arrays (or the current mesh context) live on, or None."""
  meshes = [jax.typeof(x).sharding.mesh for x in arrays if x is not None]
  for mesh in (*meshes, jax.sharding.get_abstract_mesh()):
    if any(kind == AxisType.Explicit for kind in mesh.axis_types):
      return mesh
  return None


def concrete_mesh(mesh):
  """`mesh` with its devices: itself if it has them, else `jax.set_mesh`'s mesh of that
  shape, else the first `mesh.size` devices in row-major order (the order Mosaic GPU's
  collective kernels require: they address peers by device id).

  >>> m = jax.sharding.AbstractMesh((1,), ("d",))
  >>> concrete_mesh(m).devices.ravel().tolist() == jax.devices()[:1]
  True
  """
  if isinstance(mesh, jax.sharding.Mesh):
    return mesh
  current = _compat.concrete_mesh_context()
  if current is not None and current.abstract_mesh == mesh:
    return current
  devices = jax.devices()
  if mesh.size > len(devices):
    raise ValueError(f"the mesh {mesh} needs {mesh.size} devices; this process has {len(devices)}")
  return jax.sharding.Mesh(
      np.array(devices[: mesh.size]).reshape(mesh.axis_sizes),
      mesh.axis_names,
      axis_types=mesh.axis_types,
  )


def reshard(x, spec, mesh=None):
  """`x` with per-dim `spec` (tuples of mesh axis names) on `mesh` (default: x's own).

  A no-op where x already has it, or where spec is None.
  """
  if spec is None or _spec(x) == tuple(spec):
    return x
  mesh = mesh or explicit_mesh(x)
  return jax.sharding.reshard(x, NamedSharding(mesh, partition_spec(spec)))


def explicit_spec(x):
  """x's per-dim spec if it lives on a mesh with Explicit axes (else None), for `reshard`."""
  return None if explicit_mesh(x) is None else _spec(x)


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Per-dim specs (tuples of mesh axis names, () = replicated) of one sharded GEMM."""

  a: tuple
  b: tuple
  out: tuple
  n: tuple
  k: tuple

  @classmethod
  def of(cls, call, a, b):
    sa, sb = _spec(a), _spec(b)
    batch_a, batch_b = sa[:-2], sb[:-2]
    if batch_a and batch_b:
      batch = tuple(x or y for x, y in zip(batch_a, batch_b))
    else:
      batch = batch_a or batch_b
    m, k_a = sa[-2:][::-1] if call.transpose_a else sa[-2:]
    k_b, n = sb[-2:][::-1] if call.transpose_b else sb[-2:]
    used = set()
    roles = []
    for entry in (*batch, m, n, k_a or k_b):
      entry = tuple(axis for axis in entry if axis not in used)
      used.update(entry)
      roles.append(entry)
    *batch, m, n, k = roles
    a_spec = (*batch[: len(batch_a)], *((k, m) if call.transpose_a else (m, k)))
    b_spec = (*batch[: len(batch_b)], *((n, k) if call.transpose_b else (k, n)))
    return cls(a=a_spec, b=b_spec, out=(*batch, m, n), n=n, k=k)


def _spec(x):
  """x's sharding as one tuple of mesh axis names per dim."""
  spec = tuple(jax.typeof(x).sharding.spec)
  spec += (None,) * (x.ndim - len(spec))
  return tuple(() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec)


def partition_spec(spec):
  """The `PartitionSpec` of a per-dim spec (tuples of mesh axis names, () = replicated)."""
  return P(*(None if not e else e[0] if len(e) == 1 else e for e in spec))
