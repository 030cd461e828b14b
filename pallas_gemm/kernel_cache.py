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
key, is the same either way. The entry also records the kernel's output types,
so that process does not trace the kernel's body either: the primitive carries a
`Deferred` stand-in, traced only if something asks for the body (NOTES exp. 133).

`launch(fn, static, args)` calls `fn(*args, **static)` through a primitive
whose CUDA lowering consults the store. The entry's name is a hash of what
decides the lowering: the package's source, jax's version, the device, the
kernel function, its static arguments and the operand types. The stored call
names its operands as indices into the entry's arguments (any order, repeats
allowed). A kernel whose lowering is more than one custom call on those
arguments (XLA ops around it), a static argument without a stable `repr`,
another platform or no cache dir: lowered as usual, nothing stored.

>>> import jax, jax.numpy as jnp
>>> double = lambda x, *, k: x * k
>>> float(jax.jit(lambda x: launch(double, {"k": 2.0}, (x,)))(jnp.ones(())))
2.0
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import importlib
import json
import os
import pathlib
import tempfile
import types
from typing import Callable

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core
from jax.interpreters import batching, mlir

from pallas_gemm import _compat
from pallas_gemm import compile_ahead
from pallas_gemm import lowering_pool

SUBDIR = "pallas_gemm_kernels"

kernel_p = jex_core.Primitive("pallas_gemm_kernel")
kernel_p.multiple_results = True


def launch(
    fn,
    static: dict,
    args: tuple,
    kwargs: dict | None = None,
    *,
    lower_ahead=False,
    storable=True,
):
  """`fn(*args, **kwargs, **static)` through `kernel_p` (arrays or None in args, kwargs).

  `lower_ahead=True` (a Mosaic GPU kernel): a kernel not lowered yet is handed to
  `lowering_pool` now, to be lowered while the rest of the program is traced.
  `storable=False`: always lowered where it is called (its lowering depends on more
  than the key holds), never stored.
  """
  kwargs = kwargs or {}
  flat, tree = jax.tree.flatten((args, kwargs))
  avals = [jax.typeof(x) for x in flat]
  key = entry_key(fn, static, tree, avals) if storable else None
  deferred = _deferred(key, fn, static, tree, avals)
  if deferred is not None:  # lowered before: its outputs are known, its body untraced
    outs = kernel_p.bind(*flat, jaxpr=deferred, key=key)
    return _rebuild(deferred.out_tree, outs)
  closed, out_shape = jax.make_jaxpr(_flat_fn(fn, static, tree), return_shape=True)(*flat)
  if key is not None:
    _signatures[key] = _signature(closed, out_shape)
  if lower_ahead and key is not None:
    _lower_ahead(key, fn, static, tree, avals, closed)
  outs = kernel_p.bind(*flat, jaxpr=closed, key=key)
  return jax.tree.unflatten(jax.tree.structure(out_shape), outs)


class Deferred:
  """A stored kernel's stand-in for its jaxpr: the output types the store recorded, and
  the body traced only if something asks for it (running it eagerly, vmap, lowering it
  again for another platform). A warm start then neither traces nor lowers the kernel.
  Equal (and hashed) by the entry key, which fixes the body."""

  def __init__(self, key, fn, static, tree, avals, out_avals, out_tree):
    self.key, self.out_avals, self.out_tree = key, out_avals, out_tree
    self._trace = lambda: jax.make_jaxpr(_flat_fn(fn, static, tree))(*avals)
    self._closed = None

  @property
  def effects(self):
    return set()  # only kernels without effects are deferred (`_signature`)

  @property
  def closed(self):
    if self._closed is None:
      self._closed = self._trace()
    return self._closed

  def __eq__(self, other):
    return isinstance(other, Deferred) and other.key == self.key

  def __hash__(self):
    return hash(self.key)

  def __repr__(self):
    return f"Deferred({self.key[:12]})"


def _closed(jaxpr):
  """The ClosedJaxpr of a kernel_p `jaxpr` parameter (traced now if deferred)."""
  return jaxpr.closed if isinstance(jaxpr, Deferred) else jaxpr


def _signature(closed, out_shape) -> dict | None:
  """What a warm start needs to skip tracing a kernel: its output types and their
  pytree ("leaf", or a tuple/list of leaves), if it has no effects; else None."""
  if closed.effects:
    return None
  leaves, structure = jax.tree.flatten(out_shape)
  if structure == jax.tree.structure(0):
    form = "leaf"
  elif structure == jax.tree.structure(tuple(leaves)):
    form = "tuple"
  elif structure == jax.tree.structure(list(leaves)):
    form = "list"
  else:
    return None
  avals = [[list(a.shape), str(a.dtype), bool(a.weak_type)] for a in closed.out_avals]
  return {"out_tree": form, "out_avals": avals}


_OUT_FORMS = {"leaf": lambda outs: outs[0], "tuple": tuple, "list": list}
"""How a deferred kernel's flat outputs are put back in its pytree, by `_signature`'s form."""


