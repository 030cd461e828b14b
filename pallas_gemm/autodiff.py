"""`matmul`, differentiable in every mode: a `jax.custom_jvp` around the kernel whose
tangent map (`pallas_gemm.tangent_map`) reverse mode transposes with the backward below.

    y = clamp(act(alpha * op(a) @ op(b) + beta * c + bias + row_bias) + residual)

Forward under differentiation. An affine epilogue (no activation, no clamp)
is the kernel with everything fused, and the residuals are inputs only: `a`
(for dB) and `b` (for dA), each saved only if that gradient was requested.
With an activation or a clamp, the kernel's epilogue writes both y and the
affine part `pre = alpha * op(a) @ op(b) + beta * c + bias + row_bias` in
`out_dtype` (`return_pre`: one more TMA store per tile, no elementwise pass),
and `pre` is saved beside the inputs (plus `residual` when there is a clamp):
the derivative of gelu or silu cannot be had from their output.

Forward mode (`jax.jvp`, `jacfwd`): y' = d tail(pre') with pre' = alpha * (op(a') @
op(b) + op(a) @ op(b')) + beta * c' + bias' + row_bias', the two GEMMs the same
kernel (f32 out), the tail's derivative XLA's (`_GemmTangent.forward`).

Backward (`g` = cotangent of y):
  dPre = g * act'(pre) * [lo < y < hi]
                 XLA, one elementwise pass (the kernel has no prologue to fuse
                 it into), which also casts to the operand dtype; no pass at
                 all for an affine epilogue when g has the operand dtype.
  dA, dB         the same kernel with transpose flags instead of transposed
                 copies: d op(a) = alpha * dPre @ op(b)^T is an NT problem for
                 an NN forward, d op(b) = alpha * op(a)^T @ dPre a TN one; alpha
                 fused, f32 accumulation, output in the operand dtype whatever
                 `out_dtype` was (bf16 operands: bf16 GEMMs even after an f32
                 forward output).
  dbias, drow_bias, dc = beta * dPre, dresidual
                 XLA reductions, accumulated in f32, over what each broadcast
                 over; they read dPre in the operand dtype (as XLA's own bf16
                 autodiff does), so the f32 dPre is never written to memory.
A shared 2-D operand's gradient folds the batch into the contraction where
the layout allows (dB of an untransposed A) and otherwise sums an f32
batched GEMM.

Gradients nobody asked for are skipped (`symbolic_zeros=True`: only the perturbed
operands enter the tangent map): frozen weights cost no dB GEMM, inputs no dA. The
residuals are inputs, or `pre`, which the forward kernel writes beside y, so
under `jax.checkpoint` the backward recomputes `pre` and nothing else
(tests/test_autodiff.py counts the kernels).

Higher orders (a gradient of a gradient, `jax.hessian`): the backward's GEMMs
and the forward's are `_matmul` again, and the fused dPre pass has XLA's
derivative (`_dpre_jvp`). Not differentiable: fp8 operands or outputs (raises
NotImplementedError; fp8 training needs scaled e5m2 gradients).

>>> import jax, jax.numpy as jnp
>>> a = jnp.ones((4, 3), jnp.bfloat16); b = jnp.ones((3, 2), jnp.bfloat16)
>>> loss = lambda a, b: matmul(a, b, activation="relu", implementation="xla").sum()
>>> jax.grad(loss, argnums=1)(a, b).tolist()
[[4.0, 4.0], [4.0, 4.0], [4.0, 4.0]]
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers

import jax
from jax.custom_derivatives import SymbolicZero
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import batching
from pallas_gemm import dpre
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import sharding
from pallas_gemm import tangent_map
from pallas_gemm.batching import GemmCall
from pallas_gemm.config import FP8_DTYPES, GemmConfig
from pallas_gemm.gemm import IMPLEMENTATIONS, check_flags, check_real
from pallas_gemm.operands import COLUMN, OPERANDS as EPILOGUE_OPERANDS, PUBLIC, TILE


def matmul(
    a,
    b,
    *,
    transpose_a=False,
    transpose_b=False,
    bias=None,
    activation=None,
    c=None,
    alpha=1.0,
    beta=0.0,
    out_dtype=None,
    config: GemmConfig | None = None,
    implementation: str | None = None,
    autotune: bool | None = None,
    row_bias=None,
    residual=None,
    clamp=None,
    out_scale=None,
    scalar=None,
):
  """`pallas_gemm.gemm.gemm` (the kernel entry; same arguments, same result), differentiable.

  Adds derivatives in a, b, bias, c, row_bias, residual and scalar, in every mode
  (`jax.grad`, `jax.jvp`, `jax.jacfwd`, `jax.hessian`; see the module doc), vmap onto
  the kernel's batch dimension (`batching`), and operands sharded over Explicit mesh
  axes (`sharding`). With `implementation="xla"` (the default off Hopper) and the
  output in the operands' dtype it is XLA's ops throughout, as `lax.dot_general`.

  >>> import jax.numpy as jnp
  >>> a = jnp.ones((2, 3), jnp.bfloat16); b = jnp.ones((2, 4), jnp.bfloat16)
  >>> matmul(a, b, transpose_a=True, implementation="xla").shape
  (3, 4)
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  for name, value in (("alpha", alpha), ("beta", beta)):
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
      raise TypeError(
          f"{name} must be a Python number (it is compiled into the kernel), "
          f"got {type(value).__name__}"
      )
  activation = epilogue_lib.activation_name(activation, custom=True)
  check_flags(transpose_a=transpose_a, transpose_b=transpose_b)
  check_real(bias=bias, c=c, row_bias=row_bias, residual=residual, scalar=scalar)
  if implementation is None:
    implementation = "auto" if _compat.on_hopper() else "xla"
  a, b = jnp.asarray(a), jnp.asarray(b)
  given = dict(bias=bias, c=c, row_bias=row_bias, residual=residual, scalar=scalar)
  given = {name: None if x is None else jnp.asarray(x) for name, x in given.items()}
  if out_dtype is None:
    out_dtype = jnp.bfloat16 if a.dtype.name in FP8_DTYPES else a.dtype
  call = GemmCall(
      out_dtype=jnp.dtype(out_dtype).name,
      implementation=implementation,
      transpose_a=bool(transpose_a),
      transpose_b=bool(transpose_b),
      activation=activation,
      alpha=float(alpha),
      beta=float(beta),
      out_scale=out_scale,
      config=config,
      clamp=tuple(clamp) if isinstance(clamp, list) else clamp,
      autotune=autotune,
  )
  operands = (a, b, *(given[name] for name in PUBLIC))
  if (
      implementation == "xla"
      and call.out_dtype == a.dtype.name == b.dtype.name not in FP8_DTYPES
      and sharding.explicit_mesh(*operands) is None
  ):
    # XLA's ops all the way: every transformation jax has (jvp, jacfwd, grad of grad,
    # hessian, vmap) applies as it does to `lax.dot_general`. Not for a wider output than
    # the operands: jax's own backward would then multiply in the output's precision,
    # where the tangent map keeps the operands' (16-bit GEMMs accumulating in f32).
    return batching.run(call, *operands)
  return _matmul(call, *operands)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _matmul(call, a, b, *operands):
  return sharding.gemm(call, a, b, **dict(zip(PUBLIC, operands)))


