"""Each distinct kernel is traced, lowered and compiled once per program.

A Pallas call is lowered where it is called: its body is traced, turned into
a Mosaic GPU module and serialized into the custom call at every call site,
and the serialized module carries the call site's source locations, so XLA
then compiles every copy again. A model with 16 identical GEMMs paid 16
lowerings and 16 compilations (issue 15: 5.5 s + 7.6 s against 0.3 s + 0.6 s).

`kernel_entry` makes a kernel launcher a `jax.jit` function whose static
arguments (problem, config, epilogue, interpret parameters: everything that
decides the kernel) are its cache key. jax's trace cache then returns the
same jaxpr for every call with the same static arguments and operand types,
and the lowering of the enclosing program emits one private function for it
that every call site calls: one kernel per distinct kernel in the module,
however many call sites, forward and backward. The jit is inlined by XLA, so
nothing changes at run time. Inside it the kernel goes through
`kernel_cache.launch`: a kernel lowered by an earlier process (where jax's
persistent compilation cache is on) or an earlier program is not lowered
again, and a new one is lowered by `lowering_pool`'s helper processes while
the rest of the program is traced.

>>> import jax, jax.numpy as jnp
>>> traces = []
>>> @kernel_entry(static_argnames=("scale",))
... def scaled(x, *, scale):
...   traces.append(scale)
...   return x * scale
>>> f = lambda x: scaled(scaled(x, scale=2.0), scale=2.0) + scaled(x, scale=3.0)
>>> float(jax.jit(f)(jnp.ones(())))
7.0
>>> traces   # three call sites, two distinct kernels
[2.0, 3.0]
"""

from __future__ import annotations

import functools
from typing import Callable, Iterable

import jax

from pallas_gemm import _compat
from pallas_gemm import kernel_cache
from pallas_gemm import kernel_trace


def kernel_entry(
    fn: Callable | None = None,
    *,
    static_argnames: Iterable[str],
    mesh_dependent: Iterable[str] = (),
):
  """`fn` as a `jax.jit` function keyed on `static_argnames` (hashable values).

  Every other argument must be an array or None; pass the static ones by keyword.
  Usable as `@kernel_entry(static_argnames=...)`. `mesh_dependent`: static arguments
  that, when set, make the kernel talk to other devices; its lowering then names their
  ids (from the enclosing `shard_map`'s mesh), so it is lowered in place, never by the
  lowering pool nor from the kernel store (`kernel_cache`), whose keys hold no mesh.
  """
  if fn is None:
    return functools.partial(
        kernel_entry, static_argnames=static_argnames, mesh_dependent=mesh_dependent
    )
  static_argnames = tuple(static_argnames)
  mesh_dependent = tuple(mesh_dependent)
  kernel_cache.register(fn)

  @functools.wraps(fn)
  def entry(*args, **kwargs):
    static = {name: kwargs.pop(name) for name in static_argnames if name in kwargs}
    mosaic = static.get("interpret") is None
    if mosaic:  # the real kernel: never on another GPU
      _compat.require_hopper(f"{fn.__module__}.{fn.__name__} (implementation='pallas')")
    # A traced kernel (`kernel_trace.tracing`) carries the profiler, which the store's
    # keys and the lowering pool's processes know nothing of: lowered in place.
    storable = not any(static.get(name) for name in mesh_dependent) and not kernel_trace.active()
    return kernel_cache.launch(
        fn, static, args, kwargs, lower_ahead=mosaic and storable, storable=storable
    )

  return jax.jit(entry, static_argnames=static_argnames)


def module_kernel_count(lowered_text: str, target: str = "mosaic_gpu") -> int:
  """How many custom calls of `target` a lowered (StableHLO) module's text contains.

  >>> module_kernel_count('stablehlo.custom_call @mosaic_gpu_v2(%0) ...')
  1
  """
  return sum(
      1
      for line in lowered_text.splitlines()
      if "stablehlo.custom_call" in line and f"@{target}" in line
  )


def named_body(name: str, body: Callable, **static) -> Callable:
  """`body` with `static` bound, called `name`: the kernel's symbol in profiles
  (a bare `functools.partial(_kernel, ...)` would show every kernel as `_kernel`).

  >>> named_body("pallas_gemm_demo", lambda x, *, k: x + k, k=1).__name__
  'pallas_gemm_demo'
  """

  def bound(*refs):
    return body(*refs, **static)

  bound.__name__ = bound.__qualname__ = name
  return bound