def _rebuild(form: str, outs):
  return _OUT_FORMS[form](outs)


def _deferred(key, fn, static, tree, avals) -> Deferred | None:
  """A `Deferred` for a kernel whose entry (this process's, or the store's) records its
  outputs, or None."""
  if key is None:
    return None
  entry = _lowered.get(key) or _read(key)
  if not entry or "out_avals" not in entry or entry.get("out_tree") not in _OUT_FORMS:
    return None
  try:
    out_avals = [
        jax.core.ShapedArray(tuple(shape), jnp.dtype(dtype), weak_type=weak)
        for shape, dtype, weak in entry["out_avals"]
    ]
  except (TypeError, ValueError):
    return None
  _lowered[key] = entry
  return Deferred(key, fn, static, tree, avals, out_avals, entry["out_tree"])


def _flat_fn(fn, static, tree):
  def flat_fn(*leaves):
    a, kw = jax.tree.unflatten(tree, leaves)
    return fn(*a, **kw, **static)

  return flat_fn


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
  return jex_core.jaxpr_as_fun(_closed(jaxpr))(*args)


def _batch(args, dims, *, jaxpr, key):
  del key
  in_axes = list(dims)  # None: not batched
  outs = jax.vmap(jex_core.jaxpr_as_fun(_closed(jaxpr)), in_axes=in_axes)(*args)
  return outs, [0] * len(outs)


batching.primitive_batchers[kernel_p] = _batch


def lower_kernel(ctx, args, jaxpr):
  """The kernel's own lowering (Pallas's), inlined where it is called."""
  return mlir.lower_fun(jex_core.jaxpr_as_fun(_closed(jaxpr)), multiple_results=True)(ctx, *args)


def _lower(ctx, *args, jaxpr, key):
  if key is None or tuple(ctx.module_context.platforms) != ("cuda",):
    return lower_kernel(ctx, args, jaxpr)
  stored = _lowered.get(key) or _read(key)
  if stored is None and (stored := _from_pool(key)) is not None:
    _store(key, stored)  # the next process emits this very call: jax's cache then hits
  if stored is not None:
    try:
      flat = _flat(args)
      op = mlir.ir.Operation.create(
          "stablehlo.custom_call",
          results=[mlir.ir.Type.parse(t) for t in stored["results"]],
          operands=[
              flat[i] if isinstance(i, int) else _emit_constant(i) for i in stored["operands"]
          ],
          attributes={k: mlir.ir.Attribute.parse(v) for k, v in stored["attributes"].items()},
      )
      _lowered[key] = stored
      return [op.results[i] for i in stored["outs"]]
    except (ValueError, KeyError, TypeError, IndexError):
      pass  # unreadable: lower it
  outs = lower_kernel(ctx, args, jaxpr)
  stored = _single_custom_call(outs, _flat(args))
  if stored is not None:
    _store(key, stored)
    _compile_ahead(key, _closed(jaxpr), ctx.avals_in)
  return outs


def _store(key: str, stored: dict) -> None:
  if _signatures.get(key) and "out_avals" not in stored:
    stored = {**stored, **_signatures[key]}
  _lowered[key] = stored
  if (directory := store_dir()) is not None:
    _write(directory / f"{key}.json", stored)


_lowered: dict[str, dict] = {}
"""This process's lowerings by entry key: a kernel lowered for one program is emitted
again in the next one without a store dir."""

_pending: dict[str, concurrent.futures.Future] = {}
"""Lowerings handed to `lowering_pool`, by entry key."""

_signatures: dict[str, dict] = {}
"""Output types and pytree form of the kernels traced in this process, by entry key:
stored beside their lowerings (`_signature`), so a later launch need not trace them."""


def forget() -> None:
  """Forgets this process's lowerings, as a fresh process would not have them (the
  store on disk stays). For tests and benchmarks."""
  _lowered.clear()
  _pending.clear()
  _signatures.clear()
  compile_ahead.forget()


def _read(key: str) -> dict | None:
  directory = store_dir()
  if directory is None:
    return None
  try:
    return json.loads((directory / f"{key}.json").read_text())
  except (OSError, ValueError):
    return None


def _lower_ahead(key, fn, static, tree, avals, closed) -> None:
  if key in _lowered or key in _pending:
    return
  directory = store_dir()
  if directory is not None and (directory / f"{key}.json").exists():
    return
  name = f"{fn.__module__}.{fn.__qualname__}"
  ref = (fn.__module__, name) if _kernels.get(name) is fn else fn
  job = (ref, static, tree, [(a.shape, a.dtype, a.weak_type) for a in avals], key)
  future = lowering_pool.run(
      lower_job, (*job, _compat.device_sm_count(), jax.config.jax_enable_x64)
  )
  if future is not None:
    _pending[key] = future
    future.add_done_callback(functools.partial(_lowered_by_pool, key, closed, avals))