OPERANDS = ("a", "b", *PUBLIC)
"""`_matmul`'s differentiable operands, in order: a, b, then the epilogue's
(`operands.PUBLIC`)."""

TAIL = tuple(name for name in PUBLIC if EPILOGUE_OPERANDS[name].routable)
"""The operands the epilogue's tail (after `pre`) may read: those a user's epilogue can
take, and the residual."""


def _linear(call, x, y):
  """`_matmul` of `call` without epilogue operands."""
  return _matmul(call, x, y, *(None,) * len(PUBLIC))


@dataclasses.dataclass(frozen=True)
class _Grad:
  """Shape, dtype and (Explicit-mesh) sharding a requested gradient must have."""

  shape: tuple[int, ...]
  dtype: str
  spec: tuple | None
  varying: frozenset = frozenset()
  """Inside `shard_map`: the manual axes the primal varies along."""

  @classmethod
  def of(cls, x):
    return cls(x.shape, x.dtype.name, sharding.explicit_spec(x), _compat.varying_axes(x))


@dataclasses.dataclass(frozen=True)
class _Wanted:
  """The gradients the backward computes (None: not requested), and the operand dtype."""

  grads: tuple[_Grad | None, ...]
  """Per operand of `OPERANDS`, in order."""
  operand_dtype: str

  def __getitem__(self, name) -> _Grad | None:
    return self.grads[OPERANDS.index(name)]

  @property
  def a(self) -> _Grad | None:
    return self["a"]

  @property
  def b(self) -> _Grad | None:
    return self["b"]

  @property
  def names(self) -> tuple[str, ...]:
    """The operands whose gradients (tangents) are wanted, in `OPERANDS` order."""
    return tuple(name for name in OPERANDS if self[name] is not None)

  def only(self, names) -> _Wanted:
    """These wants, less the operands outside `names`."""
    grads = tuple(g if n in names else None for n, g in zip(OPERANDS, self.grads))
    return dataclasses.replace(self, grads=grads)


