"""The fused epilogue, in f32:

    pre = alpha * scales * acc + beta * c + bias[col] + row_bias[row]  (`affine`)
    y = clamp(act(pre) + residual, lo, hi)                            (`finish`)
    y = clamp(fn(pre, *operands), lo, hi)  (a user's `with_operands(fn, ...)` as the
                      activation: operands among residual, bias, row_bias, which then
                      leave `affine` and the residual add, and a runtime scalar)
    y = clamp(act(pre) * slope(residual), lo, hi)  (with `residual_slope`: the backward of
                      an activation whose pre-activation is the residual operand)
    y = min(max(y * out_scale, -fp8_max), fp8_max)  (fp8 outputs only, `quantize`)

`scales` are runtime multipliers (device values, not compiled in): a scalar,
a per-row and a per-column vector, already broadcast; `out_scale` is the
static `EpilogueSpec.out_scale` times an optional runtime scalar. The amax of
a scaled fp8 GEMM is taken between `compute` and `quantize`.

The same functions run inside the kernel (on a register tile) and in the XLA
reference path, so both compute exactly the same formula.

>>> import jax.numpy as jnp
>>> spec = EpilogueSpec(activation="relu", alpha=2.0)
>>> apply(spec, jnp.array([[1.0, -1.0]]), bias=jnp.array([[0.5, 0.5]]))
Array([[2.5, 0. ]], dtype=float32)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp

from pallas_gemm import operands


def _sigmoid(x):
  # 1 / (1 + e^-x): exp and divide lower in Mosaic GPU; lax.logistic does not.
  return 1.0 / (1.0 + jnp.exp(-x))


def _gelu_tanh(x):
  inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))
  return 0.5 * x * (1.0 + jnp.tanh(inner))


# Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7. Mosaic GPU's warpgroup lowering
# has no layout rule for math.erf, so erf is built from exp, abs and a select.
_ERF_P = 0.3275911
_ERF_COEFFS = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)


def _erf(x):
  ax = jnp.abs(x)
  t = 1.0 / (1.0 + _ERF_P * ax)
  poly = _ERF_COEFFS[0]
  for coeff in _ERF_COEFFS[1:]:
    poly = poly * t + coeff
  y = 1.0 - poly * t * jnp.exp(-ax * ax)
  return jnp.where(x < 0, -y, y)


def _gelu_exact(x):
  return 0.5 * x * (1.0 + _erf(x * (1.0 / math.sqrt(2.0))))


ACTIVATIONS = {
    "relu": lambda x: jnp.maximum(x, 0.0),
    "gelu_tanh": _gelu_tanh,
    "gelu_exact": _gelu_exact,
    "silu": lambda x: x * _sigmoid(x),
    "sigmoid": _sigmoid,
}
"""Activation name -> f32 function."""


ALIASES = {"gelu": "gelu_tanh", "swish": "silu"}
"""Other names users bring from jax.nn (`gelu` is the tanh form there, as here)."""


@dataclasses.dataclass(frozen=True)
class CustomActivation:
  """A user's elementwise function as the epilogue's activation: traced into the
  kernel's epilogue on f32 chunks (so it must use what Mosaic GPU lowers: arithmetic,
  exp, log, tanh, where, max/min; not `lax.logistic` or `erf`), and differentiated by
  jax in the backward. Equal (and compiled once) per function object: define it once,
  not as a fresh lambda per call.

  With `operands` (`with_operands(fn, ...)`), fn also takes GEMM operands by kind, in
  the order named: "residual" (a tile loaded beside the accumulator; fn's result then
  replaces act(pre) + residual), "bias" (a column vector) and "row_bias" (a row
  vector), each then left out of `affine` and handed to fn, broadcast to the tile, and
  "scalar" (the GEMM's `scalar=`, an f32 read from device memory, handed as it is).

  >>> act = CustomActivation(lambda x: x * x)
  >>> act.name, float(act(jnp.float32(3.0)))
  ('lambda', 9.0)
  """

  fn: Callable
  operands: tuple[str, ...] = ()

  def __call__(self, x, *operands):
    return self.fn(x, *operands)

  @property
  def name(self) -> str:
    """A label for kernel names and messages (the function's name, alphanumeric)."""
    raw = getattr(self.fn, "__name__", None) or type(self.fn).__name__
    return "".join(ch if ch.isalnum() else "_" for ch in raw).strip("_").lower() or "custom"


OPERAND_KINDS = {name: op.kind.name for name, op in operands.OPERANDS.items() if op.routable}
"""The GEMM operands a user's epilogue can take (`with_operands`), by kind
(`pallas_gemm.operands`)."""


def with_operands(fn, *operands: str) -> CustomActivation:
  """A user's epilogue `fn(pre, *operands)` of f32 tiles: pass it as `activation=` with
  those operands given to the GEMM. "residual" (a tile, loaded beside the accumulator):
  fn's result replaces act(pre) + residual; "bias" (N,) and "row_bias" (M,): left out
  of the affine part `pre` and handed to fn broadcast to the tile; "scalar" (the GEMM's
  `scalar=`, a runtime f32 such as a learned temperature): handed to fn as a 0-d array.
  Elementwise, in f32, from what Mosaic GPU lowers (as `CustomActivation`),
  differentiated by jax in every argument; define it once, not per call.

  >>> scale_gate = with_operands(lambda pre, g, s: pre * s / (1.0 + jnp.exp(-g)), "residual", "bias")
  >>> float(scale_gate(jnp.float32(2.0), jnp.float32(0.0), jnp.float32(3.0)))
  3.0
  """
  if not operands or len(set(operands)) != len(operands) or set(operands) - set(OPERAND_KINDS):
    raise ValueError(
        f"with_operands: operands must be distinct names of {sorted(OPERAND_KINDS)}, "
        f"got {operands!r}"
    )
  arguments = ", ".join(("pre",) + operands)
  _check_elementwise(
      fn,
      tuple((2, 3) if kind != "scalar" else () for kind in ("pre",) + operands),
      f"with_operands: {fn!r} must be an elementwise function of {1 + len(operands)} f32 "
      f"arrays ({arguments}); calling it so failed",
      f"with_operands: {fn!r} must be elementwise: f({arguments}) keeps their shape and "
      f"f32 dtype; (2, 3) f32 arrays gave",
  )
  return CustomActivation(fn, operands=tuple(operands))


def _check_elementwise(fn, shapes: tuple, call_failed: str, not_elementwise: str) -> None:
  """Raises a ValueError (the message given, then what happened) unless `fn` of f32
  arrays of `shapes` ((2, 3) tiles, () scalars) returns one (2, 3) f32 array."""
  probe = jax.ShapeDtypeStruct((2, 3), jnp.float32)
  try:
    out = jax.eval_shape(fn, *(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes))
  except Exception as e:  # noqa: BLE001 -- reported with the rule it breaks
    raise ValueError(f"{call_failed} ({type(e).__name__}: {e})") from e
  if getattr(out, "shape", None) != probe.shape or getattr(out, "dtype", None) != probe.dtype:
    raise ValueError(f"{not_elementwise} {out}")


def with_residual(fn) -> CustomActivation:
  """`with_operands(fn, "residual")`: y = fn(pre, residual) where the epilogue would
  compute act(pre) + residual.

  >>> gate = with_residual(lambda pre, g: pre * (1.0 / (1.0 + jnp.exp(-g))))
  >>> float(gate(jnp.float32(2.0), jnp.float32(0.0)))
  1.0
  """
  return with_operands(fn, "residual")


def routed_operands(activation) -> tuple[str, ...]:
  """The GEMM operands a user's epilogue takes (`with_operands`), else ()."""
  return activation.operands if isinstance(activation, CustomActivation) else ()


def activation_fn(activation) -> Callable:
  """The f32 function of an activation (a name of `ACTIVATIONS` or a `CustomActivation`).

  >>> float(activation_fn("relu")(jnp.float32(-2.0)))
  0.0
  """
  return activation if isinstance(activation, CustomActivation) else ACTIVATIONS[activation]


def activation_label(activation) -> str | None:
  """The activation's name in kernel names, tuning keys and messages (None: none).

  >>> activation_label("silu"), activation_label(CustomActivation(jnp.tanh))
  ('silu', 'tanh')
  """
  return activation.name if isinstance(activation, CustomActivation) else activation


def tuning_activation(activation) -> str | None:
  """The activation a tuned config is looked up under: a built-in's name; None (the
  plain GEMM's entry) for a custom one, which no table holds."""
  return None if isinstance(activation, CustomActivation) else activation


def activation_name(activation, argument: str = "activation", *, custom: bool = False):
  """The epilogue's name for `activation`: None, a name of `ACTIVATIONS` or `ALIASES`,
  or one of the jax.nn functions the epilogue implements (flax.nnx re-exports them):
  relu, gelu (either `approximate`, through `functools.partial`), silu/swish, sigmoid.
  With `custom` (the dense GEMM's `activation=`), any other callable becomes a
  `CustomActivation`; elsewhere only these are taken.

  >>> import functools, jax
  >>> activation_name("gelu"), activation_name(jax.nn.silu), activation_name(
  ...     functools.partial(jax.nn.gelu, approximate=False))
  ('gelu_tanh', 'silu', 'gelu_exact')
  >>> activation_name(jax.nn.tanh, custom=True).name   # any other elementwise function
  'tanh'
  >>> activation_name(jax.nn.tanh)  # doctest: +ELLIPSIS
  Traceback (most recent call last):
  ...
  ValueError: activation must be None, one of ['gelu', 'gelu_exact', 'gelu_tanh', 'relu', 'sigmoid', 'silu', 'swish'] or the jax.nn function of one, got <PjitFunction of <function tanh at ...>>
  """
  if activation is None or (custom and isinstance(activation, CustomActivation)):
    return activation
  if isinstance(activation, str) and activation in ACTIVATIONS:
    return activation
  if isinstance(activation, str) and activation in ALIASES:
    return ALIASES[activation]
  import functools

  fn, kwargs = activation, {}
  if isinstance(fn, functools.partial) and not fn.args:
    fn, kwargs = fn.func, dict(fn.keywords)
  functions = {
      jax.nn.relu: "relu",
      jax.nn.silu: "silu",
      jax.nn.swish: "silu",
      jax.nn.sigmoid: "sigmoid",
  }
  try:
    if fn in functions and not kwargs:
      return functions[fn]
    if fn is jax.nn.gelu and set(kwargs) <= {"approximate"}:
      return "gelu_tanh" if kwargs.get("approximate", True) else "gelu_exact"
  except TypeError:  # unhashable
    pass
  if custom and callable(activation):
    _check_elementwise(
        activation,
        ((2, 3),),
        f"{argument}: {activation!r} must be an elementwise function of one f32 array; "
        "calling it on one failed",
        f"{argument}: {activation!r} must be elementwise: f(x) keeps x's shape and f32 "
        "dtype; a (2, 3) f32 array gave",
    )
    return CustomActivation(activation)
  names = sorted([*ACTIVATIONS, *ALIASES])
  allowed = f"None, one of {names}" + (
      ", the jax.nn function of one, or an elementwise function of an f32 array"
      if custom
      else " or the jax.nn function of one"
  )
  raise ValueError(f"{argument} must be {allowed}, got {activation!r}")


def combine_row_lse(parts):
  """log sum_j exp(y[r, j]) of each row r from per-column-tile parts: `parts[..., j, 0, r]`
  the max m_j of row r over column tile j, `parts[..., j, 1, r]` the sum of exp(y - m_j)
  there (the kernel's `row_lse` output); f32 (..., rows).

  >>> y = jnp.array([[1.0, 2.0, 3.0, 4.0]])
  >>> m = jnp.array([2.0, 4.0]); s = jnp.array([1 + jnp.exp(-1.0), 1 + jnp.exp(-1.0)])
  >>> parts = jnp.stack([m, s], axis=1)[:, :, None]  # 2 tiles of 2 columns, 1 row
  >>> bool(jnp.allclose(combine_row_lse(parts), jax.nn.logsumexp(y, axis=1)))
  True
  """
  maxima, sums = parts[..., 0, :], parts[..., 1, :]
  top = jnp.max(maxima, axis=-2)
  return top + jnp.log(jnp.sum(sums * jnp.exp(maxima - top[..., None, :]), axis=-2))


def abs_max(x):
  """max |x| (f32) that propagates NaN on every backend: the max runs on the bits of |x|,
  which order like |x| and put NaN above Inf (XLA's CPU max, and the GPU's float max
  instruction, return the other operand of a NaN).

  >>> float(abs_max(jnp.array([1.0, -3.0]))), float(abs_max(jnp.array([1.0, jnp.nan, jnp.inf])))
  (3.0, nan)
  """
  bits = jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.int32)
  # initial=0: an empty array's amax is 0 (nothing to scale), not an error
  return jax.lax.bitcast_convert_type(jnp.max(bits & jnp.int32(0x7FFFFFFF), initial=0), jnp.float32)


def block_abs_max(x, axis):
  """max |x| (f32) over `axis`, propagating NaN like `abs_max`.

  >>> block_abs_max(jnp.array([[1.0, -3.0], [jnp.nan, 2.0]]), axis=1).tolist()
  [3.0, nan]
  """
  bits = jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.int32)
  return jax.lax.bitcast_convert_type(jnp.max(bits & jnp.int32(0x7FFFFFFF), axis=axis), jnp.float32)


