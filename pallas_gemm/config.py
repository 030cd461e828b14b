"""Kernel configuration: the tunable knobs, their limits, and the default per problem.

>>> cfg = GemmConfig(tile_m=128, tile_n=256, stages=4)
>>> cfg.validate(GemmProblem(m=4096, n=8192, k=4096))
>>> GemmConfig(stages=9).validate(GemmProblem(m=4096, n=8192, k=4096))
Traceback (most recent call last):
...
ValueError: GemmConfig.stages=9: needs 475648 bytes of shared memory, the limit is 232448 (fewer stages, smaller tiles or a smaller epilogue_tile)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from pallas_gemm import smem

SMEM_LIMIT_BYTES = 232448
"""Shared memory a Hopper CTA may use (227 KiB)."""

SMEM_ALIGN_BYTES = 1024
"""Mosaic GPU aligns every shared-memory allocation to 1 KiB."""

SMEM_RESERVED_BYTES = 512
"""Headroom for the mbarriers (Mosaic reported 96 bytes for a 4-stage ring)."""

SCHEDULES = ("cooperative", "pingpong")
WG_SPLITS = ("m", "n")
CLUSTERS = ((1, 1), (2, 1), (1, 2))
INPUT_DTYPES = ("bfloat16", "float16")
OUTPUT_DTYPES = ("bfloat16", "float16", "float32")
MAX_ACC_ELEMENTS_PER_WG = 128 * 128
"""f32 accumulator elements per warpgroup: 128 registers per thread, of ~232."""


@dataclasses.dataclass(frozen=True)
class GemmProblem:
  """What one kernel launch computes: out[b] = epilogue(op(a[b]) @ op(b[b]))."""

  m: int
  n: int
  k: int
  batch: int = 1
  dtype: str = "bfloat16"
  out_dtype: str = "bfloat16"
  transpose_a: bool = False
  transpose_b: bool = False
  has_bias: bool = False
  has_c: bool = False

  @property
  def flops(self) -> int:
    return 2 * self.batch * self.m * self.n * self.k


@dataclasses.dataclass(frozen=True)
class GemmConfig:
  """Tile shapes and schedule of the Hopper GEMM kernel (hashable: a static jit arg).

  Attributes:
    tile_m, tile_n: output tile of one CTA. `cooperative` splits it between the
      two consumer warpgroups along `wg_split`; `pingpong` gives each warpgroup
      a whole tile of its own, alternating.
    tile_k: K extent of one pipeline stage.
    stages: SMEM ring depth (A and B tiles in flight).
    schedule: "cooperative" or "pingpong".
    wg_split: "m" or "n", cooperative only.
    cluster: (cluster_m, cluster_n) CTAs per cluster; (2, 1) shares B tiles by
      TMA multicast, (1, 2) shares A tiles.
    raster: tile order, "along_n" or "along_m" (see `raster.tile_coords`).
    group: band width of the raster, in (cluster) tiles.
    epilogue_tile: (rows, cols) of one epilogue store, or None for the whole
      warpgroup tile; two such buffers per warpgroup are double-buffered.
    num_sms: persistent grid size; None means the device's SM count (132 on H100).
  """

  tile_m: int = 128
  tile_n: int = 256
  tile_k: int = 64
  stages: int = 4
  schedule: str = "cooperative"
  wg_split: str = "m"
  cluster: tuple[int, int] = (1, 1)
  raster: str = "along_n"
  group: int = 8
  epilogue_tile: tuple[int, int] | None = (64, 64)
  num_sms: int | None = None

  # -- derived shapes -------------------------------------------------------
  @property
  def wg_tile(self) -> tuple[int, int]:
    """(rows, cols) of the accumulator one consumer warpgroup holds."""
    if self.schedule == "pingpong":
      return self.tile_m, self.tile_n
    if self.wg_split == "m":
      return self.tile_m // 2, self.tile_n
    return self.tile_m, self.tile_n // 2

  @property
  def epilogue_shape(self) -> tuple[int, int]:
    return self.epilogue_tile or self.wg_tile

  @property
  def epilogue_slots(self) -> int:
    em, en = self.epilogue_shape
    wm, wn = self.wg_tile
    return min(2, (wm // em) * (wn // en))

  @property
  def cluster_size(self) -> int:
    return self.cluster[0] * self.cluster[1]

  def smem_bytes(self, problem: GemmProblem) -> int:
    """Shared memory the kernel allocates for `problem` (each buffer 1 KiB aligned)."""
    round_up = lambda x: -(-x // SMEM_ALIGN_BYTES) * SMEM_ALIGN_BYTES
    in_bytes = np.dtype(problem.dtype).itemsize
    out_bytes = np.dtype(problem.out_dtype).itemsize
    em, en = self.epilogue_shape
    total = round_up(self.stages * self.tile_m * self.tile_k * in_bytes)
    total += round_up(self.stages * self.tile_k * self.tile_n * in_bytes)
    total += round_up(2 * self.epilogue_slots * em * en * out_bytes)
    if problem.has_bias:
      total += round_up(2 * self.wg_tile[1] * 4)
    return total + SMEM_RESERVED_BYTES

  # -- checks ---------------------------------------------------------------
  def validate(self, problem: GemmProblem) -> None:
    """Raises ValueError naming the first field that breaks a limit for `problem`."""
    def fail(field, msg):
      raise ValueError(f"GemmConfig.{field}={getattr(self, field)!r}: {msg}")

    if self.schedule not in SCHEDULES:
      fail("schedule", f"must be one of {SCHEDULES}")
    if self.wg_split not in WG_SPLITS:
      fail("wg_split", f"must be one of {WG_SPLITS}")
    if tuple(self.cluster) not in CLUSTERS:
      fail("cluster", f"must be one of {CLUSTERS}")
    from pallas_gemm import raster  # local: raster imports jax.numpy

    if self.raster not in raster.ORDERS:
      fail("raster", f"must be one of {raster.ORDERS}")
    if self.group < 1:
      fail("group", "must be >= 1")
    if self.stages < 2:
      fail("stages", "must be >= 2 (one stage loading while one is consumed)")
    if self.num_sms is not None and (
        self.num_sms < 1 or self.num_sms % self.cluster_size
    ):
      fail("num_sms", f"must be a positive multiple of the cluster size {self.cluster_size}")
    if problem.dtype not in INPUT_DTYPES:
      raise ValueError(f"input dtype {problem.dtype} not supported; use one of {INPUT_DTYPES}")
    if problem.out_dtype not in OUTPUT_DTYPES:
      raise ValueError(f"out_dtype {problem.out_dtype} not supported; use one of {OUTPUT_DTYPES}")

    wm, wn = self.wg_tile
    if self.schedule == "pingpong" or self.wg_split == "n":
      if self.tile_m % 64 or not 64 <= self.tile_m <= 256:
        fail("tile_m", "must be 64, 128, 192 or 256 (WGMMA rows come in 64s)")
    elif self.tile_m % 128 or not 128 <= self.tile_m <= 256:
      fail("tile_m", "must be 128 or 256 when cooperative warpgroups split M (64 rows each at least)")
    if wn % 8 or wn > 256:
      fail("tile_n", f"gives a warpgroup tile {wn} wide; WGMMA needs N a multiple of 8 and <= 256")
    if problem.transpose_a and self.schedule == "cooperative" and self.wg_split == "m":
      fail("wg_split", "must be 'n' when A is transposed (an MN-major A tile cannot be split along M)")
    if wm * wn > MAX_ACC_ELEMENTS_PER_WG:
      fail("tile_n", f"gives a {wm}x{wn} f32 accumulator per warpgroup; at most {MAX_ACC_ELEMENTS_PER_WG} elements fit in registers")

    span = smem.swizzle_span(problem.dtype, 128)
    if self.tile_k % span:
      fail("tile_k", f"must be a multiple of {span} ({problem.dtype}: one 128-byte swizzle span)")
    minor_tiles = {"tile_m": self.tile_m if problem.transpose_a else None,
                   "tile_n": self.tile_n if not problem.transpose_b else None}
    for field, extent in minor_tiles.items():
      if extent is not None and extent % span:
        fail(field, f"is the minor dim of an MN-major operand tile; must be a multiple of {span}")

    em, en = self.epilogue_shape
    if wm % em or wn % en or em % 64:
      fail("epilogue_tile", f"must divide the warpgroup tile {wm}x{wn} with rows a multiple of 64")
    out_span = smem.swizzle_span(problem.out_dtype, 32)
    if en % out_span:
      fail("epilogue_tile", f"columns must be a multiple of {out_span} (32-byte swizzle of {problem.out_dtype})")

    need = self.smem_bytes(problem)
    if need > SMEM_LIMIT_BYTES:
      fail("stages", f"needs {need} bytes of shared memory, the limit is {SMEM_LIMIT_BYTES} "
                     "(fewer stages, smaller tiles or a smaller epilogue_tile)")


def default_config(problem: GemmProblem) -> GemmConfig:
  """A good configuration for `problem` (measured on the H100; see NOTES.md).

  128x256 CTA tiles, cooperative warpgroups (64x256 each, or 128x128 when A is
  transposed), 2-CTA clusters along M sharing B by multicast when there are
  at least two tile rows, and as many stages as shared memory allows (4 for
  16-bit outputs, 3 for f32).

  >>> default_config(GemmProblem(m=4096, n=8192, k=4096)).cluster
  (2, 1)
  >>> default_config(GemmProblem(m=4096, n=8192, k=4096, out_dtype="float32")).stages
  3
  """
  cfg = GemmConfig()
  if problem.transpose_a:
    cfg = dataclasses.replace(cfg, wg_split="n")
  if problem.m <= 64:
    cfg = dataclasses.replace(cfg, tile_m=64, wg_split="n")
  elif tiles(problem.m, cfg.tile_m) >= 2:
    cfg = dataclasses.replace(cfg, cluster=(2, 1))
  for stages in (4, 3, 2):
    candidate = dataclasses.replace(cfg, stages=stages)
    if candidate.smem_bytes(problem) <= SMEM_LIMIT_BYTES:
      return candidate
  return dataclasses.replace(cfg, stages=2)


def tiles(extent: int, tile: int) -> int:
  return math.ceil(extent / tile)
