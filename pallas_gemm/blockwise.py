"""Blockwise-scaled fp8 (the DeepSeek-V3 recipe): `quantize_blockwise` and
`blockwise_scaled_matmul`.

Activations carry one f32 scale per (1 x 128) block of a row, weights one per
(128 x 128) block; `x ~= x_fp8 * scale` block by block. The GEMM multiplies each
128-wide K block in fp8 WGMMA into a fresh f32 accumulator and adds it to the
register sum times a_scale[row, kb] * b_scale[col block, kb] (`Ring.mma_promoted`):
the result matches a float64 product of the dequantized operands to f32
accumulation error, and fp8 WGMMA's reduced-precision accumulation never spans more
than one block.

>>> import jax.numpy as jnp
>>> x = jnp.array([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]])
>>> q, s = quantize_blockwise(x, block=(1, 2))   # blocks [1, 2], [4] (partial), ...
>>> q.dtype.name, s.shape, q.astype(jnp.float32).tolist()[0]   # amax -> 448
('float8_e4m3fn', (2, 2), [224.0, 448.0, 448.0])
>>> dequantize_blockwise(q, s, block=(1, 2)).tolist()
[[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]]
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from pallas_gemm import _compat
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import gemm as gemm_lib
from pallas_gemm import grouped
from pallas_gemm import heuristics
from pallas_gemm import ragged_gemm as rg
from pallas_gemm import smem
from pallas_gemm.config import (
    B_SCALE_BOX,
    DEFAULT_NUM_SMS,
    FP8_DTYPES,
    INPUT_DTYPES,
    GemmConfig,
    GemmProblem,
    fit_stages,
    tiles,
)
from pallas_gemm.heuristics import default_config
from pallas_gemm.hopper_gemm import hopper_gemm
from pallas_gemm.operands import OPERANDS
from pallas_gemm.tma_padding import pad_last2, round_up

SCALE_BLOCK = 128
"""K extent of a scale block (and of A's row blocks, B's square blocks) in the kernel."""


def quantize_blockwise(x, block=(1, SCALE_BLOCK), dtype=jnp.float8_e4m3fn, *, power_of_two=False):
  """(x_q, scales): `x` (M, K) cast to fp8 block by block, with f32 scales of shape
  (cdiv(M, bm), cdiv(K, bk)) such that x ~= x_q * scales (each block's amax maps to
  the dtype's largest finite value; a partial last block uses its own amax; an
  all-zero block gets scale 1, a block with a NaN a NaN scale). One fused XLA pass:
  amax, scale, saturating cast.

  Args:
    x: (M, K) real array.
    block: (bm, bk) block shape: (1, 128) for activations, (128, 128) for weights,
      (128, 1) for an operand contracted along its rows in the backward; (1, 32) with
      `power_of_two` for MXFP8.
    dtype: float8_e4m3fn or float8_e5m2.
    power_of_two: round each scale up to a power of two (exact as float8_e8m0fnu, MX's
      scale type: `scales.astype(jnp.float8_e8m0fnu)`); no block value then saturates.

  >>> q, s = quantize_blockwise(jnp.full((1, 32), 3.0), (1, 32), power_of_two=True)
  >>> float(s[0, 0]), float(q[0, 0])  # 3 / 448 rounded up to 2^-7
  (0.0078125, 384.0)
  """
  dtype = jnp.dtype(dtype)
  if dtype.name not in FP8_DTYPES:
    raise TypeError(f"dtype must be one of {FP8_DTYPES}, got {dtype}")
  x = jnp.asarray(x)
  if x.ndim != 2:
    raise ValueError(f"x must be 2-D (M, K), got shape {x.shape}")
  if jnp.iscomplexobj(x):
    raise TypeError(f"x must be real, got {x.dtype}")
  if (
      not isinstance(block, (tuple, list))
      or len(block) != 2
      or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
  ):
    raise ValueError(f"block must be a pair of positive ints (bm, bk), got {block!r}")
  (m, k), (bm, bk) = x.shape, block
  mb, kb = -(-m // bm), -(-k // bk)
  padded = pad_last2(x.astype(jnp.float32), mb * bm, kb * bk).reshape(mb, bm, kb, bk)
  amax = epilogue_lib.block_abs_max(padded, axis=(1, 3))
  finite_max = float(jnp.finfo(dtype).max)
  scales = jnp.where(amax == 0, 1.0, amax / finite_max).astype(jnp.float32)  # NaN stays NaN
  if power_of_two:
    scales = jnp.exp2(jnp.ceil(jnp.log2(scales)))
  q = jnp.clip(padded / scales[:, None, :, None], -finite_max, finite_max).astype(dtype)
  return q.reshape(mb * bm, kb * bk)[:m, :k], scales


def dequantize_blockwise(x_q, scales, block=(1, SCALE_BLOCK)):
  """`x_q * scales` block by block, in f32 (the inverse of `quantize_blockwise`)."""
  (m, k), (bm, bk) = x_q.shape, block
  full = jnp.repeat(jnp.repeat(scales, bm, axis=0), bk, axis=1)[:m, :k]
  return x_q.astype(jnp.float32) * full


def blockwise_scaled_matmul(
    a,
    b,
    a_scales,
    b_scales,
    *,
    out_dtype=jnp.bfloat16,
    bias=None,
    activation=None,
    residual=None,
    config: GemmConfig | None = None,
    implementation: str | None = None,
    block_k: int = SCALE_BLOCK,
):
  """act((a * a_scales) @ (b * b_scales)^T + bias) + residual, with A scaled per (1 x 128)
  block and B per (128 x 128) block, each K block's product scaled in f32 registers.

  Args:
    a: (M, K) float8_e4m3fn or float8_e5m2 (the activations, e.g. `quantize_blockwise(x)`).
    b: (N, K) fp8 (the weights, stored (out, in) as WGMMA's K-major B).
    a_scales: f32 (M, cdiv(K, 128)).
    b_scales: f32 (cdiv(N, 128), cdiv(K, 128)) for (128 x 128) blocks, or (N, cdiv(K, 128))
      for per-row (1 x 128) blocks like A's (the weight gradient's layout); N <= 128 reads
      as (128 x 128) blocks.
    block_k: the scale blocks' K extent: 128, or 32 (MXFP8: per-row blocks on both
      operands, a_scales (M, cdiv(K, 32)) and b_scales (N, cdiv(K, 32)); one K step of 32
      per block in the kernel).
    out_dtype: bf16, f16 or f32.
    bias: (N,) or None; activation: as `pallas_gemm.matmul`; residual: (M, N) or None.
    config: a `GemmConfig` (tile_k 128 and tile_n 128 for the kernel), or None.
    implementation: None ("pallas" on a Hopper GPU, else "xla"), "pallas", "interpret"
      or "xla" (dequantize and multiply in f32 at HIGHEST precision).
  Returns:
    (M, N) of `out_dtype`.
  """
  if implementation not in gemm_lib.IMPLEMENTATIONS:
    raise ValueError(
        f"implementation must be one of {gemm_lib.IMPLEMENTATIONS}, got {implementation!r}"
    )
  a, b = jnp.asarray(a), jnp.asarray(b)
  for name, x in (("a", a), ("b", b)):
    if x.ndim != 2:
      raise ValueError(f"{name} must be 2-D, got shape {x.shape}")
    if x.dtype.name not in FP8_DTYPES:
      raise TypeError(f"{name} must be one of {FP8_DTYPES}, got {x.dtype}")
  (m, k), (n, kb_) = a.shape, b.shape
  if k != kb_:
    raise ValueError(f"a (M, K) and b (N, K) must share K: got {a.shape} and {b.shape}")
  if block_k not in (32, SCALE_BLOCK) or isinstance(block_k, bool):
    raise ValueError(f"block_k must be 32 or {SCALE_BLOCK}, got {block_k!r}")
  k_blocks = -(-k // block_k)
  if jnp.shape(a_scales) != (m, k_blocks):
    raise ValueError(
        f"a_scales must have shape {(m, k_blocks)} (one scale per 1 x {block_k} block of a), "
        f"got {jnp.shape(a_scales)}"
    )
  square = (-(-n // SCALE_BLOCK), k_blocks)
  if block_k == SCALE_BLOCK and jnp.shape(b_scales) not in (square, (n, k_blocks)):
    raise ValueError(
        f"b_scales must have shape {square} (one scale per 128 x 128 block of b) or "
        f"{(n, k_blocks)} (per 1 x 128 block), got {jnp.shape(b_scales)}"
    )
  if block_k != SCALE_BLOCK and jnp.shape(b_scales) != (n, k_blocks):
    raise ValueError(
        f"b_scales must have shape {(n, k_blocks)} (one scale per 1 x {block_k} block of b), "
        f"got {jnp.shape(b_scales)}"
    )
  b_rows = SCALE_BLOCK if block_k == SCALE_BLOCK and jnp.shape(b_scales) == square else 1
  gemm_lib.check_real(bias=bias, residual=residual)
  out_dtype = jnp.dtype(out_dtype).name
  if out_dtype not in ("bfloat16", "float16", "float32"):
    raise TypeError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
  activation = epilogue_lib.activation_name(activation)
  for name, x in (("bias", bias), ("residual", residual)):
    OPERANDS[name].check(x, m, n)
  spec = epilogue_lib.EpilogueSpec(activation=activation)
  a_scales, b_scales = (jnp.asarray(s, jnp.float32) for s in (a_scales, b_scales))
  if implementation is None or implementation == "auto":
    implementation = "pallas" if _compat.on_hopper() else "xla"
  if 0 in (m, n, k):
    implementation = "xla"
  if implementation == "xla":
    acc = jnp.matmul(
        dequantize_blockwise(a, a_scales, (1, block_k)),
        dequantize_blockwise(b, b_scales, (b_rows, block_k)).T,
        precision=jax.lax.Precision.HIGHEST,
    )
    pre = epilogue_lib.affine(spec, acc, bias=bias)
    return epilogue_lib.finish(spec, pre, residual=residual).astype(out_dtype)
  return _kernel_path(
      a, b, a_scales, b_scales, b_rows, block_k, spec, out_dtype, bias, residual, config,
      implementation,
  )  # fmt: skip


def nn_scaled_matmul(
    lhs,
    rhs,
    lhs_scales,
    rhs_scales,
    preferred_element_type=jnp.float32,
    *,
    implementation: str | None = None,
):
  """`jax.nn.scaled_matmul` (same arguments, same result) on the blockwise kernel where it
  applies: fp8 operands whose per-row scale blocks span 128 (or, asked for, 32: MXFP8 with
  E8M0 scales) K elements on both operands, and a bf16, f16 or f32 result. Hopper has no MX
  hardware, so XLA dequantizes there; the kernel multiplies the fp8 bytes with WGMMA and
  scales each block's product in registers. By default the kernel runs 128-blocks; 32-blocks
  run XLA's path, which is faster on the H100 (scaling every 32-wide K step costs the kernel
  more than XLA's dequantize pass: NOTES exp. 87), unless `implementation="pallas"`.
  Anything else (other block sizes, fp4, differing blocks) runs `jax.nn.scaled_matmul`.

  Args:
    lhs: (B, M, K); rhs: (B, N, K).
    lhs_scales: (B, M, K // block); rhs_scales: (B, N, K // block), any real dtype
      (float8_e8m0fnu for MXFP8), applied in f32.
    preferred_element_type: the result's dtype (default f32, as jax's).
    implementation: None (the kernel for 128-blocks on a Hopper GPU, else
      `jax.nn.scaled_matmul`), "pallas", "interpret" or "xla" (`jax.nn.scaled_matmul`).
  Returns:
    (B, M, N) of `preferred_element_type`.

  >>> q, s = quantize_blockwise(jnp.ones((4, 64)), (1, 32), power_of_two=True)
  >>> nn_scaled_matmul(q[None], q[None], s[None], s[None], implementation="xla")[0, 0, :2]
  Array([64., 64.], dtype=float32)
  """
  if implementation not in gemm_lib.IMPLEMENTATIONS:
    raise ValueError(
        f"implementation must be one of {gemm_lib.IMPLEMENTATIONS}, got {implementation!r}"
    )
  lhs, rhs, lhs_scales, rhs_scales = map(jnp.asarray, (lhs, rhs, lhs_scales, rhs_scales))
  for name, x in (
      ("lhs", lhs),
      ("rhs", rhs),
      ("lhs_scales", lhs_scales),
      ("rhs_scales", rhs_scales),
  ):
    if x.ndim != 3:
      raise ValueError(f"{name} must be 3-D (B, rows, K or K blocks), got shape {x.shape}")
  (batch, m, k), (batch_b, n, k_b) = lhs.shape, rhs.shape
  if batch != batch_b or k != k_b:
    raise ValueError(
        f"lhs (B, M, K) and rhs (B, N, K) must share B and K: {lhs.shape}, {rhs.shape}"
    )
  for name, x, rows in (("lhs_scales", lhs_scales, m), ("rhs_scales", rhs_scales, n)):
    if x.shape[:2] != (batch, rows) or x.shape[2] == 0 or k % x.shape[2]:
      raise ValueError(
          f"{name} must have shape (B, {rows}, K // block) with K = {k} a multiple of it, "
          f"got {x.shape}"
      )
  block = k // lhs_scales.shape[2]
  out_dtype = jnp.dtype(preferred_element_type)
  kernel_case = (
      lhs.dtype.name in FP8_DTYPES
      and rhs.dtype.name in FP8_DTYPES
      and rhs_scales.shape[2] == lhs_scales.shape[2]
      and block in (32, SCALE_BLOCK)
      and out_dtype.name in ("bfloat16", "float16", "float32")
  )
  if implementation is None or implementation == "auto":
    # 32-blocks: the kernel scales every 32-wide K step in registers and runs at 225-291
    # TFLOP/s on the H100, XLA's dequantize + GEMM at 254-591 (NOTES exp. 87).
    fast = _compat.on_hopper() and block == SCALE_BLOCK
    implementation = "pallas" if fast else "xla"
  if not kernel_case or 0 in (batch, m, n, k):
    return jax.nn.scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype)
  if implementation == "xla" and (_compat.SCALED_MATMUL_ON_CPU or jax.default_backend() != "cpu"):
    return jax.nn.scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype)
  outs = [  # "xla" here: the dequantized f32 product
      blockwise_scaled_matmul(
          lhs[i],
          rhs[i],
          lhs_scales[i],
          rhs_scales[i],
          out_dtype=out_dtype,
          implementation=implementation,
          block_k=block,
      )
      for i in range(batch)
  ]
  return jnp.stack(outs)


STREAM_K_MAX_WAVES = 1.15
"""Stream-K (`GemmConfig.stream_k`) when the whole tiles fill one wave of SMs and at most
this much of a second: the K loop then runs once over all SMs instead of twice. Measured
on the H200 (NOTES exp. 124), with 7168-16384 K: 1.126x at 1.03 waves, 1.06-1.10x at
1.09, 1.015x at 1.21, 0.93x at 1.33 and 0.72-0.97x at 1.9-62 waves. (Our reading, not
profiled: concurrent stream-K ranges sit at different K offsets, so their operands stop
sharing L2, while whole tiles walk K in step.)"""
STREAM_K_MIN_BLOCKS = 48
"""...and when a tile has at least this many K blocks: at K = 2048 (16 blocks) stream-K
lost at 1.03 and 1.09 waves (0.95x, 0.88x), its fixup no longer amortized."""


def stream_k_pays(problem: GemmProblem, num_sms: int) -> bool:
  """Whether the blockwise kernel's default runs stream-K on `num_sms` SMs.

  >>> p = lambda m, n, k: GemmProblem(m, n, k, dtype="float8_e4m3fn", block_scaled=True)
  >>> [stream_k_pays(p(1024, n, 7168), 132) for n in (1024, 2112, 3072)]  # 64, 136, 192 tiles
  [False, True, False]
  >>> stream_k_pays(p(1024, 2112, 2048), 132)   # 16 K blocks
  False
  """
  count = tiles(problem.m, 128) * tiles(problem.n, SCALE_BLOCK)
  blocks = tiles(problem.k, problem.scale_block_k)
  return (
      problem.b_scale_rows > 1
      and num_sms < count <= STREAM_K_MAX_WAVES * num_sms
      and blocks >= STREAM_K_MIN_BLOCKS
  )


def block_config(
    problem: GemmProblem, config: GemmConfig | None = None, num_sms: int | None = None
) -> GemmConfig:
  """`config`, or the default made blockwise-ready: tile_k the scale block's K extent,
  tile_n 128 (one B scale block per tile and a 64-register sum beside the 64-register
  block accumulator), whole tiles, no cluster, and 64x32 epilogue stores, whose smaller
  buffers leave room for a sixth stage (1.3-5.0% faster on the H200, NOTES exp. 116).
  Promotion depth 2, or 1 with per-row B scales: their factor is a full 64-register array
  per block, and two blocks in flight beside it spill (256 against 941 TFLOP/s at
  2048x7168x16384 on the H200, NOTES exp. 112). On `num_sms` SMs (default: the
  device's), balanced stream-K where `stream_k_pays`, else with square B blocks the
  last wave split into K slices of >= 12 blocks where it has a tail
  (`heuristics.split_tail`: 1.056x at 1024x7168x16384 on the H200, NOTES exp. 125)."""
  if config is not None:
    return config
  cfg = default_config(dataclasses.replace(problem, block_scaled=False))
  cfg = dataclasses.replace(
      cfg,
      tile_m=128,
      tile_n=SCALE_BLOCK,
      tile_k=problem.scale_block_k,
      wg_split="m",
      schedule="cooperative",
      cluster=(1, 1),
      split_k=1,
      epilogue_tile=(64, 32),
      promotion_depth=2 if problem.b_scale_rows > 1 else 1,
      stream_k=False,
      split_tail=False,
  )
  cfg = fit_stages(cfg, problem, 6 * SCALE_BLOCK // problem.scale_block_k)
  sms = num_sms or _compat.device_sm_count() or DEFAULT_NUM_SMS
  if stream_k_pays(problem, sms):
    return dataclasses.replace(cfg, stream_k=True)
  return heuristics.split_tail(problem, cfg, sms) if problem.b_scale_rows > 1 else cfg


def _kernel_path(
    a, b, a_scales, b_scales, b_rows, block_k, spec, out_dtype, bias, residual, config, impl
):
  interpret = impl == "interpret"
  if interpret:  # B (N, K) is read through a transposed shared-memory view
    _compat.require_interpret_transposes(False, True)
  (m, k), n = a.shape, b.shape[0]
  problem = GemmProblem(
      m=m,
      n=n,
      k=k,
      dtype=a.dtype.name,
      out_dtype=out_dtype,
      transpose_b=True,
      has_bias=bias is not None,
      b_dtype=b.dtype.name if b.dtype != a.dtype else None,
      residual_dtype=None if residual is None else jnp.result_type(residual).name,
      block_scaled=True,
      b_scale_rows=b_rows,
      scale_block_k=block_k,
  )
  cfg = block_config(problem, config)
  if interpret:  # the interpreter has no GMEM semaphores for stream-K's fixup
    cfg = gemm_lib.interpret_config(cfg.whole_tiles() if config is None else cfg, problem)
  cfg.validate(problem)
  a, b = gemm_lib.tma_layout(a, b, problem, cfg, interpret)
  rows, cols = gemm_lib.out_extent(problem, cfg, interpret)
  m_tiles, n_tiles = tiles(m, cfg.tile_m), tiles(n, cfg.tile_n)
  k_blocks = a_scales.shape[1]
  # Transposed scales: a K block's row of A scales is one TMA box (1, tile_m), B's the
  # aligned (1, B_SCALE_BOX) box that holds the tile's block.
  a_scales_t = pad_last2(a_scales.T, k_blocks, round_up(max(m_tiles * cfg.tile_m, 4), 4))
  b_cols = round_up(n_tiles, B_SCALE_BOX) if b_rows > 1 else n_tiles * cfg.tile_n
  b_scales_t = pad_last2(b_scales.T, k_blocks, round_up(b_cols, 4))
  if bias is not None:
    bias = gemm_lib.kernel_layout("bias", jnp.asarray(bias), problem, cfg, rows, cols)
  if residual is not None:
    residual = gemm_lib.kernel_layout("residual", residual, problem, cfg, rows, cols)
  out = hopper_gemm(
      a,
      b,
      bias,
      None,
      residual=residual,
      block_scales=(a_scales_t, b_scales_t),
      problem=dataclasses.replace(problem, m=rows, n=cols),
      config=cfg,
      epilogue=spec,
      interpret=_compat.interpret_params(zero_fill=False) if interpret else None,
  )
  return out[:m, :n]


# -- a differentiable linear layer: the DeepSeek-V3 recipe --------------------------------
def blockwise_fp8_linear(
    x,
    w,
    bias=None,
    *,
    dtype=jnp.float8_e4m3fn,
    implementation: str | None = None,
):
  """`x @ w + bias` with both GEMMs of the forward and the backward in blockwise fp8,
  quantizing inside (DeepSeek-V3's recipe):

    forward   y  = q(x, 1x128) @ q(w^T, 128x128)^T          (x's rows, w's square blocks)
    dgrad     dx = q(g, 1x128) @ q(w, 128x128)^T             (w's blocks transposed, same scales)
    wgrad     dw = q(x^T, 1x128) @ q(g^T, 1x128)^T           (both per 1x128 along the tokens)

  with f32 accumulation and every result in x's (or w's) dtype. What is saved for the
  backward: x and w (requantized there in their backward orientation) and w's fp8
  copy with its scales.

  Args:
    x: (..., K) activations, bf16/f16/f32; w: (K, N) weights (as `nnx.Linear` stores them);
    bias: (N,) or None.
    dtype: the fp8 format of every quantized operand (e4m3, or e5m2).
    implementation: as `blockwise_scaled_matmul`.

  >>> import jax, jax.numpy as jnp
  >>> x = jnp.ones((4, 256), jnp.bfloat16); w = jnp.full((256, 128), 0.01, jnp.bfloat16)
  >>> y = blockwise_fp8_linear(x, w, implementation="xla")
  >>> y.shape, y.dtype, round(float(y[0, 0]), 2)
  ((4, 128), dtype(bfloat16), 2.56)
  """
  x, w = jnp.asarray(x), jnp.asarray(w)
  if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[0]:
    raise ValueError(f"x must be (..., K) and w (K, N); got {x.shape} and {w.shape}")
  OPERANDS["bias"].check(bias, 1, w.shape[1])
  static = _layer_static(dtype, implementation, x)
  y = _fp8_linear(static, x.reshape(math.prod(x.shape[:-1]), x.shape[-1]), w, bias)
  return y.reshape(*x.shape[:-1], w.shape[1])


def _layer_static(dtype, implementation, x):
  """The fp8 layers' static arguments, checked: (fp8 dtype name, implementation, x's
  dtype name)."""
  if jnp.dtype(dtype).name not in FP8_DTYPES:
    raise TypeError(f"dtype must be one of {FP8_DTYPES}, got {jnp.dtype(dtype)}")
  if implementation not in gemm_lib.IMPLEMENTATIONS:
    raise ValueError(
        f"implementation must be one of {gemm_lib.IMPLEMENTATIONS}, got {implementation!r}"
    )
  return jnp.dtype(dtype).name, implementation, x.dtype.name


def _matmul(static, a, a_block, b, b_block, out_dtype):
  """blockwise_scaled_matmul of a (M, K) and b (N, K), each quantized here."""
  dtype, implementation, _ = static
  aq, a_s = quantize_blockwise(a, a_block, dtype)
  bq, b_s = quantize_blockwise(b, b_block, dtype)
  return blockwise_scaled_matmul(
      aq, bq, a_s, b_s, out_dtype=out_dtype, implementation=implementation
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fp8_linear(static, x, w, bias):
  return _linear_fwd(static, x, w, bias)[0]


def _linear_fwd(static, x, w, bias):
  dtype, implementation, out = static
  wq, w_s = quantize_blockwise(w.T, (SCALE_BLOCK, SCALE_BLOCK), dtype)
  xq, x_s = quantize_blockwise(x, (1, SCALE_BLOCK), dtype)
  y = blockwise_scaled_matmul(
      xq, wq, x_s, w_s, out_dtype=out, bias=bias, implementation=implementation
  )
  bias_dtype = None if bias is None else jnp.dtype(bias.dtype).name
  return y, (x, w, wq, w_s, _Names(bias_dtype, jnp.dtype(w.dtype).name))


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Names:
  bias: str | None
  w: str


def _linear_bwd(static, saved, g):
  dtype, implementation, out = static
  x, w, wq, w_s, names = saved
  gq, g_s = quantize_blockwise(g, (1, SCALE_BLOCK), dtype)
  # dgrad: B = w (K, N), the forward's fp8 weight transposed (square blocks keep their scales)
  d_x = blockwise_scaled_matmul(gq, wq.T, g_s, w_s.T, out_dtype=out, implementation=implementation)
  # wgrad: dw (K, N) = x^T g, both operands per 1 x 128 along the tokens
  d_w = _matmul(static, x.T, (1, SCALE_BLOCK), g.T, (1, SCALE_BLOCK), names.w)
  d_bias = None if names.bias is None else g.astype(jnp.float32).sum(0).astype(names.bias)
  return d_x, d_w, d_bias


_fp8_linear.defvjp(_linear_fwd, _linear_bwd)


def make_blockwise_fp8_dot_general(*, dtype=jnp.float8_e4m3fn, implementation: str | None = None):
  """A `lax.dot_general` drop-in whose dense-layer contractions run `blockwise_fp8_linear`,
  for injection into Flax's layers (`nnx.Linear(..., dot_general=...)`,
  `nnx.LinearGeneral`, `nnx.Einsum`): lhs (..., K) contracted on its last dim with a
  2-D rhs, (K, N) or (N, K), no batch dims. Every other contraction (attention's
  batched ones, ...) runs `lax.dot_general` unchanged.

  >>> import jax.numpy as jnp
  >>> from flax import nnx
  >>> f = make_blockwise_fp8_dot_general(implementation="xla")
  >>> layer = nnx.Linear(256, 128, dot_general=f, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  >>> layer(jnp.ones((2, 256))).shape
  (2, 128)
  """

  def dot_general(
      lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None
  ):
    (lhs_c, rhs_c), (lhs_b, rhs_b) = dimension_numbers
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    dense = (
        not lhs_b
        and not rhs_b
        and rhs.ndim == 2
        and lhs.ndim >= 1
        and tuple(lhs_c) == (lhs.ndim - 1,)
        and tuple(rhs_c) in ((0,), (1,))
        and jnp.issubdtype(lhs.dtype, jnp.floating)
        and jnp.issubdtype(rhs.dtype, jnp.floating)
        and out_sharding is None
    )
    if not dense:
      return jax.lax.dot_general(
          lhs,
          rhs,
          dimension_numbers,
          precision=precision,
          preferred_element_type=preferred_element_type,
          out_sharding=out_sharding,
      )
    out_dtype = preferred_element_type or jnp.result_type(lhs, rhs)
    w = rhs if tuple(rhs_c) == (0,) else rhs.T
    y = blockwise_fp8_linear(lhs.astype(out_dtype), w, dtype=dtype, implementation=implementation)
    return y.astype(out_dtype)

  return dot_general


# -- grouped (MoE): contiguous groups of rows, one expert's weights each ------------------
def blockwise_ragged_dot(
    lhs,
    rhs,
    lhs_scales,
    rhs_scales,
    group_sizes,
    *,
    out_dtype=jnp.bfloat16,
    config=None,
    implementation: str | None = None,
):
  """Grouped blockwise-scaled fp8 GEMM: out[r] = (lhs[r] * s) @ (rhs[group(r)] * s)^T for
  the rows r of each contiguous group (DeepSeek-V3's MoE layout; `jax.lax.ragged_dot`'s
  grouping), scales applied per 128-wide K block in registers. Rows past
  `sum(group_sizes)` come out zero.

  Args:
    lhs: (M, K) fp8 tokens sorted by expert, with `lhs_scales` f32 (M, cdiv(K, 128)).
    rhs: (G, N, K) fp8 expert weights (K-major), with `rhs_scales` f32
      (G, cdiv(N, 128), cdiv(K, 128)).
    group_sizes: (G,) int rows per expert.
    out_dtype: bf16, f16 or f32.
    config: a `RaggedConfig` (tile_k and tile_n 128), or None.
    implementation: None ("pallas" on a Hopper GPU, else "xla"), "pallas", "interpret"
      or "xla" (dequantize, then `lax.ragged_dot` at HIGHEST precision).
  """
  if implementation not in gemm_lib.IMPLEMENTATIONS:
    raise ValueError(
        f"implementation must be one of {gemm_lib.IMPLEMENTATIONS}, got {implementation!r}"
    )
  lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
  for name, x, ndim in (("lhs", lhs, 2), ("rhs", rhs, 3)):
    if x.ndim != ndim or x.dtype.name not in FP8_DTYPES:
      raise ValueError(f"{name} must be a {ndim}-D fp8 array, got {x.dtype} {x.shape}")
  (m, k), (g, n, k_rhs) = lhs.shape, rhs.shape
  if k != k_rhs:
    raise ValueError(f"lhs (M, K) and rhs (G, N, K) must share K: {lhs.shape}, {rhs.shape}")
  kb = -(-k // SCALE_BLOCK)
  for name, s, shape in (
      ("lhs_scales", lhs_scales, (m, kb)),
      ("rhs_scales", rhs_scales, (g, -(-n // SCALE_BLOCK), kb)),
      ("group_sizes", group_sizes, (g,)),
  ):
    if jnp.shape(s) != shape:
      raise ValueError(f"{name} must have shape {shape}, got {jnp.shape(s)}")
  if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise TypeError(f"group_sizes must be integers, got {group_sizes.dtype}")
  out_dtype = jnp.dtype(out_dtype).name
  lhs_scales, rhs_scales = (jnp.asarray(s, jnp.float32) for s in (lhs_scales, rhs_scales))
  if implementation is None or implementation == "auto":
    implementation = "pallas" if _compat.on_hopper() else "xla"
  if 0 in (m, n, k, g):
    implementation = "xla"
  if implementation == "xla":
    a = dequantize_blockwise(lhs, lhs_scales)
    b = jax.vmap(lambda w, s: dequantize_blockwise(w, s, (SCALE_BLOCK, SCALE_BLOCK)))(
        rhs, rhs_scales
    )
    out = jax.lax.ragged_dot(
        a,
        jnp.swapaxes(b, 1, 2),
        group_sizes.astype(jnp.int32),
        precision=jax.lax.Precision.HIGHEST,
    )
    return out.astype(out_dtype)
  interpret = implementation == "interpret"
  if interpret:
    _compat.require_interpret_transposes(False, True)
  problem = rg.RaggedProblem(
      m=m,
      n=n,
      k=k,
      groups=g,
      dtype=lhs.dtype.name,
      out_dtype=out_dtype,
      transpose_rhs=True,
      block_scaled=True,
  )
  if config is None:
    config = fit_ragged_stages(problem)
  if interpret and config.num_sms is None:
    config = dataclasses.replace(config, num_sms=grouped.INTERPRET_NUM_SMS)
  config.validate(problem)
  lhs_p, rhs_p, rows, cols = grouped.ragged_layout(lhs, rhs, True, out_dtype, config, interpret)
  n_tiles = -(-n // config.tile_n)
  # Transposed scales: a K block's scales of a row box are one TMA box (1, tile_m); a group's
  # block scale is in an aligned (1, B_SCALE_BOX) box.
  lhs_scales_t = pad_last2(lhs_scales.T, kb, round_up(max(rows, lhs_p.shape[0]) + config.tile_m, 4))
  rhs_scales_t = jnp.pad(
      jnp.swapaxes(rhs_scales, 1, 2),
      ((0, 0), (0, 0), (0, round_up(n_tiles, B_SCALE_BOX) - n_tiles)),
  )
  out = rg.ragged_gemm(
      lhs_p,
      rhs_p,
      group_sizes,
      (lhs_scales_t, rhs_scales_t),
      problem=dataclasses.replace(problem, n=cols, m_out=rows),
      config=config,
      interpret=_compat.interpret_params(zero_fill=False) if interpret else None,
  )
  return out[:m, :n]


def blockwise_fp8_ragged_linear(
    x, w, group_sizes, *, dtype=jnp.float8_e4m3fn, implementation: str | None = None
):
  """Grouped `x[rows_g] @ w[g]` (`jax.lax.ragged_dot`'s layout), differentiable, with the
  forward and the input gradient in blockwise fp8 (as `blockwise_fp8_linear`):

    forward   y  = q(x, 1x128) @ q(w[g]^T, 128x128)^T         (`blockwise_ragged_dot`)
    dgrad     dx = q(g, 1x128) @ q(w[g], 128x128)^T           (the forward's fp8 weights
                                                               transposed, same scales)
    wgrad     dw[g] = x[rows_g]^T @ g[rows_g] in x's dtype    (`ragged_weight_gradient`)

  The weight gradient stays 16-bit: DeepSeek's fp8 wgrad scales 128-token blocks, which
  straddle the groups here.

  Args:
    x: (M, K) tokens sorted by expert, bf16/f16/f32; w: (G, K, N) expert weights;
    group_sizes: (G,) rows per expert (rows past their sum give zeros).
    dtype: the fp8 format of the quantized operands.
    implementation: as `blockwise_ragged_dot`.

  >>> x = jnp.ones((4, 128), jnp.bfloat16); w = jnp.full((2, 128, 16), 0.01, jnp.bfloat16)
  >>> y = blockwise_fp8_ragged_linear(x, w, jnp.array([1, 3]), implementation="xla")
  >>> y.shape, y.dtype, round(float(y[0, 0]), 2)
  ((4, 16), dtype(bfloat16), 1.28)
  """
  x, w, group_sizes = jnp.asarray(x), jnp.asarray(w), jnp.asarray(group_sizes)
  if x.ndim != 2 or w.ndim != 3 or x.shape[1] != w.shape[1]:
    raise ValueError(f"x must be (M, K) and w (G, K, N); got {x.shape} and {w.shape}")
  if group_sizes.shape != (w.shape[0],) or not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise ValueError(
        f"group_sizes must be ({w.shape[0]},) integers, got {group_sizes.dtype} {group_sizes.shape}"
    )
  static = _layer_static(dtype, implementation, x)
  return _fp8_ragged_linear(static, x, w, group_sizes.astype(jnp.int32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fp8_ragged_linear(static, x, w, group_sizes):
  return _ragged_linear_fwd(static, x, w, group_sizes)[0]


def _ragged_linear_fwd(static, x, w, group_sizes):
  dtype, implementation, out = static
  quantize_square = lambda v: quantize_blockwise(v, (SCALE_BLOCK, SCALE_BLOCK), dtype)
  wq, w_s = jax.vmap(quantize_square)(jnp.swapaxes(w, 1, 2))  # (G, N, K), K-major
  xq, x_s = quantize_blockwise(x, (1, SCALE_BLOCK), dtype)
  y = blockwise_ragged_dot(
      xq, wq, x_s, w_s, group_sizes, out_dtype=out, implementation=implementation
  )
  return y, (x, wq, w_s, group_sizes, _Names(None, jnp.dtype(w.dtype).name))


def _ragged_linear_bwd(static, saved, g):
  dtype, implementation, out = static
  x, wq, w_s, group_sizes, names = saved
  gq, g_s = quantize_blockwise(g, (1, SCALE_BLOCK), dtype)
  # dgrad: rhs (G, K, N), contracted over N: the forward's fp8 weights transposed
  d_x = blockwise_ragged_dot(
      gq,
      jnp.swapaxes(wq, 1, 2),
      g_s,
      jnp.swapaxes(w_s, 1, 2),
      group_sizes,
      out_dtype=out,
      implementation=implementation,
  )
  d_w = grouped.ragged_weight_gradient(  # (the kernel takes 16-bit operands only)
      x,
      g.astype(x.dtype),
      group_sizes,
      out_dtype=names.w,
      implementation=implementation if x.dtype.name in INPUT_DTYPES else "xla",
  )
  return d_x, d_w, None


_fp8_ragged_linear.defvjp(_ragged_linear_fwd, _ragged_linear_bwd)


def fit_ragged_stages(problem):
  """The grouped kernel's blockwise config: 128x128x128 tiles, the deepest ring that fits."""
  return smem.deepest(
      lambda stages: rg.RaggedConfig(tile_n=SCALE_BLOCK, tile_k=SCALE_BLOCK, stages=stages),
      (6, 5, 4, 3, 2),
      lambda cfg: cfg.smem_bytes(problem) <= smem.LIMIT_BYTES,
  )