def _gelu_tanh_slope(x):
  c = math.sqrt(2.0 / math.pi)
  t = jnp.tanh(c * (x + 0.044715 * (x * x * x)))
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (c * (1.0 + 3 * 0.044715 * (x * x)))


def _gelu_exact_slope(x):
  return 0.5 * (1.0 + _erf(x * (1.0 / math.sqrt(2.0)))) + x * (
      jnp.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
  )


def _silu_slope(x):
  s = _sigmoid(x)
  return s * (1.0 + x * (1.0 - s))


def _sigmoid_slope(x):
  s = _sigmoid(x)
  return s * (1.0 - s)


def _relu_slope(x):
  return jnp.where(x > 0, 1.0, jnp.where(x < 0, 0.0, 0.5))  # jax's tie rule


ACTIVATION_SLOPES = {
    "relu": _relu_slope,
    "gelu_tanh": _gelu_tanh_slope,
    "gelu_exact": _gelu_exact_slope,
    "silu": _silu_slope,
    "sigmoid": _sigmoid_slope,
}
"""Activation name -> its derivative, in closed form (f32): what the fused backward
pass (`pallas_gemm.dpre`) multiplies the cotangent by. Mosaic GPU cannot lower the
`add_any` that autodiff of the activations produces.

>>> import jax
>>> x = jnp.linspace(-3.0, 3.0, 7)
>>> all(bool(jnp.allclose(ACTIVATION_SLOPES[name](x), jax.vmap(jax.grad(ACTIVATIONS[name]))(x),
...                       atol=2e-6)) for name in ACTIVATIONS)
True
"""


