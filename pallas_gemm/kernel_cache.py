"""Lowered kernels kept on disk beside jax's persistent compilation cache.

jax's persistent cache keeps compiled executables, but it finds them by the
lowered program, so a warm start still lowers every Pallas kernel first:
~0.3 s per distinct kernel (Mosaic GPU's layout inference and MLIR lowering
in Python), 5-9 s for a decoder's 15-18 kernels against XLA's 1-1.5 s warm
start (NOTES exp. 46). Where jax's persistent cache is on
(`jax_compilation_cache_dir`), this module stores each kernel's lowering,
the Mosaic GPU custom call with its serialized module, under
`<cache dir>/pallas_gemm_kernels/`, and the next process emits that custom
call instead of lowering the kernel again. The program, and so jax's cache
key, is the same either way.

`launch(fn, static, args)` calls `fn(*args, **static)` through a primitive
whose CUDA lowering consults the store. The entry's name is a hash of what
decides the lowering: the package's source, jax's version, the device, the
kernel function, its static arguments and the operand types. A kernel whose
lowering is more than one custom call of its operands, a static argument
without a stable `repr`, another platform or no cache dir: lowered as usual,
nothing stored.

>>> import jax, jax.numpy as jnp
>>> double = lambda x, *, k: x * k
>>> float(jax.jit(lambda x: launch(double, {"k": 2.0}, (x,)))(jnp.ones(())))
2.0
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import tempfile
import types

import jax
from jax.extend import core as jex_core
from jax.interpreters import batching, mlir

SUBDIR = "pallas_gemm_kernels"

kernel_p = jex_core.Primitive("pallas_gemm_kernel")
kernel_p.multiple_results = True


def launch(fn, static: dict, args: tuple, kwargs: dict | None = None):
  """`fn(*args, **kwargs, **static)` through `kernel_p` (arrays or None in args, kwargs)."""
  kwargs = kwargs or {}
  flat, tree = jax.tree.flatten((args, kwargs))

  def flat_fn(*leaves):
    a, kw = jax.tree.unflatten(tree, leaves)
    return fn(*a, **kw, **static)

  closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*flat)
  outs = kernel_p.bind(
      *flat, jaxpr=closed, key=entry_key(fn, static, tree, [jax.typeof(x) for x in flat])
  )
  return jax.tree.unflatten(jax.tree.structure(out_shape), outs)


def entry_key(fn, static: dict, tree, avals) -> str | None:
  """The store's file name for this kernel, or None when a static argument has no
  stable text (an object address in it would never hit)."""
  static_text = repr(sorted((k, _stable(v)) for k, v in static.items()))
  if " at 0x" in static_text:
    return None
  device = jax.devices()[0]
  parts = (
      source_hash(),
      jax.__version__,
      device.device_kind,
      str(getattr(device, "core_count", "")),
      f"{fn.__module__}.{fn.__qualname__}",
      static_text,
      str(tree),
      str(avals),
  )
  return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _stable(value):
  """A module-level function as its dotted name (its repr holds an address)."""
  if isinstance(value, types.FunctionType) and "<" not in value.__qualname__:
    return f"{value.__module__}.{value.__qualname__}"
  return value


@functools.cache
def source_hash() -> str:
  """A hash of the `pallas_gemm` and `layouts` sources: a change to any kernel code
  makes every stored lowering a miss."""
  root = pathlib.Path(__file__).resolve().parent.parent
  h = hashlib.sha256()
  for package in ("pallas_gemm", "layouts"):
    for path in sorted((root / package).glob("**/*.py")):
      h.update(path.relative_to(root).as_posix().encode())
      h.update(path.read_bytes())
  return h.hexdigest()


def store_dir() -> pathlib.Path | None:
  """Where lowerings live: beside jax's persistent cache, or None when it is off."""
  cache_dir = jax.config.jax_compilation_cache_dir
  if not cache_dir or not jax.config.jax_enable_compilation_cache:
    return None
  return pathlib.Path(cache_dir) / SUBDIR


@kernel_p.def_effectful_abstract_eval
def _abstract_eval(*avals, jaxpr, key):
  del avals, key
  return jaxpr.out_avals, jaxpr.effects


@kernel_p.def_impl
def _impl(*args, jaxpr, key):
  del key
  return jex_core.jaxpr_as_fun(jaxpr)(*args)


def _batch(args, dims, *, jaxpr, key):
  del key
  in_axes = [None if d is batching.not_mapped else d for d in dims]
  outs = jax.vmap(jex_core.jaxpr_as_fun(jaxpr), in_axes=in_axes)(*args)
  return outs, [0] * len(outs)


batching.primitive_batchers[kernel_p] = _batch


def lower_kernel(ctx, args, jaxpr):
  """The kernel's own lowering (Pallas's), inlined where it is called."""
  return mlir.lower_fun(jex_core.jaxpr_as_fun(jaxpr), multiple_results=True)(ctx, *args)


def _lower(ctx, *args, jaxpr, key):
  directory = store_dir()
  if key is None or directory is None or tuple(ctx.module_context.platforms) != ("cuda",):
    return lower_kernel(ctx, args, jaxpr)
  path = directory / f"{key}.json"
  try:
    stored = json.loads(path.read_text())
    op = mlir.ir.Operation.create(
        "stablehlo.custom_call",
        results=[mlir.ir.Type.parse(t) for t in stored["results"]],
        operands=_flat(args),
        attributes={k: mlir.ir.Attribute.parse(v) for k, v in stored["attributes"].items()},
    )
    return list(op.results)
  except (OSError, ValueError, KeyError, TypeError):
    pass  # not stored, or unreadable: lower it
  outs = lower_kernel(ctx, args, jaxpr)
  stored = _single_custom_call(outs, _flat(args))
  if stored is not None:
    _write(path, stored)
  return outs


mlir.register_lowering(kernel_p, _lower)


def _flat(values) -> list:
  """The ir.Values of a lowering rule's arguments or results (each one value or a tuple)."""
  flat = []
  for v in values:
    flat.extend(v if isinstance(v, (list, tuple)) else [v])
  return flat


def _single_custom_call(outs, operands) -> dict | None:
  """The result types and attributes (as text) of the one custom call that takes
  `operands` and makes `outs`, or None when the lowering is anything else."""
  outs = _flat(outs)
  if not outs:
    return None
  op = getattr(outs[0].owner, "operation", outs[0].owner)
  if getattr(op, "name", None) != "stablehlo.custom_call":
    return None
  if list(op.results) != outs or list(op.operands) != list(operands):
    return None
  return {
      "results": [str(v.type) for v in outs],
      "attributes": {name: str(op.attributes[name]) for name in op.attributes},
  }


def _write(path: pathlib.Path, content: dict) -> None:
  """Atomically (a concurrent reader sees the old file or the new one); failures ignored:
  the store is an optimization."""
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
      json.dump(content, f)
    os.replace(tmp, path)
  except OSError:
    pass
