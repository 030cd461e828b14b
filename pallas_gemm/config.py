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

from pallas_gemm import operands
from pallas_gemm import smem
from pallas_gemm.operands import ADDEND_DTYPES, OPERANDS

SMEM_LIMIT_BYTES = smem.LIMIT_BYTES

SCHEDULES = ("cooperative", "pingpong")
WG_SPLITS = ("m", "n")
CLUSTERS = ((1, 1), (2, 1), (1, 2))
INPUT_DTYPES = ("bfloat16", "float16")
"""16-bit operand dtypes: any layout (WGMMA reads them K- or MN-major)."""
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
INT_DTYPES = ("int8",)
"""Integer operand dtypes: WGMMA multiplies s8 x s8 into an s32 accumulator (exact),
converted to f32 for the epilogue (W8A8, `pallas_gemm.int8_matmul`)."""
K_MAJOR_DTYPES = (*FP8_DTYPES, *INT_DTYPES, "float32")
"""Operand dtypes WGMMA reads K-major only: A stored (M, K), B stored (N, K).
float32 operands are multiplied in tf32 (10-bit mantissa), accumulated in f32."""
NARROW_DTYPES = (*FP8_DTYPES, *INT_DTYPES)
"""1-byte operand dtypes, whose GEMMs default to a bf16 output."""
KERNEL_INPUT_DTYPES = (*INPUT_DTYPES, *K_MAJOR_DTYPES)
B_SCALE_BOX = 32
"""Blockwise fp8: f32 columns of the TMA box that brings a tile's (128 x 128) B block scale
into a ring stage: the aligned box of 32 that holds it. TMA needs each stage's
shared-memory destination 128-byte aligned (a box of 4 f32: CUDA_ERROR_MISALIGNED_ADDRESS
on the H100), and a box that starts at the tile's own column stops it too
(CUDA_ERROR_ILLEGAL_INSTRUCTION): 32 f32 from a multiple of 32 (NOTES exp. 63)."""
OUTPUT_DTYPES = ("bfloat16", "float16", "float32")
"""Output dtypes without a scale (fp8 outputs are in FP8_DTYPES, with `out_scale`)."""
KERNEL_OUTPUT_DTYPES = (*OUTPUT_DTYPES, *FP8_DTYPES)
MAX_ACC_ELEMENTS_PER_WG = 128 * 128
"""f32 accumulator elements per warpgroup of two: 128 registers per thread, of 232."""

CONSUMER_COUNTS = (2, 3)
"""Consumer warpgroups a cooperative CTA may run (`GemmConfig.consumers`)."""

OTHER_REGISTERS = 104
"""Registers per consumer thread besides its accumulator (addresses, the epilogue's
values): 232 - 128 with two consumers, kept for three."""


def max_acc_elements(consumers: int) -> int:
  """f32 accumulator elements one of `consumers` warpgroups may hold in registers.

  >>> max_acc_elements(2) == MAX_ACC_ELEMENTS_PER_WG, max_acc_elements(3)   # 64x96
  (True, 6144)
  """
  from pallas_gemm import pipeline  # local: pipeline imports jax's Pallas

  return (pipeline.compute_registers(consumers) - OTHER_REGISTERS) * 128