@dataclasses.dataclass(frozen=True)
class EpilogueSpec:
  """Static description of the epilogue (hashable)."""

  activation: str | CustomActivation | None = None
  alpha: float = 1.0
  beta: float = 0.0
  clamp_lo: float | None = None
  clamp_hi: float | None = None
  out_scale: float = 1.0
  """Multiplies the result before an fp8 cast (the output's quantization scale)."""
  saturate: float | None = None
  """The largest finite value of an fp8 output dtype; the result is clamped to
  +-saturate before the cast (None for non-fp8 outputs)."""
  residual_slope: str | None = None
  """An activation name: the residual operand is that activation's input, and the
  result is multiplied by the activation's derivative there instead of adding the
  residual (dPre = dY @ W^T * act'(pre): the backward of a fused MLP)."""
  gated: bool = False
  """A gated linear unit: the accumulator holds gate and up columns side by side,
  and the result is act(gate pre) * (up pre) (`gated`); `activation` is the gate's."""

  gated_slope: str | None = None
  """An activation name: the residual operands are a gated unit's (gate, up)
  pre-activations and the result is the cotangent of the gate's, y * up * act'(gate)
  (`finish`); the kernel's second output is the up's, y * act(gate) (`up_cotangent`)."""

  def __post_init__(self):
    for name in ("activation", "residual_slope", "gated_slope"):
      value = getattr(self, name)
      if name == "activation" and isinstance(value, CustomActivation):
        continue
      if value is not None and value not in ACTIVATIONS:
        raise ValueError(f"{name} must be None or one of {sorted(ACTIVATIONS)}, got {value!r}")