def _jvp(call, primals, tangents):
  a = primals[0]
  wanted = _Wanted(
      tuple(
          None if t is None or isinstance(t, SymbolicZero) else _Grad.of(x)
          for x, t in zip(primals, tangents)
      ),
      operand_dtype=a.dtype.name,
  )
  out, saved = _forward(call, wanted, *primals)
  outs = out if call.return_pre else (out,)
  rule = _GemmTangent(call, wanted, tuple(x is not None for x in saved), outs[0].shape)
  given = [t for t, name in zip(tangents, OPERANDS) if name in wanted.names]
  residuals = [x for x in saved if x is not None]
  out_dots = tangent_map.apply(rule, residuals, given, [jax.typeof(x) for x in outs])
  return out, tuple(out_dots) if call.return_pre else out_dots[0]


_matmul.defjvp(_jvp, symbolic_zeros=True)


def _forward(call, wanted, a, b, *operands):
  """`_matmul`'s output (y, or (y, pre) for `call.return_pre`) and what the tangent
  map reads: (a, b, pre, then the `TAIL` operands), each None unless a wanted tangent
  needs it. The GEMM is `_matmul`'s own, so that a jvp rule running under another
  differentiation (a gradient of a gradient) is differentiated in turn."""
  if {a.dtype.name, b.dtype.name, call.out_dtype}.intersection(FP8_DTYPES):
    raise NotImplementedError(
        f"pallas_gemm.matmul is not differentiable with fp8 operands or outputs "
        f"({a.dtype} x {b.dtype} -> {call.out_dtype}): fp8 training needs scaled e5m2 "
        f"gradients; differentiate a bf16 model, or stop_gradient the fp8 GEMM"
    )
  if call.nonlinear:
    y, pre = _matmul(dataclasses.replace(call, return_pre=True), a, b, *operands)
  else:
    pre, y = None, _matmul(call, a, b, *operands)
  given = dict(zip(PUBLIC, operands))
  saved = (a if wanted.b else None, b if wanted.a else None, pre) + tuple(
      given[name] if _in_tail(call, name) else None for name in TAIL
  )
  return ((y, pre) if call.return_pre else y), saved


def _in_tail(call, name) -> bool:
  """Whether the tail (after `pre`) reads operand `name`: a user's epilogue takes it, or
  it is the residual under a clamp."""
  routed = epilogue_lib.routed_operands(call.activation)
  return name in routed or (name == "residual" and call.clamp is not None)


@dataclasses.dataclass(frozen=True)
class _GemmTangent:
  """`_matmul`'s tangent map (a `tangent_map.TangentRule`): y' (and pre' for
  `call.return_pre`) from the wanted operands' tangents, forward; their cotangents
  from the outputs', backward (`_bwd`)."""

  call: GemmCall
  wanted: _Wanted
  saved: tuple[bool, ...]
  """Which of `_forward`'s (a, b, pre, *TAIL) are residuals."""
  out_shape: tuple[int, ...]

  def _unpack(self, residuals):
    given = iter(residuals)
    a, b, pre, *tail = [next(given) if kept else None for kept in self.saved]
    return a, b, pre, dict(zip(TAIL, tail))

  def forward(self, residuals, tangents):
    """y' = d tail(pre', tail operands'), pre' = alpha * (op(a') @ op(b) + op(a) @
    op(b')) + beta * c' + the addends' tangents: the GEMMs are `_matmul`'s own (kernels,
    and differentiable again for higher orders), the rest XLA's."""
    call = self.call
    a, b, pre, tail = self._unpack(residuals)
    dot = dict(zip(self.wanted.names, tangents))
    product = lambda x, y: _linear(call.product(), x, y)
    f32 = lambda x: x.astype(jnp.float32)
    pre_dot = jnp.zeros(self.out_shape, jnp.float32)
    if "a" in dot:
      pre_dot = pre_dot + product(dot["a"], b)
    if "b" in dot:
      pre_dot = pre_dot + product(a, dot["b"])
    for name in PUBLIC:  # the addends' tangents enter pre' (unless the tail reads them)
      operand = EPILOGUE_OPERANDS[name]
      if name in dot and operand.role == "scaled addend":
        pre_dot = pre_dot + call.beta * f32(dot[name])
      elif name in dot and operand.role == "addend" and not _in_tail(call, name):
        pre_dot = pre_dot + f32(operand.kind.broadcastable(dot[name]))
    if pre is None:  # affine: y' = pre' + residual'
      y_dot = pre_dot + f32(dot["residual"]) if "residual" in dot else pre_dot
      return [y_dot.astype(call.out_dtype)]
    tail = {name: x for name, x in tail.items() if x is not None}
    tail_dot = {name: dot[name] if name in dot else jnp.zeros_like(x) for name, x in tail.items()}
    _, y_dot = jax.jvp(functools.partial(_tail, call), (f32(pre), tail), (pre_dot, tail_dot))
    if "residual" in dot and "residual" not in tail:  # added after the epilogue's tail
      y_dot = y_dot + f32(dot["residual"])
    outs = [y_dot, pre_dot] if call.return_pre else [y_dot]
    return [x.astype(call.out_dtype) for x in outs]

  def backward(self, residuals, cts, wanted):
    asked = [name for name, want in zip(self.wanted.names, wanted) if want]
    grads = dict(
        zip(OPERANDS, _bwd(self.call, self._unpack(residuals), self.wanted.only(asked), *cts))
    )
    return [grads[name] if want else None for name, want in zip(self.wanted.names, wanted)]