VECTOR_ALIGN_BYTES = 128
"""TMA writes each warpgroup's slice of a staged vector (bias, scales) at this alignment in
shared memory: 16 f32 (64 bytes) per warpgroup faulted on the H200 (misaligned address,
NOTES exp. 101), as the blockwise scales' 4-f32 boxes did."""


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
  b_dtype: str | None = None
  """B's dtype when it differs from A's (mixed e4m3 x e5m2 only); None: `dtype`."""
  has_row_bias: bool = False
  residual_dtype: str | None = None
  """dtype of the residual added after the activation; None: no residual."""
  block_scaled: bool = False
  """fp8 operands with a scale per (1 x 128) block of A and (b_scale_rows x 128) block
  of B, applied to each K block's product in registers (blockwise fp8)."""
  b_scale_rows: int = 128
  """With `block_scaled`: B's scale blocks span 128 rows (weights) or 1 (per-row
  scales, as the weight gradient's second operand)."""
  scale_block_k: int = 128
  """With `block_scaled`: the K extent of a scale block, one K step (`tile_k`) each: 128
  (DeepSeek-V3's blocks) or 32 (MXFP8's, per-row on both operands)."""
  residual_operands: int = 1
  """Residual arrays the epilogue loads per chunk: 2 for a gated unit's backward
  (its gate and up pre-activations, `EpilogueSpec.gated_slope`)."""
  has_scales: bool = False
  """Runtime scalars (accumulator and output scale) read from device memory."""
  has_row_scale: bool = False
  """A runtime per-row (M) multiplier of the accumulator."""
  has_col_scale: bool = False
  """A runtime per-column (N) multiplier of the accumulator."""
  amax: bool = False
  """A second output: per-row maxima of |y| (before fp8 output scaling) per column tile."""
  row_lse: bool = False
  """A second output: per column tile, each row's max m of the stored y and the sum of
  exp(y - m) over the tile's columns (a log-sum-exp in two parts; `cross_entropy`)."""
  a_splits: tuple[int, ...] | None = None
  """A (M, K), not transposed, read from arrays of these widths side by side along K
  (the pieces of a concatenation that is never made; `split_outputs`' backward)."""
  b_splits: tuple[int, ...] | None = None
  """B (K, N), not transposed, read from arrays of these widths side by side along N."""
  out_splits: tuple[int, ...] | None = None
  """The output stored as separate arrays of these widths (summing to N), side by side
  along N, each a whole number of epilogue chunks wide (`split_outputs`)."""

  @property
  def dtype_b(self) -> str:
    return self.b_dtype or self.dtype

  @property
  def flops(self) -> int:
    return 2 * self.batch * self.m * self.n * self.k