def apply(spec: EpilogueSpec, acc, *, c=None, residual=None, scales=(), out_scale=None, **vectors):
  """The formula of the module docstring in f32: `quantize(compute(...))`."""
  y = compute(spec, acc, c=c, residual=residual, scales=scales, **vectors)
  return quantize(spec, y, out_scale)


def compute(spec: EpilogueSpec, acc, *, c=None, residual=None, scales=(), scalar=None, **vectors):
  """The epilogue up to the clamp, in f32 (`finish(affine(...))`); arrays already broadcast.

  >>> import jax.numpy as jnp
  >>> compute(EpilogueSpec(), jnp.ones((1, 2)), scales=(jnp.float32(3), jnp.array([[1.0, 2.0]])))
  Array([[3., 6.]], dtype=float32)
  """
  pre = affine(spec, acc, c=c, scales=scales, **vectors)
  return finish(spec, pre, residual=residual, scalar=scalar, **vectors)


def _addends(vectors) -> dict:
  """The addend vectors given by name (`operands.ADDENDS`: bias, row_bias), checked."""
  unknown = sorted(set(vectors) - set(operands.ADDENDS))
  if unknown:
    raise TypeError(f"the epilogue takes the vectors {list(operands.ADDENDS)}, got {unknown}")
  return vectors


