"""Grouped weight-only GEMM for mixture-of-experts inference: `quantized_ragged_dot`.

    out[r] = x[r] @ dequantize(qw)[group(r)]      (rows past sum(group_sizes): zeros)

`jax.lax.ragged_dot`'s semantics with the experts' (E, K, N) weights quantized by
`quantize_weights` (int4/int8, group or per-channel scales, optional zero points;
stored (E, N, K) or, by default, in K blocks (E, K / 128, N, 128)). The Hopper
kernel is the weight-only kernel of `weight_only_gemm` over a table of token
tiles (`tile_table`): each tile holds one expert's rows, reads only that
expert's packed weights, and writes its own columns of f32 partial sums, which
XLA sums over K splits and gathers back into row order. Scales multiply the
converted weights (`scale_on="weights"`). The XLA route dequantizes every
expert and runs `jax.lax.ragged_dot`. The default runs the kernel on a Hopper GPU
up to `KERNEL_MAX_M` routed rows.

>>> import jax.numpy as jnp
>>> w = jnp.stack([jnp.eye(128, 8), 2 * jnp.eye(128, 8)])  # (E, K, N)
>>> qw = pallas_gemm.quantize_weights(w, bits=4, group_size=128)
>>> x = jnp.ones((3, 128), jnp.bfloat16)
>>> quantized_ragged_dot(x, qw, jnp.array([1, 2]), implementation="xla")[:, 0].tolist()
[1.0, 2.0, 2.0]
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

import pallas_gemm  # noqa: F401 (the doctest's namespace)
from pallas_gemm import _compat
from pallas_gemm import weight_only as wo
from pallas_gemm import weight_only_gemm as kernel_lib
from pallas_gemm.config import tiles
from pallas_gemm.tma_padding import round_up, tma_rows

IMPLEMENTATIONS = (None, "auto", "pallas", "interpret", "xla")
KERNEL_MAX_M = 1024
"""Auto routing: the kernel up to this many routed rows, XLA above (not measured there).
Measured (NOTES exp. 90; int4 G128, Mixtral-8x7B's 8 experts, 14336x4096 and
4096x14336, us): on the H100 the kernel 141-161 at 16 rows against XLA's route
735-745 and bf16 `ragged_dot` 315-320, 485 against 1524 / 1143 at 1024 rows; on the
H200 133 against 523 / 218 at 16 rows, 262 against 607 / 313 at 256."""


def grouped_config(
    problem: kernel_lib.WeightOnlyProblem, num_sms: int, dequant: str = "registers"
) -> kernel_lib.WeightOnlyConfig:
  """Tiles for an expert problem: the token tile of the average rows per expert (16 to
  128), 64 weight rows per warpgroup, scales on the weights, split-K by the decode
  time model over the tiles that can hold rows, the deepest ring that fits.

  >>> p = kernel_lib.WeightOnlyProblem(m=64, n=4096, k=2048, bits=4, group_size=128, experts=8)
  >>> c = grouped_config(p, 132); (c.tile_m, c.scale_on, c.output)
  (16, 'weights', 'partials')
  """
  per_expert = tiles(problem.m, problem.experts)
  tile_m = next(t for t in (16, 32, 64, 128) if t >= per_expert or t == 128)
  tile_k = 128 if (problem.per_channel or problem.group_size % 128 == 0) else 64
  active = tiles(problem.m, tile_m) + min(problem.experts, problem.m)
  items = active * tiles(problem.n, kernel_lib.pipeline.CONSUMERS * 64)
  step_us = wo.decode_step_us(64, tile_k, problem.bits)
  split_k = wo.split_k_by_model(problem, items, tiles(problem.k, tile_k), step_us, tile_m, num_sms)
  config = kernel_lib.WeightOnlyConfig(
      tile_m=tile_m,
      tile_k=tile_k,
      stages=2,
      split_k=split_k,
      dequant=dequant,
      rows_per_wg=64,
      scale_on="weights",
      output="partials",
  )
  return wo.deepest_ring(config, problem)


def _check(x, qw, group_sizes):
  if not isinstance(qw, wo.QuantizedWeight):
    raise TypeError(f"qw must be a QuantizedWeight of quantize_weights, got {type(qw).__name__}")
  if len(qw.shape) != 3:
    raise ValueError(f"qw must hold a stack of experts: (E, K, N), got a weight of {qw.shape}")
  x = jnp.asarray(x)
  if x.dtype.name not in kernel_lib.ACTIVATION_DTYPES:
    raise TypeError(f"x must be one of {kernel_lib.ACTIVATION_DTYPES}, got {x.dtype}")
  experts, k, _ = qw.shape
  if x.ndim != 2 or x.shape[1] != k:
    raise ValueError(f"x must be (M, K) with K={k} (qw stands for {qw.shape}), got {x.shape}")
  group_sizes = jnp.asarray(group_sizes)
  if group_sizes.shape != (experts,) or not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise ValueError(
        f"group_sizes must be ({experts},) integers (one per expert), got "
        f"{group_sizes.shape} {group_sizes.dtype}"
    )
  return x, group_sizes.astype(jnp.int32)


def quantized_ragged_dot(
    x, qw, group_sizes, *, out_dtype=None, config=None, implementation=None, num_sms=None
):
  """Rows of `x` (M, K), in consecutive groups of `group_sizes` (E,), times their
  expert's dequantized (K, N) weight from `qw` (a `QuantizedWeight` stack standing
  for (E, K, N)). Rows past sum(group_sizes) come out zero.

  Args:
    out_dtype: defaults to x's dtype (bfloat16 or float16).
    config: a `WeightOnlyConfig` for the kernel (`grouped_config` if None).
    implementation: None/"auto" (the kernel on a Hopper GPU up to `KERNEL_MAX_M` rows
      where it applies, else XLA), "xla" (dequantize, then `jax.lax.ragged_dot`),
      "pallas" (the Hopper kernel), "interpret" (the kernel in GPU interpret mode).
    num_sms: CTAs of the persistent kernel (default: the device's SMs).
  Returns:
    (M, N) array of `out_dtype`.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  x, group_sizes = _check(x, qw, group_sizes)
  out_dtype = jnp.dtype(out_dtype or x.dtype)
  experts, k, n = qw.shape
  m = x.shape[0]
  problem = wo.problem_of(x, qw, experts=experts)
  why_not = wo.kernel_fits(problem)
  implementation = wo.routed(implementation, why_not, m, KERNEL_MAX_M)
  if implementation == "xla" or 0 in (m, n):
    w = wo.dequantize_weights(qw, x.dtype)  # (E, K, N)
    return jax.lax.ragged_dot(x, w, group_sizes, preferred_element_type=out_dtype)
  if why_not is not None:
    raise ValueError(
        f"implementation={implementation!r}: the weight-only kernel cannot run: {why_not}"
    )
  interpret = implementation == "interpret"
  if interpret:
    num_sms = num_sms or wo.INTERPRET_NUM_SMS
    qw, problem = wo.interpretable(qw, problem)
  else:
    _compat.require_hopper("pallas_gemm.quantized_ragged_dot (implementation='pallas')")
    num_sms = num_sms or _compat.device_sm_count() or kernel_lib.DEFAULT_NUM_SMS
  config = config or grouped_config(problem, num_sms)
  if not isinstance(config, kernel_lib.WeightOnlyConfig):
    raise TypeError(f"config must be a WeightOnlyConfig or None, got {type(config).__name__}")
  values = qw.values
  if interpret:  # the interpreter drops partially out-of-bounds stores: whole tiles
    config = wo.interpret_config(config, problem)
    values = wo.pad_rows(values, round_up(n, config.tile_n))
  token_tiles = kernel_lib.max_token_tiles(m, experts, config.tile_m)
  table, columns = kernel_lib.tile_table(group_sizes, m, config.tile_m, token_tiles)
  rows = round_up(m, 8) + config.tile_m if interpret else tma_rows(m)  # a tile may start late
  x_in = jnp.pad(x, ((0, rows - m), (0, 0))) if rows != m else x
  stored_n = n if qw.fragments else values.shape[-2]  # packed: whole units, never padded
  pad = lambda v: jnp.pad(v, ((0, 0), (0, 0), (0, stored_n - n)))
  scales = pad(qw.scales.astype(x.dtype))
  zeros = None if qw.zeros is None else pad(qw.zeros.astype(x.dtype))
  partials = kernel_lib.weight_only_gemm(
      x_in,
      values,
      scales,
      zeros,
      None,
      table,
      problem=dataclasses.replace(problem, m=rows, n=stored_n),
      config=config,
      interpret=_compat.interpret_params(zero_fill=False) if interpret else None,
      num_sms=num_sms,
  )
  by_column = partials.sum(axis=0)[:n].T  # (tiles * tile_m, N)
  y = jnp.where(columns[:, None] >= 0, by_column[jnp.maximum(columns, 0)], 0.0)
  return y.astype(out_dtype)


__all__ = ["KERNEL_MAX_M", "grouped_config", "quantized_ragged_dot"]