def _bwd(call, saved, wanted, g, g_pre=None):
  """The wanted operands' cotangents (in `OPERANDS` order, None where not wanted) from
  y's, `g` (and pre's, `g_pre`, for `call.return_pre`: a gradient of a gradient
  differentiates the forward's pre). Each epilogue operand's is its kind's reduction
  (`Kind.cotangent`) of what it was added to, or the tail's vjp where the tail reads it."""
  a, b, pre, tail = saved
  tail = {name: x for name, x in tail.items() if x is not None}
  grads = {}  # the epilogue operands' cotangents known before the GEMMs
  if pre is None:
    d_affine = g
  elif g_pre is None and _fuses_dpre(call, pre, g, wanted):
    d_affine, grads["bias"] = fused_dpre(call, pre, g)
  else:
    _, tail_vjp = jax.vjp(functools.partial(_tail, call), pre, tail)
    d_affine, grads = tail_vjp(g.astype(jnp.float32))
    grads = dict(grads)
  if "residual" not in tail:  # added after the tail: its cotangent is y's
    grads["residual"] = g
  if g_pre is not None:
    d_affine = d_affine + g_pre.astype(jnp.float32)
  # Everything below reads dPre in the operand dtype (the reductions accumulate in f32),
  # so the f32 dPre never has to exist in memory: one elementwise pass writes d_acc.
  d_acc = d_affine.astype(wanted.operand_dtype)
  result = [
      wanted.a and _grad_a(call, d_acc, b, wanted.a),
      wanted.b and _grad_b(call, d_acc, a, wanted.b),
  ]
  for name in PUBLIC:
    want, operand = wanted[name], EPILOGUE_OPERANDS[name]
    if not want:
      result.append(None)
      continue
    if name in grads:  # the tail's vjp (or the fused pass, or y's for the residual)
      grad = grads[name]
      grad = operand.kind.cotangent(grad, want.shape) if operand.kind is TILE else grad
    elif operand.kind is COLUMN:  # a streaming GEMV, faster than XLA's column reduction
      grad = column_sums(call, d_acc)
    else:
      grad = operand.kind.cotangent(d_acc, want.shape)
    if operand.role == "scaled addend":
      grad = call.beta * grad
    result.append(_cast(grad, want))
  return tuple(result)


def _tail(call, pre, operands):
  """The epilogue after the affine part, in f32: clamp(act(pre) + residual), or a user's
  clamp(fn(pre, *operands)) (`with_operands`); `operands`: the `TAIL` operands it reads,
  by name (`_in_tail`)."""
  lo, hi = call.clamp or (None, None)
  spec = epilogue_lib.EpilogueSpec(activation=call.activation, clamp_lo=lo, clamp_hi=hi)
  given = {name: EPILOGUE_OPERANDS[name].kind.broadcastable(x) for name, x in operands.items()}
  y = epilogue_lib.finish(spec, pre, **given)
  return epilogue_lib.quantize(spec, y)


def _grad_a(call, d_acc, b, grad):
  """dA: d op(a) = d_acc @ op(b)^T, stored transposed when A is."""
  if call.transpose_a:
    return _gemm_into(call, b, d_acc, call.transpose_b, True, grad)
  return _gemm_into(call, d_acc, b, False, not call.transpose_b, grad)


def _grad_b(call, d_acc, a, grad):
  """dB: d op(b) = op(a)^T @ d_acc, stored transposed when B is."""
  if call.transpose_b:
    return _gemm_into(call, d_acc, a, True, call.transpose_a, grad)
  return _gemm_into(call, a, d_acc, not call.transpose_a, False, grad)