def affine(spec: EpilogueSpec, acc, *, c=None, scales=(), **vectors):
  """The part before the activation, in f32: alpha * scales * acc + beta * c + the addend
  vectors (`bias`, `row_bias`: `operands.ADDENDS`, already broadcast), less those a
  user's epilogue takes.

  >>> import jax.numpy as jnp
  >>> affine(EpilogueSpec(alpha=2.0), jnp.array([[1.0, -1.0]]), bias=jnp.array([[0.5, 0.5]]))
  Array([[ 2.5, -1.5]], dtype=float32)
  """
  vectors = _addends(vectors)
  y = acc.astype(jnp.float32)
  if spec.alpha != 1.0:
    y = y * jnp.float32(spec.alpha)
  for scale in scales:
    y = y * scale
  if c is not None and spec.beta != 0.0:
    y = y + jnp.float32(spec.beta) * c.astype(jnp.float32)
  routed = routed_operands(spec.activation)  # handed to a user's epilogue instead
  for name in operands.ADDENDS:
    if vectors.get(name) is not None and name not in routed:
      y = y + vectors[name].astype(jnp.float32)
  return y


def finish(spec: EpilogueSpec, pre, *, residual=None, scalar=None, **vectors):
  """From the activation to the clamp, in f32, given `pre = affine(...)`; the addend
  vectors (broadcast) and `scalar` are read only by a user's epilogue that takes them.

  >>> import jax.numpy as jnp
  >>> finish(EpilogueSpec(activation="relu"), jnp.array([[2.5, -1.5]]))
  Array([[2.5, 0. ]], dtype=float32)
  >>> finish(EpilogueSpec(residual_slope="relu"), jnp.array([[2.5, 1.5]]),
  ...        residual=jnp.array([[1.0, -1.0]]))
  Array([[2.5, 0. ]], dtype=float32)
  """
  y = pre.astype(jnp.float32)
  routed = routed_operands(spec.activation)
  if routed:  # a user's fn(pre, *operands); with the residual, it replaces act + residual
    given = dict(_addends(vectors), residual=residual, scalar=scalar)
    missing = [name for name in routed if given.get(name) is None]
    if missing:
      raise ValueError(
          f"activation={spec.activation.name} (with_operands) needs the operands "
          f"{missing}; this GEMM has none"
      )
    y = spec.activation(y, *(given[name].astype(jnp.float32) for name in routed))
    residual = None if "residual" in routed else residual
  elif spec.activation is not None:
    y = activation_fn(spec.activation)(y)
  if spec.gated_slope is not None:
    gate, up = (r.astype(jnp.float32) for r in residual)
    y = y * up * ACTIVATION_SLOPES[spec.gated_slope](gate)
  elif residual is not None and spec.residual_slope is not None:
    y = y * ACTIVATION_SLOPES[spec.residual_slope](residual.astype(jnp.float32))
  elif residual is not None:
    y = y + residual.astype(jnp.float32)
  if spec.clamp_lo is not None:
    y = jnp.maximum(y, jnp.float32(spec.clamp_lo))
  if spec.clamp_hi is not None:
    y = jnp.minimum(y, jnp.float32(spec.clamp_hi))
  return y


