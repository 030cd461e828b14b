"""A custom derivative's tangent map as a primitive: forward mode evaluates it, reverse
mode transposes it with a hand-written backward.

`jax.custom_vjp` gives a function its own backward but no forward mode (`jax.jvp`,
`jacfwd`, `hessian` fail); `jax.custom_jvp` gives every mode, but jax then derives
the backward by transposing the jvp's linear part, which must be made of
primitives jax can transpose: a Pallas kernel is not one. Here the jvp's linear
part is one primitive, `tangent_map_p`, bound to a `TangentRule`:

  rule.forward(residuals, tangents)     the outputs' tangents, from differentiable ops
                                        (evaluates forward mode; its own jvp is
                                        jax's jvp of it: higher orders)
  rule.backward(residuals, cts, wanted) the cotangents of the tangents `wanted`
                                        flags, from the outputs' `cts`: the
                                        hand-written backward (reverse mode)

Under `jax.grad` the primitive never runs: the jvp rule's primal part runs the
kernels forward, the linearization keeps `residuals` (what the backward reads),
and transposition calls `rule.backward`, as a custom_vjp's backward would be.
Under `vmap` the primitive stays one primitive: its operands carry their batch
dims first, one level per vmap, and both functions are vmapped over them when
they run (a tangent that is shared across a level gets its cotangent summed over
it, as jax does for a custom_vjp's backward).

>>> import dataclasses, jax, jax.numpy as jnp
>>> @dataclasses.dataclass(frozen=True)
... class Scale:                      # y = r * x, linear in x
...   def forward(self, residuals, tangents):
...     return [residuals[0] * tangents[0]]
...   def backward(self, residuals, cts, wanted):
...     return [residuals[0] * cts[0]]
>>> @jax.custom_jvp
... def scale(r, x):
...   return r * x
>>> @scale.defjvp
... def _(primals, tangents):
...   r, x = primals
...   out = scale(r, x)
...   return out, apply(Scale(), [r], [tangents[1]], [jax.typeof(out)])[0]
>>> x = jnp.float32(2.0)
>>> float(jax.jvp(lambda x: scale(3.0, x), (x,), (x,))[1]), float(jax.grad(scale, 1)(3.0, x))
(6.0, 3.0)
>>> float(jax.vmap(jax.grad(scale, 1), (None, 0))(3.0, jnp.ones(4)).sum())
12.0
"""

from __future__ import annotations

from typing import Protocol, Sequence

import jax
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir
import jax.numpy as jnp

from pallas_gemm import _compat


class TangentRule(Protocol):
  """The two halves of a linear tangent map (hashable: a primitive parameter)."""

  def forward(self, residuals: list, tangents: list) -> list:
    """The outputs' tangents, linear in `tangents`, from differentiable jax ops."""

  def backward(self, residuals: list, cts: list, wanted: list[bool]) -> list:
    """The cotangent of each tangent `wanted` flags (None elsewhere), given the
    outputs' cotangents `cts`."""


tangent_map_p = jex_core.Primitive("pallas_gemm_tangent_map")
tangent_map_p.multiple_results = True


def apply(rule: TangentRule, residuals: Sequence, tangents: Sequence, out_avals: Sequence):
  """`rule`'s tangents of outputs typed `out_avals` (`jax.typeof` of the primal
  outputs): what a `custom_jvp` rule returns as the outputs' tangents."""
  return tangent_map_p.bind(
      *residuals,
      *tangents,
      rule=rule,
      num_residuals=len(residuals),
      out_avals=tuple(out_avals),
      levels=(),
  )


def _split(args, num_residuals):
  return list(args[:num_residuals]), list(args[num_residuals:])


def _vmapped(fn, levels, out_summed=None):
  """`fn(*args)` vmapped over the leading dims `levels` describe (outermost first;
  per level, which arguments are batched there). `out_summed(level)`: per output,
  whether to sum it over that level instead of keeping the batch dim."""
  for depth, batched in reversed(list(enumerate(levels))):
    in_axes = [0 if flag else None for flag in batched]

    def level_fn(*args, fn=fn, in_axes=in_axes, depth=depth):
      outs = jax.vmap(fn, in_axes=in_axes)(*args)
      if out_summed is None:
        return outs
      return [
          None if out is None else jnp.sum(out, axis=0) if summed else out
          for out, summed in zip(outs, out_summed(depth))
      ]

    fn = level_fn
  return fn


@tangent_map_p.def_impl
def _impl(*args, rule, num_residuals, out_avals, levels):
  del out_avals
  forward = lambda *args: list(rule.forward(*_split(args, num_residuals)))
  return _vmapped(forward, levels)(*args)


@tangent_map_p.def_abstract_eval
def _abstract_eval(*avals, rule, num_residuals, out_avals, levels):
  del avals, rule, num_residuals, levels
  return list(out_avals)


mlir.register_lowering(tangent_map_p, mlir.lower_fun(_impl, multiple_results=True))


def _jvp(primals, tangents, **params):
  """Higher orders: jax's jvp of `rule.forward`, itself made of differentiable ops."""
  tangents = [ad.instantiate_zeros(t) for t in tangents]
  return jax.jvp(lambda *args: _impl(*args, **params), list(primals), tangents)


ad.primitive_jvps[tangent_map_p] = _jvp


def _transpose(cts, *args, rule, num_residuals, out_avals, levels):
  residuals, tangents = _split(args, num_residuals)
  if any(ad.is_undefined_primal(r) for r in residuals):
    raise NotImplementedError("tangent_map: residuals must be known when transposing")
  if all(type(ct) is ad.Zero for ct in cts):
    return [None] * len(args)
  cts = [ad.instantiate_zeros(ct) for ct in cts]
  wanted = [ad.is_undefined_primal(t) for t in tangents]
  backward = lambda *xs: list(rule.backward(xs[:num_residuals], xs[num_residuals:], wanted))
  # the outputs are batched at every level; a tangent unbatched at a level (a shared
  # operand) gets its cotangent summed over that level's batch
  levels_with_cts = tuple(batched[:num_residuals] + (True,) * len(out_avals) for batched in levels)
  summed = lambda depth: [not flag for flag in levels[depth][num_residuals:]]
  grads = _vmapped(backward, levels_with_cts, summed)(*residuals, *cts)
  return [None] * num_residuals + [g if want else None for g, want in zip(grads, wanted)]


ad.primitive_transposes[tangent_map_p] = _transpose


def _batch(args, dims, *, rule, num_residuals, out_avals, levels):
  size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
  moved = [x if d is None else jnp.moveaxis(x, d, 0) for x, d in zip(args, dims)]
  batched = tuple(d is not None for d in dims)
  outs = tangent_map_p.bind(
      *moved,
      rule=rule,
      num_residuals=num_residuals,
      out_avals=tuple(_compat.with_leading_dim(aval, size) for aval in out_avals),
      levels=(batched,) + levels,
  )
  return outs, [0] * len(outs)


batching.primitive_batchers[tangent_map_p] = _batch