def _lowered_by_pool(key, closed, avals, future) -> None:
  """A worker's lowering as soon as it arrives: stored, and compiled ahead."""
  if future.cancelled() or future.exception() is not None or future.result() is None:
    return
  _store(key, future.result())
  _compile_ahead(key, closed, avals)


def _compile_ahead(key, closed, avals) -> None:
  """Has `compile_ahead` compile a program of this one kernel (its stored custom call),
  so that Mosaic GPU finds it compiled when the program around it is compiled."""
  specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
  program = jax.jit(lambda *leaves: kernel_p.bind(*leaves, jaxpr=closed, key=key))
  compile_ahead.submit(key, lambda: program.lower(*specs).compile())


def _from_pool(key: str) -> dict | None:
  future = _pending.pop(key, None)
  if future is None or future.cancel():  # not started: quicker to lower it here
    return None
  try:
    return future.result(timeout=lowering_pool.TIMEOUT_S)
  except concurrent.futures.TimeoutError:
    return None


def register(fn):
  """Names `fn` for lowering workers: a kernel function that its module rebinds (to a
  `jax.jit` of it, say) cannot be pickled by reference; the worker imports the module
  and finds it here."""
  _kernels[f"{fn.__module__}.{fn.__qualname__}"] = fn
  return fn


_kernels: dict[str, Callable] = {}


def lower_job(fn, static, tree, avals, key, sm_count, x64) -> dict | None:
  """A lowering worker's job: the custom call of `fn(**static)` on `avals` (shape,
  dtype, weak type) lowered for CUDA as `_lower` would store it, or None. `fn` may be
  a registered kernel's (module, dotted name)."""
  if isinstance(fn, tuple):
    module, name = fn
    importlib.import_module(module)
    fn = _kernels[name]
  _compat.target_sm_count(sm_count)
  jax.config.update("jax_enable_x64", x64)
  specs = [jax.ShapeDtypeStruct(s, d, weak_type=w) for s, d, w in avals]
  closed = jax.make_jaxpr(_flat_fn(fn, static, tree))(*specs)
  call = jax.jit(lambda *leaves: kernel_p.bind(*leaves, jaxpr=closed, key=key))
  jax.export.export(call, platforms=["cuda"])(*specs)
  return _lowered.get(key)


mlir.register_lowering(kernel_p, _lower)


def _flat(values) -> list:
  """The ir.Values of a lowering rule's arguments or results (each one value or a tuple)."""
  flat = []
  for v in values:
    flat.extend(v if isinstance(v, (list, tuple)) else [v])
  return flat


def _single_custom_call(outs, operands) -> dict | None:
  """The result types and attributes (as text) of the one custom call that makes `outs`
  from the entry's `operands`, or None when the lowering is anything else. Each operand
  of the call is one of `operands` (in any order and any number of times: a launcher may
  pass an argument again where an operand is absent), stored as its index, or a constant
  the lowering made (as the zeroed semaphores of a stream-K kernel: `_constant`).
  The call may have results besides `outs` (a stream-K kernel's workspace, its
  semaphores): "outs" lists which of its results `outs` are.

  >>> _single_custom_call([], []) is None
  True
  """
  outs = _flat(outs)
  if not outs:
    return None
  op = getattr(outs[0].owner, "operation", outs[0].owner)
  if getattr(op, "name", None) != "stablehlo.custom_call":
    return None
  results = list(op.results)
  if any(value not in results for value in outs):
    return None
  arguments, stored_operands = list(operands), []
  for value in op.operands:
    if value in arguments:
      stored_operands.append(arguments.index(value))
    elif (constant := _constant(value)) is not None:
      stored_operands.append(constant)
    else:
      return None
  return {
      "results": [str(v.type) for v in results],
      "outs": [results.index(value) for value in outs],
      "operands": stored_operands,
      "attributes": {name: str(op.attributes[name]) for name in op.attributes},
  }


def _constant(value) -> dict | None:
  """A lowering's constant operand as text: a `stablehlo.constant`, or one broadcast by
  `stablehlo.broadcast_in_dim` (each op: its result type and attributes); else None."""
  chain = []
  while True:
    op = getattr(value.owner, "operation", value.owner)
    name = getattr(op, "name", None)
    if name not in ("stablehlo.constant", "stablehlo.broadcast_in_dim") or len(chain) > 1:
      return None
    chain.append(
        {
            "op": name,
            "type": str(value.type),
            "attributes": {a: str(op.attributes[a]) for a in op.attributes},
        }
    )
    if name == "stablehlo.constant":
      return {"constant": chain[::-1]}
    if len(op.operands) != 1:
      return None
    value = op.operands[0]


def _emit_constant(recipe: dict):
  """The ir.Value of a `_constant` recipe, built at the current insertion point."""
  value = None
  for spec in recipe["constant"]:
    op = mlir.ir.Operation.create(
        spec["op"],
        results=[mlir.ir.Type.parse(spec["type"])],
        operands=[] if value is None else [value],
        attributes={k: mlir.ir.Attribute.parse(v) for k, v in spec["attributes"].items()},
    )
    value = op.results[0]
  return value


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