def up_cotangent(spec: EpilogueSpec, y, *, gate):
  """With `gated_slope`: the up pre-activation's cotangent, y * act(gate), in f32.

  >>> import jax.numpy as jnp
  >>> up_cotangent(EpilogueSpec(gated_slope="relu"), jnp.array([[2.0, 2.0]]),
  ...              gate=jnp.array([[3.0, -1.0]]))
  Array([[6., 0.]], dtype=float32)
  """
  return y.astype(jnp.float32) * ACTIVATIONS[spec.gated_slope](gate.astype(jnp.float32))


def gated(spec: EpilogueSpec, gate_pre, up_pre):
  """A gated linear unit's output from its two pre-activations (f32): act(gate) * up,
  then the clamp.

  >>> import jax.numpy as jnp
  >>> gated(EpilogueSpec(activation="relu", gated=True), jnp.array([[2.0, -1.0]]),
  ...       jnp.array([[3.0, 5.0]]))
  Array([[6., 0.]], dtype=float32)
  """
  gate = gate_pre.astype(jnp.float32)
  if spec.activation is not None:
    gate = activation_fn(spec.activation)(gate)
  return finish(dataclasses.replace(spec, activation=None), gate * up_pre.astype(jnp.float32))


def quantize(spec: EpilogueSpec, y, out_scale=None):
  """fp8 outputs: `y * spec.out_scale * out_scale` (a runtime scalar, or None),
  saturated at +-spec.saturate; other outputs: `y` unchanged.

  >>> import jax.numpy as jnp
  >>> quantize(EpilogueSpec(saturate=448.0), jnp.array([1.0, 300.0]), jnp.float32(2))
  Array([  2., 448.], dtype=float32)
  """
  if spec.saturate is None:
    return y
  if spec.out_scale != 1.0:
    y = y * jnp.float32(spec.out_scale)
  if out_scale is not None:
    y = y * out_scale
  return jnp.minimum(jnp.maximum(y, jnp.float32(-spec.saturate)), jnp.float32(spec.saturate))
