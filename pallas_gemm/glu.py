"""`gated_linear_unit`: act(x @ w_gate + b_gate) * (x @ w_up + b_up) in one GEMM.

Forward: one kernel reads x once. Each B tile of the GEMM holds tile_n/2 gate
columns beside the same up columns (two TMA copies into one SMEM tile,
`pipeline.Parts`), one WGMMA fills both halves of the accumulator, and the
epilogue writes act(gate) * up: the (tokens x width) gate and up projections
never reach memory (XLA writes both, reads them back and writes the product).
Under differentiation the two pre-activations are stored beside the output
(what the backward needs, 2 x (tokens x width) in x's dtype; nothing else).

Backward (`g` = cotangent of the output), from the saved pre-activations:

    d_up = g * act(gate),  d_gate = g * up * act'(gate)      one XLA elementwise pass
    dx = d_gate @ w_gate^T + d_up @ w_up^T                   two GEMMs, the second adds the first (c)
    dw_gate = x^T @ d_gate,  dw_up = x^T @ d_up              db_* = column sums

`pallas_gemm.gated_mlp` also fuses the elementwise pass into the GEMM that makes
`g` (the down projection's backward).

>>> import jax.numpy as jnp
>>> x = jnp.ones((4, 8), jnp.bfloat16); w = jnp.full((8, 16), 0.1, jnp.bfloat16)
>>> gated_linear_unit(x, w, w, activation="relu", implementation="xla").shape
(4, 16)
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import autodiff
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import gemm as gemm_lib
from pallas_gemm import route
from pallas_gemm import sharding
from pallas_gemm.batching import GemmCall
from pallas_gemm.config import GemmConfig, GemmProblem, fit_stages, tiles
from pallas_gemm.heuristics import default_config
from pallas_gemm.hopper_gemm import hopper_gemm
from pallas_gemm.operands import OPERANDS
from pallas_gemm.tma_padding import pad_last2, round_up

DTYPES = ("bfloat16", "float16")
"""Operand dtypes of the kernel; others run the XLA path."""


def gated_linear_unit(
    x,
    w_gate,
    w_up=None,
    *,
    activation="silu",
    bias_gate=None,
    bias_up=None,
    out_dtype=None,
    config: GemmConfig | None = None,
    implementation: str | None = None,
):
  """act(x @ w_gate + bias_gate) * (x @ w_up + bias_up), differentiable, in one GEMM.

  Args:
    x: (..., K), bf16 or f16 for the kernel (other dtypes run XLA).
    w_gate: (K, N), as Llama checkpoints store it; or (K, 2, N) stacked gate and
      up (tokamax's layout) with `w_up` None.
    w_up: (K, N), or None with stacked `w_gate`.
    activation: the gate's activation, a name or jax.nn function as for
      `pallas_gemm.matmul` ("silu" for SwiGLU, "gelu"/"gelu_exact" for GeGLU).
    bias_gate, bias_up: (N,) or None, added in f32 before the activation / product.
    out_dtype: the output dtype (default x's); bf16 or f16 for the kernel.
    config: a `GemmConfig` for the kernel (its tile_n counts gate and up columns),
      or None for the heuristic default.
    implementation: None ("auto" on a Hopper GPU, else "xla"), "auto", "pallas",
      "interpret" or "xla".
  Returns:
    (..., N) array of `out_dtype`.
  """
  if implementation not in gemm_lib.IMPLEMENTATIONS:
    raise ValueError(
        f"implementation must be one of {gemm_lib.IMPLEMENTATIONS}, got {implementation!r}"
    )
  if config is not None and not isinstance(config, GemmConfig):
    raise TypeError(f"config must be a GemmConfig or None, got {type(config).__name__}")
  activation = epilogue_lib.activation_name(activation)
  x, w_gate = jnp.asarray(x), jnp.asarray(w_gate)
  if w_up is None:
    if w_gate.ndim != 3 or w_gate.shape[1] != 2:
      raise ValueError(
          f"w_gate must be (K, 2, N) stacked gate and up weights when w_up is None, "
          f"got {w_gate.shape}"
      )
    w_gate, w_up = w_gate[:, 0], w_gate[:, 1]
  w_up = jnp.asarray(w_up)
  if x.ndim < 1 or w_gate.ndim != 2 or w_up.shape != w_gate.shape:
    raise ValueError(
        f"x must be (..., K) and w_gate, w_up (K, N) each; got {x.shape}, {w_gate.shape}, "
        f"{w_up.shape}"
    )
  k, n = w_gate.shape
  if x.shape[-1] != k:
    raise ValueError(f"x's last dim {x.shape[-1]} must equal w_gate's K={k}")
  for name, v in (("bias_gate", bias_gate), ("bias_up", bias_up)):
    OPERANDS["bias"].check(v, x.shape[-2] if x.ndim > 1 else 1, n, argument=name)
  gemm_lib.check_real(bias_gate=bias_gate, bias_up=bias_up)
  out_dtype = jnp.dtype(out_dtype or x.dtype).name
  dtype = x.dtype.name
  rows = math.prod(x.shape[:-1])
  implementation, rounded = _resolve(
      implementation, config, GemmProblem(m=rows, n=2 * n, k=k, dtype=dtype)
  )
  if dtype not in DTYPES or out_dtype not in DTYPES or 0 in (rows, n, k):
    implementation = "xla"
  static = _Static(activation, implementation, dtype, out_dtype, config, rounded)
  y = _glu(
      static,
      x.reshape(rows, k),
      w_gate.astype(dtype),
      w_up.astype(dtype),
      bias_gate,
      bias_up,
  )
  return y.reshape(*x.shape[:-1], n)


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Static:
  activation: str | None
  implementation: str
  dtype: str
  out_dtype: str
  config: GemmConfig | None
  rounded: bool = False
  """XLA: the products are rounded to `out_dtype` before the epilogue (a routed decode
  step, as `matmul`'s: NOTES exps. 81, 99)."""


# -- the forward GEMM ----------------------------------------------------------
def gated_config(problem: GemmProblem, config: GemmConfig | None = None) -> GemmConfig:
  """The kernel config of a gated GEMM whose `problem.n` counts gate and up columns:
  `config`, else the heuristic default for that problem made gated-ready (warpgroups
  split along M, whole tiles, an epilogue tile that divides tile_n / 2).

  >>> cfg = gated_config(GemmProblem(m=8192, n=2 * 14336, k=4096))
  >>> cfg.wg_split, cfg.split_k, cfg.tile_n // 2 % cfg.epilogue_shape[1]
  ('m', 1, 0)
  """
  if config is not None:
    return config
  cfg = default_config(problem)
  cfg = dataclasses.replace(cfg, split_k=1, stream_k=False, split_tail=False)
  if cfg.tile_n < 128:
    cfg = dataclasses.replace(cfg, tile_n=128)
  if cfg.schedule == "cooperative" and (cfg.wg_split != "m" or cfg.tile_m < 128):
    cfg = dataclasses.replace(cfg, tile_m=max(cfg.tile_m, 128), wg_split="m")
  if cfg.epilogue_shape[1] > cfg.tile_n // 2:
    cfg = dataclasses.replace(cfg, epilogue_tile=(64, 64))
  return fit_stages(cfg, problem, cfg.stages)


def gated_gemm(
    x,
    w_gate,
    w_up,
    bias_gate,
    bias_up,
    *,
    activation,
    out_dtype,
    implementation,
    config=None,
    return_pre=False,
    product_dtype=None,
):
  """The forward of `gated_linear_unit` on 2-D x: y, or (y, gate pre, up pre);
  `product_dtype`: XLA's products' dtype before the f32 epilogue (None: f32)."""
  m, k = x.shape
  n = w_gate.shape[1]
  spec = epilogue_lib.EpilogueSpec(activation=activation, gated=True)
  if implementation == "xla":
    pres = [
        epilogue_lib.affine(
            spec,
            jnp.matmul(x, w, preferred_element_type=product_dtype or jnp.float32).astype(
                jnp.float32
            ),
            bias=b,
        )
        for w, b in ((w_gate, bias_gate), (w_up, bias_up))
    ]
    y = epilogue_lib.gated(spec, *pres).astype(out_dtype)
    return (y, *(p.astype(out_dtype) for p in pres)) if return_pre else y
  interpret = implementation == "interpret"
  virtual = GemmProblem(m=m, n=2 * n, k=k, dtype=x.dtype.name, out_dtype=out_dtype, has_bias=True)
  cfg = gated_config(virtual, config)
  half = cfg.tile_n // 2
  n_tiles = tiles(n, half)
  if interpret:
    cfg = gemm_lib.interpret_config(dataclasses.replace(cfg, cluster=(1, 1)), virtual)
    k_pad = round_up(k, cfg.tile_k)
    x = pad_last2(x, round_up(m, cfg.tile_m), k_pad)
    w_gate, w_up = (pad_last2(w, k_pad, n_tiles * half) for w in (w_gate, w_up))
    rows = x.shape[0]
  else:  # pads only what TMA cannot read as it is (as `matmul` does; DESIGN.md "odd shapes")
    x, w_gate = gemm_lib.tma_layout(x, w_gate, virtual, cfg, False)
    x, w_up = gemm_lib.tma_layout(x, w_up, virtual, cfg, False)
    rows = x.shape[0]
  bias = None
  if bias_gate is not None or bias_up is not None:
    halves = [
        jnp.zeros((n_tiles * half,), jnp.float32)
        if b is None
        else pad_last2(jnp.asarray(b, jnp.float32)[None], 1, n_tiles * half)[0]
        for b in (bias_gate, bias_up)
    ]
    bias = jnp.stack([h.reshape(n_tiles, half) for h in halves], axis=1).reshape(-1)
  problem = dataclasses.replace(virtual, m=rows, n=n_tiles * cfg.tile_n, has_bias=bias is not None)
  outs = hopper_gemm(
      x,
      w_gate,
      bias,
      None,
      b_up=w_up,
      problem=problem,
      config=cfg,
      epilogue=spec,
      return_pre=return_pre,
      interpret=_compat.interpret_params(zero_fill=False) if interpret else None,
  )
  crop = lambda out: out[:m, :n]
  return tuple(map(crop, outs)) if return_pre else crop(outs)


# -- differentiation -----------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _glu(static, x, w_gate, w_up, bias_gate, bias_up):
  return _forward(static, x, w_gate, w_up, bias_gate, bias_up, return_pre=False)


def _forward(static, x, w_gate, w_up, bias_gate, bias_up, *, return_pre):
  return gated_gemm(
      x,
      w_gate,
      w_up,
      bias_gate,
      bias_up,
      activation=static.activation,
      out_dtype=static.out_dtype,
      implementation=static.implementation,
      config=static.config,
      return_pre=return_pre,
      product_dtype=static.out_dtype if static.rounded else None,
  )


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _BiasDtypes:
  gate: str | None
  up: str | None


def _fwd(static, x, w_gate, w_up, bias_gate, bias_up):
  y, gate, up = _forward(static, x, w_gate, w_up, bias_gate, bias_up, return_pre=True)
  dtypes = _BiasDtypes(
      *(None if b is None else jnp.dtype(b.dtype).name for b in (bias_gate, bias_up))
  )
  return y, (x, w_gate, w_up, gate, up, dtypes)


def gate_cotangents(activation, g, gate, up, dtype):
  """(d_gate, d_up) = (g * up * act'(gate), g * act(gate)) in f32, cast to `dtype`.

  >>> import jax.numpy as jnp
  >>> one = jnp.ones((1, 1))
  >>> [float(v[0, 0]) for v in gate_cotangents("relu", 2 * one, 3 * one, 5 * one, jnp.float32)]
  [10.0, 6.0]
  """
  g, gate, up = (v.astype(jnp.float32) for v in (g, gate, up))
  act = epilogue_lib.ACTIVATIONS[activation] if activation else (lambda v: v)
  slope = epilogue_lib.ACTIVATION_SLOPES[activation](gate) if activation else 1.0
  return (g * up * slope).astype(dtype), (g * act(gate)).astype(dtype)


def _bwd(static, saved, g):
  x, w_gate, w_up, gate, up, dtypes = saved
  dtype = static.dtype
  d_gate, d_up = gate_cotangents(static.activation, g, gate, up, dtype)
  return (
      *input_grads(static.implementation, dtype, x, w_gate, w_up, d_gate, d_up),
      *(
          None
          if to is None
          else autodiff.column_sums(GemmCall(dtype, static.implementation), d).astype(to)
          for d, to in ((d_gate, dtypes.gate), (d_up, dtypes.up))
      ),
  )


def input_grads(implementation, dtype, x, w_gate, w_up, d_gate, d_up):
  """(dx, dw_gate, dw_up) from the pre-activations' cotangents: four GEMMs, the
  second of dx adding the first in its epilogue."""
  call = lambda **kw: GemmCall(dtype, implementation, **kw)
  d_x = sharding.gemm(call(transpose_b=True), d_gate, w_gate)
  d_x = sharding.gemm(call(transpose_b=True, beta=1.0), d_up, w_up, c=d_x)
  d_w_gate = sharding.gemm(call(transpose_a=True), x, d_gate)
  d_w_up = sharding.gemm(call(transpose_a=True), x, d_up)
  return d_x, d_w_gate, d_w_up


_glu.defvjp(_fwd, _bwd)


# -- the gated MLP: the backward's elementwise pass in the down projection's dH GEMM --
def _resolve(implementation, config, up: GemmProblem) -> tuple[str, bool]:
  """(implementation, rounded). None/"auto": the kernel on a Hopper GPU where `route`
  gives the up projection `up` (gate and up side by side) to it or a config asks for it,
  else XLA; others as given. `rounded`: a decode step routed to XLA, whose products are
  rounded to the output dtype before the epilogue, as `matmul`'s routed decode (at M = 1
  an f32 product made the gate and up GEMV 15% slower on the H100, NOTES exp. 99)."""
  if implementation not in (None, "auto"):
    return implementation, False
  if not _compat.on_hopper():
    return "xla", False
  if config is not None:
    return "pallas", False
  implementation = route.choose(up)[0]
  return implementation, implementation == "xla" and route.is_decode(up)


def gated_mlp(
    x,
    w_gate,
    w_up,
    w_down,
    *,
    activation="silu",
    bias_gate=None,
    bias_up=None,
    bias_down=None,
    residual=None,
    implementation: str | None = None,
    fuse_backward: bool = False,
):
  """`(act(x @ w_gate + b) * (x @ w_up + b)) @ w_down + bias_down + residual`, differentiable.

  The forward is `gated_linear_unit` and one GEMM (bias and residual in its epilogue).
  The backward makes the hidden cotangent dh = g @ w_down^T and from it the gate and up
  cotangents (d_gate = dh * up * act'(gate), d_up = dh * act(gate)).

  Args:
    x: (..., D); w_gate, w_up: (D, H); w_down: (H, D_out); x's dtype (bf16/f16 for
      the kernels; other dtypes run XLA).
    activation: the gate's, as for `gated_linear_unit`.
    bias_gate, bias_up: (H,) or None; bias_down: (D_out,) or None.
    residual: (..., D_out) added last, or None.
    implementation: as for `gated_linear_unit`.
    fuse_backward: the kernel that makes dh loads the saved gate and up pre-activations
      in its epilogue and writes their cotangents: dh never reaches memory. Off by
      default: on the H100 that kernel took 2.18 ms at 8192x14336x4096 against 1.27 +
      0.54 for the plain GEMM and XLA's elementwise pass (NOTES exp. 64).
  Returns:
    (..., D_out) in x's dtype.

  >>> import jax.numpy as jnp
  >>> x = jnp.ones((4, 8), jnp.bfloat16); w = jnp.full((8, 16), 0.1, jnp.bfloat16)
  >>> gated_mlp(x, w, w, w.T, implementation="xla").shape
  (4, 8)
  """
  if implementation not in gemm_lib.IMPLEMENTATIONS:
    raise ValueError(
        f"implementation must be one of {gemm_lib.IMPLEMENTATIONS}, got {implementation!r}"
    )
  activation = epilogue_lib.activation_name(activation)
  x, w_gate, w_up, w_down = map(jnp.asarray, (x, w_gate, w_up, w_down))
  if w_gate.ndim != 2 or w_up.shape != w_gate.shape or w_down.ndim != 2:
    raise ValueError(
        f"w_gate and w_up must be (D, H) and w_down (H, D_out); got {w_gate.shape}, "
        f"{w_up.shape}, {w_down.shape}"
    )
  (d, h), d_out = w_gate.shape, w_down.shape[1]
  if x.ndim < 1 or x.shape[-1] != d or w_down.shape[0] != h:
    raise ValueError(
        f"shapes do not chain: x {x.shape} @ w_gate {w_gate.shape} @ w_down {w_down.shape}"
    )
  out_shape = (*x.shape[:-1], d_out)
  for name, v, n in (
      ("bias_gate", bias_gate, h),
      ("bias_up", bias_up, h),
      ("bias_down", bias_down, d_out),
  ):
    OPERANDS["bias"].check(v, 1, n, argument=name)
  if residual is not None and jnp.shape(residual) != out_shape:
    raise ValueError(f"residual must have shape {out_shape}, got {jnp.shape(residual)}")
  dtype = x.dtype.name
  rows = math.prod(x.shape[:-1])
  implementation, rounded = _resolve(
      implementation, None, GemmProblem(m=rows, n=2 * h, k=d, dtype=dtype)
  )
  if dtype not in DTYPES or 0 in (rows, d, h, d_out):
    implementation = "xla"
  if not isinstance(fuse_backward, bool):
    raise TypeError(f"fuse_backward must be a bool, got {fuse_backward!r}")
  static = _MlpStatic(activation, implementation, dtype, fuse_backward, rounded)
  y = _gated_mlp(
      static,
      x.reshape(rows, d),
      *(w.astype(dtype) for w in (w_gate, w_up, w_down)),
      bias_gate,
      bias_up,
      bias_down,
      None if residual is None else jnp.asarray(residual).reshape(rows, d_out),
  )
  return y.reshape(out_shape)


def gate_cotangents_gemm(implementation, activation, g, w_down, gate, up, fused):
  """(d_gate, d_up) = ((g @ w_down^T) * up * act'(gate), (g @ w_down^T) * act(gate)):
  `fused`, the product never written (one kernel whose epilogue loads `gate` and `up`);
  else a GEMM (f32 out on XLA, g's dtype in the kernel) and XLA's elementwise pass."""
  if implementation == "xla" or activation is None or not fused:  # (bilinear: no slope)
    dh_dtype = "float32" if implementation == "xla" else jnp.dtype(g.dtype).name
    dh = sharding.gemm(GemmCall(dh_dtype, implementation, transpose_b=True), g, w_down)
    return gate_cotangents(activation, dh, gate, up, g.dtype)
  if implementation == "interpret":
    _compat.require_interpret_transposes(False, True)
  problem, _ = gemm_lib.gemm_problem(g, w_down, False, True, None, None, 0.0, None)
  problem = gemm_lib.check_extras(problem, (), None, gate)
  spec = epilogue_lib.EpilogueSpec(gated_slope=activation)
  return gemm_lib.kernel_gemm(
      g,
      w_down,
      problem,
      (),
      spec,
      None,
      None,
      None,
      interpret=implementation == "interpret",
      autotune=None,
      residual=gate,
      residual_up=up,
      return_pre=True,
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gated_mlp(static, x, w_gate, w_up, w_down, bias_gate, bias_up, bias_down, residual):
  return _mlp_forward(static, x, w_gate, w_up, w_down, bias_gate, bias_up, bias_down, residual)[0]


def _mlp_forward(
    static, x, w_gate, w_up, w_down, bias_gate, bias_up, bias_down, residual, *, keep_pre=False
):
  pres = _forward(static.unit, x, w_gate, w_up, bias_gate, bias_up, return_pre=keep_pre)
  hidden, pres = (pres[0], pres[1:]) if keep_pre else (pres, None)
  # A routed decode step lets the down projection route itself (its product rounded too).
  call = GemmCall(static.dtype, "auto" if static.rounded else static.implementation)
  y = sharding.gemm(call, hidden, w_down, bias=bias_down, residual=residual)
  return y, hidden, pres


@dataclasses.dataclass(frozen=True)
class _MlpStatic:
  activation: str | None
  implementation: str
  dtype: str
  fuse_backward: bool
  rounded: bool = False
  """As `_Static.rounded`."""

  @property
  def unit(self) -> _Static:
    """The static arguments of the gated unit inside the block."""
    return _Static(self.activation, self.implementation, self.dtype, self.dtype, None, self.rounded)


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _MlpDtypes:
  """Dtypes of the optional inputs (None where absent): their gradients' dtypes."""

  gate: str | None
  up: str | None
  down: str | None
  residual: str | None


def _mlp_fwd(static, x, w_gate, w_up, w_down, bias_gate, bias_up, bias_down, residual):
  y, hidden, (gate, up) = _mlp_forward(
      static, x, w_gate, w_up, w_down, bias_gate, bias_up, bias_down, residual, keep_pre=True
  )
  dtypes = _MlpDtypes(
      *(
          None if v is None else jnp.dtype(v.dtype).name
          for v in (bias_gate, bias_up, bias_down, residual)
      )
  )
  return y, (x, w_gate, w_up, w_down, hidden, gate, up, dtypes)


def _mlp_bwd(static, saved, g):
  x, w_gate, w_up, w_down, hidden, gate, up, dtypes = saved
  dtype, implementation = static.dtype, static.implementation
  g = g.astype(dtype)
  d_gate, d_up = gate_cotangents_gemm(
      implementation, static.activation, g, w_down, gate, up, static.fuse_backward
  )
  d_x, d_w_gate, d_w_up = input_grads(implementation, dtype, x, w_gate, w_up, d_gate, d_up)
  d_w_down = sharding.gemm(GemmCall(dtype, implementation, transpose_a=True), hidden, g)
  call = GemmCall(dtype, implementation)
  sums = lambda v, to: None if to is None else autodiff.column_sums(call, v).astype(to)
  return (
      d_x,
      d_w_gate,
      d_w_up,
      d_w_down,
      sums(d_gate, dtypes.gate),
      sums(d_up, dtypes.up),
      sums(g, dtypes.down),
      None if dtypes.residual is None else g.astype(dtypes.residual),
  )


_gated_mlp.defvjp(_mlp_fwd, _mlp_bwd)
