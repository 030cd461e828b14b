"""The default GEMM config: a small grid of candidates ranked by a calibrated time model.

`candidates(problem)` is the grid: CTA tiles from 64x128 to 256x128 (over N <= 32
the 128x64 tile narrowed to N, `narrow_tile_n`), with and without a 2x1 cluster, each
with the deepest ring that fits and, where the `split_k` model finds a gain, a split-K
variant; where 192x96 tiles fill one wave, `WAVE_TILE` (three consumer warpgroups).
`estimate(problem, config)`
predicts a config's time; `default_config` returns the fastest prediction.

The model (seconds):

    core = waves * (k_steps * STEP[tile, cluster] + TILE_FIXED_S (+ CLUSTER_FIXED_S))
           (with a tail split: the whole waves, then one K slice of the last wave's tiles)
    hbm  = unique / (active CTAs * CTA_BYTES_PER_S) + unique / HBM_BYTES_PER_S
    time = max(core, hbm) + LAUNCH_S  (+ the split-K reduction)
           (+ TAIL_FIXED_S + S * TAIL_SLICE_S for a tail split of S slices)

`STEP` is the measured time of one K step of each CTA tile (its main-loop
efficiency: WGMMA shape, SMEM and L2 feed), `waves` counts whole waves of
work units over the SMs (wave quantization), `unique` is the bytes of A, B
and the output; the memory rates scale with the board's HBM bandwidth
(`Params.for_board`). Everything is fitted (`fit`) to
`benchmarks/calibration/{h100,h200}_fit.json`, the timings of every candidate on the fit sweep
(`pallas_gemm/shapes/fit.json`, `python -m benchmarks.calibrate`); the held-out
sweep is the check that it generalizes (NOTES.md exp. 53). A K step is
`default_tile_k(dtype)` deep, which makes its time about the same for fp8
(twice the rate, twice the depth) and tf32 (half, half) as for 16-bit types.
Where a tile runs at most two K steps, the pick stores each warpgroup tile at
once (`short_k_stores`).

>>> from pallas_gemm.config import GemmProblem
>>> cfg = default_config(GemmProblem(m=65536, n=64, k=1024))    # skinny N: a narrow tile
>>> (cfg.tile_m, cfg.tile_n)
(128, 64)
>>> cfg = default_config(GemmProblem(m=8192, n=8192, k=8192))   # large: the widest tile
>>> (cfg.tile_m, cfg.tile_n, cfg.cluster)
(128, 256, (2, 1))
>>> describe(config_fields(cfg))
'128x256x64 s4 cooperative/m cluster 2x1'
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import statistics

import jax.numpy as jnp

from pallas_gemm import operands, smem, split_k, stream_k
from pallas_gemm.config import (
    DEFAULT_NUM_SMS,
    PARTIAL_EPILOGUE_TILE,
    VECTOR_ALIGN_BYTES,
    GemmConfig,
    GemmProblem,
    default_tile_k,
    fit_stages,
    tiles,
)
from pallas_gemm.operands import OPERANDS

TILES = ((64, 128), (64, 256), (128, 64), (128, 128), (128, 192), (128, 256), (256, 128))
"""CTA tiles (tile_m, tile_n) the default chooses from. 64x64 was dropped (NOTES exp. 53):
its full-wave step time predicts decode badly (1x14336x4096 ran at 0.66x in two waves of
64x64 tiles, against 0.91x in one wave of 64x128), and 128x64 serves skinny N."""

WAVE_TILE = GemmConfig(tile_m=192, tile_n=96, consumers=3, cluster=(1, 2), epilogue_tile=(64, 32))
"""The candidate for a problem whose 192x96 tiles fill one wave (128 of them at
1536x1536: 97% of 132 SMs, where 128x192 leaves 96 tiles and 128x128 takes 144):
three consumer warpgroups of 64x96 each and A multicast along the 1x2 cluster, as
cuBLAS runs 1536^3. Single wave only: there it ran 0.92-1.0x XLA against the default's
0.88-0.92x, but in 2-29 waves 0.74-0.90x (its K step feeds three narrow WGMMAs). And M
a multiple of 192: on 14 one-wave shapes it beat the two-consumer pick on all 9 whose M
was (1.05-1.17x) and lost on all 5 whose M was not (0.92-0.98x: its time grows with the
last tile's rows out of bounds, ~65 ns a row at K 4096, which two consumers do not pay;
cause not isolated). Held out on 11 more: 1.03-1.18x (NOTES exp. 131). 16-bit operands,
A stored (M, K) (warpgroups split M)."""

MAX_STAGES = 8
"""Deepest ring tried (narrow tiles fit that many 64-deep stages)."""

STEP_S = {
    (64, 128, 1): 261e-9,
    (64, 128, 2): 263e-9,
    (64, 256, 1): 394e-9,
    (64, 256, 2): 426e-9,
    (128, 64, 1): 369e-9,
    (128, 64, 2): 344e-9,
    (128, 128, 1): 414e-9,
    (128, 128, 2): 401e-9,
    (128, 192, 1): 515e-9,
    (128, 192, 2): 518e-9,
    (128, 256, 1): 674e-9,
    (128, 256, 2): 674e-9,
    (256, 128, 1): 683e-9,
    (256, 128, 2): 693e-9,
    (192, 96, 1): 440e-9,
}
"""Seconds per K step of a (tile_m, tile_n, cluster rows) CTA in a full wave: the
median over the eight large projections of the fit sweep on the H100 and the H200
(`fit_steps`). Narrow tiles sit on a floor of ~260-370 ns per step (the feed, not
the tensor cores); 128x256 runs at 820 TFLOP/s equivalent. (192, 96, 1) is `WAVE_TILE`,
measured apart (one wave of it at 1536x1536x4096 on the H200, NOTES exp. 131)."""

LAUNCH_S = 1.5e-6
"""Fixed cost of one launch (`fit`)."""

TILE_FIXED_S = 1e-6
"""Per work unit outside its K steps: pipeline fill and epilogue (`fit`)."""

CLUSTER_FIXED_S = 0.1e-6
"""A 2x1 cluster's cost per work unit beyond `TILE_FIXED_S` (barriers, multicast set-up;
`fit`). Held out (NOTES exp. 79, H100): alone, the 7 picks it changes, all short-K or
small, ran 1.004-1.106x faster (geomean 1.042, two runs); with the other scalars refitted
beside it, 6 picks changed again, 1.004-1.155x faster (geomean 1.078)."""

HBM_BYTES_PER_S = 6e12
CTA_BYTES_PER_S = 70e9
"""Streaming the unique bytes: each active CTA pulls at most CTA_BYTES_PER_S, and all
together add 1 / HBM_BYTES_PER_S per byte (`fit`; the form of `split_k.estimate`)."""

TIE_MARGIN = 0.01
"""Predictions within this fraction of the fastest count as ties, which go to the
larger tile (`_preference`): memory-bound problems predict many configs alike, and
the largest tiles are the best-tested ones (the fit's regret is lowest at 1%)."""

TAIL_FIXED_S = 12e-6
TAIL_SLICE_S = 1.7e-6
"""What a tail split (`split_tail`) costs beyond its K steps: TAIL_FIXED_S + S *
TAIL_SLICE_S for S slices a tile (the contributors' f32 partials stored and read back by
the finisher; the slices of a tile reading the operands at S different K offsets, L2
misses, NOTES exp. 102), added past the HBM bound. A line through 13 bf16 tail splits on
the H200, each against the same problem's whole tiles (NOTES exps. 125 and 139): 9-23 us
at S = 2, 30-32 us at S = 11. Drawn after the fit, 10 moved picks: 1.011x in geomean."""

SPLIT_REDUCE_FIXED_S = 2.0e-6
REDUCE_BYTES_PER_S = 3.0e12
"""The split-K reduction in XLA: its launch, and its f32 partials in, output out."""


@dataclasses.dataclass(frozen=True)
class Params:
  """The fitted scalars of the model (the `STEP_S` table is fitted apart)."""

  launch_s: float = LAUNCH_S
  tile_fixed_s: float = TILE_FIXED_S
  hbm_bytes_per_s: float = HBM_BYTES_PER_S
  cta_bytes_per_s: float = CTA_BYTES_PER_S
  cluster_fixed_s: float = CLUSTER_FIXED_S

  def for_board(self, hbm_scale: float) -> "Params":
    """These parameters on a board with `hbm_scale` times the H100 SXM's HBM bandwidth
    (`_compat.hbm_scale`): the memory rates scale, nothing else (not fitted there)."""
    return dataclasses.replace(
        self,
        hbm_bytes_per_s=self.hbm_bytes_per_s * hbm_scale,
        cta_bytes_per_s=self.cta_bytes_per_s * hbm_scale,
    )


NARROW_SPAN_BYTES = 64
"""The narrowest SMEM row a narrow tile may give an MN-major B (and so A, which WGMMA
makes share B's swizzle): at a 32-byte swizzle A streamed at 0.48-0.81x XLA's rate
(N = 8 and 16 stored (K, N), H200; NOTES exp. 101), at 64 bytes 0.95-1.18x (N = 32)."""


def narrow_tile_n(problem: GemmProblem) -> int | None:
  """The CTA tile width for an output no wider than 32 columns, or None.

  A 64-wide tile over N <= 32 computes columns that do not exist, and its output, one
  swizzle span or less wide, is written widened and then sliced (`gemm.out_extent`):
  0.75-0.85x XLA at 65536x32x{512,2048} and 8192x32x4096 TT (H200). A tile as narrow as
  N (16 or 32 columns) writes the output as it is: 0.95-1.18x (NOTES exp. 101).

  K-major B (stored (N, K)) takes 16 or 32 columns. An N-major B tile sets the swizzle of
  both operands (WGMMA shares one) to its row's bytes, and narrower than
  `NARROW_SPAN_BYTES` A streams slowly; so there the narrow tile is 32 bf16 columns and
  is used only when N fills it (a 32-wide tile over 16 columns widens the output again
  and pads B: 0.68-0.93x, below the 64-wide tile; such GEMMs go to XLA, `route`).

  Each warpgroup's columns are half the tile where A is transposed (split along N), and
  32 at least where a column vector (bias, scales) is staged per warpgroup
  (`config.VECTOR_ALIGN_BYTES`).

  >>> narrow_tile_n(GemmProblem(m=65536, n=16, k=2048, transpose_b=True))   # B (N, K)
  16
  >>> narrow_tile_n(GemmProblem(m=65536, n=16, k=2048, transpose_b=True, has_bias=True))
  32
  >>> narrow_tile_n(GemmProblem(m=65536, n=32, k=2048))   # B (K, N): 32 bf16 = 64 bytes
  32
  >>> narrow_tile_n(GemmProblem(m=65536, n=16, k=2048)) is None
  True
  >>> narrow_tile_n(GemmProblem(m=65536, n=64, k=2048)) is None
  True
  """
  if problem.n > 32:
    return None
  if problem.transpose_b:
    tn = 16 if problem.n <= 16 else 32
  else:
    tn = problem.n
    if tn not in (16, 32) or tn * jnp.dtype(problem.dtype_b).itemsize < NARROW_SPAN_BYTES:
      return None
    if not problem.transpose_a and not smem.rows_tileable(problem.m):
      return None  # A at B's 64-byte swizzle has no row view: its odd rows would be copied
  columns = VECTOR_ALIGN_BYTES // 4 if _column_vectors(problem) else 16
  tn = max(tn, columns * (2 if problem.transpose_a else 1))
  return tn if tn <= 32 else None


SHORT_K_STEPS = 2
"""At most this many K steps per tile (K <= 128 at 16 bits), a tile is mostly its epilogue."""

SHORT_K_MIN_STAGES = 3
"""The shallowest ring `short_k_stores` gives up stages to (it prefetches the next tiles)."""


def short_k_stores(problem: GemmProblem, config: GemmConfig) -> GemmConfig:
  """`config` storing each warpgroup tile at once (`epilogue_tile=None`) where its tiles run
  at most `SHORT_K_STEPS` K steps and a ring of `SHORT_K_MIN_STAGES` still fits beside it.

  There the GEMM is output-bound (batched attention-like products, K = 64-128) and the
  consumers spend most of a tile storing: one store per warpgroup tile instead of four
  64x64 chunks, where more chunks in flight did not help, took 16x2048x2048x64 NT from
  0.919 to 0.960x XLA and 8192x8192x96 from 0.921 to 0.964 (H100, fit shapes); against
  the chunks 1.01-1.02x over the fit sweep's four short-K shapes, 1.01-1.05x over held-out
  and unseen ones, on both boards (`benchmarks.short_k`, NOTES exp. 102). Four K steps and
  more keep the chunks and the deeper ring.

  >>> cfg = short_k_stores(GemmProblem(m=8192, n=8192, k=96), GemmConfig(stages=4))
  >>> (cfg.epilogue_tile, cfg.stages)
  (None, 3)
  >>> short_k_stores(GemmProblem(m=8192, n=8192, k=4096), GemmConfig()).epilogue_tile
  (64, 64)
  """
  if config.epilogue_shape == config.wg_tile or config.split_k > 1 or config.stream_k:
    return config
  if config.k_splits(problem)[1] > SHORT_K_STEPS:
    return config
  whole = fit_stages(dataclasses.replace(config, epilogue_tile=None), problem, config.stages)
  if whole.epilogue_tile is not None or whole.stages < SHORT_K_MIN_STAGES:
    return config  # f32 outputs, residuals: the larger buffers leave too shallow a ring
  try:
    whole.validate(problem)
  except ValueError:
    return config
  return whole


def _column_vectors(problem: GemmProblem) -> bool:
  """Whether the epilogue stages a per-column vector (bias, column scales) per warpgroup."""
  return any(OPERANDS[name].kind is operands.COLUMN for name in operands.present(problem))


def _step_key(config: GemmConfig) -> tuple[int, int, int]:
  """The `STEP_S` entry of a config: narrow tiles (`narrow_tile_n`) step at the 128x64
  tile's rate, the feed of A (their WGMMAs are a quarter to a half as wide)."""
  return (config.tile_m, max(config.tile_n, 64), config.cluster[0])


def candidates(
    problem: GemmProblem,
    num_sms: int = DEFAULT_NUM_SMS,
    hbm_scale: float = 1.0,
    wave_tile: bool = True,
) -> list[GemmConfig]:
  """The valid configs of the grid for `problem`: tiles that do not overhang it by
  half a tile or more (a smaller tile does the same work), a 2x1 cluster only with
  >= 2 tile rows; over N <= 32 columns the 64-wide tile narrowed (`narrow_tile_n`);
  `WAVE_TILE` where it fills one wave (unless `wave_tile=False`, the grid before it).

  >>> sorted({(c.tile_m, c.tile_n) for c in candidates(GemmProblem(m=65536, n=64, k=1024))})
  [(128, 64)]
  >>> sorted({(c.tile_m, c.tile_n) for c in candidates(GemmProblem(m=65536, n=32, k=1024))})
  [(128, 32)]
  """
  tk = default_tile_k(problem.dtype)
  narrow = narrow_tile_n(problem)
  configs = []
  for tm, tn in TILES:
    if tm >= 2 * max(problem.m, 64) or tn >= 2 * max(problem.n, 64):
      continue
    if tn == 64 and narrow is not None:
      tn = narrow
    wg_split = "n" if problem.transpose_a or tm == 64 else "m"
    for cluster in ((1, 1), (2, 1)):
      if cluster != (1, 1) and tiles(problem.m, tm) < 2:
        continue
      cfg = GemmConfig(tile_m=tm, tile_n=tn, tile_k=tk, wg_split=wg_split, cluster=cluster)
      if cfg.epilogue_tile and cfg.epilogue_tile[1] > cfg.wg_tile[1]:
        cfg = dataclasses.replace(cfg, epilogue_tile=None)  # narrow: the whole tile
      cfg = fit_stages(cfg, problem, MAX_STAGES)
      options = [cfg]
      splits = split_k.choose(
          problem,
          tile_m=tm,
          tile_n=tn,
          tile_k=tk,
          stages=cfg.stages,
          num_sms=num_sms,
          hbm_scale=hbm_scale,
      )
      if splits > 1:
        options.append(
            fit_stages(
                dataclasses.replace(cfg, split_k=splits, epilogue_tile=PARTIAL_EPILOGUE_TILE),
                problem,
                MAX_STAGES,
            )
        )
      for option in options:
        try:
          option.validate(problem)
        except ValueError:
          continue
        configs.append(option)
  if wave_tile:
    configs += _wave_tile(problem, num_sms)
  return list(dict.fromkeys(configs))


def _wave_tile(problem: GemmProblem, num_sms: int) -> list[GemmConfig]:
  """[`WAVE_TILE` with the deepest ring that fits] where its tiles fill at most one wave of
  `num_sms` and it is valid for `problem`, else [].

  >>> [c.consumers for c in _wave_tile(GemmProblem(m=1536, n=1536, k=1536), 132)]
  [3]
  >>> _wave_tile(GemmProblem(m=2560, n=2560, k=2560), 132)   # 392 tiles: three waves
  []
  """
  sixteen_bit = problem.dtype in ("bfloat16", "float16") and problem.dtype_b == problem.dtype
  if problem.transpose_a or problem.block_scaled or not sixteen_bit:
    return []
  if problem.m % WAVE_TILE.tile_m or problem.n < WAVE_TILE.tile_n:
    return []  # rows in whole tiles: with a partial last row of tiles it lost (exp. 131)
  config = fit_stages(WAVE_TILE, problem, MAX_STAGES)
  if _work(problem, config, num_sms)[3] > num_sms:
    return []
  try:
    config.validate(problem)
  except ValueError:
    return []
  return [config]


def _work(problem: GemmProblem, config: GemmConfig, num_sms: int):
  """(waves, K steps per unit, K slices, work units) of `config` on `problem`."""
  cm, cn = config.cluster
  steps = tiles(problem.k, config.tile_k)
  k_iters = tiles(steps, config.split_k)
  splits = tiles(steps, k_iters)
  m_tiles = tiles(tiles(problem.m, config.tile_m), cm) * cm
  n_tiles = tiles(tiles(problem.n, config.tile_n), cn) * cn
  units = problem.batch * m_tiles * n_tiles * splits
  return tiles(units, num_sms - num_sms % (cm * cn)), k_iters, splits, units


def estimate(
    problem: GemmProblem,
    config: GemmConfig,
    num_sms: int = DEFAULT_NUM_SMS,
    params: Params = Params(),
    steps: dict = STEP_S,
    tail_model: bool = True,
) -> float:
  """Predicted seconds of `config` on `problem` (the model of the module docstring;
  `tail_model=False`: as if `split_tail` gave no config a tail split, the model before it).

  >>> p = GemmProblem(m=4096, n=4096, k=4096)
  >>> round(estimate(p, GemmConfig(cluster=(2, 1))) * 1e6)   # measured ~175 us
  178
  """
  waves, k_iters, splits, units = _work(problem, config, num_sms)
  step = steps[_step_key(config)]
  fixed = params.tile_fixed_s + (params.cluster_fixed_s if config.cluster[0] > 1 else 0.0)
  tail = tail_plan(problem, config, num_sms) if tail_model else None
  if tail is None:
    core = waves * (k_iters * step + fixed)
  else:  # the whole waves, then one K slice of the last wave's tiles
    core = tail.dp_tiles_per_worker * (k_iters * step + fixed)
    core += tiles(k_iters, tail.slices) * step + fixed
  in_bytes = _itemsize(problem.dtype)
  out_elems = problem.batch * problem.m * problem.n
  out_bytes = out_elems * (4 * splits if splits > 1 else _itemsize(problem.out_dtype))
  unique = problem.batch * (problem.m + problem.n) * problem.k * in_bytes + out_bytes
  active = min(units, num_sms)
  hbm = unique / (active * params.cta_bytes_per_s) + unique / params.hbm_bytes_per_s
  seconds = max(core, hbm) + params.launch_s
  if tail is not None:
    seconds += TAIL_FIXED_S + tail.slices * TAIL_SLICE_S
  if splits > 1:
    seconds += (
        SPLIT_REDUCE_FIXED_S
        + (out_bytes + out_elems * _itemsize(problem.out_dtype)) / REDUCE_BYTES_PER_S
    )
  return seconds


def over_ideal(problem: GemmProblem, config: GemmConfig, num_sms: int, hbm_scale: float) -> float:
  """`estimate` of `config` over the time of `problem`'s FLOPs spread evenly on every SM at
  the widest tile's rate (plus one launch): how far the tiles, waves and K slices of the
  best schedule the model knows leave the SMs from full.

  >>> p = GemmProblem(m=768, n=3072, k=16384, transpose_a=True)   # 72 wide tiles
  >>> round(over_ideal(p, default_config(p, 132, 1.0), 132, 1.0), 2)
  1.51
  """
  params = Params().for_board(hbm_scale)
  plain = dataclasses.replace(config, stream_k=False, split_tail=False)
  step = STEP_S[(128, 256, 1)]
  per_sm = 2 * 128 * 256 * 64 / step  # FLOP/s of one SM at the widest tile's rate
  ideal = 2.0 * problem.batch * problem.m * problem.n * problem.k / (num_sms * per_sm)
  return estimate(problem, plain, num_sms, params) / (ideal + params.launch_s)


def default_config(
    problem: GemmProblem, num_sms: int | None = None, hbm_scale: float | None = None
) -> GemmConfig:
  """The candidate `estimate` predicts fastest: the config `matmul` uses when no tuning
  cache or shipped table holds one for `problem`. `num_sms` and `hbm_scale` default to
  the device's SM count and HBM bandwidth over the H100 SXM's (132 and 1.0 without a GPU).

  >>> default_config(GemmProblem(m=4096, n=8192, k=4096, out_dtype="float32")).stages
  3
  >>> cfg = default_config(GemmProblem(m=1, n=5120, k=13824))      # decode: split K
  >>> (cfg.tile_m, cfg.tile_n, cfg.split_k)   # measured: 50.8 us, XLA 48.9
  (64, 256, 6)
  """
  if num_sms is None or hbm_scale is None:
    from pallas_gemm import _compat  # local: jax is only needed to ask the device

    num_sms = num_sms or _compat.device_sm_count() or DEFAULT_NUM_SMS
    hbm_scale = hbm_scale or _compat.hbm_scale()
  return _default_config(problem, num_sms, hbm_scale)


@functools.lru_cache(maxsize=4096)
def _default_config(problem: GemmProblem, num_sms: int, hbm_scale: float) -> GemmConfig:
  """`default_config` for a resolved board: ranked once per problem (it runs at every
  call site's trace, forward and backward; ~0.7 ms of model evaluation each)."""
  return split_tail(problem, pick(problem, num_sms, hbm_scale, Params()), num_sms)


def split_tail(problem: GemmProblem, config: GemmConfig, num_sms: int) -> GemmConfig:
  """`config` with its partial last wave cut into K slices (`stream_k.TailSplit`) where
  that plan exists after at least one whole wave: whole cooperative tiles without
  split-K. 1.003-1.27x on six bf16 projections of 1.3-27 waves on the H200 (NOTES exp.
  125); under one wave `split_k` decides, as before. The time model does not see it.

  >>> p = GemmProblem(m=2048, n=2112, k=7168)   # 88 cluster tiles on 66 clusters
  >>> cfg = split_tail(p, GemmConfig(tile_n=192, tile_k=64, cluster=(2, 1)), 132)
  >>> cfg.stream_k, cfg.split_tail
  (True, True)
  """
  if tail_plan(problem, config, num_sms) is None:
    return config
  return dataclasses.replace(config, stream_k=True, split_tail=True)


def tail_plan(problem: GemmProblem, config: GemmConfig, num_sms: int):
  """The `stream_k.TailSplit` that `split_tail` gives `config` on `problem`, or None.

  >>> tail_plan(GemmProblem(m=2048, n=2112, k=7168), GemmConfig(tile_n=192, tile_k=64,
  ...     cluster=(2, 1)), 132).slices   # 22 tail tiles on 66 clusters: 3 slices each
  3
  """
  if config.schedule != "cooperative" or config.split_k != 1 or config.stream_k:
    return None
  workers = (config.num_sms or num_sms) // config.cluster_size
  units = _work(problem, config, num_sms)[3] // config.cluster_size
  plan = stream_k.TailSplit.plan(units, workers, tiles(problem.k, config.tile_k))
  return plan if plan.enabled and plan.dp_tiles_per_worker else None


def pick(
    problem: GemmProblem,
    num_sms: int,
    hbm_scale: float,
    params: Params,
    wave_tile: bool = True,
    tail_model: bool = True,
) -> GemmConfig:
  """The candidate the model with `params` (H100 values; scaled to the board here)
  predicts fastest: `default_config` with other parameters, to compare model variants
  (`wave_tile=False`: among the candidates without `WAVE_TILE`; `tail_model=False`:
  ranked as if no tail split followed).

  >>> p = GemmProblem(m=8192, n=8192, k=8192)
  >>> pick(p, 132, 1.0, Params()) == default_config(p, 132, 1.0)
  True
  """
  options = candidates(problem, num_sms, hbm_scale, wave_tile)
  params = params.for_board(hbm_scale)
  if not options:  # nothing of the grid is valid: the plain default, whose validation says why
    return fit_stages(
        GemmConfig(
            tile_k=default_tile_k(problem.dtype), wg_split="n" if problem.transpose_a else "m"
        ),
        problem,
        4,
    )
  return short_k_stores(
      problem,
      choose(
          [(estimate(problem, cfg, num_sms, params, tail_model=tail_model), cfg) for cfg in options]
      ),
  )


def choose(predicted):
  """The config of [(predicted seconds, config)] to run: the fastest prediction, ties
  (within `TIE_MARGIN`) going to the larger tile."""
  fastest = min(seconds for seconds, _ in predicted)
  ties = [cfg for seconds, cfg in predicted if seconds <= fastest * (1 + TIE_MARGIN)]
  return min(ties, key=_preference)


def _preference(config: GemmConfig):
  """Larger tiles first, then wider ones, then 2-CTA clusters, then fewer K slices."""
  return (-config.tile_m * config.tile_n, -config.tile_n, -config.cluster[0], config.split_k)


# -- fitting -------------------------------------------------------------------
def fit_steps(calibrations, large: int = 8) -> dict:
  """`STEP_S` from calibration files: per tile, the median over the first `large`
  shapes of each file (large projections, full waves) of time / (waves * K steps);
  a tile without samples there (`WAVE_TILE`) keeps its shipped entry."""
  samples = {}
  for calibration in calibrations:
    for shape in calibration["shapes"][:large]:
      problem = GemmProblem(**shape["problem"])
      for row in shape["configs"]:
        config = _config(row["config"])
        if "ms" not in row or config.split_k > 1 or (config.tile_m, config.tile_n) not in TILES:
          continue
        waves, k_iters, _, _ = _work(problem, config, DEFAULT_NUM_SMS)
        key = (config.tile_m, config.tile_n, config.cluster[0])
        samples.setdefault(key, []).append(row["ms"] * 1e-3 / (waves * k_iters))
  fitted = {key: round(statistics.median(v), 9) for key, v in sorted(samples.items())}
  return {**{k: v for k, v in STEP_S.items() if k not in fitted}, **fitted}


def _board_scale(calibration: dict) -> float:
  from pallas_gemm import _compat  # local: jax is only needed for the device table

  return _compat.hbm_scale(calibration.get("env", {}).get("device", ""))


def regret(calibrations, params: Params = Params(), steps: dict = STEP_S) -> list[tuple]:
  """Per shape of the calibration files: (label, measured time of the model's pick /
  the fastest config timed, pick, fastest us, XLA us); the model picks among the
  timed configs of the `TILES` grid."""
  rows = []
  for calibration in calibrations:
    board = params.for_board(_board_scale(calibration))
    for shape in calibration["shapes"]:
      problem = GemmProblem(**shape["problem"])
      timed = [(row["ms"], _config(row["config"])) for row in shape["configs"] if "ms" in row]
      if not timed:
        continue
      best = min(ms for ms, _ in timed)  # of every timed config, in the grid or not
      timed = [(ms, cfg) for ms, cfg in timed if (cfg.tile_m, cfg.tile_n) in TILES]
      pick = choose([(estimate(problem, cfg, params=board, steps=steps), cfg) for _, cfg in timed])
      pick_ms = next(ms for ms, cfg in timed if cfg == pick)
      rows.append((shape["label"], pick_ms / best, pick, best * 1e3, shape["xla_ms"] * 1e3))
  return rows


FIT_GRID = dict(
    launch_s=(1.5e-6, 2e-6, 2.5e-6, 3e-6),
    tile_fixed_s=(0.3e-6, 0.6e-6, 1e-6, 1.35e-6),
    hbm_bytes_per_s=(4e12, 5e12, 6e12),
    cta_bytes_per_s=(40e9, 56e9, 70e9),
    cluster_fixed_s=(0.0, 0.1e-6),
)
"""The values `fit` searches (a grid: the model is a max of terms, not smooth)."""


def fit(calibrations) -> tuple[Params, dict]:
  """(Params, STEP_S) that minimize the geometric-mean regret on the calibration
  files (ties: the smaller RMS log error of the predictions)."""
  steps = fit_steps(calibrations)
  best = None
  for values in itertools.product(*FIT_GRID.values()):
    params = Params(*values)
    rows = regret(calibrations, params, steps)
    score = (
        round(statistics.geometric_mean([r[1] for r in rows]), 4),
        _log_error(calibrations, params, steps),
    )
    if best is None or score < best[0]:
      best = (score, params)
  return best[1], steps


def fit_report(calibrations) -> str:
  """The fit of the shipped model and of a refit, shape by shape (for the CLI)."""
  lines = []
  for title, params, steps in (("shipped", Params(), STEP_S), ("refit", *fit(calibrations))):
    rows = regret(calibrations, params, steps)
    lines.append(f"{title}: {params}")
    for label, r, pick, best_us, xla_us in rows:
      lines.append(
          f"  {label:38s} regret {r:5.3f}  pick {describe(config_fields(pick)):48s} "
          f"best {best_us:8.1f} us  xla {xla_us:8.1f} us"
      )
    values = [r[1] for r in rows]
    lines.append(
        f"  geomean regret {statistics.geometric_mean(values):.3f}, worst {max(values):.3f}, "
        f"RMS log error {_log_error(calibrations, params, steps):.3f}"
    )
  return "\n".join(lines)


def _log_error(calibrations, params, steps) -> float:
  errors = [
      math.log(
          estimate(
              GemmProblem(**s["problem"]),
              _config(r["config"]),
              params=params.for_board(_board_scale(c)),
              steps=steps,
          )
          / (r["ms"] * 1e-3)
      )
      for c in calibrations
      for s in c["shapes"]
      for r in s["configs"]
      if "ms" in r and (r["config"]["tile_m"], r["config"]["tile_n"]) in TILES
  ]
  return math.sqrt(sum(e * e for e in errors) / len(errors))


# -- config <-> JSON -------------------------------------------------------------
def config_fields(config: GemmConfig) -> dict:
  """The JSON form of a config (as calibration files store it)."""
  fields = dataclasses.asdict(config)
  return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}


def _config(fields: dict) -> GemmConfig:
  return GemmConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def describe(fields: dict) -> str:
  """'TMxTNxTK sS schedule/split[xC] cluster CMxCN[ split_k S][ stream-K| tail split]' of
  a config's fields (xC: C consumer warpgroups, where not 2).

  >>> describe(config_fields(GemmConfig(tile_m=192, tile_n=96, consumers=3)))
  '192x96x64 s4 cooperative/mx3 cluster 1x1'
  """
  consumers = fields.get("consumers", 2)
  text = (
      f"{fields['tile_m']}x{fields['tile_n']}x{fields['tile_k']} s{fields['stages']} "
      f"{fields['schedule']}/{fields['wg_split']}{f'x{consumers}' if consumers != 2 else ''} "
      f"cluster {fields['cluster'][0]}x{fields['cluster'][1]}"
  )
  text += f" split_k {fields['split_k']}" if fields.get("split_k", 1) > 1 else ""
  if fields.get("stream_k"):
    text += " tail split" if fields.get("split_tail") else " stream-K"
  return text


def _itemsize(dtype: str) -> int:
  return jnp.dtype(dtype).itemsize