def _gemm_into(call, x, y, transpose_x, transpose_y, grad):
  """alpha * op(x) @ op(y) as `grad` wants it, summed over batch dims it lacks."""
  linear = GemmCall(
      out_dtype=grad.dtype,
      implementation=call.implementation,
      transpose_a=transpose_x,
      transpose_b=transpose_y,
      alpha=call.alpha,
      autotune=call.autotune,
  )
  batch = x.shape[:-2] or y.shape[:-2]
  if batch == grad.shape[:-2]:
    out = _linear(linear, x, y)
  elif transpose_x and not transpose_y:
    # The contracting dim is second-minor in both: the batch folds into it.
    out = _linear(linear, x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1]))
  else:
    out = TILE.cotangent(_linear(linear.product(), x, y), grad.shape)  # batch dims summed
  return _cast(out, grad)


def _fuses_dpre(call, pre, g, wanted) -> bool:
  """Whether dPre and the bias gradient come from one kernel pass (`pallas_gemm.dpre`):
  a bias to differentiate and `fuses_dpre`."""
  return wanted["bias"] is not None and fuses_dpre(call, pre, g, wanted.operand_dtype)


def fuses_dpre(call, pre, g, operand_dtype) -> bool:
  """Whether `fused_dpre` takes this activation's derivative: kernel implementations,
  an activation without a clamp (so no residual enters the derivative), 16-bit pre
  and cotangent in the operand dtype, a shape TMA takes, no Explicit mesh."""
  rows = (math.prod(pre.shape[:-1]), pre.shape[-1])
  return (
      call.implementation in ("auto", "pallas", "interpret")
      and call.activation in epilogue_lib.ACTIVATION_SLOPES  # a custom one: XLA's autodiff
      and call.clamp is None
      and pre.dtype == g.dtype == jnp.dtype(operand_dtype)
      and dpre.supported(rows, pre.dtype)
      and sharding.explicit_mesh(pre, g) is None
  )


def fused_dpre(call, pre, g):
  """(d_acc, bias gradient) from `dpre.dpre_and_column_sums` (NOTES exp. 34)."""
  return _dpre_kernel(call.activation, call.implementation == "interpret", pre, g)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _dpre_kernel(activation, interpret, pre, g):
  d_acc, sums = dpre.dpre_and_column_sums(
      pre.reshape(-1, pre.shape[-1]),
      g.reshape(-1, g.shape[-1]),
      slope=epilogue_lib.ACTIVATION_SLOPES[activation],
      num_sms=dpre.INTERPRET_SMS if interpret else None,
      interpret=_compat.interpret_params(zero_fill=False) if interpret else None,
  )
  return d_acc.reshape(pre.shape), jnp.sum(sums, axis=0)


@_dpre_kernel.defjvp
def _dpre_jvp(activation, interpret, primals, tangents):
  """Second derivatives (a gradient of the gradient): XLA's, of what the kernel computes."""
  del interpret

  def reference(pre, g):
    d = g.astype(jnp.float32) * epilogue_lib.ACTIVATION_SLOPES[activation](pre.astype(jnp.float32))
    return d.astype(pre.dtype), jnp.sum(d.reshape(-1, d.shape[-1]), axis=0)

  return jax.jvp(reference, primals, tangents)


def column_sums(call, x):
  """f32 sums of `x` over every axis but the last, as a (1, R) @ (R, N) GEMM.

  XLA runs this column reduction at ~1 TB/s (134 us for 8192x8192 bf16 on the
  H100, NOTES exp. 32); a GEMV with a row of ones streams x at HBM speed. Under
  an Explicit mesh the sum stays an XLA reduction (the ones row has no sharding).

  >>> x = jnp.arange(6, dtype=jnp.bfloat16).reshape(3, 2)
  >>> column_sums(GemmCall(out_dtype="bfloat16", implementation="xla"), x).tolist()
  [6.0, 9.0]
  """
  rows = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # -1 cannot be inferred from 0
  if sharding.explicit_mesh(x) is not None or 0 in rows.shape:
    return jnp.sum(rows, axis=0, dtype=jnp.float32)
  ones = jnp.ones((1, rows.shape[0]), x.dtype)
  linear = GemmCall(out_dtype="float32", implementation=call.implementation, autotune=call.autotune)
  return _linear(linear, ones, rows)[0]


def _cast(x, grad):
  """`x` in the dtype and sharding (or `shard_map` varying axes) `grad` wants."""
  return _compat.vary_like(sharding.reshard(x.astype(grad.dtype), grad.spec), grad.varying)
