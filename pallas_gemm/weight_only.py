"""Weight-only quantized GEMM: `quantized_matmul(x, w_q, scales, zeros)` and its quantizer.

    w[k, n] = (w_q[n, k] - zeros[k // G, n]) * scales[k // G, n]        (G = group_size)
    y = act(x @ w + bias)

The weights are int4 or int8, stored (N, K) (K-major: the layout the kernel
reads, the transpose of a (K, N) Dense kernel), with one scale (and optionally
one zero point) per group of G consecutive K and per output column, as in
GPTQ/AWQ (G = 128) or per channel (G = K). int4 values are jnp.int4 in [-8, 7],
which XLA stores two to a byte (low nibble first); a uint8 array of packed
nibbles (N, K // 2) is accepted too (`bits=4`). Zero points are in the same
signed domain: AWQ's unsigned q_u and z_u are q_u - 8 and z_u - 8 here.
On a Hopper GPU `quantize_weights` packs int4 and int8 weights (N and K multiples of
64; an expert stack too) in WGMMA's register order (`pack_fragments`,
`pallas_gemm.fragments`: the kernel converts it with no relayout; int4 decode 5-19%
faster, int8 0-8% at decode and 5-11% at prefill); other weights in K blocks,
(K / 128, N, 128): each block's rows contiguous, so that every TMA box the kernel
reads (weight rows x 128 K) is one contiguous run of memory (`block_weights` and
`pack_fragments` convert (N, K) weights made elsewhere, once, at load time; the
kernel reads every layout).

Up to `KERNEL_MAX_M` tokens (packed weights: any M) the Hopper kernel of
`weight_only_gemm` reads the packed weights and dequantizes them in registers
(decode: group scales on each step's product, split-K partials finished here;
prefill: scales on the weights and bias, activation and the store in the kernel);
larger M runs XLA's GEMM on
the weights dequantized by an XLA fusion (`implementation="xla"`, also the
reference), whose pass is then a small share of the time.

>>> import jax.numpy as jnp
>>> w = jnp.tile(jnp.array([7.0, -7, 1, 2, 3, 0, -1, 5]), 2)[:, None] * jnp.ones((1, 2))  # (K, N)
>>> qw = quantize_weights(w, bits=4, group_size=8)
>>> qw.values.shape, qw.values.dtype, qw.scales.shape
((2, 16), dtype(int4), (2, 2))
>>> x = jnp.ones((1, 16), jnp.bfloat16)
>>> quantized_matmul(x, qw, implementation="xla").tolist()
[[20.0, 20.0]]
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from pallas_gemm import _compat
from pallas_gemm import epilogue as epilogue_lib
from pallas_gemm import fragments
from pallas_gemm import weight_only_gemm as kernel_lib
from pallas_gemm.operands import OPERANDS
from pallas_gemm.config import tiles
from pallas_gemm.tma_padding import round_up, tma_rows

IMPLEMENTATIONS = (None, "auto", "pallas", "interpret", "xla")
KERNEL_MAX_M = 2048
"""Auto routing: above this many tokens XLA's GEMM on dequantized weights is used
(its dequantization pass is a small share of the GEMM there). Measured on the H100
(NOTES exp. 88), int4 G128, (M, 4096) x 14336 and (M, 14336) x 4096: the kernel's
prefill config 300.7 / 292.9 us at M = 2048 against the XLA route's 365.0 / 364.2 (bf16
`jnp.dot` 294.7 / 289.4), 677.5 / 662.6 at 4096 against 673.6 / 657.5."""
INTERPRET_NUM_SMS = 2


K_BLOCK = 128
"""K columns per block of the stored values (`QuantizedWeight.k_block`): each of the
kernel's TMA boxes (weight rows x 128 K) is then one contiguous run of memory. The
(N, K) layout's boxes read 64-byte row segments (int4) at a stride of K / 2 bytes:
2.1 TB/s through the ring on the H100 against 2.9 for contiguous boxes
(`benchmarks.tma_rate`, NOTES exp. 90)."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
  """A (K, N) weight quantized for `quantized_matmul`: int4/int8 `values`, `scales`
  (K // group_size, N), `zeros` like `scales` or None; a pytree whose leaves are the
  arrays. `values` are (N, K) (K-major) with `k_block` 0, or (K / k_block, N, k_block)
  (K blocks whose rows are contiguous), or with `fragments` `fragments.pack`'s int32
  units in WGMMA's register order (`quantize_weights`' default on Hopper, what the kernel
  reads fastest); an expert stack's arrays carry a leading E.

  >>> qw = quantize_weights(jnp.ones((256, 8)), bits=4)
  >>> qw.values.shape, qw.k_block, qw.shape, qw.nk_values().shape
  ((2, 8, 128), 128, (256, 8), (8, 256))
  """

  values: jax.Array
  scales: jax.Array
  zeros: jax.Array | None = None
  group_size: int = dataclasses.field(default=128, metadata=dict(static=True))
  k_block: int = dataclasses.field(default=0, metadata=dict(static=True))
  fragments: bool = dataclasses.field(default=False, metadata=dict(static=True))

  @property
  def bits(self) -> int:
    if self.fragments:
      return fragments.bits_of(self.values)
    return 4 if self.values.dtype == jnp.int4 else 8

  @property
  def shape(self) -> tuple[int, ...]:
    """The (K, N) shape of the weight it stands for ((E, K, N) for a stack of experts)."""
    shape = self.values.shape
    if self.fragments:
      packed = [(words, 128) for words in fragments.WORDS.values()]
      if len(shape) not in (4, 5) or shape[-2:] not in packed or self.values.dtype != jnp.int32:
        raise ValueError(
            "QuantizedWeight.values with fragments=True must be `fragments.pack`'s "
            f"([E,] K / 64, N / 64, 4 or 8, 128) int32, got {self.values.dtype} {shape}"
        )
      *lead, kb, nb = shape[:-2]
      return (*lead, kb * fragments.UNIT, nb * fragments.UNIT)
    if self.k_block:
      if len(shape) < 3 or shape[-1] != self.k_block:
        raise ValueError(
            f"QuantizedWeight.values must be (..., K / k_block, N, k_block) with k_block="
            f"{self.k_block}, got shape {shape}"
        )
      *lead, blocks, n, block = shape
      return (*lead, blocks * block, n)
    if len(shape) < 2:
      raise ValueError(f"QuantizedWeight.values must be (..., N, K), got shape {shape}")
    *lead, n, k = shape
    return (*lead, k, n)

  def nk_values(self):
    """The values as (N, K) (or (E, N, K)), whatever the stored layout."""
    if self.fragments:
      return fragments.unpack(self.values).astype(jnp.int4 if self.bits == 4 else jnp.int8)
    if not self.k_block:
      return self.values
    *lead, k, n = self.shape
    return jnp.swapaxes(self.values, -3, -2).reshape(*lead, n, k)