@dataclasses.dataclass(frozen=True)
class GemmConfig:
  """Tile shapes and schedule of the Hopper GEMM kernel (hashable: a static jit arg).

  Attributes:
    tile_m, tile_n: output tile of one CTA. `cooperative` splits it between the
      consumer warpgroups along `wg_split`; `pingpong` gives each of two warpgroups
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
    split_k: K is cut into this many slices (at most; see `k_splits`), each a
      separate work unit writing f32 partial sums that XLA adds and passes
      through the epilogue (`pallas_gemm.split_k`). 1: no split.
    stream_k: spread the partial last wave of tiles over every SM at K-step
      granularity, reduced inside the kernel (`pallas_gemm.stream_k`);
      cooperative, split_k=1, and not in GPU interpret mode (no GMEM semaphores).
    split_tail: with stream_k, the whole waves first, then each tile of the partial last
      wave cut into equal K slices run side by side, the idle SMs' share
      (`stream_k.TailSplit`), instead of the balanced ranges before the whole tiles.
    promotion_depth: blockwise fp8 only: K blocks multiplied into fresh accumulators
      before their products are scaled into the sum (`Ring.mma_promoted`): 2 lets one
      block's WGMMA run while the previous block is scaled, at 64 more registers per
      thread: 1-14% faster than 1 (serial) on the H100 (NOTES exp. 63); the default is 1
      with per-row B scales, whose factor array would not fit beside two blocks (exp. 112).
    consumers: consumer warpgroups of a cooperative CTA, 2 or 3 (each then holds a third
      of the tile: 192 rows as three 64-row slices, the way cuBLAS runs 192x96 tiles); they
      share the registers the producer leaves (`pipeline.compute_registers`: 232 per
      thread for 2, 152 for 3), so 3 bounds each accumulator at 64x96.
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
  split_k: int = 1
  stream_k: bool = False
  split_tail: bool = False
  promotion_depth: int = 2
  consumers: int = 2

  def __post_init__(self):
    """Types, checked at construction (a cache file's entries too): positive ints where
    counts go, pairs as tuples (a list would make the config unhashable)."""

    def fail(field, msg):
      raise ValueError(f"GemmConfig.{field}={getattr(self, field)!r}: {msg}")

    def positive_int(x):
      return isinstance(x, int) and not isinstance(x, bool) and x >= 1

    for field in ("tile_m", "tile_n", "tile_k", "stages", "group", "split_k"):
      if not positive_int(getattr(self, field)):
        fail(field, "must be an int >= 1")
    if self.num_sms is not None and not positive_int(self.num_sms):
      fail("num_sms", "must be None or an int >= 1")
    for field in ("cluster", "epilogue_tile"):
      value = getattr(self, field)
      if value is None and field == "epilogue_tile":
        continue
      if (
          not isinstance(value, (tuple, list))
          or len(value) != 2
          or not all(positive_int(v) for v in value)
      ):
        fail(
            field, "must be a pair of ints >= 1" + (" or None" if field == "epilogue_tile" else "")
        )
      object.__setattr__(self, field, tuple(value))
    if not isinstance(self.stream_k, bool):
      fail("stream_k", "must be a bool")
    if not isinstance(self.split_tail, bool) or (self.split_tail and not self.stream_k):
      fail("split_tail", "must be a bool, True only with stream_k=True")
    if self.promotion_depth not in (1, 2) or isinstance(self.promotion_depth, bool):
      fail("promotion_depth", "must be 1 or 2")
    if self.consumers not in CONSUMER_COUNTS or isinstance(self.consumers, bool):
      fail("consumers", f"must be one of {CONSUMER_COUNTS}")
    for field in ("schedule", "wg_split", "raster"):
      if not isinstance(getattr(self, field), str):
        fail(field, "must be a str")

  # -- derived shapes -------------------------------------------------------
  @property
  def wg_tile(self) -> tuple[int, int]:
    """(rows, cols) of the accumulator one consumer warpgroup holds."""
    if self.schedule == "pingpong":
      return self.tile_m, self.tile_n
    if self.wg_split == "m":
      return self.tile_m // self.consumers, self.tile_n
    return self.tile_m, self.tile_n // self.consumers

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

  def whole_tiles(self) -> "GemmConfig":
    """This config with every tile run whole (no stream-K, no tail split): for kernels
    that cannot run stream-K's fixup (the interpreter, the collective rings).

    >>> GemmConfig(stream_k=True, split_tail=True).whole_tiles().stream_k
    False
    """
    return dataclasses.replace(self, stream_k=False, split_tail=False)

  def k_splits(self, problem: GemmProblem) -> tuple[int, int]:
    """(splits, k_iters): K slices the kernel runs and tile_k steps per slice.

    Every slice but the last has `k_iters` steps; the last has at least one
    step inside K, the rest of it reads TMA's zero fill. `split_k` is lowered
    to the number of slices that are not empty.

    >>> GemmConfig(split_k=3).k_splits(GemmProblem(m=40, n=136, k=1000))  # 16 steps
    (3, 6)
    >>> GemmConfig(split_k=4).k_splits(GemmProblem(m=8, n=8, k=576))       # 9 steps
    (3, 3)
    """
    steps = tiles(problem.k, self.tile_k)
    k_iters = tiles(steps, min(self.split_k, steps))
    return tiles(steps, k_iters), k_iters

  def kernel_problem(self, problem: GemmProblem) -> GemmProblem:
    """What the kernel launch itself computes: with split-K, f32 partial sums
    and no epilogue extras (those run in XLA after the sum)."""
    if self.k_splits(problem)[0] == 1:
      return problem
    return dataclasses.replace(
        problem,
        out_dtype="float32",
        has_bias=False,
        has_c=False,
        has_row_bias=False,
        residual_dtype=None,
        has_scales=False,
        has_row_scale=False,
        has_col_scale=False,
        amax=False,
        row_lse=False,
        out_splits=None,
    )

  def smem_bytes(self, problem: GemmProblem) -> int:
    """Shared memory the kernel allocates for `problem` (each buffer 1 KiB aligned)."""
    problem = self.kernel_problem(problem)
    em, en = self.epilogue_shape
    wm, wn = self.wg_tile
    slots = (self.consumers, self.epilogue_slots, em, en)
    return smem.footprint(
        ((self.stages, self.tile_m, self.tile_k), problem.dtype),
        ((self.stages, self.tile_k, self.tile_n), problem.dtype_b),
        (slots, problem.out_dtype),
        *(  # the vector operands, staged per tile (`operands.VECTORS`)
            ((self.consumers, OPERANDS[name].kind.along(wm, wn)), "float32")
            for name in operands.present(problem)
            if name in operands.VECTORS
        ),
        ((*slots[:2], problem.residual_operands, em, en), problem.residual_dtype)
        if problem.residual_dtype
        else None,
        ((self.consumers, wm), "float32") if problem.amax else None,
        ((self.consumers, 2, wm), "float32") if problem.row_lse else None,
        ((self.stages, 1, self.tile_m), "float32") if problem.block_scaled else None,
        ((self.stages, 1, B_SCALE_BOX if problem.b_scale_rows > 1 else self.tile_n), "float32")
        if problem.block_scaled
        else None,
    )

  # -- checks ---------------------------------------------------------------
  def validate(self, problem: GemmProblem) -> None:
    """Raises ValueError naming the first field that breaks a limit for `problem`."""

    def fail(field, msg):
      raise ValueError(f"GemmConfig.{field}={getattr(self, field)!r}: {msg}")

    if problem.block_scaled:  # blockwise fp8: one scale block per K step and per B tile
      want_k = problem.scale_block_k
      for field, want in (("tile_k", want_k), ("tile_n", 128), ("split_k", 1), ("cluster", (1, 1))):
        if getattr(self, field) != want:
          fail(field, f"a blockwise-scaled GEMM runs {field}={want!r}")
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
    if self.schedule == "pingpong" and (self.stages % 2 or self.stages < 4):
      fail(
          "stages",
          "must be even and >= 4 for pingpong (stages // 2 per consumer "
          "warpgroup, at least 2 each)",
      )
    if self.num_sms is not None and (self.num_sms < 1 or self.num_sms % self.cluster_size):
      fail("num_sms", f"must be a positive multiple of the cluster size {self.cluster_size}")
    if not isinstance(self.split_k, int) or isinstance(self.split_k, bool) or self.split_k < 1:
      fail("split_k", "must be an int >= 1")
    steps = tiles(problem.k, self.tile_k)
    if self.split_k > steps:
      fail(
          "split_k",
          f"exceeds the {steps} tile_k={self.tile_k} steps of K={problem.k} "
          "(a slice needs at least one)",
      )
    if self.stream_k and (self.schedule != "cooperative" or self.split_k != 1):
      fail("stream_k", "needs schedule='cooperative' and split_k=1")
    _validate_dtypes(problem)
    problem = self.kernel_problem(problem)

    wm, wn = self.wg_tile
    if self.consumers != 2 and (self.schedule != "cooperative" or problem.block_scaled):
      fail("consumers", "must be 2 for pingpong and for blockwise-scaled GEMMs")
    if self.schedule == "pingpong" or self.wg_split == "n":
      if self.tile_m % 64 or not 64 <= self.tile_m <= 256:
        fail("tile_m", "must be 64, 128, 192 or 256 (WGMMA rows come in 64s)")
    elif self.tile_m % (64 * self.consumers) or not wm <= 128:
      fail(
          "tile_m",
          f"must give each of {self.consumers} warpgroups splitting M 64 or 128 rows "
          f"({', '.join(str(r * self.consumers) for r in (64, 128))})",
      )
    if wn % 8 or wn > 256:
      fail("tile_n", f"gives a warpgroup tile {wn} wide; WGMMA needs N a multiple of 8 and <= 256")
    if problem.transpose_a and self.schedule == "cooperative" and self.wg_split == "m":
      fail(
          "wg_split",
          "must be 'n' when A is transposed (an MN-major A tile cannot be split along M)",
      )
    if wm * wn > max_acc_elements(self.consumers):
      fail(
          "tile_n",
          f"gives a {wm}x{wn} f32 accumulator per warpgroup; at most "
          f"{max_acc_elements(self.consumers)} elements fit in registers with "
          f"{self.consumers} consumers",
      )

    span = smem.swizzle_span(problem.dtype, 128)
    narrow_blocks = problem.block_scaled and problem.scale_block_k < span  # MXFP8's 32-blocks
    if self.tile_k % span and not narrow_blocks:
      fail("tile_k", f"must be a multiple of {span} ({problem.dtype}: one 128-byte swizzle span)")
    span = smem.swizzle_span(problem.dtype, min(smem.SWIZZLE_BYTES))  # MN-major tiles may narrow
    # An MN-major operand's tile (and each warpgroup's slice of it) must hold whole swizzle spans.
    minor_tiles = {
        "tile_m": (self.tile_m, wm) if problem.transpose_a else None,
        "tile_n": (self.tile_n, wn) if not problem.transpose_b else None,
    }
    for field, extents in minor_tiles.items():
      if extents is None:
        continue
      if extents[0] % span:
        fail(field, f"is the minor dim of an MN-major operand tile; must be a multiple of {span}")
      if extents[1] % span:
        fail(
            field,
            f"gives each warpgroup a {extents[1]}-wide slice of an MN-major operand "
            f"tile; must be a multiple of {span} (or wg_split='m', or that operand K-major)",
        )

    for name in operands.present(problem):
      extent = OPERANDS[name].kind.along(wm, wn) if OPERANDS[name].kind.vector else None
      if extent is not None and extent * 4 % VECTOR_ALIGN_BYTES:
        fail(
            OPERANDS[name].kind.along("tile_m", "tile_n"),
            f"gives each warpgroup {extent} f32 of `{name}`; TMA stages them into shared "
            f"memory in slices that must be {VECTOR_ALIGN_BYTES}-byte aligned (a multiple of "
            f"{VECTOR_ALIGN_BYTES // 4})",
        )

    em, en = self.epilogue_shape
    if wm % em or wn % en or em % 64:
      fail("epilogue_tile", f"must divide the warpgroup tile {wm}x{wn} with rows a multiple of 64")
    out_span = smem.swizzle_span(problem.out_dtype, 32)
    if en % out_span:
      fail(
          "epilogue_tile",
          f"columns must be a multiple of {out_span} (32-byte swizzle of {problem.out_dtype})",
      )

    need = self.smem_bytes(problem)
    if need > SMEM_LIMIT_BYTES:
      fail(
          "stages",
          f"needs {need} bytes of shared memory, the limit is {SMEM_LIMIT_BYTES} "
          "(fewer stages, smaller tiles or a smaller epilogue_tile)",
      )


def _itemsize(dtype: str) -> int:
  import jax.numpy as jnp  # local: the fp8 dtypes come from ml_dtypes through jax

  return jnp.dtype(dtype).itemsize


def _validate_dtypes(problem: GemmProblem) -> None:
  """Raises ValueError for a dtype/layout combination the kernel does not run."""
  from pallas_gemm import _compat

  a, b = problem.dtype, problem.dtype_b
  for name, dtype in (("dtype", a), ("b_dtype", b)):
    if dtype not in KERNEL_INPUT_DTYPES:
      raise ValueError(
          f"GemmProblem.{name}={dtype!r}: input dtype {dtype} not supported; "
          f"use one of {KERNEL_INPUT_DTYPES}"
      )
  if a != b:
    if a not in FP8_DTYPES or b not in FP8_DTYPES:
      raise ValueError(
          f"GemmProblem.b_dtype={b!r}: A is {a}; only fp8 operands may differ " "(e4m3 x e5m2)"
      )
    if not _compat.SUPPORTS_MIXED_FP8:
      raise ValueError(
          f"GemmProblem.b_dtype={b!r}: mixed e4m3 x e5m2 WGMMA needs jax >= 0.11 "
          f"(this is {'.'.join(map(str, _compat.JAX_VERSION))})"
      )
  if a in K_MAJOR_DTYPES and (problem.transpose_a or not problem.transpose_b):
    raise ValueError(
        f"GemmProblem.transpose_a={problem.transpose_a}, transpose_b="
        f"{problem.transpose_b}: input dtype {a} not supported in this layout; "
        f"{a} operands must be K-major in the kernel (A stored (M, K), B stored "
        "(N, K): transpose_a=False, transpose_b=True); matmul transposes others"
    )
  if problem.out_dtype not in KERNEL_OUTPUT_DTYPES:
    raise ValueError(
        f"GemmProblem.out_dtype={problem.out_dtype!r}: not supported; use one of "
        f"{KERNEL_OUTPUT_DTYPES}"
    )
  if problem.out_dtype in FP8_DTYPES and problem.has_c:
    raise ValueError("GemmProblem.has_c=True: a beta * c addend is not supported with fp8 outputs")
  if problem.residual_dtype is not None and problem.residual_dtype not in ADDEND_DTYPES:
    raise ValueError(
        f"GemmProblem.residual_dtype={problem.residual_dtype!r}: use one of {ADDEND_DTYPES}"
    )
  if problem.block_scaled and (
      problem.scale_block_k not in (32, 128)
      or (problem.scale_block_k != 128 and problem.b_scale_rows != 1)
  ):
    raise ValueError(
        f"GemmProblem.scale_block_k={problem.scale_block_k!r}: use 128, or 32 with per-row "
        f"B scales (b_scale_rows=1; got {problem.b_scale_rows})"
    )


def default_tile_k(dtype: str) -> int:
  """One 128-byte swizzle span of K: 64 bf16/f16, 128 fp8, 32 f32 (tf32)."""
  return 128 // _itemsize(dtype)


DEFAULT_NUM_SMS = 132
"""H100 SXM: the SM count the planners and kernels use when no GPU is attached."""

PARTIAL_EPILOGUE_TILE = (64, 32)
"""Epilogue stores of f32 partial sums (split-K): one 128-byte span wide, so
that the deep rings of the table below still fit in SMEM."""


def fit_stages(cfg: GemmConfig, problem: GemmProblem, max_stages: int) -> GemmConfig:
  """`cfg` with the deepest ring (<= max_stages) that fits in SMEM, of a depth its
  schedule takes (pingpong: even, >= 4); f32 outputs with an f32 residual fall back to
  narrower epilogue tiles to keep the shallowest ring.

  >>> fit_stages(GemmConfig(tile_m=64, tile_n=128, schedule="pingpong"), GemmProblem(4096, 4096, 4096), 7).stages
  6
  """
  fits = lambda candidate: candidate.smem_bytes(problem) <= SMEM_LIMIT_BYTES
  pingpong = cfg.schedule == "pingpong"  # stages // 2 per consumer warpgroup, 2+ each
  shallowest, step = (4, 2) if pingpong else (2, 1)
  depths = range(max(max_stages - max_stages % step, shallowest), shallowest - 1, -step)
  for epilogue_tile in (cfg.epilogue_tile, (64, 32)):
    candidate = smem.deepest(
        lambda stages: dataclasses.replace(cfg, stages=stages, epilogue_tile=epilogue_tile),
        depths,
        fits,
    )
    if fits(candidate):
      return candidate
  return dataclasses.replace(cfg, stages=shallowest)


def tiles(extent: int, tile: int) -> int:
  return math.ceil(extent / tile)