def block_weights(qw: QuantizedWeight, k_block: int = K_BLOCK) -> QuantizedWeight:
  """`qw` with its values stored in K blocks of `k_block` (0: back to (N, K)), e.g. for
  weights quantized elsewhere and passed as (N, K) arrays: once, at load time.

  >>> qw = quantize_weights(jnp.ones((256, 8)), bits=8, k_block=0)
  >>> qw.values.shape, block_weights(qw).values.shape
  ((8, 256), (2, 8, 128))
  """
  k, n = qw.shape[-2:]
  if k_block and (not isinstance(k_block, int) or k_block % 64 or k % k_block):
    raise ValueError(f"k_block={k_block!r} must be a multiple of 64 dividing K={k} (or 0)")
  values = qw.nk_values()
  if k_block:
    *lead, _, _ = values.shape
    values = jnp.swapaxes(values.reshape(*lead, n, k // k_block, k_block), -3, -2)
  return dataclasses.replace(qw, values=values, k_block=k_block, fragments=False)


def pack_fragments(qw: QuantizedWeight) -> QuantizedWeight:
  """`qw` (an int4 or int8 (K, N) weight, or an (E, K, N) stack of experts' weights, N
  and K multiples of 64) with its values packed in WGMMA's register order
  (`pallas_gemm.fragments`): the kernel converts them without a relayout (int4 decode
  5-15% faster on the H100, 15-19% on the H200, NOTES exp. 91; int8 0-8% at decode and
  5-11% at prefill on the H100, exp. 94; expert stacks 10-22%, exp. 97); once, at load
  time.

  >>> qw = pack_fragments(quantize_weights(jnp.ones((256, 128)), bits=4))
  >>> qw.values.shape, qw.values.dtype, qw.shape
  ((4, 2, 4, 128), dtype('int32'), (256, 128))
  """
  if len(qw.shape) not in (2, 3):
    raise ValueError(
        f"pack_fragments packs a (K, N) weight or an (E, K, N) stack, got shape {qw.shape}"
    )
  if qw.fragments:
    return qw
  values = fragments.pack(qw.nk_values(), bits=qw.bits)
  return dataclasses.replace(qw, values=values, k_block=0, fragments=True)


def quantize_weights(
    w,
    bits: int = 4,
    group_size: int = 128,
    *,
    symmetric=True,
    dtype=jnp.bfloat16,
    k_block=None,
    fragments=None,
):
  """Quantizes a (K, N) weight, or an (E, K, N) stack of experts' weights, per group of
  `group_size` K rows (-1: per channel).

  Symmetric: scale = max|w| / qmax (qmax 7 for int4, 127 for int8), no zeros.
  Asymmetric: the group's [min, max] spans [-2^(bits-1), 2^(bits-1) - 1] with a
  real-valued zero point. Returns a `QuantizedWeight` whose scales (and zeros)
  are `dtype`, the activations' dtype, as the kernel multiplies in it; an expert
  stack's arrays carry the leading E. The values' layout (see `QuantizedWeight`):
  `fragments` packs the values in WGMMA's register order (`pack_fragments`, what the
  kernel reads fastest); None: on a Hopper GPU where it can (N and K multiples of 64)
  unless `k_block` is given (elsewhere XLA's route would unpack it with a
  gather). Else `k_block`; None: `K_BLOCK` where it divides K, else 0
  ((N, K)).
  """
  w = jnp.asarray(w)
  if w.ndim not in (2, 3):
    raise ValueError(f"w must be (K, N) or (E, K, N), got shape {w.shape}")
  if bits not in kernel_lib.BITS:
    raise ValueError(f"bits must be one of {kernel_lib.BITS}, got {bits!r}")
  *lead, k, n = w.shape
  group_size = k if group_size == -1 else group_size
  if not isinstance(group_size, int) or group_size <= 0 or k % group_size:
    raise ValueError(f"group_size={group_size!r} must be a positive divisor of K={k} (or -1)")
  lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
  groups = w.astype(jnp.float32).reshape(*lead, k // group_size, group_size, n)
  if symmetric:
    amax = jnp.max(jnp.abs(groups), axis=-2)
    scales = jnp.where(amax > 0, amax / hi, 1.0)
    zeros = None
    q = jnp.round(groups / scales[..., None, :])
  else:
    gmin, gmax = jnp.min(groups, axis=-2), jnp.max(groups, axis=-2)
    scales = jnp.where(gmax > gmin, (gmax - gmin) / (hi - lo), 1.0)
    zeros = lo - gmin / scales
    q = jnp.round(groups / scales[..., None, :] + zeros[..., None, :])
  q = jnp.clip(q, lo, hi).reshape(*lead, k, n)
  q = jnp.swapaxes(q, -1, -2).astype(jnp.int4 if bits == 4 else jnp.int8)
  qw = QuantizedWeight(
      q, scales.astype(dtype), None if zeros is None else zeros.astype(dtype), group_size
  )
  if fragments is None:  # where the kernel reads it: XLA would unpack it with a gather
    packable = k % 64 == 0 and n % 64 == 0
    fragments = k_block is None and packable and _compat.on_hopper()
  if fragments:
    return pack_fragments(qw)
  if k_block is None:
    k_block = K_BLOCK if k % K_BLOCK == 0 else 0
  return block_weights(qw, k_block) if k_block else qw


def dequantize_weights(qw: QuantizedWeight, dtype=jnp.float32):
  """The (K, N) (or (E, K, N)) weight `qw` stands for, computed in f32, returned as `dtype`."""
  return jnp.swapaxes(dequantize_transposed(qw, dtype), -1, -2)


def dequantize_transposed(qw: QuantizedWeight, dtype=jnp.float32):
  """The (N, K) (or (E, N, K)) transpose of the weight `qw` stands for."""
  q = qw.nk_values().astype(jnp.float32)  # (..., N, K)
  repeat = lambda v: jnp.repeat(jnp.swapaxes(v.astype(jnp.float32), -1, -2), qw.group_size, axis=-1)
  if qw.zeros is not None:
    q = q - repeat(qw.zeros)
  return (q * repeat(qw.scales)).astype(dtype)


def unpack_int4(packed):
  """(N, K // 2) uint8 of two nibbles per byte (low nibble = even k) -> (N, K) int4."""
  packed = jnp.asarray(packed)
  if packed.dtype != jnp.uint8:
    raise TypeError(f"packed int4 weights must be uint8, got {packed.dtype}")
  low = (packed & 0xF).astype(jnp.int8)
  high = (packed >> 4).astype(jnp.int8)
  both = jnp.stack([low, high], axis=-1).reshape(*packed.shape[:-1], -1)
  return jnp.where(both > 7, both - 16, both).astype(jnp.int4)


def _as_quantized(w_q, scales, zeros, bits, group_size) -> QuantizedWeight:
  """Checks `quantized_matmul`'s weight arguments; a `QuantizedWeight`."""
  if isinstance(w_q, QuantizedWeight):
    if scales is not None or zeros is not None:
      raise ValueError("scales and zeros come from the QuantizedWeight; pass them as None")
    if len(w_q.shape) != 2:
      raise ValueError(f"w_q must be one (K, N) weight, got a QuantizedWeight of {w_q.shape}")
    values, scales, zeros, k_block = w_q.values, w_q.scales, w_q.zeros, w_q.k_block
    if group_size is not None and group_size != w_q.group_size:
      raise ValueError(f"group_size={group_size} but the QuantizedWeight has {w_q.group_size}")
    k, n = w_q.shape
    if w_q.fragments:  # checked by its shape property; the bits by its word rows
      if bits is not None and bits != w_q.bits:
        raise ValueError(f"bits={bits} but w_q is packed int{w_q.bits} (fragments)")
      return w_q
  else:
    values, k_block = jnp.asarray(w_q), 0
    if scales is None:
      raise TypeError("scales is required with an array w_q")
    if values.dtype == jnp.uint8:
      if bits != 4:
        raise ValueError(
            f"w_q is uint8: packed int4 (two per byte) needs bits=4, got bits={bits!r}; "
            "int8 weights are int8"
        )
      values = unpack_int4(values)
    if values.ndim != 2:
      raise ValueError(f"w_q must be (N, K) (K-major), got shape {values.shape}")
    n, k = values.shape
  if values.dtype in (jnp.int4, jnp.int8):
    dtype_bits = 4 if values.dtype == jnp.int4 else 8
    if bits is not None and bits != dtype_bits:
      raise ValueError(f"bits={bits} but w_q is {values.dtype} ({dtype_bits} bits)")
  else:
    raise TypeError(f"w_q must be int4, int8 or uint8 (packed int4), got {values.dtype}")
  scales = jnp.asarray(scales)
  if scales.ndim == 1:
    scales = scales[None]
  if scales.ndim != 2 or scales.shape[1] != n or scales.shape[0] == 0 or k % scales.shape[0]:
    raise ValueError(
        f"scales must be (K // group_size, N) with N={n} and a group count dividing K={k}, "
        f"got shape {scales.shape}"
    )
  inferred = k // scales.shape[0]
  if group_size is not None and group_size not in (inferred, -1 if inferred == k else None):
    raise ValueError(
        f"group_size={group_size} does not match scales {scales.shape}: K={k} / "
        f"{scales.shape[0]} groups = {inferred}"
    )
  if not jnp.issubdtype(scales.dtype, jnp.floating):
    raise TypeError(f"scales must be floating, got {scales.dtype}")
  if zeros is not None:
    zeros = jnp.asarray(zeros)
    zeros = zeros[None] if zeros.ndim == 1 else zeros
    if zeros.shape != scales.shape:
      raise ValueError(f"zeros must have the shape of scales {scales.shape}, got {zeros.shape}")
  return QuantizedWeight(values, scales, zeros, inferred, k_block)


DECODE_STEP_US = {(64, 4): 0.44, (128, 4): 0.89, (64, 8): 0.81, (128, 8): 1.52}
"""Measured time (us) of one 128-wide K step of the decode kernel per CTA, by (weight rows
per warpgroup, bits), HBM-bound (H100, weights packed in WGMMA's order or in K blocks,
NOTES exp. 92): a step of twice the rows costs about twice as much at int4, 1.9x at int8."""
PARTIAL_BYTES_PER_US = 3.0e6
"""HBM rate at which XLA's fusion writes and reads the f32 split-K partials."""
PARTIAL_KERNEL_US = 1.5
"""The XLA kernel that sums split-K partials costs this much besides its bytes (H100,
NOTES exp. 92: 1.5-2.0 us at 16 tokens of 14336 or 4096 columns)."""


def decode_step_us(rows_per_wg: int, tile_k: int, bits: int) -> float:
  """`DECODE_STEP_US` scaled to a step of `tile_k`.

  >>> decode_step_us(128, 128, 4), decode_step_us(64, 64, 8)
  (0.89, 0.405)
  """
  return DECODE_STEP_US[rows_per_wg, bits] * tile_k / 128


DECODE_MAX_M = 64
"""Up to this many tokens the group scales multiply each step's product (decode);
above, they multiply the converted weights (scale_on="weights")."""


def prefill_step_us(tile_m: int) -> float:
  """Measured time of one ring step (128 weight rows x 64 K, `tile_m` tokens) of the
  scale_on="weights" register pipeline per CTA: a fixed ~0.38 us plus the tensor-core
  time, which grows with the tokens (H100, NOTES exp. 88: 0.50-0.57 us at 128 tokens,
  0.66-0.70 at 256).

  >>> round(prefill_step_us(128), 2), round(prefill_step_us(256), 2)
  (0.53, 0.69)
  """
  return 0.38 + 0.0012 * tile_m


def default_config(
    problem: kernel_lib.WeightOnlyProblem, num_sms: int, dequant: str = "registers"
) -> kernel_lib.WeightOnlyConfig:
  """Tiles for the weight-only kernel.

  Decode (M <= DECODE_MAX_M): the narrowest token tile that holds M, the widest K
  step one scale group allows, group scales on each step's product, and the pair of
  weight rows per warpgroup (64, or 128 to 32 tokens) and split-K of least modelled
  time (waves x steps per item x the step's time, plus the f32 partials that XLA
  sums); without split-K the kernel scales the weights and stores the finished
  16-bit output itself ("tile"). Prefill: 128 to 256 tokens per tile, 64 weight rows
  per warpgroup, 64-wide K steps, scales on the weights, split-K by the same model,
  and the kernel's own store without it. The ring is the deepest that fits.
  (`stream_k` is not picked: measured slower, NOTES exp. 92.)

  >>> p = kernel_lib.WeightOnlyProblem(m=1, n=4096, k=14336, bits=4, group_size=128)
  >>> c = default_config(p, 132); (c.tile_m, c.tile_k, c.rows_per_wg, c.split_k)
  (16, 128, 64, 4)
  >>> c = default_config(dataclasses.replace(p, m=2048, n=14336, k=4096), 132)
  >>> (c.tile_m, c.tile_k, c.scale_on, c.split_k)
  (256, 64, 'weights', 1)
  """
  if problem.m > DECODE_MAX_M:
    return _prefill_config(problem, num_sms, dequant)
  tile_m = next(t for t in (16, 32, 64) if t >= problem.m)
  tile_k = next(
      t
      for t in (256, 128, 64)
      if (problem.per_channel or problem.group_size % t == 0)
      and (not problem.k_block or problem.k_block % t == 0)
      and tile_m * t <= 256 * 128
      and (t <= 128 or problem.bits == 4)
  )
  candidates = (64, 128) if tile_m <= 32 and tile_k <= 128 else (64,)
  rows = min(candidates, key=lambda r: decode_split(problem, r, tile_m, tile_k, num_sms)[0])
  _, split_k = decode_split(problem, rows, tile_m, tile_k, num_sms)
  if split_k == 1 and _tile_output(problem):
    # Whole sums per CTA: the kernel finishes and stores them, and no f32 partials make
    # the round trip through XLA (16 tokens, 14336 x 4096: 16.0 us against 18.3 with
    # 128 rows per warpgroup and split-K 2, H100, NOTES exp. 92).
    config = kernel_lib.WeightOnlyConfig(
        tile_m=tile_m,
        tile_k=tile_k,
        stages=2,
        dequant=dequant,
        rows_per_wg=rows,
        scale_on="weights",
        output="tile",
    )
  else:
    config = kernel_lib.WeightOnlyConfig(
        tile_m=tile_m, tile_k=tile_k, stages=2, split_k=split_k, dequant=dequant, rows_per_wg=rows
    )
  return deepest_ring(rows_that_fit(config, problem), problem)


def decode_split(problem, rows_per_wg: int, tile_m: int, tile_k: int, num_sms: int):
  """(modelled us, split-K) of decode with `rows_per_wg` weight rows per warpgroup: the
  split count of least modelled time and that time."""
  items = tiles(problem.m, tile_m) * tiles(problem.n, kernel_lib.pipeline.CONSUMERS * rows_per_wg)
  step_us = decode_step_us(rows_per_wg, tile_k, problem.bits)
  k_steps = tiles(problem.k, tile_k)
  split_k = split_k_by_model(problem, items, k_steps, step_us, tile_m, num_sms)
  return _cost(problem, items, k_steps, step_us, tile_m, num_sms, split_k), split_k


def _tile_output(problem) -> bool:
  """Whether the kernel can store the finished (M, N) output itself ("tile")."""
  return (
      problem.out_dtype in kernel_lib.ACTIVATION_DTYPES
      and not problem.experts
      and _compat.STORES_THROUGH_TRANSPOSED_SMEM
  )


def _prefill_config(problem, num_sms, dequant):
  """The scale_on="weights" config of the fastest (token tile, split-K) pair by the model."""
  best = None
  for tile_m in kernel_lib.TILE_M[3:]:  # 128 to 256 tokens
    if tile_m > round_up(problem.m, 32) and tile_m > 128:
      break
    items = tiles(problem.m, tile_m) * tiles(problem.n, kernel_lib.pipeline.CONSUMERS * 64)
    step_us = prefill_step_us(tile_m)
    k_steps = tiles(problem.k, 64)
    split_k = split_k_by_model(problem, items, k_steps, step_us, tile_m, num_sms)
    cost = _cost(problem, items, k_steps, step_us, tile_m, num_sms, split_k)
    if best is None or cost < best[0]:
      best = cost, tile_m, split_k
  _, tile_m, split_k = best
  tile = split_k == 1 and _tile_output(problem)
  config = kernel_lib.WeightOnlyConfig(
      tile_m=tile_m,
      tile_k=64,
      stages=2,
      split_k=split_k,
      dequant=dequant,
      rows_per_wg=64,
      scale_on="weights",
      output="tile" if tile else "partials",
  )
  return deepest_ring(config, problem)


def _cost(problem, items, k_steps, step_us, tile_m, num_sms, splits):
  """Modelled us: waves x steps per item x step time, plus the f32 partials' round trip
  through XLA's summing kernel."""
  partial_us = problem.n * tiles(problem.m, tile_m) * tile_m * 8 / PARTIAL_BYTES_PER_US
  cost = tiles(items * splits, num_sms) * tiles(k_steps, splits) * step_us
  return cost + (splits > 1) * (PARTIAL_KERNEL_US + splits * partial_us)


def split_k_by_model(problem, items, k_steps, step_us, tile_m, num_sms) -> int:
  """The split-K count (1-16) of the least modelled time."""
  costs = {
      splits: _cost(problem, items, k_steps, step_us, tile_m, num_sms, splits)
      for splits in range(1, min(16, k_steps) + 1)
  }
  return min(costs, key=costs.get)


def rows_that_fit(config, problem):
  """`config`, with 64 weight rows per warpgroup if its rows do not fit two stages in SMEM
  (the SMEM convert's double-buffered tiles grow with them)."""
  if dataclasses.replace(config, stages=2).smem_bytes(problem) > kernel_lib.SMEM_BYTES:
    return dataclasses.replace(config, rows_per_wg=64)
  return config


def interpret_config(config, problem):
  """`config` as the GPU interpreter runs it: the SMEM convert and WGMMA (it has no
  register operand and no warp-level MMA), and whole K splits (it does not zero-fill
  past K), in no more stages than `config` had."""
  k_steps = tiles(problem.k, config.tile_k)
  split_k = max(s for s in range(1, config.split_k + 1) if k_steps % s == 0)
  fields = dict(dequant="smem", mma="wgmma", split_k=split_k, stream_k=False)
  config = rows_that_fit(dataclasses.replace(config, **fields), problem)
  return deepest_ring(config, problem, most=config.stages)


def problem_of(x, qw: QuantizedWeight, **fields) -> kernel_lib.WeightOnlyProblem:
  """The kernel's problem for (M, K) activations `x` times `qw` (one weight or a stack)."""
  *_, k, n = qw.shape
  return kernel_lib.WeightOnlyProblem(
      m=x.shape[0],
      n=n,
      k=k,
      bits=qw.bits,
      group_size=qw.group_size,
      dtype=x.dtype.name,
      zeros=qw.zeros is not None,
      k_block=qw.k_block,
      fragments=qw.fragments,
      **fields,
  )


def deepest_ring(config, problem, most: int = 16):
  """`config` with the most stages (up to `most`, and the K steps) that fit in SMEM."""
  for stages in range(min(most, tiles(problem.k, config.tile_k) + 1), 1, -1):
    candidate = dataclasses.replace(config, stages=stages)
    if candidate.smem_bytes(problem) <= kernel_lib.SMEM_BYTES:
      return candidate
  return config


def kernel_fits(problem: kernel_lib.WeightOnlyProblem) -> str | None:
  """Why the kernel cannot run this problem (None: it can)."""
  if problem.k % 256:
    return f"K={problem.k} is not a multiple of 256 (TMA's swizzled rows of both operands)"
  if problem.n % 8:
    return f"N={problem.n} is not a multiple of 8 (TMA's rows of the (N, K) weight)"
  if not problem.per_channel and problem.group_size % 64:
    return f"group_size={problem.group_size} is not a multiple of 64 (one scale row per K step)"
  return None


def routed(implementation, why_not: str | None, m: int, max_m: int):
  """`implementation` with None/"auto" decided: "pallas" on a Hopper GPU where the kernel
  fits (`why_not` is None) and 0 < m <= max_m, else "xla"; other values as given.

  >>> routed(None, "K=100 is not a multiple of 256", 16, 2048), routed("interpret", None, 1, 1)
  ('xla', 'interpret')
  """
  if implementation not in (None, "auto"):
    return implementation
  use_kernel = _compat.on_hopper() and why_not is None and 0 < m <= max_m
  return "pallas" if use_kernel else "xla"


def quantized_matmul(
    x,
    w_q,
    scales=None,
    zeros=None,
    *,
    bits=None,
    group_size=None,
    bias=None,
    activation=None,
    out_dtype=None,
    config: kernel_lib.WeightOnlyConfig | None = None,
    implementation=None,
):
  """`act(x @ dequantize(w_q) + bias)` with int4/int8 weights and per-group scales.

  Args:
    x: (..., K) bfloat16 or float16 activations.
    w_q: (N, K) int4 or int8 values (K-major), (N, K // 2) uint8 packed int4 with
      `bits=4`, or a `QuantizedWeight` (then `scales`/`zeros` are None).
    scales: (K // group_size, N) dequantization multipliers ((N,) or (1, N) per channel).
    zeros: zero points shaped like `scales`, or None (symmetric).
    bits: 4 or 8; inferred from `w_q`'s dtype, required for packed uint8.
    group_size: checked against the scales' shape when given (-1: per channel).
    bias: (N,) added in f32, or None. activation: as `pallas_gemm.matmul`'s.
    out_dtype: defaults to x's dtype.
    config: a `WeightOnlyConfig`, or None for `default_config`.
    implementation: None/"auto" (the kernel on a Hopper GPU for M <= KERNEL_MAX_M
      tokens where it applies, else XLA), "pallas", "interpret" or "xla".
  Returns:
    (..., N) array of `out_dtype`.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  qw = _as_quantized(w_q, scales, zeros, bits, group_size)
  x = jnp.asarray(x)
  if x.dtype.name not in kernel_lib.ACTIVATION_DTYPES:
    raise TypeError(f"x must be one of {kernel_lib.ACTIVATION_DTYPES}, got {x.dtype}")
  k, n = qw.shape
  if x.ndim < 1 or x.shape[-1] != k:
    raise ValueError(
        f"x must be (..., K) with K={k} (w_q stands for (K, N) = {qw.shape}), got {x.shape}"
    )
  OPERANDS["bias"].check(bias, 1, n)
  if config is not None and not isinstance(config, kernel_lib.WeightOnlyConfig):
    raise TypeError(f"config must be a WeightOnlyConfig or None, got {type(config).__name__}")
  activation = epilogue_lib.activation_name(activation)
  out_dtype = jnp.dtype(out_dtype or x.dtype)
  lead, x2 = x.shape[:-1], x.reshape(-1, k)
  m = x2.shape[0]
  problem = problem_of(x2, qw)
  why_not = kernel_fits(problem)
  # Packed weights stay in the kernel whatever M: XLA would unpack them with a gather
  # (4096 x 14336 x 4096: 1097 us against 659 from K blocks, H100).
  max_m = m if qw.fragments else KERNEL_MAX_M
  implementation = routed(implementation, why_not, m, max_m)
  if 0 in (m, n):
    implementation = "xla"
  if implementation != "xla" and why_not is not None:
    raise ValueError(
        f"implementation={implementation!r}: the weight-only kernel cannot run: {why_not}"
    )
  if implementation == "xla":
    # (K, N) dequantized by one XLA fusion, then XLA's GEMM: 55 + 300 us at 2048x14336x4096
    # on the H100, against 73 + 300 for the stored (N, K) layout (NOTES exp. 67).
    w = dequantize_weights(qw, x.dtype)
    if activation is None and bias is None:  # cuBLAS writes the output dtype itself
      return jnp.matmul(x2, w, preferred_element_type=out_dtype).reshape(*lead, n)
    acc = jnp.matmul(x2, w, preferred_element_type=jnp.float32)
    y = epilogue_lib.apply(
        epilogue_lib.EpilogueSpec(activation=activation),
        acc,
        bias=None if bias is None else jnp.asarray(bias, jnp.float32)[None],
    )
    return y.astype(out_dtype).reshape(*lead, n)
  problem = dataclasses.replace(
      problem, out_dtype=out_dtype.name, bias=bias is not None, activation=activation
  )
  y = _kernel_matmul(x2, qw, bias, problem, config, interpret=implementation == "interpret")
  return y.astype(out_dtype).reshape(*lead, n)


def pad_rows(values, rows: int):
  """Stored values with N (their axis -2 in either layout) padded to `rows` with zeros.

  >>> pad_rows(jnp.ones((2, 5, 128), jnp.int8), 8).shape
  (2, 8, 128)
  """
  widths = [(0, 0)] * values.ndim
  widths[-2] = (0, rows - values.shape[-2])
  return jnp.pad(values, widths)


def interpretable(qw: QuantizedWeight, problem):
  """(qw, problem) as GPU interpret mode runs them: packed values (converted by inline
  Mosaic GPU code, which the interpreter lacks) in K blocks instead; others as they are."""
  if not qw.fragments:
    return qw, problem
  qw = block_weights(qw, K_BLOCK if problem.k % K_BLOCK == 0 else 0)
  return qw, dataclasses.replace(problem, fragments=False, k_block=qw.k_block)


def _rows(n: int, config) -> int:
  """N rounded up to whole weight tiles: the rows of a vector the kernel reads per tile."""
  return round_up(n, config.tile_n)


def _kernel_matmul(x, qw: QuantizedWeight, bias, problem, config, *, interpret: bool):
  """act(x @ dequantize(qw) + bias) (M, N) through the kernel. With the "partials"
  output, per-group scales are applied in it, and per-channel scales (and zero points),
  bias and activation to its summed partials here; with "tile" all of it in the kernel."""
  if interpret:
    num_sms = INTERPRET_NUM_SMS
    qw, problem = interpretable(qw, problem)
  else:
    _compat.require_hopper("pallas_gemm.quantized_matmul (implementation='pallas')")
    num_sms = _compat.device_sm_count()
  config = config or default_config(problem, num_sms or kernel_lib.DEFAULT_NUM_SMS)
  tile_output = config.output == "tile"
  on_weights = config.scale_on == "weights"
  if interpret:
    config = interpret_config(config, problem)
  m_rows = round_up(problem.m, config.tile_m) if interpret else tma_rows(problem.m)
  x_in = jnp.pad(x, ((0, m_rows - problem.m), (0, 0))) if m_rows != problem.m else x
  values, n = qw.values, problem.n
  if interpret:  # the interpreter drops partially out-of-bounds stores: whole tiles
    values = pad_rows(values, _rows(n, config))
  group_scales = group_zeros = None
  if tile_output and problem.per_channel and not on_weights:  # scaled as the kernel stores
    group_scales = jnp.pad(qw.scales.astype(jnp.float32), ((0, 0), (0, _rows(n, config) - n)))
  elif not problem.per_channel or on_weights:
    group_scales = qw.scales.astype(x.dtype)
    if qw.zeros is not None:  # the kernel subtracts them from q, then scales
      group_zeros = qw.zeros.astype(x.dtype)
    if interpret:
      pad = lambda v: jnp.pad(v, ((0, 0), (0, values.shape[-2] - n)))
      group_scales = pad(group_scales)
      group_zeros = None if group_zeros is None else pad(group_zeros)
  kernel_bias = None
  if tile_output and bias is not None:  # read by whole warpgroup rows: padded to tile_n
    kernel_bias = jnp.asarray(bias, jnp.float32)
    kernel_bias = jnp.pad(kernel_bias, (0, _rows(n, config) - n))
  out = kernel_lib.weight_only_gemm(
      x_in,
      values,
      group_scales,
      group_zeros,
      kernel_bias,
      problem=dataclasses.replace(
          problem, m=x_in.shape[0], n=problem.n if problem.fragments else values.shape[-2]
      ),
      config=config,
      interpret=_compat.interpret_params(zero_fill=False) if interpret else None,
      num_sms=num_sms,
  )
  if tile_output:
    return out[: problem.m, :n]
  acc = out.sum(axis=0)[:n, : problem.m].T  # (M, N) f32
  if problem.per_channel and not on_weights:
    scale = qw.scales[0].astype(jnp.float32)
    if qw.zeros is not None:
      row_sums = x.astype(jnp.float32).sum(axis=1, keepdims=True)
      acc = acc - row_sums * qw.zeros[0].astype(jnp.float32)
    acc = acc * scale
  return epilogue_lib.apply(
      epilogue_lib.EpilogueSpec(activation=problem.activation),
      acc,
      bias=None if bias is None else jnp.asarray(bias, jnp.float32)[None],
  )


__all__ = [
    "K_BLOCK",
    "QuantizedWeight",
    "block_weights",
    "pack_fragments",
    "dequantize_weights",
    "quantize_weights",
    "quantized_matmul",
    "unpack_int4",
]
